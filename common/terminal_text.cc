// TerminalSafe (terminal_text.h).
#include "common/terminal_text.h"

#include "absl/strings/str_format.h"

namespace lockstep {

std::string TerminalSafe(absl::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    const auto byte = static_cast<unsigned char>(c);
    if ((byte < 0x20 && c != '\n' && c != '\t') || byte == 0x7f) {
      absl::StrAppendFormat(&out, "\\x%02x", byte);
    } else {
      out.push_back(c);
    }
  }
  return out;
}

}  // namespace lockstep
