// Whether finished runs computed the same function (run_comparison.h).
#include "common/run_comparison.h"

#include <google/protobuf/struct.pb.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/proto_json.h"

namespace lockstep {

int64_t HistoryStep(const v1::JobStatus& status, int index) {
  return index * std::max<int64_t>(1, status.loss_stride()) + 1;
}

std::optional<double> HistoryLr(const v1::JobStatus& status, int index) {
  if (status.step_lrs_size() != status.step_losses_size() || index < 0 ||
      index >= status.step_lrs_size() || std::isnan(status.step_lrs(index))) {
    return std::nullopt;
  }
  return status.step_lrs(index);
}

int GlobalBatch(const v1::JobStatus& status) {
  if (status.plan().global_batch_size() > 0) {
    return status.plan().global_batch_size();
  }
  const v1::JobSpec& spec = status.spec();
  return spec.has_global_batch_size()
             ? spec.global_batch_size()
             : spec.per_replica_batch_size() * std::max(1, status.world_size());
}

// What explains diverging curves: the runs differ in global batch, in
// lr_scaling, or in learning rate at the same global batch.
std::vector<std::string> CompareWarnings(
    const std::vector<v1::JobStatus>& jobs) {
  std::vector<std::string> warnings;
  std::set<int> globals;
  std::set<std::string> scalings;
  std::set<std::string> lrs;
  for (const v1::JobStatus& job : jobs) {
    globals.insert(GlobalBatch(job));
    scalings.insert(job.spec().lr_scaling());
    lrs.insert(absl::StrFormat("%.6g", job.plan().scaled_lr()));
  }
  auto list = [&](auto value) {
    std::vector<std::string> parts;
    for (const v1::JobStatus& job : jobs) {
      parts.push_back(absl::StrCat(job.job_id(), " ", value(job)));
    }
    return absl::StrJoin(parts, ", ");
  };
  if (globals.size() > 1) {
    warnings.push_back(absl::StrCat(
        "the runs differ in global batch (",
        list([](const v1::JobStatus& j) { return GlobalBatch(j); }),
        "): a step is not the same amount of data, so compare the curves by "
        "samples seen, and expect different results unless the learning "
        "rate is scaled (lr_scaling linear or sqrt)"));
  }
  if (scalings.size() > 1) {
    warnings.push_back(absl::StrCat(
        "the runs differ in lr_scaling (",
        list([](const v1::JobStatus& j) { return j.spec().lr_scaling(); }),
        "): their learning rates after scaling differ"));
  } else if (globals.size() == 1 && lrs.size() > 1) {
    warnings.push_back(absl::StrCat(
        "the runs have the same global batch but different learning rates (",
        list([](const v1::JobStatus& j) {
          return absl::StrFormat("%.6g", j.plan().scaled_lr());
        }),
        ")"));
  }
  return warnings;
}

namespace {

// Fields of a job spec that do not change the function a run computes:
// where and how it runs, saves and reports (the steps it trains are
// compared on their own, the schedule's length through the plan's total
// steps).
constexpr const char* kNotTheFunction[] = {"name",
                                           "num_workers",
                                           "per_replica_batch_size",
                                           "global_batch_size",
                                           "min_workers",
                                           "max_workers",
                                           "max_restarts",
                                           "communication",
                                           "checkpoint",
                                           "export_path",
                                           "export_format",
                                           "priority",
                                           "priority_class",
                                           "placement",
                                           "log_every_steps",
                                           "eval_every_steps",
                                           "eval_batches",
                                           "reproducible",
                                           "epochs",
                                           "max_steps"};

void Flatten(const google::protobuf::Struct& tree, const std::string& prefix,
             std::map<std::string, std::string>* out) {
  for (const auto& [key, value] : tree.fields()) {
    if (value.has_struct_value() && !value.struct_value().fields().empty()) {
      Flatten(value.struct_value(), prefix + key + ".", out);
    } else {
      (*out)[prefix + key] = ToJson(value, JsonStyle::kCompact);
    }
  }
}

}  // namespace

std::map<std::string, std::string> FunctionSettings(const v1::JobStatus& job) {
  google::protobuf::Struct tree;
  (void)FromJson(ToJson(job.spec(), JsonStyle::kCompact), &tree,
                 "the job spec");
  for (const char* name : kNotTheFunction) tree.mutable_fields()->erase(name);
  std::map<std::string, std::string> flat;
  Flatten(tree, "", &flat);
  const std::string& compression = job.spec().communication().compression();
  flat["communication.compression"] =
      absl::StrCat("\"", compression.empty() ? "none" : compression, "\"");
  flat["global batch"] = absl::StrCat(GlobalBatch(job));
  flat["scaled LR"] = absl::StrFormat("%.6g", job.plan().scaled_lr());
  flat["total steps"] = absl::StrCat(job.plan().total_steps());
  return flat;
}

namespace {

// The largest difference of two loss histories over their common steps,
// and how many steps they share.
std::pair<double, int> LossGap(const v1::JobStatus& a, const v1::JobStatus& b) {
  std::map<int64_t, float> losses;
  for (int i = 0; i < a.step_losses_size(); ++i) {
    losses[HistoryStep(a, i)] = a.step_losses(i);
  }
  double gap = 0;
  int common = 0;
  for (int i = 0; i < b.step_losses_size(); ++i) {
    auto it = losses.find(HistoryStep(b, i));
    if (it == losses.end()) continue;
    gap = std::max(gap, std::abs(static_cast<double>(it->second) -
                                 static_cast<double>(b.step_losses(i))));
    ++common;
  }
  return {gap, common};
}

}  // namespace

RunVerdict CompareRuns(const v1::JobStatus& a, const v1::JobStatus& b) {
  const std::string names = absl::StrCat(a.job_id(), " and ", b.job_id());
  const int wa = a.plan().replicas(), wb = b.plan().replicas();
  const std::string workers = wa != wb
                                  ? absl::StrCat(wa, " and ", wb, " workers")
                                  : absl::StrCat(wa, " workers each");
  const std::string da =
      a.ranks_size() > 0 ? a.ranks(0).model_digest() : std::string();
  const std::string db =
      b.ranks_size() > 0 ? b.ranks(0).model_digest() : std::string();
  if (da.empty() || db.empty()) {
    return {false, absl::StrCat(names, ": cannot tell yet: ",
                                da.empty() ? a.job_id() : b.job_id(),
                                " has no final model digest (it has not "
                                "succeeded)")};
  }
  std::vector<std::string> differs;
  if (a.step() != b.step()) {
    differs.push_back(
        absl::StrCat("steps trained (", a.step(), " vs ", b.step(), ")"));
  }
  std::map<std::string, std::string> sa = FunctionSettings(a),
                                     sb = FunctionSettings(b);
  std::set<std::string> fields;
  for (const auto& [name, value] : sa) fields.insert(name);
  for (const auto& [name, value] : sb) fields.insert(name);
  for (const std::string& name : fields) {
    auto value = [&name](const std::map<std::string, std::string>& s) {
      auto it = s.find(name);
      return it == s.end() ? std::string("unset") : it->second;
    };
    if (value(sa) != value(sb)) {
      differs.push_back(
          absl::StrCat(name, " (", value(sa), " vs ", value(sb), ")"));
    }
  }
  if (!differs.empty()) {
    return {false,
            absl::StrCat(names, ": different functions: ",
                         absl::StrJoin(differs, "; "), " (on ", workers, ")")};
  }
  if (da == db) {
    return {true, absl::StrCat(names,
                               ": same function, bit-identical: the same "
                               "model (digest ",
                               da.substr(0, 16), ") after ", a.step(),
                               " steps on ", workers)};
  }
  const auto [gap, common] = LossGap(a, b);
  if (wa != wb) {
    return {
        true,
        absl::StrFormat(
            "%s: same function on %s: the same seed, global batch and "
            "settings; the models differ only by the floating-point "
            "order of the gradient sum across world sizes (digests %s vs "
            "%s), the losses by at most %.3g over %d common steps",
            names, workers, da.substr(0, 16), db.substr(0, 16), gap, common)};
  }
  const char* cause =
      a.spec().reproducible() && b.spec().reproducible()
          ? "although both ran with reproducible: true; report it"
          : "replicas on different CPU kernels? Set reproducible: true";
  return {false,
          absl::StrFormat("%s: the same settings on %s, yet different models "
                          "(digests %s vs %s; losses up to %.3g apart): %s",
                          names, workers, da.substr(0, 16), db.substr(0, 16),
                          gap, cause)};
}

std::vector<RunVerdict> CompareAllRuns(const std::vector<v1::JobStatus>& jobs) {
  std::vector<RunVerdict> verdicts;
  for (size_t i = 0; i < jobs.size(); ++i) {
    for (size_t j = i + 1; j < jobs.size(); ++j) {
      verdicts.push_back(CompareRuns(jobs[i], jobs[j]));
    }
  }
  return verdicts;
}

}  // namespace lockstep
