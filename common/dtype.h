// The element types a data set's columns may hold, by the names a job spec
// uses ("uint8", "float32", ...) and the codes NumPy writes ("u1", "f4").
#ifndef LOCKSTEP_COMMON_DTYPE_H_
#define LOCKSTEP_COMMON_DTYPE_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace lockstep {

enum class Dtype : uint8_t {
  kUInt8,
  kInt8,
  kInt16,
  kInt32,
  kInt64,
  kUInt16,
  kUInt32,
  kFloat16,
  kBFloat16,
  kFloat32,
  // NumPy's and pandas' defaults, read as they are and converted where
  // used: float64 to float32 for inputs (round to nearest), bool as 0 or 1,
  // a uint64 above int64's range as an out-of-range label or id.
  kFloat64,
  kBool,
  kUInt64,
};

// "uint8", "int64", "bfloat16", ... (the job spec's names).
std::optional<Dtype> DtypeFromName(absl::string_view name);
const char* DtypeName(Dtype dtype);
// The job spec's names, for an error's list of choices.
const char* DtypeNames();

// NumPy's type code without the byte order ("u1", "i8", "f4", "f8", "b1");
// NumPy has no bfloat16. nullopt for another code.
std::optional<Dtype> DtypeFromNumpy(absl::string_view code);

int DtypeSize(Dtype dtype);
bool IsInteger(Dtype dtype);
bool IsFloat(Dtype dtype);

// Element `i` of `data` (little-endian, of `dtype`) as an integer; floats
// are truncated toward zero. Used for labels and token ids.
int64_t ElementAsInt(Dtype dtype, const char* data, int64_t i);
// Element `i` of `data` as a float (bf16 and fp16 widened exactly).
float ElementAsFloat(Dtype dtype, const char* data, int64_t i);

}  // namespace lockstep

#endif  // LOCKSTEP_COMMON_DTYPE_H_
