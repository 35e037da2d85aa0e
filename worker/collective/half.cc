// bfloat16 and fp16 <-> fp32 conversions, rounding to nearest even (half.h).
#include "worker/collective/half.h"

#include <cmath>
#include <cstring>

namespace lockstep::worker {
namespace {

uint32_t Bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, 4);
  return bits;
}

float FromBits(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, 4);
  return value;
}

}  // namespace

float BFloat16ToFloat(uint16_t bits) { return FromBits(uint32_t{bits} << 16); }

uint16_t FloatToBFloat16(float value) {
  uint32_t bits = Bits(value);
  if (std::isnan(value)) return static_cast<uint16_t>((bits >> 16) | 0x40);
  uint32_t rounding = 0x7FFF + ((bits >> 16) & 1);
  return static_cast<uint16_t>((bits + rounding) >> 16);
}

float HalfToFloat(uint16_t h) {
  uint32_t sign = uint32_t{h & 0x8000u} << 16;
  uint32_t exponent = (h >> 10) & 0x1F;
  uint32_t mantissa = h & 0x3FF;
  if (exponent == 0x1F) return FromBits(sign | 0x7F800000 | (mantissa << 13));
  if (exponent != 0) {
    return FromBits(sign | ((exponent + 112) << 23) | (mantissa << 13));
  }
  // Zero or subnormal: mantissa * 2^-24.
  float magnitude = std::ldexp(static_cast<float>(mantissa), -24);
  return sign ? -magnitude : magnitude;
}

uint16_t FloatToHalf(float value) {
  uint32_t bits = Bits(value);
  uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000);
  if (std::isnan(value)) return sign | 0x7E00;
  float magnitude = std::fabs(value);
  if (magnitude >= 65520.0f) return sign | 0x7C00;  // rounds to infinity
  if (magnitude < 6.103515625e-05f) {
    // Subnormal: a multiple of 2^-24, rounded to nearest even.
    float scaled = magnitude * 16777216.0f;  // 2^24
    return sign | static_cast<uint16_t>(std::nearbyint(scaled));
  }
  uint32_t m = Bits(magnitude);
  uint32_t rounding = 0xFFF + ((m >> 13) & 1);
  m += rounding;
  uint32_t exponent = (m >> 23) - 112;
  return sign | static_cast<uint16_t>((exponent << 10) | ((m >> 13) & 0x3FF));
}

}  // namespace lockstep::worker
