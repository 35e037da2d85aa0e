// Gathering each step's samples on the device (device_batches.h).
#include "worker/train/device_batches.h"

#include <numeric>
#include <vector>

#include "common/status_macros.h"

namespace lockstep::worker {

absl::StatusOr<std::optional<DeviceSplit>> AssembleOnDevice(
    const BatchAssembler& assembler, torch::Device device) {
  if (!device.is_cuda()) return std::nullopt;
  const int64_t n = assembler.size();
  DeviceSplit split;
  split.inputs = assembler.NewInputs(1, {});
  split.targets = assembler.NewTargets(1, {});
  const int64_t bytes = (split.inputs.nbytes() + split.targets.nbytes()) * n;
  if (bytes / n != split.inputs.nbytes() + split.targets.nbytes() ||
      bytes > kMaxDeviceDatasetBytes) {
    return std::nullopt;
  }
  split.inputs = assembler.NewInputs(n, {});
  split.targets = assembler.NewTargets(n, {});
  std::vector<int64_t> all(static_cast<size_t>(n));
  std::iota(all.begin(), all.end(), 0);
  std::vector<char> scratch;
  RETURN_IF_ERROR(assembler.Fill(all, split.inputs, split.targets, scratch));
  split.inputs = split.inputs.to(device);
  split.targets = split.targets.to(device);
  return split;
}

DeviceBatches::DeviceBatches(DeviceSplit split, GlobalSampler sampler)
    : split_(std::move(split)), sampler_(std::move(sampler)) {}

absl::StatusOr<std::pair<torch::Tensor, torch::Tensor>> DeviceBatches::Take(
    int64_t step) {
  const std::vector<int64_t>& indices = sampler_.RankBatch(step);
  // The indices' copy is the only host work; the gather is queued behind
  // the previous step's kernels. Through page-locked memory: a copy from
  // pageable memory would wait for the device. LibTorch's pinned allocator
  // keeps the block until the copy is done.
  torch::Tensor index =
      torch::from_blob(const_cast<int64_t*>(indices.data()),
                       {static_cast<int64_t>(indices.size())}, torch::kInt64)
          .pin_memory()
          .to(split_.inputs.device(), /*non_blocking=*/true);
  return std::make_pair(split_.inputs.index_select(0, index),
                        split_.targets.index_select(0, index));
}

}  // namespace lockstep::worker
