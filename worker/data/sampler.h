// The global sampler of docs/DESIGN.md §4: sample order depends only on (seed,
// epoch). Each epoch is a seeded permutation of the data set (a
// FeistelPermutation: computed position by position, so it needs no table
// and the sampler's memory does not grow with the data set); global step k
// of an epoch consumes positions [k*G, (k+1)*G) and rank r of W takes the
// r-th slice of B = G/W of them (with gradient accumulation, B is split into
// consecutive micro-batches by the trainer). The same job on 1, 2 or 4 workers
// therefore sees the same samples at the same step. The tail that does not fill
// a global batch is dropped each epoch (it is a different tail every epoch).
//
// With data.shuffle "blocks" an epoch permutes blocks of `shuffle_block`
// consecutive samples, and the samples inside each block: a step reads one
// or two blocks' worth of neighbouring samples (for data on slow or network
// storage), and the sampler holds one entry per block rather than per
// sample. The order still depends only on (seed, epoch).
//
// Thread-compatible.
#ifndef LOCKSTEP_WORKER_DATA_SAMPLER_H_
#define LOCKSTEP_WORKER_DATA_SAMPLER_H_

#include <cstdint>
#include <vector>

#include "common/job_spec.h"

namespace lockstep::worker {

// The seed of rank `rank`'s random generators (LibTorch's CPU and CUDA
// ones: dropout) for optimizer step `step`: a pure function, so a
// replacement worker needs no generator state and a resumed run draws the
// same masks as an uninterrupted one.
uint64_t StepSeed(uint64_t seed, int rank, int64_t step);

// A pseudo-random permutation of [0, n) that depends only on (key, n),
// evaluated at one position at a time in O(1) memory: a balanced Feistel
// network over the smallest even number of bits that covers n (a domain
// of at most 4n), applied again to any value outside [0, n) ("cycle
// walking") until it lands inside; that keeps it a bijection of [0, n).
// The same on every platform.
class FeistelPermutation {
 public:
  FeistelPermutation(uint64_t key, int64_t n);

  int64_t size() const { return n_; }
  // The value at position `p` (0 <= p < n).
  int64_t operator()(int64_t p) const;

 private:
  static constexpr int kRounds = 6;
  uint64_t Encrypt(uint64_t x) const;

  int64_t n_;
  int half_bits_ = 1;
  uint64_t half_mask_ = 1;
  uint64_t keys_[kRounds] = {};
};

class GlobalSampler {
 public:
  // `shuffle_block` 0: a full permutation of the samples each epoch.
  GlobalSampler(uint64_t seed, int64_t dataset_size, const BatchPlan& plan,
                int rank, int64_t shuffle_block = 0);

  int64_t steps_per_epoch() const { return steps_per_epoch_; }

  // The dataset indices rank `rank` trains on at global step `step` (counted
  // from the start of training, across epochs).
  const std::vector<int64_t>& RankBatch(int64_t step);

  // The key of the epoch that holds `step`: a function of (seed, epoch)
  // for sources whose samples move between epochs (SplitSource::
  // ReadInEpoch).
  uint64_t EpochKey(int64_t step) const;

  // The permutation of [0, n) a global shuffle uses in epoch `epoch`.
  static FeistelPermutation EpochOrder(uint64_t seed, int64_t epoch, int64_t n);

  // A permutation of [0, n) as a table, Fisher-Yates from (seed, epoch); the
  // same on every platform (no std:: distribution involved). The blocks'
  // shuffle uses it for blocks and inside one block.
  static std::vector<int64_t> EpochPermutation(uint64_t seed, int64_t epoch,
                                               int64_t n);

 private:
  // The sample at position `p` of epoch `cached_epoch_`.
  int64_t At(int64_t p);
  void StartEpoch(int64_t epoch);

  const uint64_t seed_;
  const int64_t dataset_size_;
  const BatchPlan plan_;
  const int rank_;
  const int64_t steps_per_epoch_;
  const int64_t shuffle_block_;
  int64_t cached_epoch_ = -1;
  FeistelPermutation order_{0, 0};  // global: of the samples
  // blocks: the blocks' order, where each starts in the epoch, and the
  // permutation inside the block last read.
  std::vector<int64_t> block_order_;
  std::vector<int64_t> block_starts_;
  int64_t cached_block_ = -1;
  std::vector<int64_t> block_permutation_;
  std::vector<int64_t> batch_;
};

}  // namespace lockstep::worker

#endif  // LOCKSTEP_WORKER_DATA_SAMPLER_H_
