// The learning rate at each step: scaling, warmup and decay (lr_schedule.h).
#include "worker/train/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace lockstep::worker {

LrSchedule::LrSchedule(const v1::JobSpec& spec, int global_batch,
                       int64_t total_steps)
    : base_lr_(spec.base_lr()),
      warmup_steps_(spec.warmup_steps()),
      total_steps_(total_steps),
      decay_(spec.lr_decay()),
      decay_steps_(spec.lr_decay_steps()),
      decay_rate_(spec.has_lr_decay_rate() ? spec.lr_decay_rate() : 0.1),
      min_lr_(spec.min_lr()) {
  int reference = spec.reference_batch_size() > 0 ? spec.reference_batch_size()
                                                  : global_batch;
  double ratio = static_cast<double>(global_batch) / reference;
  double factor = 1.0;
  if (spec.lr_scaling() == "linear") factor = ratio;
  if (spec.lr_scaling() == "sqrt") factor = std::sqrt(ratio);
  scaled_lr_ = base_lr_ * factor;
}

double LrSchedule::At(int64_t step) const {
  if (step >= warmup_steps_) {
    const int64_t after = step - warmup_steps_;
    if (decay_ == "cosine") {
      const int64_t span = std::max<int64_t>(1, total_steps_ - warmup_steps_);
      const double progress = std::min(1.0, static_cast<double>(after) / span);
      return min_lr_ + (scaled_lr_ - min_lr_) * 0.5 *
                           (1 + std::cos(3.14159265358979323846 * progress));
    }
    if (decay_ == "step" && decay_steps_ > 0) {
      return scaled_lr_ *
             std::pow(decay_rate_, static_cast<double>(after / decay_steps_));
    }
    return scaled_lr_;
  }
  double progress = static_cast<double>(step) / warmup_steps_;
  return base_lr_ + (scaled_lr_ - base_lr_) * progress;
}

}  // namespace lockstep::worker
