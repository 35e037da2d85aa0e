// The global sampler: per-epoch permutations, rank slices that tile the
// global batch at every world size, and pure per-step seeds.
#include "worker/data/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

namespace lockstep::worker {
namespace {

TEST(SamplerTest, EpochPermutationIsAPermutationAndDependsOnSeedAndEpoch) {
  std::vector<int64_t> p = GlobalSampler::EpochPermutation(7, 0, 1000);
  std::vector<int64_t> sorted = p;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 1000; ++i) ASSERT_EQ(sorted[i], i);
  EXPECT_EQ(p, GlobalSampler::EpochPermutation(7, 0, 1000));
  EXPECT_NE(p, GlobalSampler::EpochPermutation(7, 1, 1000));
  EXPECT_NE(p, GlobalSampler::EpochPermutation(8, 0, 1000));
}

// The global shuffle's permutation is a bijection of [0, n) for every n,
// sizes that are and are not powers of four included.
TEST(SamplerTest, FeistelPermutationIsABijectionForEverySize) {
  for (int64_t n : {1, 2, 3, 4, 5, 17, 64, 100, 1000, 4097, 65536, 100003}) {
    FeistelPermutation order(42, n);
    std::vector<char> seen(static_cast<size_t>(n), 0);
    for (int64_t p = 0; p < n; ++p) {
      const int64_t v = order(p);
      ASSERT_GE(v, 0) << "n " << n;
      ASSERT_LT(v, n) << "n " << n;
      ASSERT_FALSE(seen[v]) << "n " << n << " value " << v << " twice";
      seen[v] = 1;
    }
  }
}

TEST(SamplerTest, EpochOrderDependsOnSeedAndEpochOnly) {
  auto first = [](uint64_t seed, int64_t epoch) {
    FeistelPermutation order = GlobalSampler::EpochOrder(seed, epoch, 1000);
    std::vector<int64_t> values;
    for (int64_t p = 0; p < 50; ++p) values.push_back(order(p));
    return values;
  };
  EXPECT_EQ(first(7, 0), first(7, 0));
  EXPECT_NE(first(7, 0), first(7, 1));
  EXPECT_NE(first(7, 0), first(8, 0));
}

// Shuffled well enough: over 20,000 epochs the sample at position 0 of a
// 10-sample set is each sample about a tenth of the time, and the samples
// at positions 0 and 1 are about as often in one order as in the other.
TEST(SamplerTest, EpochOrderIsCloseToUniform) {
  constexpr int kEpochs = 20000;
  std::vector<int> first(10, 0);
  int ascending = 0;
  for (int64_t epoch = 0; epoch < kEpochs; ++epoch) {
    FeistelPermutation order = GlobalSampler::EpochOrder(3, epoch, 10);
    ++first[order(0)];
    if (order(0) < order(1)) ++ascending;
  }
  // Binomial(20000, 0.1): sd 42; 6 sd either side.
  for (int count : first) {
    EXPECT_GT(count, 2000 - 252);
    EXPECT_LT(count, 2000 + 252);
  }
  EXPECT_GT(ascending, 10000 - 425);  // sd 71
  EXPECT_LT(ascending, 10000 + 425);
}

// A data set of 10^11 samples costs the sampler nothing per sample: a
// batch deep into an epoch is computed directly.
TEST(SamplerTest, AHugeDataSetNeedsNoTable) {
  const BatchPlan plan{4, 16, 64};
  GlobalSampler sampler(9, int64_t{100'000'000'000}, plan, 3);
  const std::vector<int64_t>& batch = sampler.RankBatch(1'000'000'000);
  ASSERT_EQ(batch.size(), 16u);
  std::set<int64_t> distinct(batch.begin(), batch.end());
  EXPECT_EQ(distinct.size(), 16u);
  for (int64_t i : batch) {
    EXPECT_GE(i, 0);
    EXPECT_LT(i, int64_t{100'000'000'000});
  }
}

class SamplerWorldTest : public ::testing::TestWithParam<int> {};

// The union of every rank's slice equals the single-worker batch, in order,
// at every step of several epochs.
TEST_P(SamplerWorldTest, RankSlicesTileTheGlobalBatch) {
  const int world = GetParam();
  const int global = 12;  // divides by 1, 2, 3 and 4
  const int64_t dataset = 100;
  BatchPlan single{1, global, global};
  BatchPlan split{world, global / world, global};
  GlobalSampler reference(3, dataset, single, 0);
  std::vector<GlobalSampler> ranks;
  for (int r = 0; r < world; ++r) ranks.emplace_back(3, dataset, split, r);
  EXPECT_EQ(reference.steps_per_epoch(), dataset / global);
  for (int64_t step = 0; step < 3 * reference.steps_per_epoch(); ++step) {
    std::vector<int64_t> expected = reference.RankBatch(step);
    std::vector<int64_t> joined;
    for (GlobalSampler& rank : ranks) {
      const std::vector<int64_t>& slice = rank.RankBatch(step);
      ASSERT_EQ(slice.size(), static_cast<size_t>(global / world));
      joined.insert(joined.end(), slice.begin(), slice.end());
    }
    ASSERT_EQ(joined, expected) << "step " << step << " world " << world;
  }
}

INSTANTIATE_TEST_SUITE_P(Worlds, SamplerWorldTest,
                         ::testing::Values(1, 2, 3, 4));

TEST(SamplerTest, AnEpochVisitsEachSampleAtMostOnce) {
  BatchPlan plan{2, 5, 10};
  GlobalSampler sampler(1, 95, plan, 1);
  GlobalSampler other(1, 95, plan, 0);
  std::set<int64_t> seen;
  for (int64_t step = 0; step < sampler.steps_per_epoch(); ++step) {
    for (int64_t i : sampler.RankBatch(step))
      ASSERT_TRUE(seen.insert(i).second);
    for (int64_t i : other.RankBatch(step)) ASSERT_TRUE(seen.insert(i).second);
  }
  EXPECT_EQ(seen.size(), 90u);  // the 5 left over are dropped this epoch
}

TEST(SamplerTest, StepSeedsArePureAndDistinct) {
  std::set<uint64_t> seeds;
  for (int rank = 0; rank < 4; ++rank) {
    for (int64_t step = 0; step < 100; ++step) {
      EXPECT_EQ(StepSeed(7, rank, step), StepSeed(7, rank, step));
      seeds.insert(StepSeed(7, rank, step));
    }
  }
  EXPECT_EQ(seeds.size(), 400u);
  EXPECT_NE(StepSeed(7, 0, 0), StepSeed(8, 0, 0));
}

// data.shuffle "blocks": every world size sees the same samples at the same
// step, an epoch is still a permutation, and a step's samples come from few
// blocks of neighbours.
TEST(SamplerTest, BlockShuffleIsAPermutationOfBlocksWhateverTheWorldSize) {
  constexpr int64_t kSize = 1003, kBlock = 100;
  const BatchPlan one{1, 20, 20};
  const BatchPlan four{4, 5, 20};
  GlobalSampler whole(5, kSize, one, 0, kBlock);
  std::vector<GlobalSampler> ranks;
  for (int r = 0; r < 4; ++r) ranks.emplace_back(5, kSize, four, r, kBlock);
  std::set<int64_t> seen;
  std::set<int64_t> blocks_of_step;
  for (int64_t step = 0; step < whole.steps_per_epoch(); ++step) {
    std::vector<int64_t> joined;
    for (GlobalSampler& rank : ranks) {
      const std::vector<int64_t>& part = rank.RankBatch(step);
      joined.insert(joined.end(), part.begin(), part.end());
    }
    ASSERT_EQ(joined, whole.RankBatch(step)) << "step " << step;
    std::set<int64_t> blocks;
    for (int64_t i : joined) {
      ASSERT_TRUE(seen.insert(i).second) << i;
      blocks.insert(i / kBlock);
    }
    // Two blocks, or three around the last, short one.
    EXPECT_LE(blocks.size(), 3u) << "step " << step;
  }
  EXPECT_EQ(seen.size(), 1000u);  // 50 steps of 20; 3 left over
  // The next epoch orders them differently.
  const std::vector<int64_t> next = whole.RankBatch(whole.steps_per_epoch());
  EXPECT_NE(next, whole.RankBatch(0));
}

}  // namespace
}  // namespace lockstep::worker
