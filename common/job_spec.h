// Job specs: JSON through the protobuf JSON mapping (unknown fields are
// rejected), `--set field=value` overrides, defaults, and the semantic rules
// of docs/DESIGN.md §4. README.md lists every field with its default and rule.
#ifndef LOCKSTEP_COMMON_JOB_SPEC_H_
#define LOCKSTEP_COMMON_JOB_SPEC_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "lockstep/v1/job.pb.h"

namespace lockstep {

inline constexpr char kDefaultDataDir[] = "/usr/share/datasets/fashion-mnist";

// Upper bounds far beyond any real job (README.md, "Job spec reference",
// lists every field's). They keep every product of sizes and counts well
// inside 64 bits, and the resolved batch sizes inside `int`.
inline constexpr int64_t kMaxReplicas = 65536;  // num/min/max_workers
inline constexpr int64_t kMaxAccumulationSteps = 65536;
inline constexpr int64_t kMaxPerReplicaBatch = 1 << 20;
inline constexpr int64_t kMaxGlobalBatch = 1 << 24;  // also the product
inline constexpr int64_t kMaxEpochs = 1000000;
inline constexpr int64_t kMaxRestarts = 10000;
// |priority|, and a --priority-class value.
inline constexpr int64_t kMaxPriority = 1000000;
// A year.
inline constexpr int64_t kMaxTimeLimitSeconds = 366 * 24 * 3600;
inline constexpr int64_t kMaxSteps = 1000000000000;  // int64 step counts
inline constexpr int64_t kMaxSteps32 = 1000000000;   // int32 step counts
inline constexpr int64_t kMaxJobNameBytes = 256;
inline constexpr int64_t kMaxPathBytes = 4096;
inline constexpr int64_t kMaxClasses = 1 << 24;  // also a vocabulary
inline constexpr int64_t kMaxBlockSize = 1 << 20;
inline constexpr int64_t kMaxColumnNameBytes = 64;
// A declared column: dimensions, and elements of one sample.
inline constexpr int kMaxColumnRank = 8;
inline constexpr int64_t kMaxSampleElements = int64_t{1} << 28;
inline constexpr int kMaxColumns = 64;
// data.columns (CSV): the names listed in all, and each name's bytes.
inline constexpr int64_t kMaxCsvColumnNames = 1 << 16;
inline constexpr int64_t kMaxCsvColumnNameBytes = 256;
// data.skip_corrupt: a data set with more damage needs repair, not skipping.
inline constexpr int64_t kMaxSkipCorrupt = 1000;

// The upper bound of the job spec field at `path` (dotted, proto field
// names: "communication.bucket_mb"): bytes for strings, the value for
// numbers (infinity where the field's whole range is valid, as for seed).
// nullopt for an unknown path or a message field.
std::optional<double> JobSpecFieldBound(absl::string_view path);

// Parses a job spec; the error names `origin` (a file name, say).
absl::StatusOr<v1::JobSpec> ParseJobSpec(absl::string_view json,
                                         absl::string_view origin = "job spec");
absl::StatusOr<v1::JobSpec> LoadJobSpec(const std::string& path);

// Applies one `field=value` override; `field` may be dotted
// (`optimizer.type=adam`). The value is taken as JSON when it parses as JSON
// (numbers, true/false, quoted strings, null to clear), else as a string.
// Setting global_batch_size or per_replica_batch_size clears the other.
absl::Status ApplyOverride(absl::string_view assignment, v1::JobSpec* spec);

// Fills every field the user left at zero/empty with its default.
void ApplyDefaults(v1::JobSpec* spec);

// How a job's batch splits over replicas.
struct BatchPlan {
  int replicas = 0;
  int per_replica = 0;   // one micro-batch of one replica
  int global = 0;        // per_replica x replicas x accumulation
  int accumulation = 1;  // micro-batches per optimizer step
  // The samples one replica trains on per optimizer step.
  int rank_batch() const { return per_replica * accumulation; }
};

// Errors: InvalidArgument when the global batch does not divide by
// `replicas` (the message names both numbers and suggests sizes), when a
// size is out of its range, or when the product per_replica x replicas x
// accumulation (computed in 64 bits) passes kMaxGlobalBatch. Never divides
// by zero, whatever the spec holds.
absl::StatusOr<BatchPlan> ResolveBatch(const v1::JobSpec& spec, int replicas);

// The split of a resumed job: the global batch it was trained with, over
// `replicas`. Errors: FailedPrecondition when it does not divide, naming
// `origin` (a checkpoint) and the world sizes that would work.
absl::StatusOr<BatchPlan> ResumeBatch(int global, int replicas,
                                      int accumulation,
                                      absl::string_view origin);

// Checks every rule of a spec with defaults applied: every float field
// (nested ones too, found by reflection) is finite, every field is within
// its JobSpecFieldBound, and the rules of README.md hold. `replicas` > 0
// also checks the batch split for that many replicas. Errors:
// InvalidArgument naming the field and its bound.
absl::Status ValidateJobSpec(const v1::JobSpec& spec, int replicas = 0);

// Whether the job sends its gradients in a 16-bit wire format
// (communication.compression other than "none"; empty, as in a job stored
// before the field existed, is "none"). Only the Gloo all-reduce has one.
bool CompressesGradients(const v1::CommunicationSpec& spec);

// JSON with the proto field names, for logs and `--json` output.
std::string JobSpecToJson(const v1::JobSpec& spec);

}  // namespace lockstep

#endif  // LOCKSTEP_COMMON_JOB_SPEC_H_
