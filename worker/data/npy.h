// NumPy .npy files (format versions 1.0 to 3.0): headers parsed and checked
// against the file's size, so `data.format: "npy"` can map arrays of any
// dtype lockstep reads (worker/data/split_source.h) and never read them
// whole. Every malformed input -- wrong magic, a header that does not parse
// or is too long, Fortran order, big-endian or unsupported dtypes, a
// truncated file -- is an error naming the file.
#ifndef LOCKSTEP_WORKER_DATA_NPY_H_
#define LOCKSTEP_WORKER_DATA_NPY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace lockstep::worker {

struct NpyArray {
  std::string dtype;  // the descr without byte order: "u1", "i8", "f4", ...
  std::vector<int64_t> shape;
  std::string data;  // raw little-endian elements, C order
};

// What a .npy file's header says, and where its data starts.
struct NpyHeader {
  std::string dtype;  // without byte order: "u1", "f4", ...
  std::vector<int64_t> shape;
  int64_t data_offset = 0;
  int element_size = 0;
  std::string shape_text;  // as written, for errors
  std::string descr;
};

// Headers longer than this are refused (NumPy writes a few hundred bytes).
inline constexpr size_t kMaxNpyHeaderBytes = 1 << 16;

// Parses the header at the start of `bytes` (at least its first
// kMaxNpyHeaderBytes + 12 bytes, or the whole file when shorter).
absl::StatusOr<NpyHeader> ParseNpyHeader(absl::string_view bytes,
                                         const std::string& origin);

// The bytes of data `header` describes, checked against the `available`
// bytes after the header without overflowing. DataLoss naming `origin` when
// the file is shorter.
absl::StatusOr<int64_t> NpyDataBytes(const NpyHeader& header, int64_t available,
                                     const std::string& origin);

// Parses the bytes of a .npy file; `origin` (its path) names it in errors.
absl::StatusOr<NpyArray> ParseNpy(absl::string_view bytes,
                                  const std::string& origin);
absl::StatusOr<NpyArray> ReadNpy(const std::string& path);

}  // namespace lockstep::worker

#endif  // LOCKSTEP_WORKER_DATA_NPY_H_
