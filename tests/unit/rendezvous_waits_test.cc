// The pending rendezvous calls' index (coordinator/rendezvous_waits.h).
#include "coordinator/rendezvous_waits.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

namespace lockstep::coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

RendezvousWaits::Wait KvWait(const std::string& job, int64_t generation,
                             const std::string& key) {
  RendezvousWaits::Wait wait;
  wait.job_id = job;
  wait.generation = generation;
  wait.name = key;
  wait.kv_done = [](absl::StatusOr<std::string>) {};
  return wait;
}

TEST(RendezvousWaitsTest, WaitsAreFoundByWhatTheyWaitOn) {
  RendezvousWaits waits;
  const auto a = waits.Add(KvWait("job-1", 1, "addr/0"));
  const auto b = waits.Add(KvWait("job-1", 1, "addr/0"));
  const auto c = waits.Add(KvWait("job-1", 1, "addr/1"));
  const auto d = waits.Add(KvWait("job-1", 2, "addr/0"));
  const auto e = waits.Add(KvWait("job-2", 1, "addr/0"));
  EXPECT_NE(a, 0u);
  EXPECT_THAT(waits.On("job-1", 1, "addr/0"), UnorderedElementsAre(a, b));
  EXPECT_THAT(waits.On("job-1", 1, "addr/1"), ElementsAre(c));
  EXPECT_THAT(waits.On("job-1", 2, "addr/0"), ElementsAre(d));
  EXPECT_THAT(waits.On("job-2", 1, "addr/0"), ElementsAre(e));
  EXPECT_THAT(waits.On("job-3", 1, "addr/0"), IsEmpty());
  EXPECT_EQ(waits.size(), 5u);
}

// A fence wakes its own job's waits, never another job's, even one whose
// id starts the same.
TEST(RendezvousWaitsTest, AJobsWaitsAreItsOwn) {
  RendezvousWaits waits;
  const auto a = waits.Add(KvWait("job-1", 1, "k"));
  const auto b = waits.Add(KvWait("job-1", 3, "setup"));
  const auto c = waits.Add(KvWait("job-10", 1, "k"));
  const auto d = waits.Add(KvWait("job-", 1, "k"));
  EXPECT_THAT(waits.OfJob("job-1"), UnorderedElementsAre(a, b));
  EXPECT_THAT(waits.OfJob("job-10"), ElementsAre(c));
  EXPECT_THAT(waits.OfJob("job-"), ElementsAre(d));
  EXPECT_THAT(waits.OfJob("job-2"), IsEmpty());
  EXPECT_THAT(waits.All(), UnorderedElementsAre(a, b, c, d));
}

TEST(RendezvousWaitsTest, ATakenWaitIsGoneFromEveryIndex) {
  RendezvousWaits waits;
  const auto a = waits.Add(KvWait("job-1", 1, "k"));
  const auto b = waits.Add(KvWait("job-1", 1, "k"));
  RendezvousWaits::Wait taken = waits.Take(a);
  EXPECT_EQ(taken.name, "k");
  EXPECT_EQ(waits.Find(a), nullptr);
  EXPECT_THAT(waits.On("job-1", 1, "k"), ElementsAre(b));
  EXPECT_THAT(waits.OfJob("job-1"), ElementsAre(b));
  EXPECT_EQ(waits.size(), 1u);
  // Ids are not reused.
  EXPECT_GT(waits.Add(KvWait("job-1", 1, "k")), b);
}

}  // namespace
}  // namespace lockstep::coordinator
