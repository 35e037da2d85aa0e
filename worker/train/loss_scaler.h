// Dynamic loss scaling for fp16 training (docs/DESIGN.md §4): the loss is
// multiplied by `scale` before backward so small gradients survive fp16; after
// the all-reduce every rank sees the same averaged gradients, so every rank
// takes the same decision: with an inf/nan anywhere the step is skipped and
// the scale halves; after `growth_interval` good steps in a row it doubles.
// A skipped step does not advance the learning-rate schedule.
//
// Disabled (fp32, bf16): the scale is 1 and every step is applied.
// Thread-compatible.
#ifndef LOCKSTEP_WORKER_TRAIN_LOSS_SCALER_H_
#define LOCKSTEP_WORKER_TRAIN_LOSS_SCALER_H_

#include <cstdint>

namespace lockstep::worker {

class LossScaler {
 public:
  struct Options {
    double initial_scale = 65536;
    int growth_interval = 2000;
    double growth_factor = 2;
    double backoff_factor = 0.5;
    // The scale never falls below this; gradients that overflow even
    // unscaled keep skipping steps, which the trainer reports.
    double min_scale = 1;
    double max_scale = 16777216;  // 2^24
  };

  LossScaler() : LossScaler(false, Options()) {}
  LossScaler(bool enabled, Options options)
      : enabled_(enabled),
        options_(options),
        scale_(enabled ? options.initial_scale : 1) {}

  bool enabled() const { return enabled_; }
  double scale() const { return scale_; }
  // Good steps since the scale last changed.
  int good_steps() const { return good_steps_; }
  // Steps skipped since the start of the job.
  int64_t skipped_steps() const { return skipped_; }
  // Consecutive skipped steps (a run that never recovers is an error).
  int consecutive_skips() const { return consecutive_skips_; }

  // After the all-reduce: whether every averaged gradient was finite.
  // Returns whether to apply the step.
  bool Update(bool finite) {
    if (!enabled_) return true;
    if (!finite) {
      scale_ = scale_ * options_.backoff_factor;
      if (scale_ < options_.min_scale) scale_ = options_.min_scale;
      good_steps_ = 0;
      ++skipped_;
      ++consecutive_skips_;
      return false;
    }
    consecutive_skips_ = 0;
    if (++good_steps_ >= options_.growth_interval) {
      scale_ = scale_ * options_.growth_factor;
      if (scale_ > options_.max_scale) scale_ = options_.max_scale;
      good_steps_ = 0;
    }
    return true;
  }

  // From a checkpoint or the rank the generation adopted.
  void Restore(double scale, int good_steps, int64_t skipped) {
    if (enabled_) {
      scale_ = scale;
      good_steps_ = good_steps;
    }
    skipped_ = skipped;
    consecutive_skips_ = 0;
  }

 private:
  bool enabled_;
  Options options_;
  double scale_;
  int good_steps_ = 0;
  int64_t skipped_ = 0;
  int consecutive_skips_ = 0;
};

}  // namespace lockstep::worker

#endif  // LOCKSTEP_WORKER_TRAIN_LOSS_SCALER_H_
