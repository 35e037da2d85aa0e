// protobuf <-> JSON with lockstep's options (see proto_json.h).
#include "common/proto_json.h"

#include <google/protobuf/util/json_util.h>

#include "absl/strings/str_cat.h"
#include "common/log.h"

namespace lockstep {
namespace {

namespace pbutil = google::protobuf::util;

pbutil::JsonPrintOptions PrintOptions(JsonStyle style) {
  pbutil::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  switch (style) {
    case JsonStyle::kCompact:
      break;
    case JsonStyle::kFile:
      options.add_whitespace = true;
      options.always_print_primitive_fields = true;
      break;
  }
  return options;
}

// protobuf 3.21's util::Status has its own string type.
template <typename ProtobufStatus>
std::string Reason(const ProtobufStatus& status) {
  return std::string(status.message().data(), status.message().size());
}

}  // namespace

std::string ToJson(const google::protobuf::Message& message, JsonStyle style) {
  std::string json;
  auto status =
      pbutil::MessageToJsonString(message, &json, PrintOptions(style));
  if (!status.ok()) {
    LogError("cannot write a ", message.GetTypeName(), " as JSON (",
             Reason(status), "); writing nothing");
    return "";
  }
  return json;
}

absl::Status FromJson(absl::string_view json,
                      google::protobuf::Message* message,
                      absl::string_view what, bool ignore_unknown) {
  pbutil::JsonParseOptions options;
  options.ignore_unknown_fields = ignore_unknown;
  auto status = pbutil::JsonStringToMessage(
      google::protobuf::StringPiece(json.data(), json.size()), message,
      options);
  if (!status.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", Reason(status)));
  }
  return absl::OkStatus();
}

}  // namespace lockstep
