// Fuzz target: NumPy .npy files as a worker reads a `data.format: "npy"`
// data set. The input is one file (parsed from memory), or
// "IMAGES--labels--LABELS": train_images.npy and train_labels.npy of a data
// folder, loaded as a split. What parses must hold exactly the bytes its
// shape and dtype promise; a split that loads must be consistent.
#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/strings/numbers.h"
#include "tests/fuzz/fuzz_files.h"
#include "worker/data/npy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using lockstep::fuzz::Check;
  absl::string_view input(reinterpret_cast<const char*>(data), size);
  absl::string_view a, b;
  const bool pair = lockstep::fuzz::SplitAt(input, "--labels--", &a, &b);
  auto array = lockstep::worker::ParseNpy(a, "fuzz.npy");
  if (array.ok()) {
    int element = 0;
    Check(absl::SimpleAtoi(array->dtype.substr(1), &element) && element > 0,
          "a parsed dtype has no element size");
    // Each dimension is at most the data's size, so this cannot overflow
    // unless a dimension is 0.
    uint64_t bytes = static_cast<uint64_t>(element);
    for (int64_t dim : array->shape) {
      Check(dim >= 0, "negative dimension");
      bytes = dim == 0 ? 0 : bytes * static_cast<uint64_t>(dim);
    }
    Check(array->data.size() == bytes,
          "npy data size differs from shape x element size");
  }
  if (!pair) return 0;
  const std::string dir = lockstep::fuzz::ScratchDir() + "/npy";
  lockstep::fuzz::Reset(dir);
  lockstep::fuzz::WriteFile(dir + "/train_images.npy", a);
  lockstep::fuzz::WriteFile(dir + "/train_labels.npy", b);
  auto dataset = lockstep::worker::LoadNpyDataset(dir, /*train=*/true);
  if (dataset.ok()) {
    lockstep::fuzz::CheckDataset(*dataset, lockstep::worker::kNumClasses);
  }
  return 0;
}
