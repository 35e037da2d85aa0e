// The live progress view and the `watch`, `metrics` and `compare` commands
// that show a job (views.h; compare's plot is svg_plot.cc).
#include "client/views.h"

#include <google/protobuf/struct.pb.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iostream>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/commands.h"
#include "client/svg_plot.h"
#include "common/job_state.h"
#include "common/proto_json.h"
#include "common/terminal_text.h"

namespace lockstep::client {
namespace {

constexpr char kWatchUsage[] = R"(Usage: lockstep watch JOB [--json]

Follows a job until it ends. On a terminal, a progress bar for the current
epoch is redrawn in place: steps, loss, test accuracy, samples/s, time left
(ETA) and generation; each evaluation and each event (a failed worker, a
resume, a checkpoint) is printed on a line of its own. Piped or redirected,
it prints plain lines instead. Exits 0 if the job succeeded, 1 otherwise.

Flags:
  --json   one JSON object (the job's status) per line, at each change

Examples:
  lockstep watch fashion-mnist-cnn-3
  lockstep watch fashion-mnist-cnn-3 --json | jq .step
)";

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
epoch, steps trained, final loss, test accuracy and samples/s, and an SVG
plot of the loss curves by step and by samples seen (open it in a browser).
It warns when the runs differ in global batch or learning-rate scaling:
that, not the number of workers, is what makes curves diverge.

Flags:
  --svg FILE   where to write the plot (default lockstep-compare.svg)
  --json       the table and the warnings as JSON; the plot is still written

Example:
  lockstep compare mlp-1w-1 mlp-2w-2 --svg scaling.svg
)";

std::string FormatDuration(double seconds) {
  if (!(seconds >= 0) || seconds > 359999) return "--:--";
  int64_t s = static_cast<int64_t>(seconds + 0.5);
  if (s >= 3600) {
    return absl::StrFormat("%d:%02d:%02d", s / 3600, s / 60 % 60, s % 60);
  }
  return absl::StrFormat("%d:%02d", s / 60, s % 60);
}

int64_t StepsPerEpoch(const v1::JobStatus& status) {
  if (status.plan().steps_per_epoch() > 0)
    return status.plan().steps_per_epoch();
  int epochs = std::max(1, status.spec().epochs());
  return std::max<int64_t>(1, status.total_steps() / epochs);
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

std::string EventLine(const v1::JobEvent& event) {
  return absl::StrCat("gen ", event.generation(), "  ", event.kind(),
                      event.message().empty() ? "" : ": ", event.message());
}

std::string EvalLine(const v1::JobStatus& status, const v1::EvalPoint& eval) {
  return absl::StrFormat(
      "%s  epoch %d/%d done at step %d: test accuracy %.2f%%, test loss %.4f",
      status.job_id(), eval.epoch() + 1, status.spec().epochs(), eval.step(),
      100 * eval.test_accuracy(), eval.test_loss());
}

}  // namespace

std::string ProgressBar(const v1::JobStatus& status) {
  if (status.state() != v1::JOB_STATE_RUNNING || status.total_steps() == 0) {
    return FormatProgress(status);
  }
  const int64_t per_epoch = StepsPerEpoch(status);
  const int64_t epoch_start = static_cast<int64_t>(status.epoch()) * per_epoch;
  const int64_t in_epoch =
      std::clamp<int64_t>(status.step() - epoch_start, 0, per_epoch);
  constexpr int kWidth = 20;
  const int filled = static_cast<int>(kWidth * in_epoch / per_epoch);
  std::string bar =
      std::string(filled, '#') + std::string(kWidth - filled, '-');
  const double left_samples =
      static_cast<double>(status.total_steps() - status.step()) *
      GlobalBatch(status);
  const double eta = status.samples_per_second() > 0
                         ? left_samples / status.samples_per_second()
                         : -1;
  std::string line = absl::StrFormat("epoch %d/%d [%s] %d/%d  loss %.4f",
                                     status.epoch() + 1, status.spec().epochs(),
                                     bar, in_epoch, per_epoch, status.loss());
  if (status.has_test_accuracy()) {
    absl::StrAppendFormat(&line, "  acc %.2f%%", 100 * status.test_accuracy());
  }
  absl::StrAppendFormat(&line, "  %.0f samples/s  ETA %s  gen %d",
                        status.samples_per_second(), FormatDuration(eta),
                        status.generation());
  if (!status.stall().empty())
    absl::StrAppend(&line, "  [", status.stall(), "]");
  return line;
}

ProgressView::ProgressView(std::ostream& out, bool tty,
                           absl::Duration plain_every)
    : out_(out), tty_(tty), plain_every_(plain_every) {}

void ProgressView::Print(const std::string& line) {
  if (tty_ && bar_shown_) out_ << "\r\033[K";
  out_ << TerminalSafe(line) << "\n";
  bar_shown_ = false;
}

void ProgressView::Update(const v1::JobStatus& status) {
  for (; events_seen_ < status.events_size(); ++events_seen_) {
    Print(EventLine(status.events(events_seen_)));
  }
  for (; evals_seen_ < status.evals_size(); ++evals_seen_) {
    Print(EvalLine(status, status.evals(evals_seen_)));
  }
  if (IsTerminal(status.state())) {
    if (tty_ && bar_shown_) out_ << "\r\033[K" << std::flush;
    bar_shown_ = false;
    return;
  }
  if (tty_) {
    out_ << "\r\033[K" << ProgressBar(status) << std::flush;
    bar_shown_ = true;
    return;
  }
  // A new phase (queued, loading, training, recovering; a new generation)
  // is shown at once, progress within a phase at most every plain_every_.
  const std::string phase = absl::StrCat(
      status.state(), "/", status.generation(), "/", status.total_steps() > 0);
  absl::Time now = absl::Now();
  if (phase != last_phase_ || now - last_plain_ >= plain_every_) {
    out_ << ProgressBar(status) << std::endl;
    last_plain_ = now;
    last_phase_ = phase;
  }
}

void ProgressView::Finish(const v1::JobStatus& status) {
  Update(status);
  std::string line = absl::StrFormat(
      "%s %s: %d steps, loss %.4f, test accuracy %.2f%%, %.0f samples/s on %d "
      "worker%s, %d generation%s",
      status.job_id(), StateName(status.state()), status.step(), status.loss(),
      100 * status.test_accuracy(), status.samples_per_second(),
      status.world_size(), status.world_size() == 1 ? "" : "s",
      status.generations(), status.generations() == 1 ? "" : "s");
  if (!status.error().empty()) absl::StrAppend(&line, ": ", status.error());
  Print(line);
  out_.flush();
}

int RunWatch(const std::vector<std::string>& argv) {
  int exit = kExitOk;
  auto call = Begin(argv, {}, {"json"}, kWatchUsage, 1, 1, &exit);
  if (!call) return exit;
  const std::string& job = call->args.positional()[0];
  const bool json = call->args.Has("json");
  ProgressView view(std::cout, isatty(STDOUT_FILENO));
  grpc::ClientContext context;
  auto final_status = WatchJob(call->stub.get(), job, &context,
                               [&](const v1::JobStatus& status) {
                                 if (json) {
                                   std::cout << ToJson(status) << std::endl;
                                 } else {
                                   view.Update(status);
                                 }
                               });
  if (!final_status.ok()) {
    if (absl::IsUnavailable(final_status.status())) {
      return Fail(absl::UnavailableError(absl::StrCat(
          "cannot reach the coordinator at ", call->address, " (",
          final_status.status().message(),
          "); is lockstep-coordinator running? Set --coordinator or "
          "LOCKSTEP_COORDINATOR")));
    }
    return Fail(final_status.status());
  }
  if (!json) view.Finish(*final_status);
  return final_status->state() == v1::JOB_STATE_SUCCEEDED ? kExitOk
                                                          : kExitJobFailed;
}

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
  const int global = GlobalBatch(*status);
  if (call->args.Has("json")) {
    google::protobuf::Struct out;
    auto& f = *out.mutable_fields();
    f["job_id"].set_string_value(status->job_id());
    google::protobuf::Value plan;
    (void)FromJson(ToJson(status->plan()), &plan, "the plan");
    f["plan"] = plan;
    auto* steps = f["steps"].mutable_list_value();
    for (int i = 0; i < status->step_losses_size(); ++i) {
      auto& row =
          *steps->add_values()->mutable_struct_value()->mutable_fields();
      row["step"].set_number_value(i + 1);
      row["samples_seen"].set_number_value(static_cast<double>(i + 1) * global);
      row["loss"].set_number_value(status->step_losses(i));
    }
    auto* evals = f["evals"].mutable_list_value();
    for (const v1::EvalPoint& eval : status->evals()) {
      auto& row =
          *evals->add_values()->mutable_struct_value()->mutable_fields();
      row["step"].set_number_value(static_cast<double>(eval.step()));
      row["epoch"].set_number_value(eval.epoch() + 1);
      row["test_accuracy"].set_number_value(eval.test_accuracy());
      row["test_loss"].set_number_value(eval.test_loss());
      row["time"].set_number_value(eval.time());
    }
    std::cout << ToJson(out) << std::endl;
    return kExitOk;
  }
  std::map<int64_t, const v1::EvalPoint*> evals;
  for (const v1::EvalPoint& eval : status->evals()) evals[eval.step()] = &eval;
  std::cout << "step,samples_seen,loss,test_accuracy,test_loss\n";
  for (int i = 0; i < status->step_losses_size(); ++i) {
    const int64_t step = i + 1;
    std::cout << step << "," << step * global << ","
              << absl::StrFormat("%.9g", status->step_losses(i));
    auto it = evals.find(step);
    if (it != evals.end()) {
      std::cout << absl::StrFormat(",%.6f,%.6f", it->second->test_accuracy(),
                                   it->second->test_loss());
    } else {
      std::cout << ",,";
    }
    std::cout << "\n";
  }
  std::cout.flush();
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

  // What explains diverging curves.
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

  // The plot.
  std::vector<Curve> by_step, by_samples;
  for (const v1::JobStatus& job : jobs) {
    const std::string label =
        absl::StrCat(job.job_id(), " (", job.plan().replicas(), "x",
                     job.plan().per_replica_batch_size(), ")");
    Curve step{label, {}, {}}, samples{label, {}, {}};
    for (int i = 0; i < job.step_losses_size(); ++i) {
      step.x.push_back(i + 1);
      step.y.push_back(job.step_losses(i));
      samples.x.push_back(static_cast<double>(i + 1) * GlobalBatch(job));
      samples.y.push_back(job.step_losses(i));
    }
    by_step.push_back(std::move(step));
    by_samples.push_back(std::move(samples));
  }
  const std::string svg_path = call->args.Get("svg", "lockstep-compare.svg");
  {
    std::ofstream out(svg_path);
    out << PlotSvg({{"training loss by step", "optimizer step"},
                    {"training loss by samples seen", "samples seen"}},
                   {by_step, by_samples});
    if (!out) {
      return Fail(absl::FailedPreconditionError(
          absl::StrCat("cannot write the plot to ", svg_path)));
    }
  }

  if (call->args.Has("json")) {
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
      r["test_accuracy"].set_number_value(job.test_accuracy());
      r["samples_per_second"].set_number_value(job.samples_per_second());
    }
    auto* warned = f["warnings"].mutable_list_value();
    for (const std::string& w : warnings) {
      warned->add_values()->set_string_value(w);
    }
    f["svg"].set_string_value(svg_path);
    std::cout << ToJson(out) << std::endl;
    return kExitOk;
  }
  std::cout << absl::StrFormat(
      "%-24s %8s %11s %7s %10s %10s %7s %10s %8s %10s\n", "JOB", "REPLICAS",
      "PER-REPLICA", "GLOBAL", "LR", "STEPS/EP", "STEPS", "LOSS", "TEST ACC",
      "SAMPLES/S");
  for (const v1::JobStatus& job : jobs) {
    std::cout << TerminalSafe(absl::StrFormat(
        "%-24s %8d %11d %7d %10.4g %10d %7d %10.4f %7.2f%% %10.0f\n",
        job.job_id(), job.plan().replicas(),
        job.plan().per_replica_batch_size(), GlobalBatch(job),
        job.plan().scaled_lr(), job.plan().steps_per_epoch(), job.step(),
        job.loss(), 100 * job.test_accuracy(), job.samples_per_second()));
  }
  for (const std::string& w : warnings) {
    std::cerr << "lockstep: warning: " << TerminalSafe(w) << "\n";
  }
  std::cout << "loss curves: " << svg_path << " (open it in a browser)"
            << std::endl;
  return kExitOk;
}

}  // namespace lockstep::client
