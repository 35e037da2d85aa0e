// Which OpenBLAS kernel set a worker should run on its CPU.
//
// Debian's OpenBLAS is built with DYNAMIC_ARCH: it reads the CPU at load and
// picks a kernel set ("core") for it, unless OPENBLAS_CORETYPE names one.
// A CPU newer than the library (OpenBLAS 0.3.21 and an Intel Xeon of family
// 6 model 207) is not in its tables, and it falls back to "Prescott", its
// SSE3 kernels: 6x slower matrix products than the AVX-512 ones the CPU
// runs (docs/BENCHMARKS.md, "The BLAS kernel"). The worker reads the CPU's
// own feature flags and, when OpenBLAS picked a kernel of an older
// instruction set than the CPU has, starts itself again with the best
// kernel the CPU supports (worker/compute_setup.h). Never one it lacks:
// that would be SIGILL.
//
// No LibTorch, no OpenBLAS here: the features come from cpuid, the choice
// is a pure function of them, unit-tested with any CPU's flags.
#ifndef LOCKSTEP_COMMON_BLAS_KERNEL_H_
#define LOCKSTEP_COMMON_BLAS_KERNEL_H_

#include <string>

#include "absl/strings/string_view.h"

namespace lockstep {

// What the CPU offers the BLAS, with the operating system's consent (XCR0:
// a CPU whose ymm or zmm state the kernel does not save cannot use them).
struct CpuFeatures {
  bool avx = false;
  bool avx2 = false;
  bool fma = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512dq = false;
  bool avx512vl = false;
  bool avx512_bf16 = false;
  bool os_saves_ymm = false;  // XCR0 bits 1-2
  bool os_saves_zmm = false;  // XCR0 bits 5-7
};

// This machine's, from cpuid and xgetbv; all false on a CPU that is not
// x86-64.
CpuFeatures HostCpuFeatures();

// "AVX-512 F/BW/DQ/VL + BF16", "AVX2 + FMA", "AVX", "SSE": the widest level
// the features reach, for log lines.
std::string CpuLevelText(const CpuFeatures& cpu);

// Instruction-set levels of OpenBLAS' x86-64 kernel sets, in order.
enum class KernelLevel {
  kUnknown = -1,  // not an x86-64 core name this code knows
  kSse = 0,       // Prescott, Core2, Nehalem, Opteron, Barcelona, ...
  kAvx = 1,       // Sandybridge, Bulldozer, Piledriver, Steamroller
  kAvx2 = 2,      // Haswell, Zen, Excavator
  kAvx512 = 3,    // SkylakeX, Cooperlake, SapphireRapids
};

// The level of OpenBLAS core `name` as openblas_get_corename() spells it
// (case-insensitive).
KernelLevel LevelOfKernel(absl::string_view name);

// The best kernel `cpu` supports: "Cooperlake" for AVX-512 F/BW/DQ/VL with
// BF16 (what OpenBLAS itself picks for such a CPU it knows; its sgemm is
// SkylakeX's, plus bf16 kernels), "SkylakeX" for AVX-512 F/BW/DQ/VL,
// "Haswell" for AVX2 + FMA, "" when the CPU has less (OpenBLAS' own choice
// then stands: the older kernels differ little).
std::string BestKernelFor(const CpuFeatures& cpu);

// What the worker does about its BLAS kernel at start.
struct KernelDecision {
  enum Action {
    kKeep,     // run what OpenBLAS loaded
    kRestart,  // start again with OPENBLAS_CORETYPE=kernel
    kWarn,     // keep it, but it is slower than the CPU allows: say so
  };
  Action action = kKeep;
  std::string kernel;  // the kernel to set (kRestart)
  // "openblas", "environment", "lockstep" or "fallback" (v1::Device).
  std::string source;
  std::string reason;  // one sentence for the log
};

// Decides from the CPU, the kernel OpenBLAS loaded (`loaded`, its core
// name; empty when the BLAS is not OpenBLAS), OPENBLAS_CORETYPE as the
// process found it (`env_coretype`, empty when unset) and, in the process
// the worker started again, the kernel OpenBLAS had picked before
// (`restarted_from`; empty on a first start). An explicit OPENBLAS_CORETYPE
// always wins. Restarts only when the loaded kernel's level is below that
// of the best kernel the CPU supports, and never twice.
KernelDecision DecideKernel(const CpuFeatures& cpu, absl::string_view loaded,
                            absl::string_view env_coretype,
                            absl::string_view restarted_from);

}  // namespace lockstep

#endif  // LOCKSTEP_COMMON_BLAS_KERNEL_H_
