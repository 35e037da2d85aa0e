// Turns samples of a split into the tensors a step takes: the model's
// input (floats normalized as the task says, or int64 token ids) and the
// loss's target (int64 labels, float values, or the next tokens), checking
// every label and token id against the task's range.
//
// Thread-safe: Fill only reads the split, and writes what it is given.
#ifndef LOCKSTEP_WORKER_TRAIN_BATCH_ASSEMBLER_H_
#define LOCKSTEP_WORKER_TRAIN_BATCH_ASSEMBLER_H_

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "worker/data/split_source.h"
#include "worker/train/task.h"

namespace lockstep::worker {

// A step's tensors: {inputs, targets}, or for a training-step module
// (TaskType::kCustom) one tensor per column, named by BatchAssembler::names.
using Batch = std::vector<torch::Tensor>;

class BatchAssembler {
 public:
  BatchAssembler(std::shared_ptr<const SplitSource> source, const Task& task);

  // Empty tensors for `n` samples: [n, model input...] float or int64, and
  // [n] int64, [n, outputs] float or [n, block] int64.
  torch::Tensor NewInputs(int64_t n, const torch::TensorOptions& options) const;
  torch::Tensor NewTargets(int64_t n,
                           const torch::TensorOptions& options) const;

  // Fills the first indices.size() rows of `inputs` and `targets` (CPU,
  // contiguous, from NewInputs/NewTargets). `scratch` is reused between
  // calls; `epoch_key` is the samples' epoch's (SplitSource::ReadInEpoch).
  // Errors: the source's, or a label or token id out of range, naming the
  // sample.
  absl::Status Fill(absl::Span<const int64_t> indices, torch::Tensor& inputs,
                    torch::Tensor& targets, std::vector<char>& scratch,
                    uint64_t epoch_key = 0) const;

  // The same for any task: a Batch of `n` samples, and filling it.
  // kCustom: each column as float32 (float dtypes) or int64 (integers),
  // [n, per-sample shape...], not normalized.
  Batch NewBatch(int64_t n, const torch::TensorOptions& options) const;
  absl::Status Fill(absl::Span<const int64_t> indices, Batch& batch,
                    std::vector<char>& scratch, uint64_t epoch_key = 0) const;
  // kCustom: the columns' names, in the Batch's order.
  std::vector<std::string> names() const;

  const SplitSource& source() const { return *source_; }
  int64_t size() const { return source_->size(); }

 private:
  absl::Status OutOfRange(const char* what, int64_t value, int64_t index) const;

  const std::shared_ptr<const SplitSource> source_;
  const Task task_;
};

}  // namespace lockstep::worker

#endif  // LOCKSTEP_WORKER_TRAIN_BATCH_ASSEMBLER_H_
