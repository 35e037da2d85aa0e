// The CPU's features and the OpenBLAS kernel they call for (blas_kernel.h).
#include "common/blas_kernel.h"

#include <cstdint>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace lockstep {
namespace {

#if defined(__x86_64__) || defined(__i386__)
// XCR0: which register states the operating system saves on a context
// switch. xgetbv is only valid when cpuid says OSXSAVE.
uint64_t ReadXcr0() {
  uint32_t eax = 0, edx = 0;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return (uint64_t{edx} << 32) | eax;
}
#endif

bool SupportsAvx512(const CpuFeatures& cpu) {
  return cpu.avx512f && cpu.avx512bw && cpu.avx512dq && cpu.avx512vl &&
         cpu.os_saves_zmm;
}

bool SupportsAvx2(const CpuFeatures& cpu) {
  return cpu.avx2 && cpu.fma && cpu.os_saves_ymm;
}

bool SameName(absl::string_view a, absl::string_view b) {
  return absl::AsciiStrToLower(a) == absl::AsciiStrToLower(b);
}

}  // namespace

CpuFeatures HostCpuFeatures() {
  CpuFeatures cpu;
#if defined(__x86_64__) || defined(__i386__)
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid(0, &eax, &ebx, &ecx, &edx) == 0) return cpu;
  const unsigned max_leaf = eax;
  __cpuid(1, eax, ebx, ecx, edx);
  const bool osxsave = (ecx >> 27) & 1;
  cpu.avx = (ecx >> 28) & 1;
  cpu.fma = (ecx >> 12) & 1;
  if (osxsave) {
    const uint64_t xcr0 = ReadXcr0();
    cpu.os_saves_ymm = (xcr0 & 0x6) == 0x6;
    cpu.os_saves_zmm = cpu.os_saves_ymm && (xcr0 & 0xe0) == 0xe0;
  }
  if (max_leaf >= 7) {
    __cpuid_count(7, 0, eax, ebx, ecx, edx);
    const unsigned subleaves = eax;
    cpu.avx2 = (ebx >> 5) & 1;
    cpu.avx512f = (ebx >> 16) & 1;
    cpu.avx512dq = (ebx >> 17) & 1;
    cpu.avx512bw = (ebx >> 30) & 1;
    cpu.avx512vl = (ebx >> 31) & 1;
    if (subleaves >= 1) {
      __cpuid_count(7, 1, eax, ebx, ecx, edx);
      cpu.avx512_bf16 = (eax >> 5) & 1;
    }
  }
#endif
  return cpu;
}

std::string CpuLevelText(const CpuFeatures& cpu) {
  if (SupportsAvx512(cpu)) {
    return cpu.avx512_bf16 ? "AVX-512 F/BW/DQ/VL + BF16" : "AVX-512 F/BW/DQ/VL";
  }
  if (SupportsAvx2(cpu)) return "AVX2 + FMA";
  if (cpu.avx && cpu.os_saves_ymm) return "AVX";
  return "SSE";
}

KernelLevel LevelOfKernel(absl::string_view name) {
  static constexpr struct {
    const char* name;
    KernelLevel level;
  } kKernels[] = {
      {"Katmai", KernelLevel::kSse},
      {"Coppermine", KernelLevel::kSse},
      {"Northwood", KernelLevel::kSse},
      {"Prescott", KernelLevel::kSse},
      {"Banias", KernelLevel::kSse},
      {"Atom", KernelLevel::kSse},
      {"Core2", KernelLevel::kSse},
      {"Penryn", KernelLevel::kSse},
      {"Dunnington", KernelLevel::kSse},
      {"Nehalem", KernelLevel::kSse},
      {"Opteron", KernelLevel::kSse},
      {"Opteron_SSE3", KernelLevel::kSse},
      {"Barcelona", KernelLevel::kSse},
      {"Bobcat", KernelLevel::kSse},
      {"Sandybridge", KernelLevel::kAvx},
      {"Bulldozer", KernelLevel::kAvx},
      {"Piledriver", KernelLevel::kAvx},
      {"Steamroller", KernelLevel::kAvx},
      {"Haswell", KernelLevel::kAvx2},
      {"Zen", KernelLevel::kAvx2},
      {"Excavator", KernelLevel::kAvx2},
      {"SkylakeX", KernelLevel::kAvx512},
      {"Cooperlake", KernelLevel::kAvx512},
      {"SapphireRapids", KernelLevel::kAvx512},
  };
  for (const auto& kernel : kKernels) {
    if (SameName(name, kernel.name)) return kernel.level;
  }
  return KernelLevel::kUnknown;
}

std::string BestKernelFor(const CpuFeatures& cpu) {
  if (SupportsAvx512(cpu)) return cpu.avx512_bf16 ? "Cooperlake" : "SkylakeX";
  if (SupportsAvx2(cpu)) return "Haswell";
  return "";
}

KernelDecision DecideKernel(const CpuFeatures& cpu, absl::string_view loaded,
                            absl::string_view env_coretype,
                            absl::string_view restarted_from) {
  KernelDecision decision;
  if (loaded.empty()) {
    decision.reason = "the BLAS is not OpenBLAS; no kernel to choose";
    return decision;
  }
  const std::string best = BestKernelFor(cpu);
  const std::string cpu_text = CpuLevelText(cpu);
  const bool below_best = !best.empty() &&
                          LevelOfKernel(loaded) != KernelLevel::kUnknown &&
                          LevelOfKernel(loaded) < LevelOfKernel(best);
  if (!restarted_from.empty()) {
    if (SameName(loaded, env_coretype)) {
      decision.source = "lockstep";
      decision.reason =
          absl::StrCat("OpenBLAS picked ", restarted_from,
                       ", an older kernel than this CPU (", cpu_text,
                       ") runs; lockstep set OPENBLAS_CORETYPE=", env_coretype);
      return decision;
    }
    decision.action = KernelDecision::kWarn;
    decision.source = "fallback";
    decision.reason =
        absl::StrCat("OpenBLAS picked ", restarted_from,
                     " and ignored OPENBLAS_CORETYPE=", env_coretype,
                     " (this OpenBLAS lacks that kernel); it runs ", loaded,
                     ", slower than this CPU (", cpu_text,
                     ") allows: install an OpenBLAS that knows the CPU, or set "
                     "OPENBLAS_CORETYPE to a kernel it has");
    return decision;
  }
  if (!env_coretype.empty()) {
    decision.source = "environment";
    if (!SameName(loaded, env_coretype) && below_best) {
      decision.action = KernelDecision::kWarn;
      decision.reason = absl::StrCat(
          "OPENBLAS_CORETYPE=", env_coretype, " is not a kernel of this ",
          "OpenBLAS; it runs ", loaded, ", slower than this CPU (", cpu_text,
          ") allows: set OPENBLAS_CORETYPE=", best,
          " or unset it to let lockstep choose");
      return decision;
    }
    decision.reason = absl::StrCat("OPENBLAS_CORETYPE=", env_coretype,
                                   " set in the environment");
    if (below_best) {
      absl::StrAppend(&decision.reason, "; this CPU (", cpu_text,
                      ") could run ", best);
    }
    return decision;
  }
  if (below_best) {
    decision.action = KernelDecision::kRestart;
    decision.kernel = best;
    decision.source = "lockstep";
    decision.reason = absl::StrCat(
        "OpenBLAS picked ", loaded, ", an older kernel than this CPU (",
        cpu_text, ") runs; starting again with OPENBLAS_CORETYPE=", best);
    return decision;
  }
  decision.source = "openblas";
  decision.reason =
      absl::StrCat("OpenBLAS' own choice for this CPU (", cpu_text, ")");
  return decision;
}

}  // namespace lockstep
