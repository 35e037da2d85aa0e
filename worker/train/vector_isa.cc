// The vector instruction sets lockstep's own kernels may use (vector_isa.h).
#include "worker/train/vector_isa.h"

#include <dlfcn.h>

#include <cstdlib>
#include <string>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace lockstep::worker {
namespace {

VectorIsa CpuVectorIsa() {
  if (__builtin_cpu_supports("avx512f")) return VectorIsa::kAvx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    return VectorIsa::kAvx2;
  }
  return VectorIsa::kNone;
}

// ATEN_CPU_CAPABILITY's cap, by ATen's names; an unknown value caps
// nothing, as ATen ignores it.
VectorIsa CapabilityCap() {
  const char* value = std::getenv("ATEN_CPU_CAPABILITY");
  if (value == nullptr) return VectorIsa::kAvx512;
  const std::string capability = absl::AsciiStrToLower(value);
  if (capability == "default") return VectorIsa::kNone;
  if (capability == "avx2") return VectorIsa::kAvx2;
  return VectorIsa::kAvx512;
}

// dnnl_get_effective_cpu_isa() of the oneDNN LibTorch loaded, or -1.
int EffectiveOneDnnIsa() {
  using EffectiveIsa = int (*)();
  auto effective = reinterpret_cast<EffectiveIsa>(
      dlsym(RTLD_DEFAULT, "dnnl_get_effective_cpu_isa"));
  return effective != nullptr ? effective() : -1;
}

}  // namespace

VectorIsa AllowedVectorIsa() {
  static const VectorIsa allowed = [] {
    const VectorIsa cpu = CpuVectorIsa();
    const VectorIsa cap = CapabilityCap();
    return static_cast<int>(cpu) < static_cast<int>(cap) ? cpu : cap;
  }();
  return allowed;
}

std::string OneDnnCpuIsa() {
  // dnnl_cpu_isa_t of oneDNN 2.x (dnnl_types.h); 0 is "all" (no cap and
  // nothing detected yet), which the effective ISA never is.
  static constexpr std::pair<int, absl::string_view> kNames[] = {
      {0x1, "SSE41"},
      {0x3, "AVX"},
      {0x7, "AVX2"},
      {0x407, "AVX2_VNNI"},
      {0xf, "AVX512_MIC"},
      {0x1f, "AVX512_MIC_4OPS"},
      {0x27, "AVX512_CORE"},
      {0x67, "AVX512_CORE_VNNI"},
      {0xe7, "AVX512_CORE_BF16"},
      {0x3e7, "AVX512_CORE_AMX"},
  };
  if (const int isa = EffectiveOneDnnIsa(); isa >= 0) {
    for (const auto& [value, name] : kNames) {
      if (value == isa) return std::string(name);
    }
    return absl::StrCat("0x", absl::Hex(isa));
  }
  for (const char* variable : {"ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA"}) {
    const char* value = std::getenv(variable);
    if (value != nullptr && *value != '\0') {
      return absl::AsciiStrToUpper(value);
    }
  }
  return "";
}

bool OneDnnLacksBf16Kernels() {
  // oneDNN 2.x's dnnl_cpu_isa_avx512_core: its bit set is in every ISA
  // with bf16 kernels (AVX512_CORE and later).
  constexpr int kAvx512Core = 0x27;
  const int isa = EffectiveOneDnnIsa();
  const bool libtorch_sends_bf16 = __builtin_cpu_supports("avx512bw") &&
                                   __builtin_cpu_supports("avx512vl") &&
                                   __builtin_cpu_supports("avx512dq");
  return isa >= 0 && libtorch_sends_bf16 && (isa & kAvx512Core) != kAvx512Core;
}

}  // namespace lockstep::worker
