// Bucketed, overlapped gradient reduction against one flat all-reduce, with
// ranks as threads over real Gloo TCP on loopback.
#include "worker/train/gradient_reducer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <string>

#include "absl/synchronization/mutex.h"
#include "tests/unit/gloo_ranks.h"
#include "worker/collective/half.h"

namespace lockstep::worker {
namespace {

// Ranks are threads sharing LibTorch's global generator: seed and build
// under a lock so every rank gets the same initial weights.
torch::nn::Sequential Model() {
  static absl::Mutex mu(absl::kConstInit);
  absl::MutexLock lock(&mu);
  torch::manual_seed(7);
  return torch::nn::Sequential(torch::nn::Linear(20, 64), torch::nn::ReLU(),
                               torch::nn::Linear(64, 64), torch::nn::ReLU(),
                               torch::nn::Linear(64, 5));
}

// Inputs that differ by rank and step, without the shared generator.
torch::Tensor Loss(torch::nn::Sequential& model, int rank, int step) {
  torch::Tensor x = torch::sin(
      torch::arange(160, torch::kFloat32).reshape({8, 20}) * (0.37f + rank) +
      step);
  torch::Tensor y =
      torch::arange(8, torch::kInt64).add(rank + step).remainder(5);
  return torch::nn::functional::cross_entropy(model->forward(x), y);
}

// Checks the hand-off's contract as a GPU would need it: each step, a
// bucket is reduced only after it was filled, and the gradients are read
// only after every bucket was reduced.
class CheckingHandoff : public BucketHandoff {
 public:
  explicit CheckingHandoff(int buckets)
      : filled_(buckets, false), reduced_(buckets, false) {}
  void Filled(int bucket) override {
    absl::MutexLock lock(&mu_);
    if (filled_[bucket]) Fail("filled twice in one step");
    filled_[bucket] = true;
  }
  absl::Status BeforeReduce(int bucket) override {
    absl::MutexLock lock(&mu_);
    if (!filled_[bucket]) Fail("reduced before it was filled");
    reduced_[bucket] = true;
    return absl::OkStatus();
  }
  absl::Status Reduced() override {
    absl::MutexLock lock(&mu_);
    for (size_t b = 0; b < reduced_.size(); ++b) {
      if (!reduced_[b]) Fail("gradients read before bucket was reduced");
    }
    std::fill(filled_.begin(), filled_.end(), false);
    std::fill(reduced_.begin(), reduced_.end(), false);
    ++steps_;
    return absl::OkStatus();
  }
  std::string errors() {
    absl::MutexLock lock(&mu_);
    return errors_;
  }
  int steps() {
    absl::MutexLock lock(&mu_);
    return steps_;
  }

 private:
  void Fail(const std::string& what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    errors_ += what + "; ";
  }
  absl::Mutex mu_;
  std::vector<bool> filled_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> reduced_ ABSL_GUARDED_BY(mu_);
  std::string errors_ ABSL_GUARDED_BY(mu_);
  int steps_ ABSL_GUARDED_BY(mu_) = 0;
};

// Buckets small enough that Model()'s gradient spans several.
GradientReducer::Options SmallBuckets(bool overlap) {
  GradientReducer::Options options;
  options.first_bucket_bytes = 300 * sizeof(float);
  options.bucket_bytes = 3000 * sizeof(float);
  options.overlap = overlap;
  return options;
}

class GradientReducerTest
    : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(GradientReducerTest, BucketsGiveTheFlatAllReduceBitForBit) {
  const auto [world, overlap] = GetParam();
  std::vector<std::vector<std::vector<int>>> orders(world);
  OnRanks(world, [&](int rank, Communicator& comm) {
    torch::nn::Sequential bucketed = Model();
    torch::nn::Sequential flat = Model();
    GradientReducer::Options small = SmallBuckets(overlap);
    // The layout decides the bucket count; the checker needs it first.
    const size_t buckets =
        GradientReducer(bucketed->parameters(), &comm, small).buckets().size();
    CheckingHandoff checker(static_cast<int>(buckets));
    small.handoff = &checker;
    GradientReducer reducer(bucketed->parameters(), &comm, small);
    orders[rank] = reducer.buckets();
    ASSERT_GT(reducer.buckets().size(), 2u);
    for (int step = 0; step < 3; ++step) {
      bucketed->zero_grad();
      torch::Tensor loss = Loss(bucketed, rank, step);
      reducer.Prepare(loss.item<float>(), rank == 1 ? 1.0f : 0.0f);
      loss.backward();
      float loss_sum = 0, votes = 0;
      ASSERT_TRUE(reducer.Finish(&loss_sum, &votes).ok());
      EXPECT_EQ(votes, world > 1 ? 1.0f : 0.0f);

      // The reference: every gradient in one flat all-reduce.
      flat->zero_grad();
      Loss(flat, rank, step).backward();
      std::vector<float> all;
      for (const torch::Tensor& p : flat->parameters()) {
        torch::Tensor g = p.grad().contiguous();
        all.insert(all.end(), g.data_ptr<float>(),
                   g.data_ptr<float>() + g.numel());
      }
      ASSERT_TRUE(comm.AllReduceSum(all.data(), all.size()).ok());
      size_t offset = 0;
      for (const torch::Tensor& p : bucketed->parameters()) {
        torch::Tensor g = p.grad().contiguous();
        for (int64_t i = 0; i < g.numel(); ++i) {
          float expected = all[offset + i] * (1.0f / world);
          ASSERT_EQ(std::memcmp(&g.data_ptr<float>()[i], &expected, 4), 0)
              << "step " << step << " element " << offset + i;
        }
        offset += g.numel();
      }
    }
    // Alone (world 1) nothing is reduced, so nothing is handed off.
    EXPECT_EQ(checker.steps(), world > 1 ? 3 : 0);
    EXPECT_EQ(checker.errors(), "");
  });
  for (int rank = 1; rank < world; ++rank) EXPECT_EQ(orders[rank], orders[0]);
  // Reverse registration order: the output layer's bias comes first.
  EXPECT_EQ(orders[0][0][0], 5);
}

INSTANTIATE_TEST_SUITE_P(WorldsAndOverlap, GradientReducerTest,
                         ::testing::Combine(::testing::Values(1, 2, 3),
                                            ::testing::Bool()));

// communication.compression "bf16": the gradients cross the wire as
// bfloat16 (the same bits as one flat bf16 all-reduce of the rounded
// gradients), while the loss and stop vote keep fp32.
class GradientReducerBf16Test
    : public ::testing::TestWithParam<std::tuple<int, bool>> {};

TEST_P(GradientReducerBf16Test, GradientsTravelAsBf16TheLossAsFp32) {
  const auto [world, overlap] = GetParam();
  OnRanks(world, [&](int rank, Communicator& comm) {
    torch::nn::Sequential bucketed = Model();
    torch::nn::Sequential flat = Model();
    GradientReducer::Options small = SmallBuckets(overlap);
    small.bf16_wire = true;
    GradientReducer reducer(bucketed->parameters(), &comm, small);
    ASSERT_GT(reducer.buckets().size(), 2u);
    for (int step = 0; step < 3; ++step) {
      bucketed->zero_grad();
      torch::Tensor loss = Loss(bucketed, rank, step);
      // A loss that bf16 cannot hold: 1 + 2^-12 rounds to 1 in bf16.
      const float reported = 1.0f + std::ldexp(1.0f, -12) * (rank + 1);
      reducer.Prepare(reported, rank == 1 ? 1.0f : 0.0f);
      loss.backward();
      float loss_sum = 0, votes = 0;
      ASSERT_TRUE(reducer.Finish(&loss_sum, &votes).ok());
      EXPECT_EQ(votes, 1.0f);
      float expected_loss = reported;
      ASSERT_TRUE(comm.AllReduceSum(&expected_loss, 1).ok());
      EXPECT_EQ(loss_sum, expected_loss);

      flat->zero_grad();
      Loss(flat, rank, step).backward();
      std::vector<uint16_t> wire;
      for (const torch::Tensor& p : flat->parameters()) {
        torch::Tensor g = p.grad().contiguous();
        for (int64_t i = 0; i < g.numel(); ++i) {
          wire.push_back(FloatToBFloat16(g.data_ptr<float>()[i]));
        }
      }
      ASSERT_TRUE(
          comm.AllReduceSum(wire.data(), wire.size(), DataType::kBFloat16)
              .ok());
      size_t offset = 0;
      bool rounded = false;  // some gradient lost bits to the wire
      for (size_t i = 0; i < flat->parameters().size(); ++i) {
        torch::Tensor g = bucketed->parameters()[i].grad().contiguous();
        torch::Tensor full = flat->parameters()[i].grad().contiguous();
        for (int64_t j = 0; j < g.numel(); ++j) {
          float expected = BFloat16ToFloat(wire[offset + j]) * (1.0f / world);
          ASSERT_EQ(std::memcmp(&g.data_ptr<float>()[j], &expected, 4), 0)
              << "step " << step << " element " << offset + j;
          float own = full.data_ptr<float>()[j];
          rounded |= BFloat16ToFloat(FloatToBFloat16(own)) != own;
        }
        offset += g.numel();
      }
      EXPECT_TRUE(rounded);
    }
  });
}

INSTANTIATE_TEST_SUITE_P(WorldsAndOverlap, GradientReducerBf16Test,
                         ::testing::Combine(::testing::Values(2, 3),
                                            ::testing::Bool()));

}  // namespace
}  // namespace lockstep::worker
