// The `lockstep` commands that show training curves: metrics (one job's, as
// CSV or JSON) and compare (several jobs', as a table and an SVG plot).
#include <google/protobuf/struct.pb.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/commands.h"
#include "client/svg_plot.h"
#include "client/views.h"
#include "common/proto_json.h"
#include "common/terminal_text.h"

namespace lockstep::client {
namespace {

constexpr char kMetricsUsage[] = R"(Usage: lockstep metrics JOB [--csv | --json]

Exports the job's training curve: the global mean loss of every step with
the samples seen so far, and the test-set evaluations. CSV (the default):
  step,samples_seen,loss,test_accuracy,test_loss
with the test columns filled at the steps where the test set was evaluated.
--json gives {"job_id", "plan", "steps": [{step, samples_seen, loss}],
"evals": [{step, epoch, test_accuracy, test_loss, time}]}.

Examples:
  lockstep metrics fashion-mnist-cnn-3 --csv > cnn.csv
  lockstep metrics fashion-mnist-cnn-3 --json
)";

constexpr char kCompareUsage[] =
    R"(Usage: lockstep compare JOB_A JOB_B ... [--svg FILE] [--json]

Compares runs of a job across configurations: a table of replicas,
per-replica batch, global batch, learning rate after scaling, steps per
epoch, steps trained, final loss, test accuracy and samples/s; for each
pair of runs whether they computed the same function (the same seed,
global batch and settings for the same steps: bit-identical on one world
size; across world sizes the digests differ by the floating-point order of
the gradient sum, and the largest gap between the loss curves is given) or
what differs; and an SVG plot of the loss curves by step and by samples
seen, and of the test loss at each evaluation (open it in a browser).
It warns when the runs differ in global batch or learning-rate scaling:
that, not the number of workers, is what makes curves diverge.

Flags:
  --svg FILE   where to write the plot (default lockstep-compare.svg)
  --json       the table, the verdicts and the warnings as JSON; the plot is
               still written

Example:
  lockstep compare mlp-1w-1 mlp-2w-2 --svg scaling.svg
)";

// `lockstep metrics --json`: the plan, every step's loss, every evaluation.
std::string MetricsJson(const v1::JobStatus& status) {
  const int global = GlobalBatch(status);
  google::protobuf::Struct out;
  auto& f = *out.mutable_fields();
  f["job_id"].set_string_value(status.job_id());
  google::protobuf::Value plan;
  (void)FromJson(ToJson(status.plan()), &plan, "the plan");
  f["plan"] = plan;
  auto* steps = f["steps"].mutable_list_value();
  for (int i = 0; i < status.step_losses_size(); ++i) {
    auto& row = *steps->add_values()->mutable_struct_value()->mutable_fields();
    const double step = static_cast<double>(HistoryStep(status, i));
    row["step"].set_number_value(step);
    row["samples_seen"].set_number_value(step * global);
    row["loss"].set_number_value(status.step_losses(i));
    if (const std::optional<double> lr = HistoryLr(status, i)) {
      row["lr"].set_number_value(*lr);
    }
  }
  auto* evals = f["evals"].mutable_list_value();
  for (const v1::EvalPoint& eval : status.evals()) {
    auto& row = *evals->add_values()->mutable_struct_value()->mutable_fields();
    row["step"].set_number_value(static_cast<double>(eval.step()));
    row["epoch"].set_number_value(eval.epoch() + 1);
    if (eval.metrics().empty() || eval.metrics().contains("test_accuracy")) {
      row["test_accuracy"].set_number_value(eval.test_accuracy());
    }
    row["test_loss"].set_number_value(eval.test_loss());
    for (const auto& [name, value] : eval.metrics()) {
      row[name].set_number_value(value);
    }
    if (eval.samples() > 0) {
      row["samples"].set_number_value(static_cast<double>(eval.samples()));
    }
    row["time"].set_number_value(eval.time());
  }
  return ToJson(out);
}

// `lockstep metrics --csv`: one row per step of the loss history (every
// step's until 2^20, then every loss_stride-th) with the learning rate the
// workers reported for it, the test columns filled at the steps where the
// test set was evaluated; an evaluation at a step the history thinned out
// gets its own row with an empty loss and learning rate.
void PrintMetricsCsv(const v1::JobStatus& status) {
  const int global = GlobalBatch(status);
  std::map<int64_t, const v1::EvalPoint*> evals;
  for (const v1::EvalPoint& eval : status.evals()) evals[eval.step()] = &eval;
  auto row = [&](int64_t step, std::string loss_and_lr,
                 const v1::EvalPoint* eval) {
    std::cout << step << "," << step * global << "," << loss_and_lr;
    if (eval != nullptr) {
      std::cout << absl::StrFormat(",%.6f,%.6f", eval->test_accuracy(),
                                   eval->test_loss());
    } else {
      std::cout << ",,";
    }
    std::cout << "\n";
  };
  std::cout << "step,samples_seen,loss,lr,test_accuracy,test_loss\n";
  auto next_eval = evals.begin();
  for (int i = 0; i < status.step_losses_size(); ++i) {
    const int64_t step = HistoryStep(status, i);
    for (; next_eval != evals.end() && next_eval->first < step; ++next_eval) {
      row(next_eval->first, ",", next_eval->second);
    }
    const v1::EvalPoint* eval = nullptr;
    if (next_eval != evals.end() && next_eval->first == step) {
      eval = next_eval->second;
      ++next_eval;
    }
    const std::optional<double> lr = HistoryLr(status, i);
    row(step,
        absl::StrFormat("%.9g,%s", status.step_losses(i),
                        lr ? absl::StrFormat("%.9g", *lr) : ""),
        eval);
  }
  for (; next_eval != evals.end(); ++next_eval) {
    row(next_eval->first, ",", next_eval->second);
  }
  std::cout.flush();
}

// Writes the loss curves of `jobs`, by step and by samples seen, to
// `svg_path`. Errors: FailedPrecondition when the file cannot be written.
absl::Status WriteComparePlot(const std::vector<v1::JobStatus>& jobs,
                              const std::string& svg_path) {
  std::vector<Curve> by_step, by_samples, evaluations;
  for (const v1::JobStatus& job : jobs) {
    const std::string label =
        absl::StrCat(job.job_id(), " (", job.plan().replicas(), "x",
                     job.plan().per_replica_batch_size(), ")");
    Curve step{label, {}, {}}, samples{label, {}, {}};
    for (int i = 0; i < job.step_losses_size(); ++i) {
      const double at = static_cast<double>(HistoryStep(job, i));
      step.x.push_back(at);
      step.y.push_back(job.step_losses(i));
      samples.x.push_back(at * GlobalBatch(job));
      samples.y.push_back(job.step_losses(i));
    }
    by_step.push_back(std::move(step));
    by_samples.push_back(std::move(samples));
    // Every evaluation: after each epoch, at the end, and eval_every_steps.
    Curve test{label, {}, {}};
    for (const v1::EvalPoint& eval : job.evals()) {
      test.x.push_back(static_cast<double>(eval.step()));
      test.y.push_back(eval.test_loss());
    }
    evaluations.push_back(std::move(test));
  }
  std::ofstream out(svg_path);
  out << PlotSvg({{"training loss by step", "optimizer step"},
                  {"training loss by samples seen", "samples seen"},
                  {"test loss at each evaluation", "optimizer step"}},
                 {by_step, by_samples, evaluations});
  if (!out) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot write the plot to ", svg_path));
  }
  return absl::OkStatus();
}

// `lockstep compare --json`: the table, the warnings and the plot's path.
std::string CompareJson(const std::vector<v1::JobStatus>& jobs,
                        const std::vector<std::string>& warnings,
                        const std::vector<RunVerdict>& verdicts,
                        const std::string& svg_path) {
  google::protobuf::Struct out;
  auto& f = *out.mutable_fields();
  auto* rows = f["jobs"].mutable_list_value();
  for (const v1::JobStatus& job : jobs) {
    auto& r = *rows->add_values()->mutable_struct_value()->mutable_fields();
    r["job_id"].set_string_value(job.job_id());
    r["state"].set_string_value(StateName(job.state()));
    r["replicas"].set_number_value(job.plan().replicas());
    r["per_replica_batch_size"].set_number_value(
        job.plan().per_replica_batch_size());
    r["global_batch_size"].set_number_value(GlobalBatch(job));
    r["lr_scaling"].set_string_value(job.spec().lr_scaling());
    r["scaled_lr"].set_number_value(job.plan().scaled_lr());
    r["steps_per_epoch"].set_number_value(job.plan().steps_per_epoch());
    r["steps"].set_number_value(static_cast<double>(job.step()));
    r["final_loss"].set_number_value(job.loss());
    if (job.has_test_accuracy()) {
      r["test_accuracy"].set_number_value(job.test_accuracy());
    }
    if (job.has_test_loss()) r["test_loss"].set_number_value(job.test_loss());
    for (const auto& [name, value] : job.test_metrics()) {
      r[name].set_number_value(value);
    }
    r["samples_per_second"].set_number_value(job.samples_per_second());
    if (job.tokens_per_second() > 0) {
      r["tokens_per_second"].set_number_value(job.tokens_per_second());
    }
  }
  auto* warned = f["warnings"].mutable_list_value();
  for (const std::string& w : warnings) {
    warned->add_values()->set_string_value(w);
  }
  auto* judged = f["verdicts"].mutable_list_value();
  for (const RunVerdict& v : verdicts) {
    auto& r = *judged->add_values()->mutable_struct_value()->mutable_fields();
    r["same_function"].set_bool_value(v.same_function);
    r["text"].set_string_value(v.text);
  }
  f["svg"].set_string_value(svg_path);
  return ToJson(out);
}

}  // namespace

int RunMetrics(const std::vector<std::string>& argv) {
  int exit = kExitOk;
  auto call = Begin(argv, {}, {"csv", "json"}, kMetricsUsage, 1, 1, &exit);
  if (!call) return exit;
  if (call->args.Has("csv") && call->args.Has("json")) {
    return Fail(absl::InvalidArgumentError(
        "lockstep metrics takes --csv or --json, not both"));
  }
  auto status = GetJob(*call, call->args.positional()[0], /*history=*/true);
  if (!status.ok()) return Fail(status.status());
  if (call->args.Has("json")) {
    std::cout << MetricsJson(*status) << std::endl;
    return kExitOk;
  }
  PrintMetricsCsv(*status);
  return kExitOk;
}

int RunCompare(const std::vector<std::string>& argv) {
  int exit = kExitOk;
  auto call = Begin(argv, {"svg"}, {"json"}, kCompareUsage, 2, 16, &exit);
  if (!call) return exit;
  std::vector<v1::JobStatus> jobs;
  for (const std::string& id : call->args.positional()) {
    auto status = GetJob(*call, id, /*history=*/true);
    if (!status.ok()) return Fail(status.status());
    jobs.push_back(*std::move(status));
  }
  // The verdicts and warnings are the coordinator's (CompareJobs): one
  // implementation for the CLI and Python (common/run_comparison.h).
  v1::CompareJobsRequest request;
  for (const std::string& id : call->args.positional()) {
    request.add_job_ids(id);
  }
  v1::CompareJobsResponse compared;
  grpc::ClientContext context;
  SetDeadline(&context, 60);
  grpc::Status rpc = call->stub->CompareJobs(&context, request, &compared);
  if (!rpc.ok()) return Fail(RpcError(rpc, call->address));
  const std::vector<std::string> warnings(compared.warnings().begin(),
                                          compared.warnings().end());
  std::vector<RunVerdict> verdicts;
  for (const auto& verdict : compared.verdicts()) {
    verdicts.push_back({verdict.same_function(), verdict.text()});
  }
  const std::string svg_path = call->args.Get("svg", "lockstep-compare.svg");
  absl::Status plotted = WriteComparePlot(jobs, svg_path);
  if (!plotted.ok()) return Fail(plotted);

  if (call->args.Has("json")) {
    std::cout << CompareJson(jobs, warnings, verdicts, svg_path) << std::endl;
    return kExitOk;
  }
  std::cout << absl::StrFormat(
      "%-24s %8s %11s %7s %10s %10s %7s %10s %-22s %10s\n", "JOB", "REPLICAS",
      "PER-REPLICA", "GLOBAL", "LR", "STEPS/EP", "STEPS", "LOSS", "TEST",
      "SAMPLES/S");
  for (const v1::JobStatus& job : jobs) {
    const std::string metrics = MetricsText(job);
    std::cout << TerminalSafe(absl::StrFormat(
        "%-24s %8d %11d %7d %10.4g %10d %7d %10.4f %-22s %10.0f\n",
        job.job_id(), job.plan().replicas(),
        job.plan().per_replica_batch_size(), GlobalBatch(job),
        job.plan().scaled_lr(), job.plan().steps_per_epoch(), job.step(),
        job.loss(), metrics.empty() ? "-" : metrics, job.samples_per_second()));
  }
  for (const RunVerdict& v : verdicts) {
    std::cout << TerminalSafe(v.text) << "\n";
  }
  for (const std::string& w : warnings) {
    std::cerr << "lockstep: warning: " << TerminalSafe(w) << "\n";
  }
  std::cout << "loss curves: " << svg_path << " (open it in a browser)"
            << std::endl;
  return kExitOk;
}

}  // namespace lockstep::client
