#include "worker/worker_metrics.h"

namespace lockstep::worker {
namespace {

constexpr const char* kPhaseNames[WorkerMetrics::kPhases] = {
    "data", "forward", "backward", "exposed_communication", "optimizer"};
constexpr const char* kOpNames[WorkerMetrics::kOps] = {"allreduce", "broadcast",
                                                       "allgather", "barrier"};

double Seconds(const std::atomic<int64_t>& ns) {
  return static_cast<double>(ns.load(std::memory_order_relaxed)) * 1e-9;
}
double Count(const std::atomic<int64_t>& n) {
  return static_cast<double>(n.load(std::memory_order_relaxed));
}

}  // namespace

void WorkerMetrics::CollectiveDone(Collective op, uint64_t bytes,
                                   absl::Duration time) {
  calls_[op].fetch_add(1, std::memory_order_relaxed);
  bytes_[op].fetch_add(static_cast<int64_t>(bytes), std::memory_order_relaxed);
  op_ns_[op].fetch_add(absl::ToInt64Nanoseconds(time),
                       std::memory_order_relaxed);
}

void WorkerMetrics::CheckpointWritten(absl::Duration time) {
  checkpoint_writes_.fetch_add(1, std::memory_order_relaxed);
  checkpoint_write_ns_.fetch_add(absl::ToInt64Nanoseconds(time),
                                 std::memory_order_relaxed);
}

void WorkerMetrics::SetAssignment(const std::string& job, int rank,
                                  const std::string& backend) {
  absl::MutexLock lock(&mu_);
  job_ = job;
  rank_ = rank;
  backend_ = backend;
}

void WorkerMetrics::SetCompute(const std::string& blas,
                               const std::string& kernel,
                               const std::string& source,
                               const std::string& aten) {
  absl::MutexLock lock(&mu_);
  blas_ = blas;
  blas_kernel_ = kernel;
  blas_kernel_source_ = source;
  aten_capability_ = aten;
}

void WorkerMetrics::Collect(metrics::Exposition& out) const {
  {
    absl::MutexLock lock(&mu_);
    out.Family("lockstep_worker_compute_info", metrics::kGauge,
               "What this worker's CPU computes with: the BLAS, the kernel "
               "set it runs and who chose it (openblas, lockstep, "
               "environment, fallback), and ATen's CPU capability (always "
               "1).");
    out.Sample("lockstep_worker_compute_info",
               {{"blas", blas_},
                {"blas_kernel", blas_kernel_},
                {"blas_kernel_source", blas_kernel_source_},
                {"aten_cpu_capability", aten_capability_}},
               1);
    out.Family("lockstep_worker_info", metrics::kGauge,
               "What this worker is: its device, task, and the job, rank and "
               "collective backend of its last generation (always 1).");
    out.Sample("lockstep_worker_info",
               {{"device", device_},
                {"task", task_},
                {"job", job_},
                {"rank", rank_ < 0 ? "" : std::to_string(rank_)},
                {"backend", backend_}},
               1);
  }
  out.Family("lockstep_worker_steps_total", metrics::kCounter,
             "Training steps this worker completed.");
  out.Sample("lockstep_worker_steps_total", {}, Count(steps_));
  out.Family("lockstep_worker_step_phase_seconds_total", metrics::kCounter,
             "Seconds of training steps spent in each phase; the exposed "
             "communication is the all-reduce time the backward pass did "
             "not hide.");
  for (int phase = 0; phase < kPhases; ++phase) {
    out.Sample("lockstep_worker_step_phase_seconds_total",
               {{"phase", kPhaseNames[phase]}}, Seconds(phase_ns_[phase]));
  }
  struct PerOp {
    const char* name;
    const char* help;
    const std::array<std::atomic<int64_t>, kOps>& values;
    bool seconds;
  };
  const PerOp per_op[] = {
      {"lockstep_worker_collective_calls_total",
       "Collective operations this worker ran, by operation.", calls_, false},
      {"lockstep_worker_collective_bytes_total",
       "Bytes this worker contributed to collectives, by operation.", bytes_,
       false},
      {"lockstep_worker_collective_seconds_total",
       "Seconds spent in collectives, by operation (all-reduce overlaps the "
       "backward pass).",
       op_ns_, true}};
  for (const PerOp& family : per_op) {
    out.Family(family.name, metrics::kCounter, family.help);
    for (int op = 0; op < kOps; ++op) {
      out.Sample(family.name, {{"op", kOpNames[op]}},
                 family.seconds ? Seconds(family.values[op])
                                : Count(family.values[op]));
    }
  }
  out.Family("lockstep_worker_checkpoint_writes_total", metrics::kCounter,
             "Checkpoints this rank wrote and synced to disk.");
  out.Sample("lockstep_worker_checkpoint_writes_total", {},
             Count(checkpoint_writes_));
  out.Family("lockstep_worker_checkpoint_write_seconds_total",
             metrics::kCounter,
             "Seconds this rank spent writing and syncing checkpoint files.");
  out.Sample("lockstep_worker_checkpoint_write_seconds_total", {},
             Seconds(checkpoint_write_ns_));
  out.Family("lockstep_worker_checkpoint_stall_seconds_total",
             metrics::kCounter,
             "Seconds training waited for checkpoint saves (the snapshot, "
             "and the write itself when checkpoints are synchronous).");
  out.Sample("lockstep_worker_checkpoint_stall_seconds_total", {},
             Seconds(save_stall_ns_));
}

}  // namespace lockstep::worker
