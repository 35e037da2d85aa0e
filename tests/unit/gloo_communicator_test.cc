// Gloo over real TCP sockets on 127.0.0.1, ranks as threads, rendezvous
// through an in-memory key-value store.
#include "worker/collective/gloo_communicator.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"

namespace lockstep::worker {
namespace {

class MemoryKv : public KeyValueClient {
 public:
  absl::Status Set(const std::string& key, const std::string& value) override {
    absl::MutexLock lock(&mu_);
    values_[key] = value;
    return absl::OkStatus();
  }
  absl::StatusOr<std::string> Get(const std::string& key,
                                  absl::Duration timeout) override {
    absl::MutexLock lock(&mu_);
    auto present = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return values_.count(key) > 0;
    };
    if (!mu_.AwaitWithTimeout(absl::Condition(&present), timeout)) {
      return absl::DeadlineExceededError("key " + key + " never set");
    }
    return values_[key];
  }

 private:
  absl::Mutex mu_;
  std::map<std::string, std::string> values_ ABSL_GUARDED_BY(mu_);
};

struct Case {
  int world;
  size_t count;
};

class GlooAllReduceTest : public ::testing::TestWithParam<Case> {};

TEST_P(GlooAllReduceTest, SumsAndBroadcastsOnEveryRank) {
  const auto [world, count] = GetParam();
  MemoryKv kv;
  std::vector<std::thread> threads;
  std::vector<absl::Status> errors(world);
  std::vector<std::vector<float>> sums(world), broadcasts(world);
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      GlooCommunicator::Options options;
      options.rank = rank;
      options.size = world;
      options.timeout = absl::Seconds(30);
      auto comm = GlooCommunicator::Connect(&kv, options);
      if (!comm.ok()) {
        errors[rank] = comm.status();
        return;
      }
      std::vector<float>& data = sums[rank];
      for (size_t i = 0; i < count; ++i)
        data.push_back(float(rank + 1) * (i % 97));
      errors[rank] = (*comm)->AllReduceSum(data.data(), data.size());
      if (!errors[rank].ok()) return;
      broadcasts[rank].assign(count, float(rank));
      errors[rank] =
          (*comm)->Broadcast(broadcasts[rank].data(), count, world - 1);
    });
  }
  for (std::thread& t : threads) t.join();
  const float factor = world * (world + 1) / 2.0f;
  for (int rank = 0; rank < world; ++rank) {
    ASSERT_TRUE(errors[rank].ok()) << errors[rank];
    for (size_t i = 0; i < count; ++i) {
      ASSERT_EQ(sums[rank][i], factor * (i % 97))
          << "rank " << rank << " i " << i;
      ASSERT_EQ(broadcasts[rank][i], float(world - 1));
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Sizes, GlooAllReduceTest,
                         ::testing::Values(Case{1, 5}, Case{2, 0}, Case{2, 1},
                                           Case{2, 1001}, Case{3, 7},
                                           Case{3, 1 << 20}, Case{4, 3},
                                           Case{4, 262147}),
                         [](const auto& info) {
                           return "W" + std::to_string(info.param.world) +
                                  "_N" + std::to_string(info.param.count);
                         });

// Only rank 0 of 2 shows up, so the rendezvous timeout is certain.
TEST(GlooCommunicatorTest, MissingPeerIsAnErrorWithinTheTimeout) {
  MemoryKv kv;
  GlooCommunicator::Options options;
  options.rank = 0;
  options.size = 2;
  options.timeout = absl::Milliseconds(200);
  auto comm = GlooCommunicator::Connect(&kv, options);
  ASSERT_FALSE(comm.ok());
  EXPECT_THAT(comm.status().message(), ::testing::HasSubstr("rank 0 of 2"));
}

}  // namespace
}  // namespace lockstep::worker

namespace lockstep::worker {
namespace {

// Rank 1 connects but never calls the all-reduce (a hung peer); Abort from
// another thread must release rank 0. The collective timeout is an hour, so
// an Abort that does not work hangs the test into ctest's timeout.
TEST(GlooCommunicatorTest, AbortUnblocksAPendingAllReduce) {
  MemoryKv kv;
  std::unique_ptr<GlooCommunicator> comms[2];
  std::thread peer([&] {
    GlooCommunicator::Options options;
    options.rank = 1;
    options.size = 2;
    comms[1] = *GlooCommunicator::Connect(&kv, options);
  });
  GlooCommunicator::Options options;
  options.rank = 0;
  options.size = 2;
  options.timeout = absl::Hours(1);
  comms[0] = *GlooCommunicator::Connect(&kv, options);
  peer.join();

  absl::Notification started;
  absl::Status result;
  std::thread blocked([&] {
    std::vector<float> data(1000, 1.0f);
    started.Notify();
    result = comms[0]->AllReduceSum(data.data(), data.size());
  });
  started.WaitForNotification();
  comms[0]->Abort();
  blocked.join();
  EXPECT_FALSE(result.ok());
  EXPECT_EQ(result.code(), absl::StatusCode::kAborted) << result;
  std::vector<float> more(4);
  EXPECT_EQ(comms[0]->AllReduceSum(more.data(), 4).code(),
            absl::StatusCode::kAborted);
}

}  // namespace
}  // namespace lockstep::worker
