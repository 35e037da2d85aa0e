// The worker's device, compute threads, BLAS and allocator set-up
// (compute_setup.h).
#include "worker/compute_setup.h"

#include <ATen/Version.h>
#include <dlfcn.h>
#include <malloc.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/blas_kernel.h"
#include "common/failpoint.h"
#include "common/log.h"

#ifdef LOCKSTEP_HAVE_NCCL
#include <cuda_runtime.h>

#include "worker/collective/nccl_communicator.h"
#endif

namespace lockstep::worker {
namespace {

// The GPUs this process sees; 0 in a build without CUDA. Counted by the
// CUDA runtime (through the NCCL backend), not LibTorch, whose CPU build
// sees none.
int GpuCount() {
#ifdef LOCKSTEP_HAVE_NCCL
  return NcclCommunicator::DeviceCount();
#else
  return 0;
#endif
}

// GPU `index` of those the process sees, as it is reported: "cuda:N", its
// model and its UUID (as nvidia-smi -L prints it).
v1::Device GpuDevice(int index) {
  v1::Device device;
  device.set_name(absl::StrCat("cuda:", index));
#ifdef LOCKSTEP_HAVE_NCCL
  cudaDeviceProp properties;
  if (cudaGetDeviceProperties(&properties, index) == cudaSuccess) {
    device.set_gpu_name(properties.name);
    const auto* b =
        reinterpret_cast<const unsigned char*>(properties.uuid.bytes);
    device.set_gpu_uuid(absl::StrFormat(
        "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x"
        "%02x",
        b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10],
        b[11], b[12], b[13], b[14], b[15]));
  }
#endif
  return device;
}

}  // namespace

absl::StatusOr<v1::Device> ResolveDevice(const std::string& flag) {
  v1::Device cpu;
  cpu.set_name("cpu");
  if (flag == "cpu") return cpu;
  // A GPU is of use only to a LibTorch built with CUDA (Debian's is not).
  const bool torch_cuda = torch::cuda::is_available();
  if (flag == "auto") {
    if (GpuCount() > 0 && !torch_cuda) {
      LogWarning(
          "a GPU is visible but this LibTorch has no CUDA support; "
          "training on the CPU (link a CUDA LibTorch to use the GPU)");
    }
    return GpuCount() > 0 && torch_cuda ? GpuDevice(0) : cpu;
  }
  int index = -1;
  if (!absl::StartsWith(flag, "cuda:") ||
      !absl::SimpleAtoi(flag.substr(5), &index) || index < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--device must be auto, cpu or cuda:N (N a GPU index), got \"", flag,
        "\""));
  }
#ifndef LOCKSTEP_HAVE_NCCL
  return absl::InvalidArgumentError(absl::StrCat(
      "--device ", flag,
      ": this lockstep-worker was built without CUDA support (no NCCL "
      "backend); use --device cpu, or build it where CUDA and NCCL are found "
      "(LOCKSTEP_CUDA=ON)"));
#else
  const int count = GpuCount();
  if (index >= count) {
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    std::string fix = "use --device cpu, or run it where a GPU is visible";
    if (count == 1) fix = "use cuda:0";
    if (count > 1) fix = absl::StrCat("use cuda:0 to cuda:", count - 1);
    return absl::InvalidArgumentError(absl::StrCat(
        "--device ", flag, ": this process sees ", count,
        count == 1 ? " GPU" : " GPUs", " (CUDA_VISIBLE_DEVICES ",
        visible ? absl::StrCat("is \"", visible, "\"") : "is not set", "); ",
        fix));
  }
  if (!torch_cuda) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--device ", flag,
        ": this lockstep-worker's LibTorch was built without CUDA; use "
        "--device cpu, or build lockstep against a CUDA LibTorch (see "
        "bench/gpu_check.sh)"));
  }
  return GpuDevice(index);
#endif
}

BlasKernel EnsureBestBlasKernel(char** argv) {
  // Set by the first process for the one it starts again: the kernel
  // OpenBLAS had picked there.
  static constexpr char kRestartedFrom[] = "LOCKSTEP_OPENBLAS_RESTARTED_FROM";
  using GetCorename = char* (*)();
  auto corename = reinterpret_cast<GetCorename>(
      dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  std::string loaded;
  if (corename != nullptr && corename() != nullptr) loaded = corename();
  const char* env = std::getenv("OPENBLAS_CORETYPE");
  const char* from = std::getenv(kRestartedFrom);
  const std::string restarted_from = from != nullptr ? from : "";
  unsetenv(kRestartedFrom);
  if (restarted_from.empty() && !loaded.empty() &&
      (env == nullptr || *env == '\0') &&
      FailPointHit("blas_kernel_fallback")) {
    loaded = "Prescott";
  }
  const KernelDecision decision = DecideKernel(
      HostCpuFeatures(), loaded, env != nullptr ? env : "", restarted_from);
  if (decision.action == KernelDecision::kRestart) {
    LogInfo("BLAS kernel: ", decision.reason);
    setenv("OPENBLAS_CORETYPE", decision.kernel.c_str(), 1);
    setenv(kRestartedFrom, loaded.c_str(), 1);
    std::cerr.flush();
    execv("/proc/self/exe", argv);
    LogWarning("could not start lockstep-worker again (", strerror(errno),
               "); training on OpenBLAS' ", loaded,
               " kernel, slower than this CPU allows: set OPENBLAS_CORETYPE=",
               decision.kernel, " in the worker's environment");
    unsetenv("OPENBLAS_CORETYPE");
    unsetenv(kRestartedFrom);
    return {loaded, "fallback"};
  }
  if (decision.action == KernelDecision::kWarn) {
    LogWarning("BLAS kernel ", loaded, ": ", decision.reason);
  } else if (!loaded.empty()) {
    LogInfo("BLAS kernel ", loaded, ": ", decision.reason);
  }
  return {loaded, decision.source};
}

BlasInfo LoadedBlas() {
  BlasInfo info;
  using GetConfig = char* (*)();
  using GetParallel = int (*)();
  auto config =
      reinterpret_cast<GetConfig>(dlsym(RTLD_DEFAULT, "openblas_get_config"));
  auto parallel = reinterpret_cast<GetParallel>(
      dlsym(RTLD_DEFAULT, "openblas_get_parallel"));
  if (config != nullptr && parallel != nullptr) {
    info.openblas = true;
    info.parallel = parallel();
    const char* text = config();
    info.description = text != nullptr ? text : "OpenBLAS";
    return info;
  }
  info.description = "unknown";
  Dl_info where;
  if (void* sgemm = dlsym(RTLD_DEFAULT, "sgemm_");
      sgemm != nullptr && dladdr(sgemm, &where) != 0 && where.dli_fname) {
    char resolved[PATH_MAX];
    info.description =
        realpath(where.dli_fname, resolved) ? resolved : where.dli_fname;
  }
  return info;
}

std::string BlasLibraryName(const BlasInfo& blas) {
  if (!blas.openblas) return blas.description;
  std::vector<absl::string_view> words =
      absl::StrSplit(blas.description, ' ', absl::SkipEmpty());
  if (words.size() < 2) return blas.description;
  return absl::StrCat(words[0], " ", words[1]);
}

std::string AtenCpuCapability() {
  static constexpr absl::string_view kLine = "CPU capability usage: ";
  const std::string config = at::show_config();
  const size_t line = config.find(kLine.data(), 0, kLine.size());
  if (line == std::string::npos) return "unknown";
  const size_t start = line + kLine.size();
  const size_t end = config.find('\n', start);
  const absl::string_view usage = absl::StripAsciiWhitespace(
      absl::string_view(config).substr(start, end - start));
  // LibTorch names its unvectorized kernels "NO AVX" there.
  return usage == "NO AVX" ? "DEFAULT" : std::string(usage);
}

void ConfigureThreads(int threads) {
  torch::set_num_threads(threads);
  using SetThreads = void (*)(int);
  if (auto set = reinterpret_cast<SetThreads>(
          dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) {
    set(threads);
  }
  const BlasInfo blas = LoadedBlas();
  static constexpr const char* kThreading[] = {"sequential", "pthreads",
                                               "OpenMP"};
  LogInfo("compute threads: ", threads, "; BLAS: ", blas.description,
          blas.parallel >= 0 && blas.parallel <= 2
              ? absl::StrCat(" (", kThreading[blas.parallel], ")")
              : "");
  if (!blas.openblas) {
    LogWarning(
        "the loaded BLAS is not OpenBLAS; training will be slow. Run "
        "scripts/install-deps as root to select OpenBLAS");
  } else if (blas.parallel == 1 && threads > 1) {
    LogWarning(
        "the loaded OpenBLAS is its pthreads build: its own thread pool "
        "competes with LibTorch's OpenMP threads for the cores, which slows "
        "training with --threads > 1. Run scripts/install-deps as root to "
        "select OpenBLAS' OpenMP build (libopenblas0-openmp)");
  }
}

void KeepLargeBlocksInTheHeap() {
  if (std::getenv("MALLOC_MMAP_THRESHOLD_") == nullptr) {
    mallopt(M_MMAP_THRESHOLD, 32 << 20);  // glibc's maximum on 64-bit
  }
  if (std::getenv("MALLOC_TRIM_THRESHOLD_") == nullptr) {
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
  }
  if (std::getenv("MALLOC_ARENA_MAX") == nullptr) {
    mallopt(M_ARENA_MAX, 1);
  }
}

}  // namespace lockstep::worker
