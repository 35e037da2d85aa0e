// protobuf <-> JSON for every component: the output styles lockstep writes
// and its parsing rules, chosen here once.
//
// Every style writes the .proto field names (snake_case), as the README and
// the job specs spell them; parsing accepts those and lowerCamelCase.
#ifndef LOCKSTEP_COMMON_PROTO_JSON_H_
#define LOCKSTEP_COMMON_PROTO_JSON_H_

#include <google/protobuf/message.h>

#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace lockstep {

enum class JsonStyle {
  // One line; fields at their default value are left out. For output that
  // programs read back: the CLI's --json (scripts and the integration tests
  // parse it) and the job spec's round trips (JobSpecToJson, --set).
  kCompact,
  // Two-space indented, every field written even at its default, so a person
  // reading a file sees `"step": "0"` rather than nothing. The checkpoint
  // files (trainer.state, rank-NNNNN.state, MANIFEST): their bytes are hashed
  // into the manifest and verified, so this style must never change.
  kFile,
};

// `message` as JSON in `style`. Cannot fail for lockstep's messages, nor for
// Struct and Value (NaN and infinities print as the strings "NaN",
// "Infinity"): protobuf refuses only an Any whose type is not linked in,
// which lockstep never uses; that logs an error and returns "".
std::string ToJson(const google::protobuf::Message& message, JsonStyle style);

// Replaces `*message` with `json` parsed. Enum names are case-sensitive. A
// field `message` does not have is an error that names it, unless
// `ignore_unknown` (for files a newer lockstep may have written).
//
// Errors: InvalidArgument "<what>: <the parser's reason>", e.g.
// "job.json: Cannot find field: epocs"; callers add what to do next.
absl::Status FromJson(absl::string_view json,
                      google::protobuf::Message* message,
                      absl::string_view what, bool ignore_unknown = false);

}  // namespace lockstep

#endif  // LOCKSTEP_COMMON_PROTO_JSON_H_
