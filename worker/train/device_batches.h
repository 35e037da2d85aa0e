// Batches gathered on the device from a data set that lives there: a data
// set small enough is put on the GPU once, and each step's samples are
// selected and normalized by kernels queued on the compute stream, so
// feeding a step costs the host only the sampler's indices.
#ifndef LOCKSTEP_WORKER_TRAIN_DEVICE_BATCHES_H_
#define LOCKSTEP_WORKER_TRAIN_DEVICE_BATCHES_H_

#include <torch/torch.h>

#include <cstdint>
#include <utility>

#include "common/job_spec.h"
#include "worker/data/sampler.h"
#include "worker/train/batch_source.h"
#include "worker/train/tensor_dataset.h"

namespace lockstep::worker {

// Whether `data` should live on `device` for training: a GPU, and the
// images fit in kMaxDeviceDatasetBytes.
bool KeepOnDevice(const TensorDataset& data, torch::Device device);
inline constexpr int64_t kMaxDeviceDatasetBytes = int64_t{2} << 30;

// Thread-compatible: one training thread.
class DeviceBatches : public BatchSource {
 public:
  // `data`'s tensors must be on the device already.
  DeviceBatches(TensorDataset data, uint64_t seed, const BatchPlan& plan,
                int rank);

  std::pair<torch::Tensor, torch::Tensor> Take(int64_t step) override;
  void Release(int64_t) override {}

 private:
  const TensorDataset data_;
  GlobalSampler sampler_;
};

}  // namespace lockstep::worker

#endif  // LOCKSTEP_WORKER_TRAIN_DEVICE_BATCHES_H_
