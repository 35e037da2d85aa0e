// The OpenBLAS kernel choice (common/blas_kernel.h): CPU feature flags and
// OpenBLAS' own pick in, the worker's action out.
#include "common/blas_kernel.h"

#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <sstream>
#include <string>

namespace lockstep {
namespace {

// An x86-64 CPU with SSE only, as OpenBLAS' oldest kernels assume.
CpuFeatures SseCpu() { return CpuFeatures{}; }

// Sandy Bridge: AVX, no AVX2 or FMA.
CpuFeatures AvxCpu() {
  CpuFeatures cpu;
  cpu.avx = true;
  cpu.os_saves_ymm = true;
  return cpu;
}

// Haswell or Zen 2: AVX2 + FMA, no AVX-512.
CpuFeatures Avx2Cpu() {
  CpuFeatures cpu = AvxCpu();
  cpu.avx2 = true;
  cpu.fma = true;
  return cpu;
}

// Skylake-SP: AVX-512 F/BW/DQ/VL.
CpuFeatures Avx512Cpu() {
  CpuFeatures cpu = Avx2Cpu();
  cpu.avx512f = cpu.avx512bw = cpu.avx512dq = cpu.avx512vl = true;
  cpu.os_saves_zmm = true;
  return cpu;
}

// Sapphire/Emerald Rapids or Zen 4: AVX-512 with BF16.
CpuFeatures Avx512Bf16Cpu() {
  CpuFeatures cpu = Avx512Cpu();
  cpu.avx512_bf16 = true;
  return cpu;
}

TEST(BlasKernelTest, BestKernelFollowsTheWidestLevelTheCpuHas) {
  EXPECT_EQ(BestKernelFor(SseCpu()), "");
  EXPECT_EQ(BestKernelFor(AvxCpu()), "");
  EXPECT_EQ(BestKernelFor(Avx2Cpu()), "Haswell");
  EXPECT_EQ(BestKernelFor(Avx512Cpu()), "SkylakeX");
  EXPECT_EQ(BestKernelFor(Avx512Bf16Cpu()), "Cooperlake");
}

TEST(BlasKernelTest, NeverAKernelTheCpuOrTheSystemLacks) {
  // AVX2 without FMA (VIA, some virtual CPUs): Haswell's kernels use FMA.
  CpuFeatures no_fma = Avx2Cpu();
  no_fma.fma = false;
  EXPECT_EQ(BestKernelFor(no_fma), "");
  // AVX-512 without BW: no SkylakeX (Knights Landing has F without BW).
  CpuFeatures no_bw = Avx512Cpu();
  no_bw.avx512bw = false;
  EXPECT_EQ(BestKernelFor(no_bw), "Haswell");
  // An operating system that does not save zmm (or ymm) state.
  CpuFeatures no_zmm = Avx512Bf16Cpu();
  no_zmm.os_saves_zmm = false;
  EXPECT_EQ(BestKernelFor(no_zmm), "Haswell");
  CpuFeatures no_ymm = Avx512Cpu();
  no_ymm.os_saves_ymm = no_ymm.os_saves_zmm = false;
  EXPECT_EQ(BestKernelFor(no_ymm), "");
}

TEST(BlasKernelTest, LevelsOfOpenBlasCoreNames) {
  EXPECT_EQ(LevelOfKernel("Prescott"), KernelLevel::kSse);
  EXPECT_EQ(LevelOfKernel("Nehalem"), KernelLevel::kSse);
  EXPECT_EQ(LevelOfKernel("Sandybridge"), KernelLevel::kAvx);
  EXPECT_EQ(LevelOfKernel("Haswell"), KernelLevel::kAvx2);
  EXPECT_EQ(LevelOfKernel("Zen"), KernelLevel::kAvx2);
  EXPECT_EQ(LevelOfKernel("SKYLAKEX"), KernelLevel::kAvx512);
  EXPECT_EQ(LevelOfKernel("cooperlake"), KernelLevel::kAvx512);
  EXPECT_EQ(LevelOfKernel("NeoverseN1"), KernelLevel::kUnknown);
  EXPECT_EQ(LevelOfKernel(""), KernelLevel::kUnknown);
}

TEST(BlasKernelTest, PrescottOnAnAvx512CpuRestartsWithItsBestKernel) {
  // The Intel Xeon of issue 38: OpenBLAS 0.3.21 does not know it.
  KernelDecision d = DecideKernel(Avx512Bf16Cpu(), "Prescott", "", "");
  EXPECT_EQ(d.action, KernelDecision::kRestart);
  EXPECT_EQ(d.kernel, "Cooperlake");
  EXPECT_EQ(d.source, "lockstep");
  EXPECT_NE(d.reason.find("Prescott"), std::string::npos) << d.reason;

  d = DecideKernel(Avx512Cpu(), "Prescott", "", "");
  EXPECT_EQ(d.action, KernelDecision::kRestart);
  EXPECT_EQ(d.kernel, "SkylakeX");
}

TEST(BlasKernelTest, OlderKernelOnAnAvx2CpuRestartsWithHaswell) {
  for (const char* loaded : {"Prescott", "Nehalem", "Sandybridge"}) {
    const KernelDecision d = DecideKernel(Avx2Cpu(), loaded, "", "");
    EXPECT_EQ(d.action, KernelDecision::kRestart) << loaded;
    EXPECT_EQ(d.kernel, "Haswell") << loaded;
  }
}

TEST(BlasKernelTest, OpenBlasOwnChoiceStandsWhenItIsAtTheCpusLevel) {
  for (const auto& [cpu, loaded] :
       {std::pair{Avx2Cpu(), "Haswell"}, std::pair{Avx2Cpu(), "Zen"},
        std::pair{Avx512Cpu(), "SkylakeX"},
        // An AVX-512 CPU OpenBLAS knows picks Cooperlake or SkylakeX itself
        // (this project's AMD EPYC: Cooperlake).
        std::pair{Avx512Bf16Cpu(), "Cooperlake"},
        std::pair{Avx512Bf16Cpu(), "SkylakeX"}}) {
    const KernelDecision d = DecideKernel(cpu, loaded, "", "");
    EXPECT_EQ(d.action, KernelDecision::kKeep) << loaded;
    EXPECT_EQ(d.source, "openblas") << loaded;
  }
}

TEST(BlasKernelTest, CpuWithoutAvx2KeepsWhatOpenBlasLoaded) {
  // Nothing better to offer: OpenBLAS' older kernels differ little.
  for (const CpuFeatures& cpu : {SseCpu(), AvxCpu()}) {
    for (const char* loaded : {"Prescott", "Sandybridge"}) {
      const KernelDecision d = DecideKernel(cpu, loaded, "", "");
      EXPECT_EQ(d.action, KernelDecision::kKeep) << loaded;
      EXPECT_EQ(d.source, "openblas") << loaded;
    }
  }
}

TEST(BlasKernelTest, AnExplicitCoretypeAlwaysWins) {
  // check-digests pins Haswell on AVX-512 machines.
  KernelDecision d = DecideKernel(Avx512Bf16Cpu(), "Haswell", "Haswell", "");
  EXPECT_EQ(d.action, KernelDecision::kKeep);
  EXPECT_EQ(d.source, "environment");
  EXPECT_NE(d.reason.find("could run Cooperlake"), std::string::npos)
      << d.reason;
  // Even an old kernel the user asked for.
  d = DecideKernel(Avx512Cpu(), "Prescott", "prescott", "");
  EXPECT_EQ(d.action, KernelDecision::kKeep);
  EXPECT_EQ(d.source, "environment");
}

TEST(BlasKernelTest, AnUnknownCoretypeThatLeftAFallbackWarns) {
  // OpenBLAS ignores a name it does not have and detects by itself.
  const KernelDecision d =
      DecideKernel(Avx512Cpu(), "Prescott", "SapphireRapids", "");
  EXPECT_EQ(d.action, KernelDecision::kWarn);
  EXPECT_EQ(d.source, "environment");
  EXPECT_NE(d.reason.find("OPENBLAS_CORETYPE=SkylakeX"), std::string::npos)
      << d.reason;
}

TEST(BlasKernelTest, TheRestartedProcessKeepsWhatItAskedFor) {
  const KernelDecision d =
      DecideKernel(Avx512Bf16Cpu(), "Cooperlake", "Cooperlake", "Prescott");
  EXPECT_EQ(d.action, KernelDecision::kKeep);
  EXPECT_EQ(d.source, "lockstep");
  EXPECT_NE(d.reason.find("OpenBLAS picked Prescott"), std::string::npos)
      << d.reason;
}

TEST(BlasKernelTest, NeverRestartsTwice) {
  // The library lacked the kernel set: still Prescott after the restart.
  const KernelDecision d =
      DecideKernel(Avx512Bf16Cpu(), "Prescott", "Cooperlake", "Prescott");
  EXPECT_EQ(d.action, KernelDecision::kWarn);
  EXPECT_EQ(d.source, "fallback");
  EXPECT_NE(d.reason.find("set OPENBLAS_CORETYPE"), std::string::npos)
      << d.reason;
}

TEST(BlasKernelTest, AnotherBlasOrAnUnknownCoreIsLeftAlone) {
  KernelDecision d = DecideKernel(Avx512Cpu(), "", "", "");
  EXPECT_EQ(d.action, KernelDecision::kKeep);
  EXPECT_EQ(d.source, "");
  d = DecideKernel(Avx512Cpu(), "NeoverseN1", "", "");
  EXPECT_EQ(d.action, KernelDecision::kKeep);
  EXPECT_EQ(d.source, "openblas");
}

// The flags cpuid gives agree with the kernel's own reading of the CPU.
TEST(BlasKernelTest, HostFeaturesMatchProcCpuinfo) {
  std::ifstream cpuinfo("/proc/cpuinfo");
  std::string line;
  std::set<std::string> flags;
  while (std::getline(cpuinfo, line)) {
    if (line.rfind("flags", 0) != 0) continue;
    std::istringstream words(line.substr(line.find(':') + 1));
    for (std::string word; words >> word;) flags.insert(word);
    break;
  }
  if (flags.empty() || flags.count("sse2") == 0) {
    GTEST_SKIP() << "no x86 flags in /proc/cpuinfo";
  }
  const CpuFeatures cpu = HostCpuFeatures();
  EXPECT_EQ(cpu.avx, flags.count("avx") == 1);
  EXPECT_EQ(cpu.avx2, flags.count("avx2") == 1);
  EXPECT_EQ(cpu.fma, flags.count("fma") == 1);
  EXPECT_EQ(cpu.avx512f, flags.count("avx512f") == 1);
  EXPECT_EQ(cpu.avx512bw, flags.count("avx512bw") == 1);
  EXPECT_EQ(cpu.avx512dq, flags.count("avx512dq") == 1);
  EXPECT_EQ(cpu.avx512vl, flags.count("avx512vl") == 1);
  EXPECT_EQ(cpu.avx512_bf16, flags.count("avx512_bf16") == 1);
  // Linux saves every state the CPU has (it lists avx only if it does).
  EXPECT_EQ(cpu.os_saves_ymm, cpu.avx);
  EXPECT_EQ(cpu.os_saves_zmm, cpu.avx512f);
}

}  // namespace
}  // namespace lockstep
