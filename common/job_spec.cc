// Parsing, overriding, defaulting and validating job specs, and resolving
// their batch sizes (job_spec.h).
#include "common/job_spec.h"

#include <google/protobuf/descriptor.h>
#include <google/protobuf/struct.pb.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/files.h"
#include "common/job_spec_internal.h"
#include "common/labels.h"
#include "common/proto_json.h"
#include "common/status_macros.h"

namespace lockstep {
namespace {

using google::protobuf::Struct;
using google::protobuf::Value;

using internal::CheckChoice;
using internal::Invalid;

// The bound of every field, by dotted path: bytes for strings, the value for
// numbers. A test checks that every scalar field of JobSpec has one, so a
// new field cannot go unbounded unnoticed. README.md lists them.
struct FieldBound {
  const char* path;
  double max;
};
constexpr double kUnbounded = std::numeric_limits<double>::infinity();
constexpr double kMaxChoiceBytes = 32;  // "constant", "cosine", ...
constexpr FieldBound kFieldBounds[] = {
    {"name", kMaxJobNameBytes},
    {"model.name", kMaxChoiceBytes},
    {"model.torchscript", kMaxPathBytes},
    {"model.dropout", 1},
    {"model.n_layer", 256},
    {"model.n_head", 256},
    {"model.n_embd", 65536},
    {"model.vocab_size", kMaxClasses},
    {"data.format", kMaxChoiceBytes},
    {"data.dir", kMaxPathBytes},
    {"data.train", kMaxPathBytes},
    {"data.test", kMaxPathBytes},
    {"data.token_dtype", kMaxChoiceBytes},
    {"data.block_size", kMaxBlockSize},
    {"data.window_stride", kMaxBlockSize},
    {"data.shuffle", kMaxChoiceBytes},
    {"data.shuffle_block", 1 << 30},
    {"data.window_offset", kMaxChoiceBytes},
    {"data.separator_token", 4294967295.0},  // a uint32 token id
    {"data.skip_corrupt", kMaxSkipCorrupt},
    {"task.type", kMaxChoiceBytes},
    {"task.num_classes", kMaxClasses},
    {"task.label_smoothing", 1},
    {"task.loss", kMaxChoiceBytes},
    {"task.input", kMaxColumnNameBytes},
    {"task.target", kMaxColumnNameBytes},
    {"epochs", kMaxEpochs},
    {"global_batch_size", kMaxGlobalBatch},
    {"per_replica_batch_size", kMaxPerReplicaBatch},
    {"num_workers", kMaxReplicas},
    {"base_lr", 1000},
    {"reference_batch_size", kMaxGlobalBatch},
    {"lr_scaling", kMaxChoiceBytes},
    {"warmup_steps", kMaxSteps32},
    {"optimizer.type", kMaxChoiceBytes},
    {"optimizer.momentum", 1},
    {"optimizer.weight_decay", 1000},
    {"optimizer.beta1", 1},
    {"optimizer.beta2", 1},
    {"seed", kUnbounded},  // every 64-bit seed is a valid seed
    {"max_steps", kMaxSteps},
    {"log_every_steps", kMaxSteps32},
    {"max_restarts", kMaxRestarts},
    {"min_workers", kMaxReplicas},
    {"max_workers", kMaxReplicas},
    {"communication.backend", kMaxChoiceBytes},
    {"communication.bucket_mb", 65536},
    {"communication.algorithm", kMaxChoiceBytes},
    {"communication.compression", kMaxChoiceBytes},
    {"checkpoint.backup_dir", kMaxPathBytes},
    {"checkpoint.save_every_steps", kMaxSteps},
    {"checkpoint.keep", 1000},
    {"export", kMaxPathBytes},
    {"export_format", kMaxChoiceBytes},
    {"accumulation_steps", kMaxAccumulationSteps},
    {"lr_decay", kMaxChoiceBytes},
    {"lr_decay_steps", kMaxSteps},
    {"lr_decay_rate", 1},
    {"min_lr", 1000},
    {"clip_grad_norm", 1e12},
    {"precision", kMaxChoiceBytes},
    {"loss_scale", 1e12},
    {"loss_scale_growth_interval", kMaxSteps32},
    {"priority", kMaxPriority},
    {"priority_class", 64},
    {"placement.device", kMaxChoiceBytes},
    {"eval_every_steps", kMaxSteps},
    {"eval_batches", 1000000},
    {"time_limit_seconds", kMaxTimeLimitSeconds},
};

// A number as a user wrote it: 65536, 0.5, 1e+12 (not 1.07374e+09).
std::string Number(double value) { return absl::StrFormat("%.15g", value); }

// A NUL ends the string every system call sees, while the checks before
// them see all of it (a path "/etc\0/../tmp" passes as /tmp and then acts
// on /etc); other control characters have no use in a job spec and garble
// the messages and logs that echo it. Refused in every string field.
absl::Status CheckNoControlCharacter(absl::string_view path,
                                     absl::string_view value) {
  for (size_t i = 0; i < value.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(value[i]);
    if (c < 0x20 || c == 0x7f) {
      return Invalid(absl::StrFormat(
          "%s holds a control character (byte 0x%02x at offset %d); "
          "remove it: no field of a job spec may hold one",
          path, c, i));
    }
  }
  return absl::OkStatus();
}

// Checks every scalar field of `message` (and of the messages it holds)
// against its bound, and every float field for NaN and infinities. The
// paths use the JSON name where the proto sets one (export_path: "export").
absl::Status CheckFieldBounds(const google::protobuf::Message& message,
                              const std::string& prefix) {
  using google::protobuf::FieldDescriptor;
  const google::protobuf::Descriptor* descriptor = message.GetDescriptor();
  const google::protobuf::Reflection* reflection = message.GetReflection();
  for (int i = 0; i < descriptor->field_count(); ++i) {
    const FieldDescriptor* field = descriptor->field(i);
    if (field->is_repeated()) continue;  // a job spec has none
    const std::string path = absl::StrCat(
        prefix, field->has_json_name() ? field->json_name() : field->name());
    const std::optional<double> bound = JobSpecFieldBound(path);
    std::string text;  // the value, for the error
    double value = 0;
    switch (field->cpp_type()) {
      case FieldDescriptor::CPPTYPE_MESSAGE:
        if (reflection->HasField(message, field)) {
          RETURN_IF_ERROR(CheckFieldBounds(
              reflection->GetMessage(message, field), path + "."));
        }
        continue;
      case FieldDescriptor::CPPTYPE_STRING: {
        std::string scratch;
        const size_t size =
            reflection->GetStringReference(message, field, &scratch).size();
        if (bound.has_value() && static_cast<double>(size) > *bound) {
          return Invalid(absl::StrCat(path, " is ", size,
                                      " bytes long; at most ", Number(*bound)));
        }
        RETURN_IF_ERROR(CheckNoControlCharacter(
            path, reflection->GetStringReference(message, field, &scratch)));
        continue;
      }
      case FieldDescriptor::CPPTYPE_DOUBLE:
        value = reflection->GetDouble(message, field);
        text = Number(value);
        break;
      case FieldDescriptor::CPPTYPE_FLOAT:
        value = reflection->GetFloat(message, field);
        text = Number(value);
        break;
      case FieldDescriptor::CPPTYPE_INT32:
        value = reflection->GetInt32(message, field);
        text = absl::StrCat(reflection->GetInt32(message, field));
        break;
      case FieldDescriptor::CPPTYPE_INT64:
        value = static_cast<double>(reflection->GetInt64(message, field));
        text = absl::StrCat(reflection->GetInt64(message, field));
        break;
      case FieldDescriptor::CPPTYPE_UINT32:
        value = reflection->GetUInt32(message, field);
        text = absl::StrCat(reflection->GetUInt32(message, field));
        break;
      case FieldDescriptor::CPPTYPE_UINT64:
        value = static_cast<double>(reflection->GetUInt64(message, field));
        text = absl::StrCat(reflection->GetUInt64(message, field));
        break;
      default:  // bool, enum: their type bounds them
        continue;
    }
    if (!std::isfinite(value)) {
      return Invalid(
          absl::StrCat(path, " is ", text, "; give a finite number"));
    }
    if (bound.has_value() && value > *bound) {
      return Invalid(
          absl::StrCat(path, " is ", text, "; at most ", Number(*bound)));
    }
  }
  return absl::OkStatus();
}

}  // namespace

namespace internal {

absl::Status Invalid(absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat("job spec: ", message));
}

bool OneOf(const std::string& value, std::initializer_list<const char*> set) {
  for (const char* item : set) {
    if (value == item) return true;
  }
  return false;
}

absl::Status CheckChoice(absl::string_view field, const std::string& value,
                         std::initializer_list<const char*> set) {
  if (OneOf(value, set)) return absl::OkStatus();
  std::string choices;
  for (const char* item : set) {
    absl::StrAppend(&choices, choices.empty() ? "" : ", ", item);
  }
  return Invalid(
      absl::StrCat(field, " is \"", value, "\"; choose one of ", choices));
}

}  // namespace internal

namespace {

// "model": "cnn" is short for "model": {"name": "cnn"}: expanded in the
// spec's text. Only the top-level "model" string is rewritten and every
// other byte stays as written: a round trip through a Struct would turn
// 64-bit integers (a seed) into doubles.
void ExpandModelShorthand(std::string* json) {
  const std::string& s = *json;
  // One past the closing quote of the string that starts at `begin`.
  auto string_end = [&](size_t begin) {
    for (size_t j = begin + 1; j < s.size(); ++j) {
      if (s[j] == '\\') {
        ++j;
      } else if (s[j] == '"') {
        return j + 1;
      }
    }
    return std::string::npos;
  };
  auto skip_space = [&](size_t j) {
    while (j < s.size() && absl::ascii_isspace(s[j])) ++j;
    return j;
  };
  int depth = 0;
  bool key_next = false;  // in the top-level object, a key comes next
  size_t i = 0;
  while (i < s.size()) {
    const char c = s[i];
    if (c == '"') {
      const size_t end = string_end(i);
      if (end == std::string::npos) return;  // the parser will say what
      if (depth == 1 && key_next) {
        key_next = false;
        const size_t colon = skip_space(end);
        const size_t value = skip_space(colon + 1);
        if (s.compare(i, end - i, "\"model\"") == 0 && colon < s.size() &&
            s[colon] == ':' && value < s.size() && s[value] == '"') {
          const size_t value_end = string_end(value);
          if (value_end == std::string::npos) return;
          json->replace(value, value_end - value,
                        absl::StrCat("{\"name\": ",
                                     s.substr(value, value_end - value), "}"));
          return;
        }
      }
      i = end;
      continue;
    }
    if (c == '{' || c == '[') {
      ++depth;
      key_next = c == '{' && depth == 1;
    } else if (c == '}' || c == ']') {
      --depth;
    } else if (c == ',' && depth == 1) {
      key_next = true;
    }
    ++i;
  }
}

}  // namespace

absl::StatusOr<v1::JobSpec> ParseJobSpec(absl::string_view json,
                                         absl::string_view origin) {
  v1::JobSpec spec;
  std::string text(json);
  ExpandModelShorthand(&text);
  absl::Status status = FromJson(text, &spec, origin);
  if (!status.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(status.message(),
                     " (the fields are listed in README.md, \"Job spec "
                     "reference\")"));
  }
  return spec;
}

absl::StatusOr<v1::JobSpec> LoadJobSpec(const std::string& path) {
  ASSIGN_OR_RETURN(std::string json, ReadFileToString(path));
  return ParseJobSpec(json, path);
}

absl::Status ApplyOverride(absl::string_view assignment, v1::JobSpec* spec) {
  size_t eq = assignment.find('=');
  if (eq == absl::string_view::npos || eq == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--set wants field=value (e.g. --set epochs=1), got '",
                     assignment, "'"));
  }
  std::string field(assignment.substr(0, eq));
  std::string text(assignment.substr(eq + 1));

  // Round-trip through a JSON Struct so dotted paths and every field type
  // work without a table of fields.
  Struct root;
  (void)FromJson(ToJson(*spec, JsonStyle::kCompact), &root, "the job spec");

  Value value;
  if (!FromJson(text, &value, "--set's value").ok()) {
    value.set_string_value(text);
  }
  std::vector<std::string> path = absl::StrSplit(field, '.');
  Struct* node = &root;
  for (size_t i = 0; i + 1 < path.size(); ++i) {
    Value& child = (*node->mutable_fields())[path[i]];
    if (child.kind_case() != Value::kStructValue) child.mutable_struct_value();
    node = child.mutable_struct_value();
  }
  (*node->mutable_fields())[path.back()] = value;
  // A built-in model and a TorchScript file exclude each other too.
  if (field == "model.name" || field == "model.torchscript") {
    node->mutable_fields()->erase(field == "model.name" ? "torchscript"
                                                        : "name");
  }
  // The two batch sizes exclude each other: setting one replaces the other.
  if (path.size() == 1 &&
      (field == "global_batch_size" || field == "per_replica_batch_size")) {
    node->mutable_fields()->erase(field == "global_batch_size"
                                      ? "per_replica_batch_size"
                                      : "global_batch_size");
  }

  std::string updated_json = ToJson(root, JsonStyle::kCompact);
  ExpandModelShorthand(&updated_json);  // --set model=cnn
  v1::JobSpec updated;
  RETURN_IF_ERROR(
      FromJson(updated_json, &updated, absl::StrCat("--set ", assignment)));
  *spec = updated;
  return absl::OkStatus();
}

void ApplyDefaults(v1::JobSpec* spec) {
  if (spec->name().empty()) spec->set_name("job");
  v1::ModelSpec* model = spec->mutable_model();
  if (model->name().empty() && model->torchscript().empty()) {
    model->set_name(spec->task().type() == "language_model" ? "gpt" : "mlp");
  }
  if (spec->precision().empty()) spec->set_precision("fp32");
  if (!spec->has_loss_scale()) spec->set_loss_scale(65536);
  if (!spec->has_loss_scale_growth_interval()) {
    spec->set_loss_scale_growth_interval(2000);
  }
  internal::ApplyWorkloadDefaults(spec);
  if (spec->epochs() == 0) spec->set_epochs(1);
  if (spec->lr_scaling().empty()) spec->set_lr_scaling("none");
  if (spec->lr_decay().empty()) spec->set_lr_decay("constant");
  if (!spec->has_lr_decay_rate()) spec->set_lr_decay_rate(0.1);
  v1::OptimizerSpec* opt = spec->mutable_optimizer();
  if (opt->type().empty()) opt->set_type("sgd");
  if (!opt->has_momentum()) opt->set_momentum(opt->type() == "sgd" ? 0.9 : 0);
  if (spec->base_lr() == 0)
    spec->set_base_lr(opt->type() == "sgd" ? 0.1 : 1e-3);
  v1::CommunicationSpec* comm = spec->mutable_communication();
  if (comm->backend().empty()) comm->set_backend("auto");
  if (comm->algorithm().empty()) comm->set_algorithm("direct");
  if (comm->compression().empty()) comm->set_compression("none");
  if (comm->bucket_mb() == 0) comm->set_bucket_mb(25);
  if (!comm->has_overlap()) comm->set_overlap(true);
  v1::CheckpointSpec* ckpt = spec->mutable_checkpoint();
  if (!ckpt->has_keep()) ckpt->set_keep(3);
  if (!ckpt->has_async()) ckpt->set_async(true);
  // Like Keras' BackupAndRestore: a backup_dir alone saves every epoch.
  if (!ckpt->backup_dir().empty() && ckpt->save_every_steps() == 0) {
    ckpt->set_save_every_epoch(true);
  }
}

std::optional<double> JobSpecFieldBound(absl::string_view path) {
  for (const FieldBound& bound : kFieldBounds) {
    if (path == bound.path) return bound.max;
  }
  return std::nullopt;
}

absl::StatusOr<BatchPlan> ResolveBatch(const v1::JobSpec& spec, int replicas) {
  if (replicas <= 0 || replicas > kMaxReplicas) {
    return absl::InvalidArgumentError(
        absl::StrCat("a job needs between 1 and ", kMaxReplicas,
                     " replicas, got ", replicas));
  }
  // Range checks first, so the 64-bit products below cannot overflow and
  // nothing divides by zero: at most 2^20 x 2^16 x 2^16.
  if (spec.accumulation_steps() < 0 ||
      spec.accumulation_steps() > kMaxAccumulationSteps) {
    return Invalid(
        absl::StrCat("accumulation_steps is ", spec.accumulation_steps(),
                     "; it must be in [0, ", kMaxAccumulationSteps, "]"));
  }
  const int64_t accumulation = std::max(1, spec.accumulation_steps());
  const int64_t parts = replicas * accumulation;
  int64_t global = 0;
  int64_t per_replica = 0;
  if (spec.has_per_replica_batch_size()) {
    per_replica = spec.per_replica_batch_size();
    if (per_replica < 1 || per_replica > kMaxPerReplicaBatch) {
      return Invalid(absl::StrCat("per_replica_batch_size is ", per_replica,
                                  "; it must be in [1, ", kMaxPerReplicaBatch,
                                  "]"));
    }
    global = per_replica * parts;
  } else {
    global = spec.global_batch_size();
    if (global < 1 || global > kMaxGlobalBatch) {
      return Invalid(absl::StrCat("global_batch_size is ", global,
                                  "; it must be in [1, ", kMaxGlobalBatch,
                                  "]"));
    }
    if (global % parts != 0) {
      const int64_t lower = global / parts * parts;
      const int64_t upper = lower + parts;
      std::string suggestion =
          lower > 0 ? absl::StrCat(lower, " or ", upper) : absl::StrCat(upper);
      return Invalid(absl::StrCat(
          "global_batch_size ", global, " does not divide by ", replicas,
          " replicas",
          accumulation > 1
              ? absl::StrCat(" x ", accumulation, " accumulation steps")
              : "",
          "; use a multiple of ", parts, " (e.g. ", suggestion,
          "), or set per_replica_batch_size instead"));
    }
    per_replica = global / parts;
  }
  if (global > kMaxGlobalBatch) {
    return Invalid(
        absl::StrCat("the global batch per_replica_batch_size x replicas x "
                     "accumulation_steps is ",
                     per_replica, " x ", replicas, " x ", accumulation, " = ",
                     global, "; at most ", kMaxGlobalBatch));
  }
  // Every value is now within [1, kMaxGlobalBatch]: it fits an int.
  return BatchPlan{replicas, static_cast<int>(per_replica),
                   static_cast<int>(global), static_cast<int>(accumulation)};
}

absl::StatusOr<BatchPlan> ResumeBatch(int global, int replicas,
                                      int accumulation,
                                      absl::string_view origin) {
  // `global` and `accumulation` come from a checkpoint: range-check them
  // before any product or division.
  if (global < 1 || global > kMaxGlobalBatch || accumulation < 0 ||
      accumulation > kMaxAccumulationSteps || replicas < 1 ||
      replicas > kMaxReplicas) {
    return absl::FailedPreconditionError(absl::StrCat(
        origin, " holds global batch ", global, " and ", accumulation,
        " accumulation steps for ", replicas,
        " replicas; a job needs a global batch in [1, ", kMaxGlobalBatch,
        "], at most ", kMaxAccumulationSteps, " accumulation steps and 1 to ",
        kMaxReplicas, " replicas"));
  }
  const int64_t steps = std::max(1, accumulation);
  if (global % (replicas * steps) == 0) {
    return BatchPlan{replicas, static_cast<int>(global / (replicas * steps)),
                     global, static_cast<int>(steps)};
  }
  // The world sizes near `replicas` the global batch divides by.
  std::vector<std::string> fits;
  for (int64_t w = 1; w * steps <= global && fits.size() < 4; ++w) {
    if (global % (w * steps) == 0 && w > replicas / 2) {
      fits.push_back(absl::StrCat(w));
    }
  }
  return absl::FailedPreconditionError(absl::StrCat(
      origin, " was trained with global batch ", global,
      ", which does not divide by ", replicas, " replicas",
      steps > 1 ? absl::StrCat(" x ", steps, " accumulation steps") : "",
      "; the resumed job keeps the global batch, so run it on a "
      "number of workers it divides by (e.g. ",
      absl::StrJoin(fits, ", "), ")"));
}

namespace {

// The model, the numeric precision and every field that names a choice.
absl::Status ValidateModelAndChoices(const v1::JobSpec& spec) {
  const v1::ModelSpec& model = spec.model();
  if (model.torchscript().empty()) {
    RETURN_IF_ERROR(CheckChoice("model.name", model.name(),
                                {"mlp", "cnn", "resnet", "gpt"}));
  } else if (!model.name().empty()) {
    return Invalid(absl::StrCat(
        "model.name \"", model.name(), "\" and model.torchscript \"",
        model.torchscript(), "\" are both set; give one of them"));
  }
  if (!(model.dropout() >= 0 && model.dropout() < 1)) {
    return Invalid(
        absl::StrCat("model.dropout must be in [0, 1), got ", model.dropout()));
  }
  RETURN_IF_ERROR(
      CheckChoice("precision", spec.precision(), {"fp32", "bf16", "fp16"}));
  if (!spec.export_format().empty()) {
    RETURN_IF_ERROR(CheckChoice("export_format", spec.export_format(),
                                {"archive", "torchscript", "state_dict"}));
    if (spec.export_path().empty()) {
      return Invalid(absl::StrCat("export_format \"", spec.export_format(),
                                  "\" needs export: the file to write"));
    }
  }
  if (!(spec.loss_scale() >= 1) || spec.loss_scale_growth_interval() < 1) {
    return Invalid(absl::StrCat(
        "loss_scale must be >= 1 and loss_scale_growth_interval >= 1, got ",
        spec.loss_scale(), " and ", spec.loss_scale_growth_interval()));
  }
  RETURN_IF_ERROR(
      CheckChoice("lr_scaling", spec.lr_scaling(), {"none", "linear", "sqrt"}));
  RETURN_IF_ERROR(CheckChoice("optimizer.type", spec.optimizer().type(),
                              {"sgd", "adam", "adamw"}));
  RETURN_IF_ERROR(CheckChoice("communication.backend",
                              spec.communication().backend(),
                              {"auto", "gloo", "nccl"}));
  RETURN_IF_ERROR(CheckChoice("communication.algorithm",
                              spec.communication().algorithm(),
                              {"direct", "ring", "auto"}));
  RETURN_IF_ERROR(CheckChoice("communication.compression",
                              spec.communication().compression(),
                              {"none", "bf16"}));
  if (spec.communication().backend() == "nccl" &&
      CompressesGradients(spec.communication())) {
    return Invalid(absl::StrCat(
        "communication.compression \"", spec.communication().compression(),
        "\" is a wire format of the Gloo all-reduce; NCCL has none: set "
        "communication.backend \"gloo\" or \"auto\", or compression "
        "\"none\""));
  }
  if (spec.reproducible() && spec.communication().algorithm() == "auto") {
    return Invalid(
        "communication.algorithm \"auto\" chooses by timing the network, "
        "and the algorithm decides the order of each gradient's sum: a "
        "reproducible job names \"direct\" or \"ring\"");
  }
  return absl::OkStatus();
}

// The bucket size, the batch (exactly one of global and per-replica) and
// the counts of epochs and workers.
absl::Status ValidateBatch(const v1::JobSpec& spec) {
  if (!(spec.communication().bucket_mb() > 0)) {
    return Invalid(
        absl::StrCat("communication.bucket_mb must be positive, got ",
                     spec.communication().bucket_mb()));
  }
  if (spec.has_global_batch_size() == spec.has_per_replica_batch_size()) {
    return Invalid(
        "set exactly one of global_batch_size and per_replica_batch_size "
        "(global = per_replica x replicas)");
  }
  if (spec.has_global_batch_size() && spec.global_batch_size() <= 0) {
    return Invalid(absl::StrCat("global_batch_size must be positive, got ",
                                spec.global_batch_size()));
  }
  if (spec.has_per_replica_batch_size() && spec.per_replica_batch_size() <= 0) {
    return Invalid(absl::StrCat("per_replica_batch_size must be positive, got ",
                                spec.per_replica_batch_size()));
  }
  if (spec.epochs() < 1) {
    return Invalid(
        absl::StrCat("epochs must be at least 1, got ", spec.epochs()));
  }
  if (spec.num_workers() < 0) {
    return Invalid(
        absl::StrCat("num_workers must be >= 0, got ", spec.num_workers()));
  }
  return absl::OkStatus();
}

// priority, priority_class and placement: what the scheduler reads
// (coordinator/scheduler.h). Errors: InvalidArgument.
absl::Status ValidateScheduling(const v1::JobSpec& spec) {
  if (spec.priority() < -kMaxPriority) {
    return Invalid(absl::StrCat("priority is ", spec.priority(), "; at least ",
                                -kMaxPriority));
  }
  if (spec.priority() != 0 && !spec.priority_class().empty()) {
    return Invalid("give priority or priority_class, not both");
  }
  if (spec.time_limit_seconds() < 0) {
    return Invalid(absl::StrCat("time_limit_seconds is ",
                                spec.time_limit_seconds(),
                                "; give the most seconds the job may run, or "
                                "0 for no limit"));
  }
  const std::string& device = spec.placement().device();
  if (!device.empty() && device != "cpu" && device != "cuda") {
    return Invalid(absl::StrCat("placement.device is \"", device,
                                "\"; give \"cpu\", \"cuda\" or nothing "
                                "(any device)"));
  }
  return CheckLabels("job spec: placement", spec.placement().labels());
}

}  // namespace

absl::Status ValidateJobSpec(const v1::JobSpec& spec, int replicas) {
  // Bounds and finiteness first: the rules below echo values, and compare
  // and multiply them.
  RETURN_IF_ERROR(CheckFieldBounds(spec, ""));
  RETURN_IF_ERROR(ValidateScheduling(spec));
  RETURN_IF_ERROR(ValidateModelAndChoices(spec));
  RETURN_IF_ERROR(internal::ValidateWorkload(spec));
  RETURN_IF_ERROR(ValidateBatch(spec));
  RETURN_IF_ERROR(internal::ValidateSchedule(spec));
  RETURN_IF_ERROR(internal::ValidateOptimizerAndCheckpoints(spec));
  if (replicas > 0) RETURN_IF_ERROR(ResolveBatch(spec, replicas).status());
  return absl::OkStatus();
}

bool CompressesGradients(const v1::CommunicationSpec& spec) {
  return !spec.compression().empty() && spec.compression() != "none";
}

std::string JobSpecToJson(const v1::JobSpec& spec) {
  return ToJson(spec, JsonStyle::kCompact);
}

}  // namespace lockstep
