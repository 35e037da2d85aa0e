#include "worker/train/lr_schedule.h"

#include <cmath>

namespace lockstep::worker {

LrSchedule::LrSchedule(const v1::JobSpec& spec, int global_batch)
    : base_lr_(spec.base_lr()), warmup_steps_(spec.warmup_steps()) {
  int reference = spec.reference_batch_size() > 0 ? spec.reference_batch_size()
                                                  : global_batch;
  double ratio = static_cast<double>(global_batch) / reference;
  double factor = 1.0;
  if (spec.lr_scaling() == "linear") factor = ratio;
  if (spec.lr_scaling() == "sqrt") factor = std::sqrt(ratio);
  scaled_lr_ = base_lr_ * factor;
}

double LrSchedule::At(int64_t step) const {
  if (step >= warmup_steps_) return scaled_lr_;
  double progress = static_cast<double>(step) / warmup_steps_;
  return base_lr_ + (scaled_lr_ - base_lr_) * progress;
}

}  // namespace lockstep::worker
