#include "common/labels.h"

#include <cctype>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace lockstep {
namespace {

bool LabelText(absl::string_view text) {
  if (text.empty() || text.size() > static_cast<size_t>(kMaxLabelBytes)) {
    return false;
  }
  for (char c : text) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' &&
        c != '-' && c != '/') {
      return false;
    }
  }
  return true;
}

}  // namespace

absl::Status CheckLabel(absl::string_view where, absl::string_view key,
                        absl::string_view value) {
  if (LabelText(key) && LabelText(value)) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat(where, ": label \"", absl::CHexEscape(key.substr(0, 80)),
                   "\"=\"", absl::CHexEscape(value.substr(0, 80)),
                   "\" is not valid: keys and values are 1 to ", kMaxLabelBytes,
                   " letters, digits, '.', '_', '-' or '/'"));
}

absl::StatusOr<std::pair<std::string, std::string>> ParseLabel(
    absl::string_view text) {
  const size_t equals = text.find('=');
  if (equals == absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("--label \"", absl::CHexEscape(text.substr(0, 80)),
                     "\": write it as KEY=VALUE (zone=a)"));
  }
  absl::string_view key = text.substr(0, equals);
  absl::string_view value = text.substr(equals + 1);
  if (absl::Status bad = CheckLabel("--label", key, value); !bad.ok()) {
    return bad;
  }
  return std::pair(std::string(key), std::string(value));
}

}  // namespace lockstep
