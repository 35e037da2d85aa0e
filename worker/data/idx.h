// IDX files (the MNIST/Fashion-MNIST format), gzip-compressed or raw. Every
// malformed input is an InvalidArgument/DataLoss error naming the file.
#ifndef LOCKSTEP_WORKER_DATA_IDX_H_
#define LOCKSTEP_WORKER_DATA_IDX_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace lockstep::worker {

struct IdxArray {
  std::vector<int64_t> dims;
  std::vector<uint8_t> data;  // row-major, unsigned bytes
};

// Reads an IDX file of unsigned bytes (type 0x08).
absl::StatusOr<IdxArray> ReadIdx(const std::string& path);

// Images with their class labels.
struct ImageDataset {
  int64_t count = 0;
  int64_t rows = 0;
  int64_t cols = 0;
  std::vector<uint8_t> pixels;  // count * rows * cols
  std::vector<uint8_t> labels;  // count, each < kNumClasses
};

inline constexpr int kNumClasses = 10;

// Loads an image file and its label file and checks they match: same count,
// 3-D images, 1-D labels, every label < kNumClasses.
absl::StatusOr<ImageDataset> LoadImageDataset(const std::string& images_path,
                                              const std::string& labels_path);

// Fashion-MNIST's split `train` (true) or test from `dir`; takes the ".gz"
// files if present, else the raw ones.
absl::StatusOr<ImageDataset> LoadFashionMnist(const std::string& dir,
                                              bool train);

}  // namespace lockstep::worker

#endif  // LOCKSTEP_WORKER_DATA_IDX_H_
