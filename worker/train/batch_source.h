// Where a generation's training batches come from: the interface the step
// takes its batches through, whether they are prepared on the host by a
// background thread (Prefetcher) or gathered on the device from a data set
// that lives there (DeviceBatches).
#ifndef LOCKSTEP_WORKER_TRAIN_BATCH_SOURCE_H_
#define LOCKSTEP_WORKER_TRAIN_BATCH_SOURCE_H_

#include <torch/torch.h>

#include <cstdint>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace lockstep::worker {

// Thread-compatible: one training thread takes the batches, in step order.
class BatchSource {
 public:
  virtual ~BatchSource() = default;
  // This rank's samples of `step` (a BatchAssembler's Batch: the model's
  // inputs and the loss's targets, or a training-step module's columns),
  // the next step not yet taken. Valid until Release(step). Errors: the
  // data's, naming the sample.
  virtual absl::StatusOr<std::vector<torch::Tensor>> Take(int64_t step) = 0;
  // The step is done with its batch.
  virtual void Release(int64_t step) = 0;
};

}  // namespace lockstep::worker

#endif  // LOCKSTEP_WORKER_TRAIN_BATCH_SOURCE_H_
