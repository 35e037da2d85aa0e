// The global sampler's per-epoch permutations and rank batches, and per-step
// seeds (sampler.h).
#include "worker/data/sampler.h"

#include <algorithm>
#include <numeric>

namespace lockstep::worker {
namespace {

// SplitMix64: a small, well-mixed generator with a fixed definition.
uint64_t SplitMix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Uniform in [0, bound) without modulo bias (rejection sampling).
uint64_t UniformBelow(uint64_t& state, uint64_t bound) {
  uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
  uint64_t value;
  do {
    value = SplitMix64(state);
  } while (value >= limit);
  return value % bound;
}

}  // namespace

uint64_t StepSeed(uint64_t seed, int rank, int64_t step) {
  uint64_t state = seed;
  uint64_t mixed = SplitMix64(state);
  state = mixed ^ static_cast<uint64_t>(rank);
  mixed = SplitMix64(state);
  state = mixed ^ static_cast<uint64_t>(step);
  return SplitMix64(state);
}

GlobalSampler::GlobalSampler(uint64_t seed, int64_t dataset_size,
                             const BatchPlan& plan, int rank,
                             int64_t shuffle_block)
    : seed_(seed),
      dataset_size_(dataset_size),
      plan_(plan),
      rank_(rank),
      steps_per_epoch_(plan.global > 0 ? dataset_size / plan.global : 0),
      shuffle_block_(shuffle_block) {}

std::vector<int64_t> GlobalSampler::EpochPermutation(uint64_t seed,
                                                     int64_t epoch, int64_t n) {
  std::vector<int64_t> permutation(static_cast<size_t>(n));
  std::iota(permutation.begin(), permutation.end(), 0);
  uint64_t state =
      seed ^ (0xA0761D6478BD642Full * static_cast<uint64_t>(epoch + 1));
  for (int64_t i = n - 1; i > 0; --i) {
    int64_t j =
        static_cast<int64_t>(UniformBelow(state, static_cast<uint64_t>(i + 1)));
    std::swap(permutation[i], permutation[j]);
  }
  return permutation;
}

void GlobalSampler::StartEpoch(int64_t epoch) {
  cached_epoch_ = epoch;
  if (shuffle_block_ <= 0) {
    permutation_ = EpochPermutation(seed_, epoch, dataset_size_);
    return;
  }
  const int64_t blocks = (dataset_size_ + shuffle_block_ - 1) / shuffle_block_;
  // The blocks' order has its own stream: the seed's bits flipped.
  block_order_ = EpochPermutation(~seed_, epoch, blocks);
  block_starts_.resize(static_cast<size_t>(blocks));
  int64_t start = 0;
  for (int64_t k = 0; k < blocks; ++k) {
    block_starts_[k] = start;
    const int64_t first = block_order_[k] * shuffle_block_;
    start += std::min(shuffle_block_, dataset_size_ - first);
  }
  cached_block_ = -1;
}

int64_t GlobalSampler::At(int64_t p) {
  if (shuffle_block_ <= 0) return permutation_[p];
  const int64_t k =
      std::upper_bound(block_starts_.begin(), block_starts_.end(), p) -
      block_starts_.begin() - 1;
  const int64_t block = block_order_[k];
  const int64_t first = block * shuffle_block_;
  if (block != cached_block_) {
    const int64_t size = std::min(shuffle_block_, dataset_size_ - first);
    // Each block's inner order: a function of (seed, epoch, block).
    const uint64_t mixed = StepSeed(seed_, 0, block);
    block_permutation_ = EpochPermutation(mixed, cached_epoch_, size);
    cached_block_ = block;
  }
  return first + block_permutation_[p - block_starts_[k]];
}

const std::vector<int64_t>& GlobalSampler::RankBatch(int64_t step) {
  int64_t epoch = step / steps_per_epoch_;
  int64_t within = step % steps_per_epoch_;
  if (epoch != cached_epoch_) StartEpoch(epoch);
  const int64_t size = plan_.rank_batch();
  int64_t begin = within * plan_.global + int64_t{rank_} * size;
  if (shuffle_block_ <= 0) {
    batch_.assign(permutation_.begin() + begin,
                  permutation_.begin() + begin + size);
    return batch_;
  }
  batch_.resize(static_cast<size_t>(size));
  for (int64_t i = 0; i < size; ++i) batch_[i] = At(begin + i);
  return batch_;
}

}  // namespace lockstep::worker
