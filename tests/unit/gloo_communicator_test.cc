// Gloo over real TCP sockets on 127.0.0.1, ranks as threads, rendezvous
// through an in-memory key-value store.
#include "worker/collective/gloo_communicator.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <map>
#include <random>
#include <thread>
#include <tuple>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "worker/collective/half.h"
#include "worker/collective/in_memory_kv.h"

namespace lockstep::worker {
namespace {

using Algorithm = GlooCommunicator::Algorithm;

std::string AlgorithmName(Algorithm algorithm) {
  return algorithm == Algorithm::kRing ? "Ring" : "Direct";
}

struct Case {
  int world;
  size_t count;
  Algorithm algorithm = Algorithm::kDirect;
};

class GlooAllReduceTest : public ::testing::TestWithParam<Case> {};

TEST_P(GlooAllReduceTest, SumsAndBroadcastsOnEveryRank) {
  // Plain copies, not a structured binding: Clang 14 (the sanitizer build)
  // cannot capture bindings in lambdas.
  const int world = GetParam().world;
  const size_t count = GetParam().count;
  const Algorithm algorithm = GetParam().algorithm;
  InMemoryKeyValue kv;
  std::vector<std::thread> threads;
  std::vector<absl::Status> errors(world);
  std::vector<std::vector<float>> sums(world), broadcasts(world);
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      GlooCommunicator::Options options;
      options.rank = rank;
      options.size = world;
      options.timeout = absl::Seconds(30);
      options.algorithm = algorithm;
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
                                           Case{4, 262147},
                                           Case{2, 1, Algorithm::kRing},
                                           Case{3, 2, Algorithm::kRing},
                                           Case{3, 1 << 20, Algorithm::kRing},
                                           Case{4, 3, Algorithm::kRing},
                                           Case{4, 262147, Algorithm::kRing}),
                         [](const auto& info) {
                           return AlgorithmName(info.param.algorithm) + "_W" +
                                  std::to_string(info.param.world) + "_N" +
                                  std::to_string(info.param.count);
                         });

// Only rank 0 of 2 shows up, so the rendezvous timeout is certain.
TEST(GlooCommunicatorTest, MissingPeerIsAnErrorWithinTheTimeout) {
  InMemoryKeyValue kv;
  GlooCommunicator::Options options;
  options.rank = 0;
  options.size = 2;
  options.timeout = absl::Milliseconds(200);
  auto comm = GlooCommunicator::Connect(&kv, options);
  ASSERT_FALSE(comm.ok());
  EXPECT_THAT(comm.status().message(), ::testing::HasSubstr("rank 0 of 2"));
}

// The peer never shows up and the timeout is an hour: only Abort() can end
// the wait for its address (an abort that does not work hangs the test into
// ctest's timeout).
TEST(GlooCommunicatorTest, AbortReleasesARankWaitingForAPeerThatNeverCame) {
  InMemoryKeyValue kv;
  GlooCommunicator::Options options;
  options.rank = 0;
  options.size = 2;
  options.timeout = absl::Hours(1);
  auto comm = GlooCommunicator::Create(options);
  ASSERT_TRUE(comm.ok()) << comm.status();
  absl::Status result;
  std::thread connecting([&] { result = (*comm)->Connect(&kv); });
  ASSERT_TRUE(kv.Get("0", absl::Minutes(1)).ok());  // published, now waiting
  (*comm)->Abort();
  connecting.join();
  EXPECT_TRUE(absl::IsAborted(result)) << result;
}

// A key-value view whose Gets wait until Cancel() (a peer that published its
// address and then hung or died before connecting), and that says when a Get
// of `watched` returned.
class StallingKeyValue : public KeyValueClient {
 public:
  StallingKeyValue(KeyValueClient* inner, bool stall, std::string watched)
      : inner_(inner), stall_(stall), watched_(std::move(watched)) {}
  absl::Status Set(const std::string& key, const std::string& value) override {
    return inner_->Set(key, value);
  }
  absl::StatusOr<std::string> Get(const std::string& key,
                                  absl::Duration timeout) override {
    if (stall_) {
      cancelled_.WaitForNotification();
      return absl::AbortedError("cancelled");
    }
    auto value = inner_->Get(key, timeout);
    if (key == watched_) fetched_.Notify();
    return value;
  }
  void Cancel() override {
    if (!cancelled_.HasBeenNotified()) cancelled_.Notify();
  }
  absl::Notification fetched_;

 private:
  KeyValueClient* const inner_;
  const bool stall_;
  const std::string watched_;
  absl::Notification cancelled_;
};

// Rank 1 publishes its address and never connects: rank 0 waits in Gloo's
// pair connect (or, when it is the connecting side, in the barrier after
// it). Abort() must release it wherever it is; the timeout is an hour.
TEST(GlooCommunicatorTest, AbortReleasesARankWaitingForAPeerToConnect) {
  for (int attempt = 0; attempt < 5; ++attempt) {
    InMemoryKeyValue kv;
    StallingKeyValue hung(&kv, /*stall=*/true, "");
    StallingKeyValue watched(&kv, /*stall=*/false, "1");
    GlooCommunicator::Options options;
    options.size = 2;
    options.timeout = absl::Hours(1);
    options.rank = 1;
    auto peer = GlooCommunicator::Create(options);
    options.rank = 0;
    auto comm = GlooCommunicator::Create(options);
    ASSERT_TRUE(peer.ok() && comm.ok());
    absl::Status peer_result, result;
    std::thread peer_thread([&] { peer_result = (*peer)->Connect(&hung); });
    std::thread connecting([&] { result = (*comm)->Connect(&watched); });
    watched.fetched_.WaitForNotification();  // rank 0 has rank 1's address
    (*comm)->Abort();
    connecting.join();
    EXPECT_TRUE(absl::IsAborted(result)) << result;
    hung.Cancel();
    (*peer)->Abort();
    peer_thread.join();
    EXPECT_FALSE(peer_result.ok());
  }
}

}  // namespace
}  // namespace lockstep::worker

namespace lockstep::worker {
namespace {

// Rank 1 connects but never calls the all-reduce (a hung peer); Abort from
// another thread must release rank 0. The collective timeout is an hour, so
// an Abort that does not work hangs the test into ctest's timeout.
TEST(GlooCommunicatorTest, AbortUnblocksAPendingAllReduce) {
  InMemoryKeyValue kv;
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

namespace lockstep::worker {
namespace {

// Runs `body(rank, comm)` on `world` ranks connected over loopback.
void OnRanks(int world, absl::Duration timeout,
             const std::function<void(int, Communicator&)>& body,
             Algorithm algorithm = Algorithm::kDirect) {
  InMemoryKeyValue kv;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      GlooCommunicator::Options options;
      options.rank = rank;
      options.size = world;
      options.timeout = timeout;
      options.algorithm = algorithm;
      auto comm = GlooCommunicator::Connect(&kv, options);
      ASSERT_TRUE(comm.ok()) << comm.status();
      body(rank, **comm);
    });
  }
  for (std::thread& t : threads) t.join();
}

class GlooWorldTest
    : public ::testing::TestWithParam<std::tuple<int, Algorithm>> {};

TEST_P(GlooWorldTest, AllGatherAndBarrier) {
  const int world = std::get<0>(GetParam());
  const Algorithm algorithm = std::get<1>(GetParam());
  for (size_t bytes : {size_t{0}, size_t{1}, size_t{13}, size_t{100000}}) {
    OnRanks(
        world, absl::Seconds(30),
        [&](int rank, Communicator& comm) {
          std::vector<char> in(bytes, static_cast<char>('a' + rank));
          std::vector<char> out(world * bytes, 0);
          ASSERT_TRUE(comm.AllGather(in.data(), bytes, out.data()).ok());
          for (int r = 0; r < world; ++r) {
            for (size_t i = 0; i < bytes; ++i) {
              ASSERT_EQ(out[r * bytes + i], 'a' + r);
            }
          }
          ASSERT_TRUE(comm.Barrier().ok());
        },
        algorithm);
  }
}

// With the direct algorithm each element is summed in rank order whatever
// the split, so reducing a buffer in pieces (as gradient buckets do) is
// bitwise the flat result. The ring's order depends on the chunk, so there
// the pieces agree with the flat sum only to rounding, and every rank must
// still hold the same bits.
TEST_P(GlooWorldTest, SplitReductionIsBitwiseTheFlatOne) {
  const int world = std::get<0>(GetParam());
  const Algorithm algorithm = std::get<1>(GetParam());
  const size_t n = 10007;
  std::vector<std::vector<float>> results(world);
  OnRanks(
      world, absl::Seconds(30),
      [&](int rank, Communicator& comm) {
        std::mt19937 random(rank + 1);
        std::normal_distribution<float> normal(0, 1e3);
        std::vector<float> flat(n);
        for (float& x : flat) x = normal(random);
        std::vector<float> pieces = flat;
        ASSERT_TRUE(comm.AllReduceSum(flat.data(), n).ok());
        ASSERT_TRUE(comm.AllReduceSum(pieces.data(), 77).ok());
        ASSERT_TRUE(comm.AllReduceSum(pieces.data() + 77, 5000).ok());
        ASSERT_TRUE(comm.AllReduceSum(pieces.data() + 5077, n - 5077).ok());
        if (algorithm == Algorithm::kDirect) {
          ASSERT_EQ(std::memcmp(flat.data(), pieces.data(), n * sizeof(float)),
                    0);
        } else {
          for (size_t i = 0; i < n; ++i) {
            ASSERT_NEAR(flat[i], pieces[i],
                        1e-3f * (std::fabs(flat[i]) + 1e3f));
          }
        }
        results[rank] = std::move(pieces);
      },
      algorithm);
  for (int rank = 1; rank < world; ++rank) {
    ASSERT_EQ(
        std::memcmp(results[0].data(), results[rank].data(), n * sizeof(float)),
        0)
        << "rank " << rank;
  }
}

TEST_P(GlooWorldTest, HalfPrecisionSumsAreWithinTheirPrecision) {
  const int world = std::get<0>(GetParam());
  const Algorithm algorithm = std::get<1>(GetParam());
  // The direct algorithm rounds once; the ring at each of its W-1 hops.
  const int roundings =
      algorithm == Algorithm::kRing ? std::max(1, world - 1) : 1;
  const size_t n = 1001;
  for (DataType type : {DataType::kBFloat16, DataType::kFloat16}) {
    OnRanks(
        world, absl::Seconds(30),
        [&](int rank, Communicator& comm) {
          auto to = type == DataType::kBFloat16 ? FloatToBFloat16 : FloatToHalf;
          auto from =
              type == DataType::kBFloat16 ? BFloat16ToFloat : HalfToFloat;
          std::vector<uint16_t> data(n);
          for (size_t i = 0; i < n; ++i) data[i] = to(0.01f * i * (rank + 1));
          ASSERT_TRUE(comm.AllReduceSum(data.data(), n, type).ok());
          const float relative =
              roundings *
              (type == DataType::kBFloat16 ? 1.0f / 128 : 1.0f / 1024);
          for (size_t i = 0; i < n; ++i) {
            float exact = 0;
            for (int r = 0; r < world; ++r)
              exact += from(to(0.01f * i * (r + 1)));
            ASSERT_NEAR(from(data[i]), exact,
                        relative * std::fabs(exact) + 1e-6)
                << "element " << i;
          }
        },
        algorithm);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Worlds, GlooWorldTest,
    ::testing::Combine(::testing::Values(1, 2, 3, 4),
                       ::testing::Values(Algorithm::kDirect, Algorithm::kRing)),
    [](const auto& info) {
      return AlgorithmName(std::get<1>(info.param)) + "_W" +
             std::to_string(std::get<0>(info.param));
    });

// Rank 2 of 3 connects, then never joins the all-reduce and disappears: the
// others fail within their timeout and name it.
TEST(GlooCommunicatorTest, ADeadPeerIsNamed) {
  std::vector<absl::Status> results(3);
  OnRanks(3, absl::Seconds(2), [&](int rank, Communicator& comm) {
    if (rank == 2) return;  // its communicator closes as the thread ends
    std::vector<float> data(1000, 1.0f);
    results[rank] = comm.AllReduceSum(data.data(), data.size());
  });
  for (int rank : {0, 1}) {
    EXPECT_FALSE(results[rank].ok());
    EXPECT_THAT(
        std::string(results[rank].message()),
        ::testing::ContainsRegex("unfinished with rank\\(s\\) ([01], )?2"));
  }
}

TEST(HalfTest, ConversionsRoundToNearestEven) {
  EXPECT_EQ(FloatToBFloat16(1.0f), 0x3F80);
  EXPECT_EQ(BFloat16ToFloat(0x3F80), 1.0f);
  EXPECT_EQ(FloatToHalf(1.0f), 0x3C00);
  EXPECT_EQ(HalfToFloat(0x3C00), 1.0f);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7BFF);
  EXPECT_EQ(FloatToHalf(1e6f), 0x7C00);  // overflow to infinity
  EXPECT_EQ(HalfToFloat(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(NAN))));
  EXPECT_TRUE(std::isnan(BFloat16ToFloat(FloatToBFloat16(NAN))));
  // 1 + 2^-8 is halfway between two bf16 values: ties go to even.
  EXPECT_EQ(FloatToBFloat16(1.0f + std::ldexp(1.0f, -8)), 0x3F80);
  for (int i = -1000; i < 1000; ++i) {
    float x = i * 0.37f;
    EXPECT_NEAR(HalfToFloat(FloatToHalf(x)), x, std::fabs(x) / 1024 + 1e-7);
    EXPECT_NEAR(BFloat16ToFloat(FloatToBFloat16(x)), x,
                std::fabs(x) / 128 + 1e-7);
  }
}

}  // namespace
}  // namespace lockstep::worker
