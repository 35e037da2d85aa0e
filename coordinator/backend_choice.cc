// The coordinator's choice of collective backend (backend_choice.h).
#include "coordinator/backend_choice.h"

#include <map>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/job_spec.h"

namespace lockstep::coordinator {
namespace {

bool HasGpu(const v1::Device& device) {
  return absl::StartsWith(device.name(), "cuda");
}

// "rank 1 (worker:1 on 10.0.0.7)": `rank` is the worker's rank in the
// generation being formed.
std::string RankName(int rank, const Worker& worker) {
  return absl::StrCat("rank ", rank, " (", worker.id, " on ", worker.host, ")");
}

}  // namespace

absl::StatusOr<Backend> ResolveBackend(const v1::CommunicationSpec& spec,
                                       const std::vector<Worker*>& workers) {
  const std::string& requested = spec.backend();
  if (requested == "gloo") return Backend{"gloo", ""};
  if (requested == "auto" && CompressesGradients(spec)) {
    return Backend{
        "gloo", absl::StrCat("communication.compression \"", spec.compression(),
                             "\" is a wire format of Gloo's")};
  }
  std::string without_gpu, shared;
  std::map<std::string, int> rank_of_gpu;  // by UUID
  for (int rank = 0; rank < static_cast<int>(workers.size()); ++rank) {
    const Worker& worker = *workers[rank];
    if (!HasGpu(worker.device)) {
      if (without_gpu.empty()) without_gpu = RankName(rank, worker);
      continue;
    }
    const std::string& uuid = worker.device.gpu_uuid();
    if (uuid.empty()) continue;
    auto [it, added] = rank_of_gpu.emplace(uuid, rank);
    if (!added && shared.empty()) {
      shared = absl::StrCat(RankName(it->second, *workers[it->second]), " and ",
                            RankName(rank, worker), " share GPU ", uuid);
    }
  }
  if (requested == "nccl") {
    if (!without_gpu.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "communication.backend is \"nccl\" but ", without_gpu,
          " has no GPU; use \"auto\" or \"gloo\", or run that worker on a "
          "GPU (lockstep-worker --device auto or cuda:N)"));
    }
    if (!shared.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "communication.backend is \"nccl\" but ", shared,
          ", and NCCL needs a GPU per rank; use \"auto\" or \"gloo\", or "
          "give each worker a GPU of its own (CUDA_VISIBLE_DEVICES)"));
    }
    return Backend{"nccl", ""};
  }
  if (!without_gpu.empty()) return Backend{"gloo", without_gpu + " has no GPU"};
  if (!shared.empty()) return Backend{"gloo", shared};
  return Backend{"nccl", ""};
}

absl::Status CheckKernels(const v1::JobSpec& spec,
                          const std::vector<Worker*>& workers) {
  int unvectorized = -1, vectorized = -1;
  for (int rank = 0; rank < static_cast<int>(workers.size()); ++rank) {
    const v1::Device& device = workers[rank]->device;
    if (HasGpu(device) || device.aten_cpu_capability().empty()) continue;
    // "NO AVX": LibTorch's name, which workers before issue 51 reported.
    const std::string& capability = device.aten_cpu_capability();
    int& first = absl::EqualsIgnoreCase(capability, "DEFAULT") ||
                         absl::EqualsIgnoreCase(capability, "NO AVX")
                     ? unvectorized
                     : vectorized;
    if (first < 0) first = rank;
  }
  if (unvectorized >= 0 && vectorized >= 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        RankName(unvectorized, *workers[unvectorized]),
        " computes with ATen's unvectorized kernels (capability DEFAULT) and ",
        RankName(vectorized, *workers[vectorized]), " with its ",
        workers[vectorized]->device.aten_cpu_capability(),
        " ones: they round the optimizer's arithmetic differently, so the "
        "replicas would drift apart; start every worker with the same ATen "
        "capability (ATEN_CPU_CAPABILITY=avx2 on all, or unset on all)"));
  }
  if (!spec.reproducible()) return absl::OkStatus();
  for (int rank = 0; rank < static_cast<int>(workers.size()); ++rank) {
    const v1::Device& device = workers[rank]->device;
    if (HasGpu(device)) continue;
    if (device.blas_kernel() == "Haswell" &&
        absl::EqualsIgnoreCase(device.aten_cpu_capability(), "AVX2") &&
        absl::EqualsIgnoreCase(device.onednn_cpu_isa(), "AVX2")) {
      continue;
    }
    return absl::FailedPreconditionError(absl::StrCat(
        "the job asks for reproducible results, but ",
        RankName(rank, *workers[rank]), " computes with OpenBLAS kernel '",
        device.blas_kernel(), "', ATen capability '",
        device.aten_cpu_capability(), "' and oneDNN ISA '",
        device.onednn_cpu_isa().empty() ? "unknown" : device.onednn_cpu_isa(),
        "'; start its worker with OPENBLAS_CORETYPE=Haswell "
        "ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 (the portable "
        "kernels), or submit without reproducible"));
  }
  return absl::OkStatus();
}

}  // namespace lockstep::coordinator
