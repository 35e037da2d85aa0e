// communication.algorithm "auto": three ranks over real TCP on 127.0.0.1
// time both all-reduce algorithms with an injected clock, agree on the same
// numbers, and then run the one they chose.
#include "worker/collective/algorithm_probe.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <thread>
#include <vector>

#include "worker/collective/half.h"
#include "worker/collective/in_memory_kv.h"
#include "worker/collective/mesh_communicator.h"

namespace lockstep::worker {
namespace {

using ::testing::HasSubstr;

constexpr int kWorld = 3;

// A clock under which each all-reduce the probe times takes `direct` or
// `ring` seconds: the probe reads it twice per try, direct then ring.
std::function<absl::Time()> ProbeClock(double direct, double ring) {
  auto calls = std::make_shared<int>(0);
  auto at = std::make_shared<absl::Time>(absl::UnixEpoch());
  return [=] {
    const int call = (*calls)++;
    if (call % 2 == 1) {
      *at += absl::Seconds((call / 2) % 2 == 0 ? direct : ring);
    }
    return *at;
  };
}

// The bf16 sum of 1 and two halves of bf16's last place: 1 + 2^-7 when the
// sum is rounded once (direct), 1 for elements the ring adds to 1 first
// (each hop rounds). Every rank's element i is its value, so which rank's
// part the ring starts from differs by element.
std::vector<float> HalfUlpSum(Communicator& comm) {
  const float mine = comm.rank() == 0 ? 1.0f : std::ldexp(1.0f, -8);
  std::vector<uint16_t> data(kWorld * 4, FloatToBFloat16(mine));
  EXPECT_TRUE(
      comm.AllReduceSum(data.data(), data.size(), DataType::kBFloat16).ok());
  std::vector<float> sums;
  for (uint16_t bits : data) sums.push_back(BFloat16ToFloat(bits));
  return sums;
}

void OnThreeRanks(const std::function<void(Communicator&)>& body) {
  InMemoryKeyValue kv;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < kWorld; ++rank) {
    threads.emplace_back([&, rank] {
      MeshCommunicator::Options options;
      options.rank = rank;
      options.size = kWorld;
      options.timeout = absl::Seconds(30);
      options.membership = FixedKeysForTesting("job-1", 1, rank, kWorld);
      auto comm = MeshCommunicator::Connect(&kv, options);
      ASSERT_TRUE(comm.ok()) << comm.status();
      body(**comm);
    });
  }
  for (std::thread& t : threads) t.join();
}

TEST(AlgorithmProbeTest, TheRingOnlyWhenClearlyFaster) {
  EXPECT_EQ(FasterAlgorithm(1.0, 0.9), AllReduceAlgorithm::kRing);
  EXPECT_EQ(FasterAlgorithm(1.0, 0.99), AllReduceAlgorithm::kDirect);
  EXPECT_EQ(FasterAlgorithm(1.0, 1.5), AllReduceAlgorithm::kDirect);
}

TEST(AlgorithmProbeTest, EveryRankAgreesAndRunsTheFasterOne) {
  for (const auto& [direct, ring, chosen] :
       {std::tuple{0.3, 0.1, AllReduceAlgorithm::kRing},
        std::tuple{0.1, 0.3, AllReduceAlgorithm::kDirect}}) {
    OnThreeRanks([&, direct = direct, ring = ring,
                  chosen = chosen](Communicator& comm) {
      absl::StatusOr<AlgorithmProbe> probe =
          ChooseAllReduceAlgorithm(comm, 1 << 16, 2, ProbeClock(direct, ring));
      ASSERT_TRUE(probe.ok()) << probe.status();
      EXPECT_EQ(probe->algorithm, chosen);
      EXPECT_EQ(probe->bytes, size_t{1} << 16);
      // Each rank's fastest try, summed over the 3 ranks.
      EXPECT_NEAR(probe->direct_seconds, 3 * direct, 1e-6);
      EXPECT_NEAR(probe->ring_seconds, 3 * ring, 1e-6);
      // What runs now sums as the chosen algorithm does, and the two
      // algorithms' sums differ.
      const std::vector<float> now = HalfUlpSum(comm);
      comm.SetAllReduceAlgorithm(AllReduceAlgorithm::kRing);
      const std::vector<float> by_ring = HalfUlpSum(comm);
      comm.SetAllReduceAlgorithm(AllReduceAlgorithm::kDirect);
      const std::vector<float> direct_sums = HalfUlpSum(comm);
      EXPECT_NE(by_ring, direct_sums);
      EXPECT_EQ(now,
                chosen == AllReduceAlgorithm::kRing ? by_ring : direct_sums);
    });
  }
}

TEST(AlgorithmProbeTest, ACommunicatorWithoutAChoiceIsAnError) {
  SingleRankCommunicator one;
  absl::StatusOr<AlgorithmProbe> probe = ChooseAllReduceAlgorithm(one, 1024);
  EXPECT_EQ(probe.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(probe.status().message(), HasSubstr("no choice"));
}

}  // namespace
}  // namespace lockstep::worker
