// What the CLI shows of a running or finished job: state names, progress
// lines and the live progress view of `watch`, `submit --watch` and `local`.
#ifndef LOCKSTEP_CLIENT_VIEWS_H_
#define LOCKSTEP_CLIENT_VIEWS_H_

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "common/job_state.h"       // StateName, which the views use
#include "common/run_comparison.h"  // GlobalBatch, HistoryStep
#include "lockstep/v1/coordinator.pb.h"

namespace lockstep::client {

// Follows a job's status updates. On a terminal, one progress bar line is
// redrawn in place:
//   epoch 1/2 [########------------] 375/937  loss 0.5123  acc 84.02%
//   2310 samples/s  ETA 0:09  gen 1
// and every evaluation and job event is printed as a line of its own.
// Elsewhere (a pipe, a log file) it prints plain lines: events, evaluations,
// each change of phase (queued, loading, training, recovering) at once, and
// progress at most every `plain_every`.
class ProgressView {
 public:
  ProgressView(std::ostream& out, bool tty,
               absl::Duration plain_every = absl::Seconds(2));
  void Update(const v1::JobStatus& status);
  // Ends the bar and prints one summary line.
  void Finish(const v1::JobStatus& status);

 private:
  void Print(const std::string& line);

  std::ostream& out_;
  const bool tty_;
  const absl::Duration plain_every_;
  bool bar_shown_ = false;
  // Counted over the job's whole life: the status keeps only the newest
  // events and a thinned list of evaluations (dropped_events, dropped_evals).
  int64_t events_seen_ = 0;
  int64_t evals_seen_ = 0;
  absl::Time last_plain_ = absl::InfinitePast();
  std::string last_phase_;
};

// The progress bar line alone.
std::string ProgressBar(const v1::JobStatus& status);

// One line of progress: "step 120/936  epoch 1  loss 0.5234 ...".
std::string FormatProgress(const v1::JobStatus& status);

// The task's test metrics, short: "acc 91.23%", "mse 0.0123 mae 0.0876" or
// "ppl 4.521"; empty before the first evaluation.
std::string MetricsText(
    const google::protobuf::Map<std::string, double>& metrics);
std::string MetricsText(const v1::JobStatus& status);

// The job's throughput: "12345 tokens/s" for a language model, else
// "2310 samples/s".
std::string ThroughputText(const v1::JobStatus& status);

// GlobalBatch and HistoryStep: common/run_comparison.h.

}  // namespace lockstep::client

#endif  // LOCKSTEP_CLIENT_VIEWS_H_
