// What a worker counts for its /metrics endpoint (common/metrics_http.h):
// where its training time goes by phase, the collectives it ran (calls,
// bytes, seconds, by operation), its checkpoint writes, and what it trains
// on. The trainer, the counting communicator and the checkpointer add to
// it through TaskContext::metrics; a scrape reads it with Collect.
//
// No LibTorch here: the counters are plain atomics, so adding costs a few
// nanoseconds on the training thread and a scrape never waits for it.
//
// Thread-safe.
#ifndef LOCKSTEP_WORKER_WORKER_METRICS_H_
#define LOCKSTEP_WORKER_WORKER_METRICS_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/metrics.h"

namespace lockstep::worker {

class WorkerMetrics {
 public:
  // The phases of a step, as StepMetrics::Phase orders them.
  enum Phase { kData, kForward, kBackward, kExposedComm, kOptimizer, kPhases };
  enum Collective { kAllReduce, kBroadcast, kAllGather, kBarrier, kOps };

  // `device` and `task` label lockstep_worker_info for the process's life.
  WorkerMetrics(std::string device, std::string task)
      : device_(std::move(device)), task_(std::move(task)) {}

  void AddPhase(Phase phase, absl::Duration time) {
    phase_ns_[phase].fetch_add(absl::ToInt64Nanoseconds(time),
                               std::memory_order_relaxed);
  }
  void StepDone() { steps_.fetch_add(1, std::memory_order_relaxed); }
  void CollectiveDone(Collective op, uint64_t bytes, absl::Duration time);
  // A rank's checkpoint files written and synced (its prepare), and how
  // long training waited for a save.
  void CheckpointWritten(absl::Duration time);
  void SaveStalled(absl::Duration time) {
    save_stall_ns_.fetch_add(absl::ToInt64Nanoseconds(time),
                             std::memory_order_relaxed);
  }
  // The generation this worker trains in now: its job, rank and backend.
  void SetAssignment(const std::string& job, int rank,
                     const std::string& backend);

  // What the CPU path computes with, set once at start: the BLAS library
  // ("OpenBLAS 0.3.21"), its kernel set and who chose it
  // (EnsureBestBlasKernel), and ATen's vector instruction set ("AVX2").
  // Labels lockstep_worker_compute_info.
  void SetCompute(const std::string& blas, const std::string& kernel,
                  const std::string& source, const std::string& aten);

  void Collect(metrics::Exposition& out) const;

 private:
  const std::string device_;
  const std::string task_;
  std::array<std::atomic<int64_t>, kPhases> phase_ns_{};
  std::atomic<int64_t> steps_{0};
  std::array<std::atomic<int64_t>, kOps> calls_{};
  std::array<std::atomic<int64_t>, kOps> bytes_{};
  std::array<std::atomic<int64_t>, kOps> op_ns_{};
  std::atomic<int64_t> checkpoint_writes_{0};
  std::atomic<int64_t> checkpoint_write_ns_{0};
  std::atomic<int64_t> save_stall_ns_{0};

  mutable absl::Mutex mu_;
  std::string job_ ABSL_GUARDED_BY(mu_);
  int rank_ ABSL_GUARDED_BY(mu_) = -1;
  std::string backend_ ABSL_GUARDED_BY(mu_);
  std::string blas_ ABSL_GUARDED_BY(mu_);
  std::string blas_kernel_ ABSL_GUARDED_BY(mu_);
  std::string blas_kernel_source_ ABSL_GUARDED_BY(mu_);
  std::string aten_capability_ ABSL_GUARDED_BY(mu_);
};

}  // namespace lockstep::worker

#endif  // LOCKSTEP_WORKER_WORKER_METRICS_H_
