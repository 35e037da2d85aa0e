// Batches gathered on the device from a split that lives there: a split
// small enough is assembled once (inputs normalized, targets decoded) and
// put on the GPU, and each step's samples are selected by kernels queued
// on the compute stream, so feeding a step costs the host only the
// sampler's indices.
#ifndef LOCKSTEP_WORKER_TRAIN_DEVICE_BATCHES_H_
#define LOCKSTEP_WORKER_TRAIN_DEVICE_BATCHES_H_

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <utility>

#include "absl/status/statusor.h"
#include "common/job_spec.h"
#include "worker/data/sampler.h"
#include "worker/train/batch_assembler.h"
#include "worker/train/batch_source.h"

namespace lockstep::worker {

// The whole split assembled, on `device`.
struct DeviceSplit {
  Batch batch;
};

// The split assembled on `device` when `device` is a GPU and the assembled
// tensors fit in kMaxDeviceDatasetBytes; nullopt otherwise (the
// prefetcher feeds it). Errors: the data's.
absl::StatusOr<std::optional<DeviceSplit>> AssembleOnDevice(
    const BatchAssembler& assembler, torch::Device device);
inline constexpr int64_t kMaxDeviceDatasetBytes = int64_t{2} << 30;

// Thread-compatible: one training thread.
class DeviceBatches : public BatchSource {
 public:
  DeviceBatches(DeviceSplit split, GlobalSampler sampler);

  absl::StatusOr<Batch> Take(int64_t step) override;
  void Release(int64_t) override {}

 private:
  const DeviceSplit split_;
  GlobalSampler sampler_;
};

}  // namespace lockstep::worker

#endif  // LOCKSTEP_WORKER_TRAIN_DEVICE_BATCHES_H_
