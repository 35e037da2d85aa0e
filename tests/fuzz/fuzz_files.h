// What the file-reading fuzz targets share: a scratch folder of this
// process, and the input split into named parts.
#ifndef LOCKSTEP_TESTS_FUZZ_FUZZ_FILES_H_
#define LOCKSTEP_TESTS_FUZZ_FUZZ_FILES_H_

#include <stdlib.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>

#include "absl/strings/string_view.h"

namespace lockstep::fuzz {

// A folder made once per process (not per input: that is the slow part)
// under $TMPDIR; each input empties it first.
inline const std::string& ScratchDir() {
  static const std::string* dir = [] {
    const char* tmp = std::getenv("TMPDIR");
    std::string pattern =
        std::string(tmp ? tmp : "/tmp") + "/lockstep-fuzz-XXXXXX";
    if (mkdtemp(pattern.data()) == nullptr) {
      std::perror("mkdtemp");
      std::abort();
    }
    std::atexit([] {
      std::error_code ignored;
      std::filesystem::remove_all(ScratchDir(), ignored);
    });
    return new std::string(pattern);
  }();
  return *dir;
}

// Empties `dir` (made if missing).
inline void Reset(const std::string& dir) {
  std::error_code ignored;
  std::filesystem::remove_all(dir, ignored);
  std::filesystem::create_directories(dir, ignored);
}

inline void WriteFile(const std::string& path, absl::string_view bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// The bytes of `path`; nullopt when it cannot be read.
inline std::optional<std::string> ReadBack(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  return std::string(std::istreambuf_iterator<char>(in),
                     std::istreambuf_iterator<char>());
}

// Splits "A<marker>B" into A and B; without the marker B is empty and
// false is returned.
inline bool SplitAt(absl::string_view input, absl::string_view marker,
                    absl::string_view* a, absl::string_view* b) {
  size_t at = input.find(marker);
  if (at == absl::string_view::npos) {
    *a = input;
    *b = absl::string_view();
    return false;
  }
  *a = input.substr(0, at);
  *b = input.substr(at + marker.size());
  return true;
}

// Aborts (a finding) with `what` when `ok` is false.
inline void Check(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "fuzz invariant broken: %s\n", what);
  std::abort();
}

// What a data set that loaded must hold, from either reader: one label per
// image, count x rows x cols pixels, every label a class.
template <typename Dataset>
void CheckDataset(const Dataset& dataset, int num_classes) {
  Check(static_cast<int64_t>(dataset.labels.size()) == dataset.count,
        "label count differs from the image count");
  Check(static_cast<int64_t>(dataset.pixels.size()) ==
            dataset.count * dataset.rows * dataset.cols,
        "pixel count differs from count x rows x cols");
  for (auto label : dataset.labels) {
    Check(static_cast<int>(label) < num_classes, "label out of range");
  }
}

}  // namespace lockstep::fuzz

#endif  // LOCKSTEP_TESTS_FUZZ_FUZZ_FILES_H_
