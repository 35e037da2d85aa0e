// The learning-rate rule of docs/DESIGN.md §4: base_lr, tuned for
// reference_batch_size, is scaled to the job's global batch by `none`,
// `linear` (x G/ref) or `sqrt` (x sqrt(G/ref)), reached through a linear
// warmup from base_lr over warmup_steps optimizer steps, then held
// (`constant`), annealed to min_lr by a half cosine over the remaining steps
// (`cosine`), or multiplied by lr_decay_rate every lr_decay_steps (`step`).
// Steps are optimizer steps, not micro-batches.
#ifndef LOCKSTEP_WORKER_TRAIN_LR_SCHEDULE_H_
#define LOCKSTEP_WORKER_TRAIN_LR_SCHEDULE_H_

#include <cstdint>
#include <string>

#include "lockstep/v1/job.pb.h"

namespace lockstep::worker {

class LrSchedule {
 public:
  // `spec` must be validated, `global_batch` > 0; `total_steps` is where a
  // cosine decay ends.
  LrSchedule(const v1::JobSpec& spec, int global_batch, int64_t total_steps);

  double base_lr() const { return base_lr_; }
  double scaled_lr() const { return scaled_lr_; }
  // The learning rate for optimizer step `step` (0-based).
  double At(int64_t step) const;

 private:
  double base_lr_;
  double scaled_lr_;
  int64_t warmup_steps_;
  int64_t total_steps_;
  std::string decay_;
  int64_t decay_steps_;
  double decay_rate_;
  double min_lr_;
};

}  // namespace lockstep::worker

#endif  // LOCKSTEP_WORKER_TRAIN_LR_SCHEDULE_H_
