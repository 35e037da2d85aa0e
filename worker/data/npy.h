// NumPy .npy files (format versions 1.0 to 3.0), so users can bring any
// image classification data set: `data.format: "npy"` reads four arrays
// from `data.dir`:
//
//   train_images.npy  uint8, [N, H, W] or [N, 1, H, W]
//   train_labels.npy  uint8, int32 or int64 (or unsigned), [N], each < 10
//   test_images.npy   as train_images.npy, with the same H and W
//   test_labels.npy   as train_labels.npy
//
// (numpy.save writes exactly this; see README.md, "Bringing your own data".)
// Every malformed input -- wrong magic, a header that does not parse,
// Fortran order, big-endian or unsupported dtypes, a shape that does not
// match, a label out of range, a truncated file -- is an error naming the
// file.
#ifndef LOCKSTEP_WORKER_DATA_NPY_H_
#define LOCKSTEP_WORKER_DATA_NPY_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "worker/data/idx.h"

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

// The split `train` (true) or test of an npy data set in `dir`.
absl::StatusOr<ImageDataset> LoadNpyDataset(const std::string& dir, bool train);

}  // namespace lockstep::worker

#endif  // LOCKSTEP_WORKER_DATA_NPY_H_
