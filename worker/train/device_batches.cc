// Gathering each step's samples on the device (device_batches.h).
#include "worker/train/device_batches.h"

#include <algorithm>
#include <numeric>
#include <vector>

#include "common/status_macros.h"

namespace lockstep::worker {

absl::StatusOr<std::optional<DeviceSplit>> AssembleOnDevice(
    const BatchAssembler& assembler, torch::Device device) {
  // A split whose samples move between epochs is read each epoch.
  if (!device.is_cuda() || assembler.source().VariesByEpoch()) {
    return std::nullopt;
  }
  const int64_t n = assembler.size();
  int64_t per_sample = 0;
  for (const torch::Tensor& t : assembler.NewBatch(1, {})) {
    per_sample += static_cast<int64_t>(t.nbytes());
  }
  if (per_sample > kMaxDeviceDatasetBytes / std::max<int64_t>(n, 1)) {
    return std::nullopt;
  }
  DeviceSplit split;
  split.batch = assembler.NewBatch(n, {});
  std::vector<int64_t> all(static_cast<size_t>(n));
  std::iota(all.begin(), all.end(), 0);
  std::vector<char> scratch;
  RETURN_IF_ERROR(assembler.Fill(all, split.batch, scratch));
  for (torch::Tensor& t : split.batch) t = t.to(device);
  return split;
}

DeviceBatches::DeviceBatches(DeviceSplit split, GlobalSampler sampler)
    : split_(std::move(split)), sampler_(std::move(sampler)) {}

absl::StatusOr<Batch> DeviceBatches::Take(int64_t step) {
  const std::vector<int64_t>& indices = sampler_.RankBatch(step);
  // The indices' copy is the only host work; the gather is queued behind
  // the previous step's kernels. Through page-locked memory: a copy from
  // pageable memory would wait for the device. LibTorch's pinned allocator
  // keeps the block until the copy is done.
  torch::Tensor index =
      torch::from_blob(const_cast<int64_t*>(indices.data()),
                       {static_cast<int64_t>(indices.size())}, torch::kInt64)
          .pin_memory()
          .to(split_.batch[0].device(), /*non_blocking=*/true);
  Batch batch;
  for (const torch::Tensor& t : split_.batch) {
    batch.push_back(t.index_select(0, index));
  }
  return batch;
}

}  // namespace lockstep::worker
