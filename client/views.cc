// What the CLI shows of a job: state names, progress lines and the live
// progress view of `watch`, `submit --watch` and `local` (views.h).
#include "client/views.h"

#include <algorithm>
#include <cstdint>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/job_state.h"
#include "common/terminal_text.h"

namespace lockstep::client {
namespace {

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

std::string EventLine(const v1::JobEvent& event) {
  return absl::StrCat("gen ", event.generation(), "  ", event.kind(),
                      event.message().empty() ? "" : ": ", event.message());
}

std::string EvalLine(const v1::JobStatus& status, const v1::EvalPoint& eval) {
  const std::string head =
      absl::StrFormat("%s  epoch %d/%d done at step %d: ", status.job_id(),
                      eval.epoch() + 1, status.spec().epochs(), eval.step());
  if (eval.metrics().empty() || eval.metrics().contains("test_accuracy")) {
    // A classifier (or an older worker's evaluation, accuracy only).
    return head + absl::StrFormat("test accuracy %.2f%%, test loss %.4f",
                                  100 * eval.test_accuracy(), eval.test_loss());
  }
  return head + absl::StrFormat("test loss %.4f, %s", eval.test_loss(),
                                MetricsText(eval.metrics()));
}

}  // namespace

std::string MetricsText(
    const google::protobuf::Map<std::string, double>& metrics) {
  auto get = [&](const char* name) -> std::optional<double> {
    auto it = metrics.find(name);
    if (it == metrics.end()) return std::nullopt;
    return it->second;
  };
  std::vector<std::string> parts;
  if (auto accuracy = get("test_accuracy")) {
    parts.push_back(absl::StrFormat("acc %.2f%%", 100 * *accuracy));
  }
  if (auto mse = get("test_mse")) {
    parts.push_back(absl::StrFormat("mse %.4g", *mse));
  }
  if (auto mae = get("test_mae")) {
    parts.push_back(absl::StrFormat("mae %.4g", *mae));
  }
  if (auto perplexity = get("test_perplexity")) {
    parts.push_back(absl::StrFormat("ppl %.3f", *perplexity));
  }
  return absl::StrJoin(parts, "  ");
}

std::string MetricsText(const v1::JobStatus& status) {
  if (!status.test_metrics().empty()) {
    return MetricsText(status.test_metrics());
  }
  if (status.has_test_accuracy()) {
    return absl::StrFormat("acc %.2f%%", 100 * status.test_accuracy());
  }
  return "";
}

std::string ThroughputText(const v1::JobStatus& status) {
  if (status.tokens_per_second() > 0) {
    return absl::StrFormat("%.0f tokens/s", status.tokens_per_second());
  }
  return absl::StrFormat("%.0f samples/s", status.samples_per_second());
}

std::string FormatProgress(const v1::JobStatus& status) {
  if (status.state() == v1::JOB_STATE_QUEUED) {
    if (!status.has_queue()) {
      return absl::StrCat(status.job_id(), "  queued, waiting for workers");
    }
    return absl::StrCat(
        status.job_id(), "  queued #", status.queue().position(), " (",
        status.queue().reason(), "): ", status.queue().message());
  }
  if (status.state() == v1::JOB_STATE_RECOVERING) {
    return absl::StrCat(status.job_id(), "  recovering after generation ",
                        status.generation(), ": ", status.error());
  }
  if (status.state() == v1::JOB_STATE_RUNNING && status.total_steps() == 0) {
    return absl::StrCat(status.job_id(), "  generation ", status.generation(),
                        " on ", status.world_size(),
                        " workers: loading data, connecting the ranks");
  }
  std::string line =
      absl::StrFormat("%s  step %d/%d  epoch %d/%d  loss %.4f  %s  gen %d",
                      status.job_id(), status.step(), status.total_steps(),
                      status.epoch() + 1, status.spec().epochs(), status.loss(),
                      ThroughputText(status), status.generation());
  if (const std::string metrics = MetricsText(status); !metrics.empty()) {
    absl::StrAppend(&line, "  test ", metrics);
  }
  if (!status.stall().empty())
    absl::StrAppend(&line, "  [", status.stall(), "]");
  return line;
}

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
  if (const std::string metrics = MetricsText(status); !metrics.empty()) {
    absl::StrAppend(&line, "  ", metrics);
  }
  absl::StrAppendFormat(&line, "  %s  ETA %s  gen %d", ThroughputText(status),
                        FormatDuration(eta), status.generation());
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
  // The new ones are at the end of each list, however many older ones the
  // coordinator dropped since the last update.
  const int64_t events = status.dropped_events() + status.events_size();
  for (int64_t i =
           std::max<int64_t>(0, status.events_size() - (events - events_seen_));
       i < status.events_size(); ++i) {
    Print(EventLine(status.events(i)));
  }
  events_seen_ = std::max(events_seen_, events);
  const int64_t evals = status.dropped_evals() + status.evals_size();
  for (int64_t i =
           std::max<int64_t>(0, status.evals_size() - (evals - evals_seen_));
       i < status.evals_size(); ++i) {
    Print(EvalLine(status, status.evals(i)));
  }
  evals_seen_ = std::max(evals_seen_, evals);
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
  const std::string phase =
      absl::StrCat(status.state(), "/", status.generation(), "/",
                   status.total_steps() > 0, "/", status.queue().reason());
  absl::Time now = absl::Now();
  if (phase != last_phase_ || now - last_plain_ >= plain_every_) {
    out_ << ProgressBar(status) << std::endl;
    last_plain_ = now;
    last_phase_ = phase;
  }
}

void ProgressView::Finish(const v1::JobStatus& status) {
  Update(status);
  const std::string metrics = MetricsText(status);
  std::string line = absl::StrFormat(
      "%s %s: %d steps, loss %.4f, %s%s on %d worker%s, %d generation%s",
      status.job_id(), StateName(status.state()), status.step(), status.loss(),
      metrics.empty() ? "" : absl::StrCat("test ", metrics, ", "),
      ThroughputText(status), status.world_size(),
      status.world_size() == 1 ? "" : "s", status.generations(),
      status.generations() == 1 ? "" : "s");
  if (!status.error().empty()) absl::StrAppend(&line, ": ", status.error());
  Print(line);
  out_.flush();
}

}  // namespace lockstep::client
