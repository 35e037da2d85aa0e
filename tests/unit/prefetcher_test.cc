// The prefetcher hands out exactly the sampler's batches, normalized, in
// step order, and stops cleanly however far it got.
#include "worker/train/prefetcher.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

namespace lockstep::worker {
namespace {

// 40 images of 2x3 pixels whose bytes say which image they are.
TensorDataset SmallDataset() {
  TensorDataset data;
  data.rows = 2;
  data.cols = 3;
  data.mean = 0.5f;
  data.std = 0.25f;
  constexpr int64_t kCount = 40;
  data.images = torch::empty({kCount, 1, 2, 3}, torch::kUInt8);
  data.labels = torch::empty({kCount}, torch::kInt64);
  for (int64_t i = 0; i < kCount; ++i) {
    data.images[i].fill_(static_cast<uint8_t>(i * 6));
    data.labels[i] = i % 10;
  }
  return data;
}

BatchPlan Plan() {
  BatchPlan plan;
  plan.replicas = 2;
  plan.per_replica = 3;
  plan.accumulation = 2;
  plan.global = 12;
  return plan;
}

TEST(PrefetcherTest, EveryStepIsTheSamplersSliceNormalized) {
  const TensorDataset data = SmallDataset();
  const BatchPlan plan = Plan();
  constexpr int kRank = 1;
  GlobalSampler sampler(9, data.size(), plan, kRank);
  Prefetcher prefetcher(data, 9, plan, kRank, /*first_step=*/2,
                        /*end_step=*/9);
  for (int64_t step = 2; step < 9; ++step) {
    auto [images, labels] = prefetcher.Take(step);
    const std::vector<int64_t>& indices = sampler.RankBatch(step);
    ASSERT_EQ(images.size(0), plan.rank_batch());
    ASSERT_EQ(indices.size(), static_cast<size_t>(plan.rank_batch()));
    for (size_t i = 0; i < indices.size(); ++i) {
      const torch::Tensor expected =
          Normalize(data.images[indices[i]].unsqueeze(0), data.mean, data.std);
      EXPECT_TRUE(torch::allclose(images[i].unsqueeze(0), expected))
          << "step " << step << " sample " << i;
      EXPECT_EQ(labels[i].item<int64_t>(), indices[i] % 10);
    }
    prefetcher.Release(step);
  }
}

TEST(PrefetcherTest, StopsWhileItsRingIsFull) {
  const TensorDataset data = SmallDataset();
  Prefetcher prefetcher(data, 1, Plan(), 0, 0, 100);
  auto batch = prefetcher.Take(0);  // the thread fills the ring and waits
  EXPECT_EQ(batch.first.size(0), Plan().rank_batch());
}  // the destructor must not wait for a Release

}  // namespace
}  // namespace lockstep::worker
