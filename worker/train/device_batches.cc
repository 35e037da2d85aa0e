// Gathering each step's samples on the device (device_batches.h).
#include "worker/train/device_batches.h"

#include <vector>

namespace lockstep::worker {

bool KeepOnDevice(const TensorDataset& data, torch::Device device) {
  return device.is_cuda() && data.images.numel() <= kMaxDeviceDatasetBytes;
}

DeviceBatches::DeviceBatches(TensorDataset data, uint64_t seed,
                             const BatchPlan& plan, int rank)
    : data_(std::move(data)), sampler_(seed, data_.size(), plan, rank) {}

std::pair<torch::Tensor, torch::Tensor> DeviceBatches::Take(int64_t step) {
  const std::vector<int64_t>& indices = sampler_.RankBatch(step);
  // The indices' copy is the only host work; the gather and the
  // normalization are queued behind the previous step's kernels.
  // Through page-locked memory: a copy from pageable memory would wait for
  // the device. LibTorch's pinned allocator keeps the block until the copy
  // is done.
  torch::Tensor index =
      torch::from_blob(const_cast<int64_t*>(indices.data()),
                       {static_cast<int64_t>(indices.size())}, torch::kInt64)
          .pin_memory()
          .to(data_.images.device(), /*non_blocking=*/true);
  return {Normalize(data_.images.index_select(0, index), data_.mean, data_.std),
          data_.labels.index_select(0, index)};
}

}  // namespace lockstep::worker
