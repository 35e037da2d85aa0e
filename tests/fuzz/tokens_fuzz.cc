// Fuzz target: token files as a worker reads a `data.format: "tokens"` data
// set. The first input byte picks the token dtype (even: uint16, odd:
// uint32), the block size (1 + byte % 16) and the window stride (1 + byte
// / 16 % 8); the rest is train.bin. A split that opens must hold windows
// inside the file, and every window must read.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_files.h"
#include "worker/data/split_source.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using lockstep::fuzz::Check;
  if (size < 1) return 0;
  const uint8_t knobs = data[0];
  absl::string_view file(reinterpret_cast<const char*>(data) + 1, size - 1);
  const std::string dir = lockstep::fuzz::ScratchDir() + "/tokens";
  lockstep::fuzz::Reset(dir);
  lockstep::fuzz::WriteFile(dir + "/train.bin", file);
  lockstep::v1::DataSpec spec;
  spec.set_format("tokens");
  spec.set_dir(dir);
  spec.set_token_dtype(knobs % 2 == 0 ? "uint16" : "uint32");
  spec.set_block_size(1 + knobs % 16);
  spec.set_window_stride(1 + knobs / 16 % 8);
  auto split = lockstep::worker::OpenSplit(spec, /*train=*/true);
  if (!split.ok()) return 0;
  const lockstep::worker::SplitSource& source = **split;
  const int token = knobs % 2 == 0 ? 2 : 4;
  const int64_t tokens = static_cast<int64_t>(file.size()) / token;
  Check(source.size() >= 1, "an opened token file has no window");
  Check((source.size() - 1) * spec.window_stride() + spec.block_size() + 1 <=
            tokens,
        "a window reaches past the end of the file");
  std::vector<int64_t> all;
  for (int64_t i = 0; i < source.size(); ++i) all.push_back(i);
  std::vector<char> out(all.size() * source.columns()[0].sample_bytes());
  Check(source.ReadColumn(0, all, out.data()).ok(), "a window did not read");
  return 0;
}
