// TF_CONFIG: the cluster description TensorFlow and Kubeflow's TFJob use,
//   {"cluster": {"chief": ["h:p"], "worker": ["h:p", ...]},
//    "task": {"type": "worker", "index": 0}}
// plus lockstep's "spare" task type: hot spares, which train only in place
// of a failed chief or worker (TensorFlow accepts any job name).
// Parsed and validated with TensorFlow's rules, stricter where TensorFlow is
// silent: known task types only, at most one chief and one evaluator, every
// address non-empty, the task present in the cluster with its index in range.
#ifndef LOCKSTEP_COMMON_TF_CONFIG_H_
#define LOCKSTEP_COMMON_TF_CONFIG_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "lockstep/v1/cluster.pb.h"

namespace lockstep {

struct TfConfig {
  v1::ClusterSpec cluster;
  // Absent when the TF_CONFIG names no task (a coordinator's view).
  std::optional<v1::TaskId> task;
};

// Parses and validates a TF_CONFIG JSON document. Errors are InvalidArgument
// and say which rule was broken and how to fix it.
absl::StatusOr<TfConfig> ParseTfConfig(absl::string_view json);

// Reads TF_CONFIG from `json_or_path`: a JSON document, or a file holding one.
absl::StatusOr<TfConfig> LoadTfConfig(const std::string& json_or_path);

absl::Status ValidateCluster(const v1::ClusterSpec& cluster);

// The tasks that train, in rank order: the chief first (the `chief` task if
// there is one, else worker 0), then the workers by index.
std::vector<v1::TaskId> TrainingTasks(const v1::ClusterSpec& cluster);

// Rank of `task` in TrainingTasks(cluster); NotFound if it does not train.
// A "spare" task has no rank of its own (IsSpareTask).
absl::StatusOr<int> RankOf(const v1::ClusterSpec& cluster,
                           const v1::TaskId& task);

// Whether `task` is one of the cluster's "spare" tasks (index in range).
bool IsSpareTask(const v1::ClusterSpec& cluster, const v1::TaskId& task);

// "worker:1".
std::string TaskName(const v1::TaskId& task);

// The address of `task` in `cluster`, or "" when it has none.
std::string TaskAddress(const v1::ClusterSpec& cluster, const v1::TaskId& task);

// Compact JSON-like text for error messages: {chief:[a],worker:[b,c]}.
std::string DescribeCluster(const v1::ClusterSpec& cluster);

bool SameCluster(const v1::ClusterSpec& a, const v1::ClusterSpec& b);

}  // namespace lockstep

#endif  // LOCKSTEP_COMMON_TF_CONFIG_H_
