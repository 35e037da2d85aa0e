// The chief's progress reports to the coordinator: the loss of every step,
// sent about once a second (or every log_every_steps steps), at each
// evaluation, and at once when a generation starts, with the training plan,
// where the state came from and any configuration warnings.
//
// Thread-compatible: the chief's training thread owns it.
#ifndef LOCKSTEP_WORKER_TRAIN_PROGRESS_REPORTER_H_
#define LOCKSTEP_WORKER_TRAIN_PROGRESS_REPORTER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "lockstep/v1/coordinator.pb.h"
#include "worker/train/state_agreement.h"

namespace lockstep::worker {

// An evaluation's results: the test loss and the task's metrics by name.
struct Evaluation {
  double test_loss = 0;
  std::map<std::string, double> metrics;
  int64_t samples = 0;  // the test samples it read
};

class ProgressReporter {
 public:
  using Send = std::function<void(const v1::ProgressReport&)>;

  // A generation of `assignment` that starts after step `first_step` with
  // the state `agreed` on, training by `plan`. `send` is called on this
  // thread.
  // `tokens_per_sample`: a language model's window (its reports carry
  // tokens/s), else 0.
  ProgressReporter(const v1::Assignment& assignment, v1::TrainingPlan plan,
                   int64_t first_step, AgreedState agreed, Send send,
                   int64_t tokens_per_sample = 0);

  // Goes into the next report (and becomes a "warning" event).
  void Warn(std::string warning) { warnings_.push_back(std::move(warning)); }

  // After each step: records its global mean loss and the learning rate it
  // was taken with, and sends a report when
  // one is due, when `force`d (after an evaluation, with its results), or
  // when it is the generation's first. `training_time` is the time the
  // generation has trained so far, evaluations excluded.
  void StepDone(int64_t step, double loss, double lr, bool force,
                const std::optional<Evaluation>& evaluation,
                absl::Duration training_time);

 private:
  const v1::Assignment& assignment_;
  const v1::TrainingPlan plan_;
  const int64_t generation_first_step_;
  const int64_t tokens_per_sample_;
  const Send send_;
  // The first report of the generation says where it resumed.
  std::optional<int64_t> resumed_at_;
  AgreedState agreed_;
  std::vector<std::string> warnings_;
  std::vector<float> pending_losses_;
  std::vector<float> pending_lrs_;
  int64_t pending_first_step_;
  absl::Time last_report_ = absl::InfinitePast();
};

}  // namespace lockstep::worker

#endif  // LOCKSTEP_WORKER_TRAIN_PROGRESS_REPORTER_H_
