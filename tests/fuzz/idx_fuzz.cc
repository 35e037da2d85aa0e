// Fuzz target: IDX files (raw or gzip) as a worker reads its data set. The
// input is one file, or "IMAGES--labels--LABELS": an image file and a label
// file loaded together. A file that reads must hold exactly the bytes its
// dimensions promise; a data set that loads must be consistent.
#include <cstddef>
#include <cstdint>
#include <string>

#include "tests/fuzz/fuzz_files.h"
#include "worker/data/idx.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using lockstep::fuzz::Check;
  absl::string_view input(reinterpret_cast<const char*>(data), size);
  const std::string& dir = lockstep::fuzz::ScratchDir();
  const std::string images = dir + "/images-idx3-ubyte";
  const std::string labels = dir + "/labels-idx1-ubyte";
  absl::string_view a, b;
  const bool pair = lockstep::fuzz::SplitAt(input, "--labels--", &a, &b);
  lockstep::fuzz::WriteFile(images, a);
  auto array = lockstep::worker::ReadIdx(images);
  if (array.ok()) {
    int64_t elements = 1;
    for (int64_t dim : array->dims) elements *= dim;
    Check(static_cast<int64_t>(array->data.size()) == elements,
          "IDX data size differs from the product of its dimensions");
  }
  if (!pair) return 0;
  lockstep::fuzz::WriteFile(labels, b);
  auto dataset = lockstep::worker::LoadImageDataset(images, labels);
  if (dataset.ok()) {
    lockstep::fuzz::CheckDataset(*dataset, lockstep::worker::kNumClasses);
  }
  return 0;
}
