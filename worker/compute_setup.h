// How this worker process computes, set once at start: the device it trains
// on (--device), its compute threads and the BLAS they use (--threads), and
// how glibc's allocator keeps training's large buffers.
#ifndef LOCKSTEP_WORKER_COMPUTE_SETUP_H_
#define LOCKSTEP_WORKER_COMPUTE_SETUP_H_

#include <string>

#include "absl/status/statusor.h"
#include "lockstep/v1/coordinator.pb.h"

namespace lockstep::worker {

// The device of --device `flag`: "auto" (GPU 0 of those the process sees,
// else the CPU), "cpu" or "cuda:N". Errors: InvalidArgument for another
// value, a GPU the process does not see, or a GPU in a build without CUDA.
absl::StatusOr<v1::Device> ResolveDevice(const std::string& flag);

// What the loaded BLAS is, read from the library itself (not its path: the
// container image copies Debian's alternatives as plain files).
struct BlasInfo {
  bool openblas = false;
  // OpenBLAS' threading: 0 sequential, 1 its own pthreads, 2 OpenMP.
  int parallel = -1;
  std::string description;  // OpenBLAS' configuration, or the file
};
BlasInfo LoadedBlas();

// "OpenBLAS 0.3.21": the library and version of LoadedBlas() without its
// build options, for labels.
std::string BlasLibraryName(const BlasInfo& blas);

// The vector instruction set ATen's own CPU kernels dispatch to ("DEFAULT",
// "AVX2", "AVX512"; ATEN_CPU_CAPABILITY lowers or raises it), as LibTorch's
// build summary states it; "unknown" if it does not.
std::string AtenCpuCapability();

// The OpenBLAS kernel set this process runs, and who chose it
// (v1::Device's blas_kernel and blas_kernel_source).
struct BlasKernel {
  std::string kernel;  // OpenBLAS' core name; empty for another BLAS
  std::string source;  // "openblas", "lockstep", "environment", "fallback"
};

// Call first thing in main: OpenBLAS has chosen its kernels when the
// program loaded it, and reads OPENBLAS_CORETYPE only then. When it chose
// an older instruction set than the CPU supports and OPENBLAS_CORETYPE is
// unset (common/blas_kernel.h), runs this program again in this process
// (execv of /proc/self/exe: same pid, arguments and descriptors) with
// OPENBLAS_CORETYPE set to the best kernel the CPU has, and returns only in
// a process that keeps its kernel. Logs the kernel and why, and warns with
// what to set when it stays on a slower one than the CPU allows. Test hook:
// the failure point blas_kernel_fallback (common/failpoint.h) makes the
// first process take OpenBLAS' choice for Prescott.
BlasKernel EnsureBestBlasKernel(char** argv);

// Limits LibTorch and OpenBLAS to `threads` and logs which BLAS is loaded,
// warning when it will be slow: the reference BLAS (~10x slower than
// OpenBLAS), or OpenBLAS' pthreads build with more than one thread, whose
// own thread pool competes with LibTorch's OpenMP threads for the cores.
void ConfigureThreads(int threads);

// Training allocates and frees the same large activation and gradient
// buffers every step. By default glibc serves blocks over 128 KiB with fresh
// mmap pages and gives them back on free, so every step pays first-touch
// page faults for all its activations: on this project's VMs the CNN's
// forward and backward ran 4x slower for it (docs/BENCHMARKS.md). Keep such
// blocks in the heap, as jemalloc or tcmalloc would; the worker's memory
// stays at its peak, which every step reaches anyway.
//
// And in one heap: the training step runs on a thread of its own, and
// glibc gives such a thread an arena of 64 MiB heaps that it unmaps whenever
// one falls empty, whatever the thresholds say. A step's activations
// outgrow one heap, so every step mapped and faulted in fresh pages again
// (about 100,000 page faults a second for the 1-worker CNN, half its speed,
// depending on which arena the thread happened to get). One arena, the
// main heap, keeps them.
//
// Variables the user set (MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_,
// MALLOC_ARENA_MAX) win. Called first thing in main, before any thread.
void KeepLargeBlocksInTheHeap();

}  // namespace lockstep::worker

#endif  // LOCKSTEP_WORKER_COMPUTE_SETUP_H_
