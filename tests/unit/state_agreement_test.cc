// What the ranks agree on when a generation starts: ranks as threads over
// real Gloo TCP on loopback, replicas built as the trainer builds them.
#include "worker/train/state_agreement.h"

#include <gtest/gtest.h>

#include <atomic>
#include <functional>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "common/job_spec.h"
#include "tests/unit/gloo_ranks.h"
#include "worker/collective/gloo_communicator.h"
#include "worker/collective/in_memory_kv.h"

namespace lockstep::worker {
namespace {

v1::JobSpec MlpSpec() {
  v1::JobSpec spec;
  spec.mutable_model()->set_name("mlp");
  spec.set_seed(3);
  ApplyDefaults(&spec);
  return spec;
}

// Ranks are threads sharing LibTorch's global generator: build under a lock
// so every rank gets the seeded initial weights.
Replica BuildReplica() {
  static absl::Mutex mu(absl::kConstInit);
  absl::MutexLock lock(&mu);
  Replica replica;
  absl::Status built = InitializeReplica(MlpSpec(), ModelOptionsOf(MlpSpec()),
                                         torch::kCPU, &replica);
  EXPECT_TRUE(built.ok()) << built;
  return replica;
}

void Shift(Replica& replica, float by) {
  torch::NoGradGuard no_grad;
  for (torch::Tensor& p : replica.model->parameters()) p.add_(by);
}

RestoreNewest NoRestore() {
  return [](int64_t) -> absl::StatusOr<int64_t> {
    ADD_FAILURE() << "no checkpoint should be restored";
    return 0;
  };
}

TEST(StateAgreementTest, EveryRankAdoptsTheMostAdvancedState) {
  constexpr int kWorld = 3;
  std::vector<Replica> replicas(kWorld);
  for (Replica& r : replicas) r = BuildReplica();
  // Rank 2 is the most advanced; rank 1 trained a little.
  replicas[1].step = 4;
  Shift(replicas[1], 0.25f);
  replicas[2].step = 9;
  replicas[2].global_batch = 96;
  replicas[2].scaler.Restore(1, 0, /*skipped=*/2);
  Shift(replicas[2], 0.5f);
  const std::string expected = ModelDigest(*replicas[2].model).value();
  std::vector<absl::StatusOr<AgreedState>> agreed(kWorld);
  OnRanks(kWorld, [&](int rank, Communicator& comm) {
    agreed[rank] = AgreeOnState(comm, replicas[rank], 0, NoRestore());
  });
  for (int rank = 0; rank < kWorld; ++rank) {
    ASSERT_TRUE(agreed[rank].ok()) << agreed[rank].status();
    EXPECT_EQ(agreed[rank]->source_rank, 2);
    EXPECT_EQ(agreed[rank]->restored_from, "");
    EXPECT_EQ(replicas[rank].step, 9);
    EXPECT_EQ(replicas[rank].global_batch, 96);
    EXPECT_EQ(replicas[rank].scaler.skipped_steps(), 2);
    EXPECT_EQ(ModelDigest(*replicas[rank].model).value(), expected) << rank;
  }
}

TEST(StateAgreementTest, ANewerCheckpointIsRestoredByRankZeroAndBroadcast) {
  constexpr int kWorld = 2;
  std::vector<Replica> replicas(kWorld);
  for (Replica& r : replicas) r = BuildReplica();
  replicas[1].step = 10;
  std::atomic<int> restores{0};
  std::string expected;
  OnRanks(kWorld, [&](int rank, Communicator& comm) {
    RestoreNewest restore = [&](int64_t newer_than) -> absl::StatusOr<int64_t> {
      ++restores;
      EXPECT_EQ(rank, 0);
      EXPECT_EQ(newer_than, 10);
      Shift(replicas[0], -1.0f);  // what the checkpoint held
      replicas[0].global_batch = 64;
      expected = ModelDigest(*replicas[0].model).value();
      return 50;
    };
    auto agreed =
        AgreeOnState(comm, replicas[rank], rank == 0 ? 50 : 0, restore);
    ASSERT_TRUE(agreed.ok()) << agreed.status();
    EXPECT_EQ(agreed->source_rank, -1);
    EXPECT_EQ(agreed->restored_from, "ckpt-000000050");
  });
  EXPECT_EQ(restores, 1);
  for (const Replica& replica : replicas) {
    EXPECT_EQ(replica.step, 50);
    EXPECT_EQ(replica.global_batch, 64);
    EXPECT_EQ(ModelDigest(*replica.model).value(), expected);
  }
}

TEST(StateAgreementTest, ACheckpointThatDoesNotRestoreFallsBackToLiveState) {
  constexpr int kWorld = 2;
  std::vector<Replica> replicas(kWorld);
  for (Replica& r : replicas) r = BuildReplica();
  replicas[1].step = 7;
  Shift(replicas[1], 0.125f);
  const std::string expected = ModelDigest(*replicas[1].model).value();
  OnRanks(kWorld, [&](int rank, Communicator& comm) {
    auto agreed =
        AgreeOnState(comm, replicas[rank], rank == 0 ? 30 : 0,
                     [](int64_t) -> absl::StatusOr<int64_t> { return 0; });
    ASSERT_TRUE(agreed.ok()) << agreed.status();
    EXPECT_EQ(agreed->source_rank, 1);
  });
  for (const Replica& replica : replicas) {
    EXPECT_EQ(replica.step, 7);
    EXPECT_EQ(ModelDigest(*replica.model).value(), expected);
  }
}

TEST(StateAgreementTest, DifferentInitialParametersNameTheRank) {
  constexpr int kWorld = 2;
  std::vector<Replica> replicas(kWorld);
  for (Replica& r : replicas) r = BuildReplica();
  Shift(replicas[1], 1e-3f);
  std::vector<absl::StatusOr<AgreedState>> agreed(kWorld);
  OnRanks(kWorld, [&](int rank, Communicator& comm) {
    agreed[rank] = AgreeOnState(comm, replicas[rank], 0, NoRestore());
  });
  EXPECT_TRUE(agreed[0].ok()) << agreed[0].status();
  ASSERT_FALSE(agreed[1].ok());
  EXPECT_EQ(agreed[1].status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(agreed[1].status().message().find("rank 1 initial parameters"),
            std::string::npos)
      << agreed[1].status();
}

TEST(StateAgreementTest, RunningStatisticsAreAveragedOverTheRanks) {
  constexpr int kWorld = 2;
  std::vector<torch::nn::BatchNorm1d> norms;
  for (int rank = 0; rank < kWorld; ++rank) {
    norms.emplace_back(4);
    torch::NoGradGuard no_grad;
    norms[rank]->running_mean.fill_(rank == 0 ? 1.0f : 3.0f);
    norms[rank]->running_var.fill_(rank == 0 ? 2.0f : 6.0f);
  }
  OnRanks(kWorld, [&](int rank, Communicator& comm) {
    RunningStatistics statistics(*norms[rank]);
    ASSERT_EQ(statistics.tensors().size(), 2u);
    absl::Status averaged = AverageRunningStatistics(comm, statistics);
    EXPECT_TRUE(averaged.ok()) << averaged;
  });
  for (const auto& norm : norms) {
    EXPECT_TRUE(torch::equal(norm->running_mean, torch::full({4}, 2.0f)));
    EXPECT_TRUE(torch::equal(norm->running_var, torch::full({4}, 4.0f)));
  }
}

TEST(RunningStatisticsTest, PutBackRestoresWhatWasRemembered) {
  torch::nn::BatchNorm1d norm(3);
  RunningStatistics statistics(*norm);
  statistics.Remember();
  norm->train();
  norm->forward(torch::randn({8, 3}) + 5);
  EXPECT_FALSE(torch::equal(norm->running_mean, torch::zeros({3})));
  statistics.PutBack();
  EXPECT_TRUE(torch::equal(norm->running_mean, torch::zeros({3})));
  EXPECT_TRUE(torch::equal(norm->running_var, torch::ones({3})));
}

}  // namespace
}  // namespace lockstep::worker
