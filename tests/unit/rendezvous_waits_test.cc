// The pending rendezvous calls: their index (coordinator/rendezvous_waits.h)
// and when each is answered (coordinator/rendezvous.h), on a fake clock with
// a fence the test moves.
#include "coordinator/rendezvous_waits.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <optional>
#include <string>

#include "common/clock.h"
#include "coordinator/generation.h"
#include "coordinator/rendezvous.h"

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

// The Rendezvous over one live generation of "job-1": the test sets keys
// in it and moves its fence.
class RendezvousTest : public ::testing::Test {
 protected:
  RendezvousTest()
      : rendezvous_(&clock_,
                    [this](const std::string& job,
                           int64_t number) -> absl::StatusOr<Generation*> {
                      if (job != "job-1")
                        return absl::NotFoundError("no job " + job);
                      if (number != live_)
                        return absl::AbortedError("generation over");
                      return &generation_;
                    }) {}
  // A KvGet whose answer lands in `*answer`; returns its id (0: answered).
  Rendezvous::WaitId Get(const std::string& job, int64_t number,
                         const std::string& key, int64_t timeout_ms,
                         std::optional<absl::StatusOr<std::string>>* answer) {
    return rendezvous_.KvGet(
        job, number, key, timeout_ms,
        [answer](absl::StatusOr<std::string> result) { *answer = result; });
  }

  FakeClock clock_;
  int64_t live_ = 1;
  Generation generation_{"job-1", 1, {"worker:0", "worker:1"}};
  Rendezvous rendezvous_;
};

TEST_F(RendezvousTest, ACallIsAnsweredWhenItsKeyIsSet) {
  std::optional<absl::StatusOr<std::string>> answer;
  const auto id = Get("job-1", 1, "addr/1", 5000, &answer);
  EXPECT_NE(id, 0u);
  EXPECT_FALSE(answer.has_value());
  ASSERT_TRUE(generation_.Set("addr/0", "a").ok());
  rendezvous_.KeySet("job-1", 1, "addr/0");  // another key
  EXPECT_FALSE(answer.has_value());
  ASSERT_TRUE(generation_.Set("addr/1", "b").ok());
  rendezvous_.KeySet("job-1", 1, "addr/1");
  ASSERT_TRUE(answer.has_value());
  EXPECT_EQ(**answer, "b");
  EXPECT_EQ(rendezvous_.pending(), 0u);
  // A key already set is answered at once.
  answer.reset();
  EXPECT_EQ(Get("job-1", 1, "addr/0", 5000, &answer), 0u);
  EXPECT_EQ(**answer, "a");
}

TEST_F(RendezvousTest, TheFenceTheDeadlineAndTheCallerEndCalls) {
  std::optional<absl::StatusOr<std::string>> fenced, late, cancelled, now;
  Get("job-1", 1, "k", 5000, &fenced);
  Get("job-1", 1, "k", 1000, &late);
  const auto id = Get("job-1", 1, "k", 5000, &cancelled);
  // A zero timeout is answered at once; an unknown job too.
  EXPECT_EQ(Get("job-1", 1, "k", 0, &now), 0u);
  EXPECT_EQ(now->status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(std::string(now->status().message()),
              ::testing::HasSubstr("key 'k' of job job-1 generation 1 was "
                                   "not set within 0 ms"));
  EXPECT_EQ(Get("job-2", 1, "k", 5000, &now), 0u);
  EXPECT_EQ(now->status().code(), absl::StatusCode::kNotFound);

  rendezvous_.Cancel(id);
  EXPECT_EQ(cancelled->status().code(), absl::StatusCode::kCancelled);
  clock_.Advance(absl::Seconds(1));
  rendezvous_.AnswerDue();
  EXPECT_EQ(late->status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_FALSE(fenced.has_value());
  live_ = 2;
  rendezvous_.FenceMoved("job-1");
  EXPECT_EQ(fenced->status().code(), absl::StatusCode::kAborted);
  EXPECT_EQ(rendezvous_.pending(), 0u);
  rendezvous_.Cancel(id);  // answered already: nothing happens
}

}  // namespace
}  // namespace lockstep::coordinator
