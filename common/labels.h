// Worker labels for placement (lockstep-worker --label zone=a, a job
// spec's placement.labels): what a label may look like, and how many.
// Labels come from a worker's registration and from job specs: both are
// untrusted, so both are checked here before the coordinator keeps them.
#ifndef LOCKSTEP_COMMON_LABELS_H_
#define LOCKSTEP_COMMON_LABELS_H_

#include <map>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace lockstep {

inline constexpr int kMaxLabels = 16;
inline constexpr int kMaxLabelBytes = 63;

// A key or value: 1 to kMaxLabelBytes of letters, digits, '.', '_', '-'
// and '/' (a key as Kubernetes writes it: topology.kubernetes.io/zone).
// Errors: InvalidArgument naming `where` and the label.
absl::Status CheckLabel(absl::string_view where, absl::string_view key,
                        absl::string_view value);

// At most kMaxLabels, each as CheckLabel says. `Labels` is any map of
// strings (std::map, google::protobuf::Map).
template <typename Labels>
absl::Status CheckLabels(absl::string_view where, const Labels& labels) {
  if (labels.size() > static_cast<size_t>(kMaxLabels)) {
    return absl::InvalidArgumentError(absl::StrCat(where, ": ", labels.size(),
                                                   " labels; at most ",
                                                   kMaxLabels, " are allowed"));
  }
  for (const auto& [key, value] : labels) {
    if (absl::Status bad = CheckLabel(where, key, value); !bad.ok()) return bad;
  }
  return absl::OkStatus();
}

// "zone=a" as (key, value), checked. Errors: InvalidArgument.
absl::StatusOr<std::pair<std::string, std::string>> ParseLabel(
    absl::string_view text);

}  // namespace lockstep

#endif  // LOCKSTEP_COMMON_LABELS_H_
