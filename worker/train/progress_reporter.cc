// When the chief reports progress, and what a report holds
// (progress_reporter.h).
#include "worker/train/progress_reporter.h"

#include <utility>

#include "absl/time/clock.h"

namespace lockstep::worker {
namespace {

constexpr size_t kMaxPendingSteps = size_t{1} << 18;

}  // namespace

ProgressReporter::ProgressReporter(const v1::Assignment& assignment,
                                   v1::TrainingPlan plan, int64_t first_step,
                                   AgreedState agreed, Send send,
                                   int64_t tokens_per_sample)
    : assignment_(assignment),
      plan_(std::move(plan)),
      generation_first_step_(first_step),
      tokens_per_sample_(tokens_per_sample),
      send_(std::move(send)),
      resumed_at_(first_step),
      agreed_(std::move(agreed)),
      pending_first_step_(first_step) {}

void ProgressReporter::StepDone(int64_t step, double loss, double lr,
                                bool force,
                                const std::optional<Evaluation>& evaluation,
                                absl::Duration training_time) {
  pending_losses_.push_back(static_cast<float>(loss));
  pending_lrs_.push_back(static_cast<float>(lr));
  const absl::Time now = absl::Now();
  const int log_every = assignment_.spec().log_every_steps();
  // However rarely the spec asks, a report holds at most kMaxPendingSteps
  // losses and learning rates (2 MiB): well inside gRPC's message limit.
  const bool due = (log_every > 0 ? step % log_every == 0
                                  : now - last_report_ >= absl::Seconds(1)) ||
                   pending_losses_.size() >= kMaxPendingSteps;
  if (!due && !force && !resumed_at_.has_value()) return;
  v1::ProgressReport report;
  report.set_job_id(assignment_.job_id());
  report.set_generation(assignment_.generation());
  report.set_step(step);
  report.set_epoch(static_cast<int>((step - 1) / plan_.steps_per_epoch()));
  report.set_total_steps(plan_.total_steps());
  report.set_first_step(pending_first_step_);
  report.mutable_step_losses()->Add(pending_losses_.begin(),
                                    pending_losses_.end());
  report.mutable_step_lrs()->Add(pending_lrs_.begin(), pending_lrs_.end());
  for (std::string& warning : warnings_) {
    report.add_warnings(std::move(warning));
  }
  warnings_.clear();
  const double seconds = absl::ToDoubleSeconds(training_time);
  if (seconds > 0) {
    report.set_samples_per_second(
        static_cast<double>(step - generation_first_step_) *
        plan_.global_batch_size() / seconds);
    report.set_tokens_per_second(report.samples_per_second() *
                                 static_cast<double>(tokens_per_sample_));
  }
  if (evaluation.has_value()) {
    report.set_test_loss(evaluation->test_loss);
    report.set_eval_samples(evaluation->samples);
    for (const auto& [name, value] : evaluation->metrics) {
      (*report.mutable_test_metrics())[name] = value;
    }
    // The field older coordinators and clients read.
    auto accuracy = evaluation->metrics.find("test_accuracy");
    if (accuracy != evaluation->metrics.end()) {
      report.set_test_accuracy(accuracy->second);
    }
  }
  if (resumed_at_.has_value()) {
    report.set_resumed_at_step(*resumed_at_);
    report.set_state_source_rank(agreed_.source_rank);
    report.set_restored_checkpoint(agreed_.restored_from);
    *report.mutable_plan() = plan_;
    resumed_at_.reset();
  }
  send_(report);
  pending_losses_.clear();
  pending_lrs_.clear();
  pending_first_step_ = step;
  last_report_ = now;
}

}  // namespace lockstep::worker
