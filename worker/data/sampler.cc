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

// The Feistel network's round function: a keyed mix of one half.
uint64_t Round(uint64_t half, uint64_t key) {
  uint64_t state = half ^ key;
  return SplitMix64(state);
}

}  // namespace

FeistelPermutation::FeistelPermutation(uint64_t key, int64_t n)
    : n_(n < 0 ? 0 : n) {
  int bits = 2;
  while (bits < 62 && (uint64_t{1} << bits) < static_cast<uint64_t>(n_)) {
    bits += 2;
  }
  half_bits_ = bits / 2;
  half_mask_ = (uint64_t{1} << half_bits_) - 1;
  uint64_t state = key;
  for (uint64_t& round_key : keys_) round_key = SplitMix64(state);
}

uint64_t FeistelPermutation::Encrypt(uint64_t x) const {
  uint64_t left = x >> half_bits_;
  uint64_t right = x & half_mask_;
  for (uint64_t key : keys_) {
    const uint64_t next = left ^ (Round(right, key) & half_mask_);
    left = right;
    right = next;
  }
  return (left << half_bits_) | right;
}

int64_t FeistelPermutation::operator()(int64_t p) const {
  // The domain is under 4n, so a walk takes fewer than 4 tries on average;
  // it ends because the network is a bijection of the domain and p < n.
  uint64_t x = static_cast<uint64_t>(p);
  do {
    x = Encrypt(x);
  } while (x >= static_cast<uint64_t>(n_));
  return static_cast<int64_t>(x);
}

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

uint64_t GlobalSampler::EpochKey(int64_t step) const {
  const int64_t epoch = steps_per_epoch_ > 0 ? step / steps_per_epoch_ : 0;
  return StepSeed(seed_ ^ 0x6A09E667F3BCC909ull, -1, epoch);
}

FeistelPermutation GlobalSampler::EpochOrder(uint64_t seed, int64_t epoch,
                                             int64_t n) {
  // A key of its own per epoch, from a stream distinct from StepSeed's.
  uint64_t state =
      seed ^ (0xD6E8FEB86659FD93ull * static_cast<uint64_t>(epoch + 1));
  return FeistelPermutation(SplitMix64(state), n);
}

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
    order_ = EpochOrder(seed_, epoch, dataset_size_);
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
  if (shuffle_block_ <= 0) return order_(p);
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
  batch_.resize(static_cast<size_t>(size));
  for (int64_t i = 0; i < size; ++i) batch_[i] = At(begin + i);
  return batch_;
}

}  // namespace lockstep::worker
