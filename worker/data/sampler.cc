// The global sampler's per-epoch permutations and rank batches, and per-step
// seeds (sampler.h).
#include "worker/data/sampler.h"

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
                             const BatchPlan& plan, int rank)
    : seed_(seed),
      dataset_size_(dataset_size),
      plan_(plan),
      rank_(rank),
      steps_per_epoch_(plan.global > 0 ? dataset_size / plan.global : 0) {}

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

const std::vector<int64_t>& GlobalSampler::RankBatch(int64_t step) {
  int64_t epoch = step / steps_per_epoch_;
  int64_t within = step % steps_per_epoch_;
  if (epoch != cached_epoch_) {
    permutation_ = EpochPermutation(seed_, epoch, dataset_size_);
    cached_epoch_ = epoch;
  }
  const int64_t size = plan_.rank_batch();
  int64_t begin = within * plan_.global + int64_t{rank_} * size;
  batch_.assign(permutation_.begin() + begin,
                permutation_.begin() + begin + size);
  return batch_;
}

}  // namespace lockstep::worker
