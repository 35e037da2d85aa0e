// Where a rank's training time goes: each step's time split into phases
// (data, forward, backward, exposed communication, optimizer) and the stall
// of each checkpoint save, averaged into the StepBreakdown of the rank's
// result (docs/DESIGN.md §5 explains the exposed communication).
//
// Thread-compatible: the training thread owns it.
#ifndef LOCKSTEP_WORKER_TRAIN_STEP_METRICS_H_
#define LOCKSTEP_WORKER_TRAIN_STEP_METRICS_H_

#include <array>
#include <cstdint>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "lockstep/v1/coordinator.pb.h"
#include "worker/worker_metrics.h"

namespace lockstep::worker {

class StepMetrics {
 public:
  enum Phase { kData, kForward, kBackward, kExposedComm, kOptimizer, kPhases };

  // Times one step: each Lap adds the time since the previous lap (or the
  // start) to a phase.
  class Timer {
   public:
    explicit Timer(StepMetrics* metrics)
        : metrics_(metrics), last_(absl::Now()) {}
    void Lap(Phase phase) {
      const absl::Time now = absl::Now();
      metrics_->phases_[phase] += now - last_;
      if (metrics_->sink_ != nullptr) {
        metrics_->sink_->AddPhase(static_cast<WorkerMetrics::Phase>(phase),
                                  now - last_);
      }
      last_ = now;
    }

   private:
    StepMetrics* metrics_;
    absl::Time last_;
  };

  // Where the worker's running totals go too (its /metrics); may be null.
  void set_sink(WorkerMetrics* sink) { sink_ = sink; }

  // A step that completed (a failed one is not averaged in).
  void StepDone() {
    ++steps_;
    if (sink_ != nullptr) sink_->StepDone();
  }
  // A checkpoint save that held training for `stall`.
  void SaveDone(absl::Duration stall) {
    save_stall_ += stall;
    ++saves_;
    if (sink_ != nullptr) sink_->SaveStalled(stall);
  }
  // The mean of each phase over the completed steps; nothing without any.
  void Fill(v1::StepBreakdown* breakdown) const;
  bool empty() const { return steps_ == 0; }

 private:
  std::array<absl::Duration, kPhases> phases_{};
  int64_t steps_ = 0;
  int saves_ = 0;
  absl::Duration save_stall_;
  WorkerMetrics* sink_ = nullptr;
};

static_assert(static_cast<int>(StepMetrics::kPhases) ==
                      static_cast<int>(WorkerMetrics::kPhases) &&
                  static_cast<int>(StepMetrics::kExposedComm) ==
                      static_cast<int>(WorkerMetrics::kExposedComm),
              "StepMetrics and WorkerMetrics name the phases alike");

inline void StepMetrics::Fill(v1::StepBreakdown* breakdown) const {
  auto mean_ms = [&](Phase phase) {
    return absl::ToDoubleMilliseconds(phases_[phase]) / steps_;
  };
  breakdown->set_data_ms(mean_ms(kData));
  breakdown->set_forward_ms(mean_ms(kForward));
  breakdown->set_backward_ms(mean_ms(kBackward));
  breakdown->set_exposed_comm_ms(mean_ms(kExposedComm));
  breakdown->set_optimizer_ms(mean_ms(kOptimizer));
  breakdown->set_saves(saves_);
  if (saves_ > 0) {
    breakdown->set_save_stall_ms(absl::ToDoubleMilliseconds(save_stall_) /
                                 saves_);
  }
}

}  // namespace lockstep::worker

#endif  // LOCKSTEP_WORKER_TRAIN_STEP_METRICS_H_
