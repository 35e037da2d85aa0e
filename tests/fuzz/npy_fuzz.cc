// Fuzz target: NumPy .npy files as a worker reads a `data.format: "npy"`
// data set. The input is one file (parsed from memory), or
// "A--labels--B[--labels--C...]": shards train_v-00000.npy, ... of one
// column plus train_w.npy (the last part) in a data folder, memory-mapped as
// a split, every sample of every column then read. What parses must hold
// exactly the bytes its shape and dtype promise; a split that opens must
// read every sample within its files.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "tests/fuzz/fuzz_files.h"
#include "worker/data/npy.h"
#include "worker/data/split_source.h"

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
  std::vector<absl::string_view> parts = absl::StrSplit(input, "--labels--");
  if (parts.size() > 8) return 0;
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    lockstep::fuzz::WriteFile(
        absl::StrCat(dir, "/train_v-0000", i, ".npy"), parts[i]);
  }
  lockstep::fuzz::WriteFile(dir + "/train_w.npy", parts.back());
  lockstep::v1::DataSpec spec;
  spec.set_format("npy");
  spec.set_dir(dir);
  auto split = lockstep::worker::OpenSplit(spec, /*train=*/true);
  if (!split.ok()) return 0;
  const lockstep::worker::SplitSource& source = **split;
  Check(source.size() > 0, "an opened split has no samples");
  std::vector<int64_t> all;
  for (int64_t i = 0; i < source.size() && i < 4096; ++i) all.push_back(i);
  for (size_t c = 0; c < source.columns().size(); ++c) {
    const int64_t bytes = source.columns()[c].sample_bytes();
    Check(bytes > 0, "a column's samples have no bytes");
    if (bytes > (int64_t{1} << 20)) continue;
    std::vector<char> out(all.size() * static_cast<size_t>(bytes));
    Check(source.ReadColumn(static_cast<int>(c), all, out.data()).ok(),
          "reading an opened npy column failed");
  }
  return 0;
}
