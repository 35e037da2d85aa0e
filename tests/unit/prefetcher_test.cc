// The prefetcher hands out exactly the sampler's batches, normalized, in
// step order, stops cleanly however far it got, and reports a bad sample
// instead of training on it.
#include "worker/train/prefetcher.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "worker/data/sources.h"

namespace lockstep::worker {
namespace {

// 40 images of 2x3 pixels whose bytes say which image they are, labelled
// i % 10 (or `bad_label` for image 7 when set).
std::shared_ptr<const SplitSource> SmallSplit(int bad_label = -1) {
  ImageDataset data;
  data.count = 40;
  data.rows = 2;
  data.cols = 3;
  for (int64_t i = 0; i < data.count; ++i) {
    data.pixels.insert(data.pixels.end(), 6, static_cast<uint8_t>(i * 6));
    data.labels.push_back(static_cast<uint8_t>(i % 10));
  }
  if (bad_label >= 0) data.labels[7] = static_cast<uint8_t>(bad_label);
  return ImagesInMemory(std::move(data), "memory");
}

Task ImageTask(const SplitSource& split) {
  v1::JobSpec spec;
  spec.mutable_data()->set_format("idx");
  spec.mutable_task()->set_type("classification");
  spec.mutable_task()->set_num_classes(10);
  auto task = ResolveTask(spec, split);
  EXPECT_TRUE(task.ok()) << task.status();
  return *task;
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
  auto split = SmallSplit();
  const Task task = ImageTask(*split);
  const BatchAssembler assembler(split, task);
  const BatchPlan plan = Plan();
  constexpr int kRank = 1;
  GlobalSampler sampler(9, split->size(), plan, kRank);
  Prefetcher prefetcher(assembler, GlobalSampler(9, split->size(), plan, kRank),
                        plan, /*first_step=*/2, /*end_step=*/9);
  const float scale = task.normalization.scale;
  const float shift = task.normalization.shift;
  for (int64_t step = 2; step < 9; ++step) {
    auto batch = prefetcher.Take(step);
    ASSERT_TRUE(batch.ok()) << batch.status();
    const torch::Tensor& images = (*batch)[0];
    const torch::Tensor& labels = (*batch)[1];
    const std::vector<int64_t>& indices = sampler.RankBatch(step);
    ASSERT_EQ(images.sizes().vec(),
              (std::vector<int64_t>{plan.rank_batch(), 1, 2, 3}));
    ASSERT_EQ(indices.size(), static_cast<size_t>(plan.rank_batch()));
    for (size_t i = 0; i < indices.size(); ++i) {
      const float expected =
          static_cast<uint8_t>(indices[i] * 6) * scale - shift;
      EXPECT_TRUE(torch::equal(images[i], torch::full({1, 2, 3}, expected)))
          << "step " << step << " sample " << i;
      EXPECT_EQ(labels[i].item<int64_t>(), indices[i] % 10);
    }
    prefetcher.Release(step);
  }
}

TEST(PrefetcherTest, StopsWhileItsRingIsFull) {
  auto split = SmallSplit();
  const BatchAssembler assembler(split, ImageTask(*split));
  Prefetcher prefetcher(assembler, GlobalSampler(1, split->size(), Plan(), 0),
                        Plan(), 0, 100);
  auto batch = prefetcher.Take(0);  // the thread fills the ring and waits
  ASSERT_TRUE(batch.ok()) << batch.status();
  EXPECT_EQ((*batch)[0].size(0), Plan().rank_batch());
}  // the destructor must not wait for a Release

TEST(PrefetcherTest, ALabelOutOfRangeFailsTheStepNamingTheSample) {
  auto split = SmallSplit();
  Task task = ImageTask(*split);
  task.outputs = 7;  // labels 7, 8 and 9 are out of range
  const BatchAssembler assembler(split, task);
  Prefetcher prefetcher(assembler, GlobalSampler(1, split->size(), Plan(), 0),
                        Plan(), 0, 3);
  bool failed = false;
  for (int64_t step = 0; step < 3 && !failed; ++step) {
    auto batch = prefetcher.Take(step);
    if (!batch.ok()) {
      EXPECT_TRUE(absl::IsInvalidArgument(batch.status()));
      EXPECT_NE(batch.status().message().find("outside [0, 7)"),
                std::string::npos)
          << batch.status();
      failed = true;
    }
    prefetcher.Release(step);
  }
  EXPECT_TRUE(failed);
}

}  // namespace
}  // namespace lockstep::worker
