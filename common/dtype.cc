// Element types by name and NumPy code, and reading single elements
// (dtype.h).
#include "common/dtype.h"

#include <cmath>
#include <cstdint>
#include <cstring>

namespace lockstep {
namespace {

struct DtypeInfo {
  Dtype dtype;
  const char* name;
  const char* numpy;  // "" where NumPy has none
  int size;
};

constexpr DtypeInfo kDtypes[] = {
    {Dtype::kUInt8, "uint8", "u1", 1},
    {Dtype::kInt8, "int8", "i1", 1},
    {Dtype::kInt16, "int16", "i2", 2},
    {Dtype::kInt32, "int32", "i4", 4},
    {Dtype::kInt64, "int64", "i8", 8},
    {Dtype::kUInt16, "uint16", "u2", 2},
    {Dtype::kUInt32, "uint32", "u4", 4},
    {Dtype::kFloat16, "float16", "f2", 2},
    {Dtype::kBFloat16, "bfloat16", "", 2},
    {Dtype::kFloat32, "float32", "f4", 4},
    {Dtype::kFloat64, "float64", "f8", 8},
    {Dtype::kBool, "bool", "b1", 1},
    {Dtype::kUInt64, "uint64", "u8", 8},
};

const DtypeInfo& Info(Dtype dtype) { return kDtypes[static_cast<int>(dtype)]; }

template <typename T>
T Load(const char* data, int64_t i) {
  T value;
  std::memcpy(&value, data + i * static_cast<int64_t>(sizeof(T)), sizeof(T));
  return value;
}

// IEEE half to float, exactly (subnormals, infinities and NaN included).
float HalfToFloat(uint16_t h) {
  const int sign = h >> 15;
  const int exponent = (h >> 10) & 0x1f;
  const int mantissa = h & 0x3ff;
  float value;
  if (exponent == 0) {
    value = std::ldexp(static_cast<float>(mantissa), -24);
  } else if (exponent == 31) {
    value = mantissa == 0 ? INFINITY : NAN;
  } else {
    value = std::ldexp(static_cast<float>(mantissa | 0x400), exponent - 25);
  }
  return sign ? -value : value;
}

float BFloat16ToFloat(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

}  // namespace

std::optional<Dtype> DtypeFromName(absl::string_view name) {
  for (const DtypeInfo& info : kDtypes) {
    if (name == info.name) return info.dtype;
  }
  return std::nullopt;
}

const char* DtypeName(Dtype dtype) { return Info(dtype).name; }

const char* DtypeNames() {
  return "uint8, int8, int16, int32, int64, uint16, uint32, uint64, bool, "
         "float16, bfloat16, float32, float64";
}

std::optional<Dtype> DtypeFromNumpy(absl::string_view code) {
  for (const DtypeInfo& info : kDtypes) {
    if (info.numpy[0] != '\0' && code == info.numpy) return info.dtype;
  }
  return std::nullopt;
}

int DtypeSize(Dtype dtype) { return Info(dtype).size; }

bool IsFloat(Dtype dtype) {
  return dtype == Dtype::kFloat16 || dtype == Dtype::kBFloat16 ||
         dtype == Dtype::kFloat32 || dtype == Dtype::kFloat64;
}

bool IsInteger(Dtype dtype) { return !IsFloat(dtype); }

int64_t ElementAsInt(Dtype dtype, const char* data, int64_t i) {
  switch (dtype) {
    case Dtype::kUInt8:
      return Load<uint8_t>(data, i);
    case Dtype::kInt8:
      return Load<int8_t>(data, i);
    case Dtype::kInt16:
      return Load<int16_t>(data, i);
    case Dtype::kInt32:
      return Load<int32_t>(data, i);
    case Dtype::kInt64:
      return Load<int64_t>(data, i);
    case Dtype::kUInt16:
      return Load<uint16_t>(data, i);
    case Dtype::kUInt32:
      return Load<uint32_t>(data, i);
    case Dtype::kBool:
      return Load<uint8_t>(data, i) != 0 ? 1 : 0;
    case Dtype::kUInt64: {
      const uint64_t value = Load<uint64_t>(data, i);
      // Above int64's range: a value no label or id can be.
      return value > static_cast<uint64_t>(INT64_MAX)
                 ? -1
                 : static_cast<int64_t>(value);
    }
    case Dtype::kFloat64: {
      const double value = Load<double>(data, i);
      if (!(std::fabs(value) < 9.2e18)) return -1;
      return static_cast<int64_t>(value);
    }
    default: {
      const float value = ElementAsFloat(dtype, data, i);
      // Out of int64's range (or NaN): a value no label or id can be.
      if (!(std::fabs(value) < 9.2e18f)) return -1;
      return static_cast<int64_t>(value);
    }
  }
}

float ElementAsFloat(Dtype dtype, const char* data, int64_t i) {
  switch (dtype) {
    case Dtype::kFloat16:
      return HalfToFloat(Load<uint16_t>(data, i));
    case Dtype::kBFloat16:
      return BFloat16ToFloat(Load<uint16_t>(data, i));
    case Dtype::kFloat32:
      return Load<float>(data, i);
    case Dtype::kFloat64:
      return static_cast<float>(Load<double>(data, i));
    case Dtype::kUInt64:
      return static_cast<float>(Load<uint64_t>(data, i));
    default:
      return static_cast<float>(ElementAsInt(dtype, data, i));
  }
}

}  // namespace lockstep
