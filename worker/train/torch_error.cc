// The first line of a LibTorch exception message (torch_error.h).
#include "worker/train/torch_error.h"

#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_split.h"

namespace lockstep::worker {

std::string TorchErrorSentence(absl::string_view what) {
  for (absl::string_view line : absl::StrSplit(what, '\n')) {
    line = absl::StripAsciiWhitespace(line);
    if (!line.empty()) return std::string(line);
  }
  return "an error without a message";
}

}  // namespace lockstep::worker
