// The bytes of .npy files, as numpy.save writes them, for the tests of the
// readers and of what is built on them.
#ifndef LOCKSTEP_TESTS_UNIT_NPY_BYTES_H_
#define LOCKSTEP_TESTS_UNIT_NPY_BYTES_H_

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace lockstep::worker {

// The bytes numpy.save would write for `descr`, `shape` and `data`
// (version 1.0, or 2.0 with a 4-byte header length).
inline std::string Npy(const std::string& descr, const std::string& shape,
                       const std::string& data, bool fortran = false,
                       int version = 1) {
  std::string header = absl::StrCat(
      "{'descr': '", descr, "', 'fortran_order': ", fortran ? "True" : "False",
      ", 'shape': ", shape, ", }");
  const size_t prefix = version == 1 ? 10 : 12;
  while ((prefix + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::string out = "\x93NUMPY";
  out += static_cast<char>(version);
  out += '\0';
  const uint32_t length = static_cast<uint32_t>(header.size());
  out.append(reinterpret_cast<const char*>(&length), version == 1 ? 2 : 4);
  return out + header + data;
}

inline std::string Floats(const std::vector<float>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()),
                     values.size() * sizeof(float));
}

inline std::string Int64s(std::initializer_list<int64_t> values) {
  std::string out;
  for (int64_t v : values) out.append(reinterpret_cast<const char*>(&v), 8);
  return out;
}

}  // namespace lockstep::worker

#endif  // LOCKSTEP_TESTS_UNIT_NPY_BYTES_H_
