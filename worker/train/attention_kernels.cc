// The fused causal attention's kernels (attention_kernels.h): the code is
// in attention_kernel.inc, compiled here three times, for AVX-512, for
// AVX2 with FMA and for no vector unit, each over its own vector type
// (the target pragmas are GCC's and Clang's: the thread-safety analysis
// compiles the trainer with Clang).
// Built with OpenMP so at::parallel_for shares LibTorch's threads.
#include "worker/train/attention_kernels.h"

#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>


namespace lockstep::worker {
namespace {

// The kernels' element types: fp32, or bfloat16 held as its bits,
// converted here, inline (half.h's conversions, which round the same way,
// are a call each: a third of a bf16 forward pass at 64 tokens).
inline float ToFloat(float x) { return x; }
inline float ToFloat(uint16_t bits) {
  const uint32_t wide = static_cast<uint32_t>(bits) << 16;
  float x;
  std::memcpy(&x, &wide, sizeof(x));
  return x;
}
template <typename E>
E FromFloat(float x);
template <>
inline float FromFloat<float>(float x) {
  return x;
}
// To nearest, ties to even; NaN stays NaN.
template <>
inline uint16_t FromFloat<uint16_t>(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<uint16_t>((bits >> 16) | 0x40);
  }
  bits += 0x7fffu + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}

namespace scalar {

struct V {
  static constexpr int64_t kWidth = 1;
  float v;
  static V Zero() { return {0.0f}; }
  static V Broadcast(float x) { return {x}; }
  static V Load(const float* p) { return {*p}; }
  void Store(float* p) const { *p = v; }
  static V Add(V a, V b) { return {a.v + b.v}; }
  static V Sub(V a, V b) { return {a.v - b.v}; }
  static V Mul(V a, V b) { return {a.v * b.v}; }
  static V Fma(V a, V b, V c) { return {std::fma(a.v, b.v, c.v)}; }
  static V Min(V a, V b) { return {std::min(a.v, b.v)}; }
  static V Max(V a, V b) { return {std::max(a.v, b.v)}; }
  static V Floor(V a) { return {std::floor(a.v)}; }
  static V Pow2(V n) {
    const uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(n.v) + 127)
                          << 23;
    float x;
    std::memcpy(&x, &bits, sizeof(x));
    return {x};
  }
  float Sum() const { return v; }
  float MaxOf() const { return v; }
};

#include "worker/train/attention_kernel.inc"

}  // namespace scalar

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma"))), \
                             apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma")
#endif
namespace avx2 {

struct V {
  static constexpr int64_t kWidth = 8;
  __m256 v;
  static V Zero() { return {_mm256_setzero_ps()}; }
  static V Broadcast(float x) { return {_mm256_set1_ps(x)}; }
  static V Load(const float* p) { return {_mm256_loadu_ps(p)}; }
  void Store(float* p) const { _mm256_storeu_ps(p, v); }
  static V Add(V a, V b) { return {_mm256_add_ps(a.v, b.v)}; }
  static V Sub(V a, V b) { return {_mm256_sub_ps(a.v, b.v)}; }
  static V Mul(V a, V b) { return {_mm256_mul_ps(a.v, b.v)}; }
  static V Fma(V a, V b, V c) { return {_mm256_fmadd_ps(a.v, b.v, c.v)}; }
  static V Min(V a, V b) { return {_mm256_min_ps(a.v, b.v)}; }
  static V Max(V a, V b) { return {_mm256_max_ps(a.v, b.v)}; }
  static V Floor(V a) { return {_mm256_floor_ps(a.v)}; }
  static V Pow2(V n) {
    const __m256i e =
        _mm256_add_epi32(_mm256_cvttps_epi32(n.v), _mm256_set1_epi32(127));
    return {_mm256_castsi256_ps(_mm256_slli_epi32(e, 23))};
  }
  float Sum() const {
    __m128 x =
        _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_add_ps(x, _mm_movehl_ps(x, x));
    x = _mm_add_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
  }
  float MaxOf() const {
    __m128 x =
        _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    x = _mm_max_ps(x, _mm_movehl_ps(x, x));
    x = _mm_max_ss(x, _mm_movehdup_ps(x));
    return _mm_cvtss_f32(x);
  }
};

#include "worker/train/attention_kernel.inc"

}  // namespace avx2
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx512f,avx2,fma"))), \
                             apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma")
#endif
namespace avx512 {

struct V {
  static constexpr int64_t kWidth = 16;
  __m512 v;
  static V Zero() { return {_mm512_setzero_ps()}; }
  static V Broadcast(float x) { return {_mm512_set1_ps(x)}; }
  static V Load(const float* p) { return {_mm512_loadu_ps(p)}; }
  void Store(float* p) const { _mm512_storeu_ps(p, v); }
  static V Add(V a, V b) { return {_mm512_add_ps(a.v, b.v)}; }
  static V Sub(V a, V b) { return {_mm512_sub_ps(a.v, b.v)}; }
  static V Mul(V a, V b) { return {_mm512_mul_ps(a.v, b.v)}; }
  static V Fma(V a, V b, V c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }
  static V Min(V a, V b) { return {_mm512_min_ps(a.v, b.v)}; }
  static V Max(V a, V b) { return {_mm512_max_ps(a.v, b.v)}; }
  static V Floor(V a) {
    return {
        _mm512_roundscale_ps(a.v, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC)};
  }
  static V Pow2(V n) {
    const __m512i e =
        _mm512_add_epi32(_mm512_cvttps_epi32(n.v), _mm512_set1_epi32(127));
    return {_mm512_castsi512_ps(_mm512_slli_epi32(e, 23))};
  }
  float Sum() const { return _mm512_reduce_add_ps(v); }
  float MaxOf() const { return _mm512_reduce_max_ps(v); }
};

#include "worker/train/attention_kernel.inc"

}  // namespace avx512
#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif

VectorIsa Capped(VectorIsa isa) {
  return static_cast<VectorIsa>(
      std::min(static_cast<int>(isa), static_cast<int>(AllowedVectorIsa())));
}

}  // namespace

void CausalAttentionForward(const void* qkv, void* y, float* lse,
                            const AttentionShape& shape, float scale, bool bf16,
                            VectorIsa isa) {
  auto run = [&](auto forward_float, auto forward_bf16) {
    if (bf16) {
      forward_bf16(static_cast<const uint16_t*>(qkv), static_cast<uint16_t*>(y),
                   lse, shape, scale);
    } else {
      forward_float(static_cast<const float*>(qkv), static_cast<float*>(y), lse,
                    shape, scale);
    }
  };
  switch (Capped(isa)) {
    case VectorIsa::kAvx512:
      return run(avx512::Forward<float>, avx512::Forward<uint16_t>);
    case VectorIsa::kAvx2:
      return run(avx2::Forward<float>, avx2::Forward<uint16_t>);
    case VectorIsa::kNone:
      return run(scalar::Forward<float>, scalar::Forward<uint16_t>);
  }
}

void CausalAttentionBackward(const void* qkv, const void* y, const float* lse,
                             const void* dy, void* dqkv,
                             const AttentionShape& shape, float scale,
                             bool bf16, VectorIsa isa) {
  auto run = [&](auto backward_float, auto backward_bf16) {
    if (bf16) {
      backward_bf16(static_cast<const uint16_t*>(qkv),
                    static_cast<const uint16_t*>(y), lse,
                    static_cast<const uint16_t*>(dy),
                    static_cast<uint16_t*>(dqkv), shape, scale);
    } else {
      backward_float(static_cast<const float*>(qkv),
                     static_cast<const float*>(y), lse,
                     static_cast<const float*>(dy), static_cast<float*>(dqkv),
                     shape, scale);
    }
  };
  switch (Capped(isa)) {
    case VectorIsa::kAvx512:
      return run(avx512::Backward<float>, avx512::Backward<uint16_t>);
    case VectorIsa::kAvx2:
      return run(avx2::Backward<float>, avx2::Backward<uint16_t>);
    case VectorIsa::kNone:
      return run(scalar::Backward<float>, scalar::Backward<uint16_t>);
  }
}

}  // namespace lockstep::worker
