// Parsing and validating TF_CONFIG, and the ranks, names and addresses of a
// cluster's tasks (tf_config.h).
#include "common/tf_config.h"

#include <google/protobuf/struct.pb.h>

#include <algorithm>
#include <cmath>
#include <map>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/files.h"
#include "common/proto_json.h"
#include "common/status_macros.h"

namespace lockstep {
namespace {

using google::protobuf::Struct;
using google::protobuf::Value;

// "spare" is lockstep's own: hot spares that take a failed rank
// (docs/DESIGN.md §3). TensorFlow accepts any job name, so TF_CONFIG with
// spares stays valid for it.
constexpr const char* kKnownTypes[] = {"chief", "worker", "ps", "evaluator",
                                       "spare"};

bool IsKnownType(const std::string& type) {
  return std::find(std::begin(kKnownTypes), std::end(kKnownTypes), type) !=
         std::end(kKnownTypes);
}

absl::Status Invalid(absl::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat("TF_CONFIG: ", message));
}

absl::StatusOr<v1::ClusterSpec> ParseCluster(const Value& value) {
  if (value.kind_case() != Value::kStructValue) {
    return Invalid(
        "\"cluster\" must be an object mapping task types to address lists");
  }
  v1::ClusterSpec cluster;
  for (const auto& [type, tasks] : value.struct_value().fields()) {
    if (tasks.kind_case() != Value::kListValue) {
      return Invalid(absl::StrCat("cluster.", type,
                                  " must be a list of \"host:port\" strings"));
    }
    v1::TaskList& list = (*cluster.mutable_tasks())[type];
    for (const Value& address : tasks.list_value().values()) {
      if (address.kind_case() != Value::kStringValue) {
        return Invalid(absl::StrCat(
            "cluster.", type, " must be a list of \"host:port\" strings"));
      }
      list.add_addresses(address.string_value());
    }
  }
  return cluster;
}

absl::StatusOr<v1::TaskId> ParseTask(const Value& value) {
  if (value.kind_case() != Value::kStructValue) {
    return Invalid(
        "\"task\" must be an object like {\"type\": \"worker\", \"index\": 0}");
  }
  const auto& fields = value.struct_value().fields();
  for (const auto& [name, unused] : fields) {
    if (name != "type" && name != "index" && name != "trial") {
      return Invalid(absl::StrCat("unknown field task.", name,
                                  "; a task has \"type\" and \"index\""));
    }
  }
  auto type = fields.find("type");
  if (type == fields.end() || type->second.kind_case() != Value::kStringValue) {
    return Invalid("task.type is missing or not a string");
  }
  v1::TaskId task;
  task.set_type(type->second.string_value());
  auto index = fields.find("index");
  if (index != fields.end()) {
    double number = -1;
    if (index->second.kind_case() == Value::kNumberValue) {
      number = index->second.number_value();
    } else if (index->second.kind_case() == Value::kStringValue) {
      // Kubeflow has been seen to render the index as a string.
      if (!absl::SimpleAtod(index->second.string_value(), &number)) number = -1;
    }
    if (number < 0 || number != std::floor(number) || number > 1e6) {
      return Invalid("task.index must be a non-negative integer");
    }
    task.set_index(static_cast<int>(number));
  }
  return task;
}

}  // namespace

absl::Status ValidateCluster(const v1::ClusterSpec& cluster) {
  if (cluster.tasks().empty()) return Invalid("the cluster has no tasks");
  for (const auto& [type, list] : cluster.tasks()) {
    if (!IsKnownType(type)) {
      return Invalid(absl::StrCat("unknown task type \"", type,
                                  "\"; known types are chief, worker, ps, "
                                  "evaluator, spare"));
    }
    if ((type == "chief" || type == "evaluator") && list.addresses_size() > 1) {
      return Invalid(absl::StrCat("there can be at most one ", type,
                                  " task, found ", list.addresses_size()));
    }
    for (int i = 0; i < list.addresses_size(); ++i) {
      const std::string& address = list.addresses(i);
      size_t colon = address.rfind(':');
      if (address.empty() || colon == std::string::npos || colon == 0 ||
          colon + 1 == address.size()) {
        return Invalid(absl::StrCat("address of ", type, ":", i, " is \"",
                                    address, "\"; expected \"host:port\""));
      }
    }
  }
  if (TrainingTasks(cluster).empty()) {
    return Invalid("the cluster has no chief or worker task to train on");
  }
  return absl::OkStatus();
}

absl::StatusOr<TfConfig> ParseTfConfig(absl::string_view json) {
  Struct root;
  absl::Status parsed = FromJson(json, &root, "not valid JSON");
  if (!parsed.ok()) return Invalid(parsed.message());
  TfConfig config;
  bool has_cluster = false;
  for (const auto& [name, value] : root.fields()) {
    if (name == "cluster") {
      ASSIGN_OR_RETURN(config.cluster, ParseCluster(value));
      has_cluster = true;
    } else if (name == "task") {
      ASSIGN_OR_RETURN(config.task, ParseTask(value));
    } else if (name != "environment" && name != "rpc_layer") {
      return Invalid(absl::StrCat("unknown top-level field \"", name,
                                  "\"; expected cluster and task"));
    }
  }
  if (!has_cluster) return Invalid("\"cluster\" is missing");
  RETURN_IF_ERROR(ValidateCluster(config.cluster));
  if (config.task.has_value()) {
    const v1::TaskId& task = *config.task;
    if (!IsKnownType(task.type())) {
      return Invalid(absl::StrCat("task.type \"", task.type(),
                                  "\" is unknown; known types are chief, "
                                  "worker, ps, evaluator, spare"));
    }
    auto it = config.cluster.tasks().find(task.type());
    int count =
        it == config.cluster.tasks().end() ? 0 : it->second.addresses_size();
    if (task.index() >= count) {
      return Invalid(absl::StrCat("task ", TaskName(task),
                                  " is out of range: the cluster has ", count,
                                  " ", task.type(), " task(s)"));
    }
  }
  return config;
}

absl::StatusOr<TfConfig> LoadTfConfig(const std::string& json_or_path) {
  std::string text = json_or_path;
  size_t first = text.find_first_not_of(" \t\r\n");
  if (first == std::string::npos || text[first] != '{') {
    ASSIGN_OR_RETURN(text, ReadFileToString(json_or_path));
  }
  return ParseTfConfig(text);
}

std::vector<v1::TaskId> TrainingTasks(const v1::ClusterSpec& cluster) {
  std::vector<v1::TaskId> tasks;
  auto add_all = [&](const std::string& type) {
    auto it = cluster.tasks().find(type);
    if (it == cluster.tasks().end()) return;
    for (int i = 0; i < it->second.addresses_size(); ++i) {
      v1::TaskId task;
      task.set_type(type);
      task.set_index(i);
      tasks.push_back(task);
    }
  };
  add_all("chief");
  add_all("worker");
  return tasks;
}

bool IsSpareTask(const v1::ClusterSpec& cluster, const v1::TaskId& task) {
  auto it = cluster.tasks().find("spare");
  return task.type() == "spare" && it != cluster.tasks().end() &&
         task.index() >= 0 && task.index() < it->second.addresses_size();
}

absl::StatusOr<int> RankOf(const v1::ClusterSpec& cluster,
                           const v1::TaskId& task) {
  std::vector<v1::TaskId> tasks = TrainingTasks(cluster);
  for (size_t rank = 0; rank < tasks.size(); ++rank) {
    if (tasks[rank].type() == task.type() &&
        tasks[rank].index() == task.index()) {
      return static_cast<int>(rank);
    }
  }
  return absl::NotFoundError(absl::StrCat(
      "task ", TaskName(task), " is not a training task of cluster ",
      DescribeCluster(cluster), "; lockstep trains on chief and worker tasks"));
}

std::string TaskName(const v1::TaskId& task) {
  return absl::StrCat(task.type(), ":", task.index());
}

std::string TaskAddress(const v1::ClusterSpec& cluster,
                        const v1::TaskId& task) {
  auto it = cluster.tasks().find(task.type());
  if (it == cluster.tasks().end() || task.index() < 0 ||
      task.index() >= it->second.addresses_size()) {
    return "";
  }
  return it->second.addresses(task.index());
}

std::string DescribeCluster(const v1::ClusterSpec& cluster) {
  std::map<std::string, std::string> sorted;
  for (const auto& [type, list] : cluster.tasks()) {
    sorted[type] =
        absl::StrCat(type, ":[", absl::StrJoin(list.addresses(), ","), "]");
  }
  std::vector<std::string> parts;
  for (const auto& [type, text] : sorted) parts.push_back(text);
  return absl::StrCat("{", absl::StrJoin(parts, ","), "}");
}

bool SameCluster(const v1::ClusterSpec& a, const v1::ClusterSpec& b) {
  return DescribeCluster(a) == DescribeCluster(b);
}

}  // namespace lockstep
