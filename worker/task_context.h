// What a running task sees of its surroundings: its assignment, the
// generation's key-value store, the channels up to the coordinator, the
// stop, preempt and abort signals, and the checkpoint commits addressed to
// it. The agent fills it in and signals it; the trainer and the
// checkpointer read it, without depending on the agent.
//
// Thread-safety: shared by the agent's session thread and the task thread;
// every member is thread-safe (atomics, or guarded by the mutex). The
// assignment, kv, host, report and send are set before the task starts and
// not changed after.
#ifndef LOCKSTEP_WORKER_TASK_CONTEXT_H_
#define LOCKSTEP_WORKER_TASK_CONTEXT_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "lockstep/v1/coordinator.pb.h"
#include "worker/collective/communicator.h"
#include "worker/collective/link_meter.h"
#include "worker/control_plane.h"
#include "worker/worker_metrics.h"

namespace lockstep::worker {

// What a task sees of its surroundings.
class TaskContext {
 public:
  v1::Assignment assignment;
  std::unique_ptr<KeyValueClient> kv;  // scoped to (job, generation)
  std::string host;                    // data-plane address of this worker
  // How the CPU collectives travel (--data-plane-encryption,
  // --data-plane-transport): AES-256-GCM on lockstep's transport unless
  // off; Gloo's unauthenticated TCP pairs only for comparisons.
  bool data_plane_encryption = true;
  bool data_plane_gloo = false;
  std::atomic<bool> stop_requested{false};
  // This worker is being preempted (SIGTERM): the ranks stop at an agreed
  // step and save it; the job re-forms when the worker is back.
  std::atomic<bool> preempt_requested{false};
  // Why the flags above are set, for a Resume (the scheduler calling off its
  // preemption): only the scheduler's own request is taken back. Read and
  // written under the agent's lock.
  bool scheduler_preempt = false;
  bool stop_on_request = false;
  // Collectives entered in this generation; sent with each heartbeat.
  std::atomic<int64_t> collective_seq{0};
  // The data plane's throughput with each peer; sent with each heartbeat.
  LinkMeter links;
  // Sends a progress report up the session. Thread-safe.
  std::function<void(const v1::ProgressReport&)> report;
  // Sends any message up the session (checkpoint prepares and commits).
  std::function<void(const v1::WorkerMessage&)> send;
  // The worker's metrics (its /metrics endpoint); null when not served.
  WorkerMetrics* metrics = nullptr;

  // The coordinator's go-ahead to commit a checkpoint (chief only).
  void DeliverCommit(const v1::CommitCheckpoint& commit);
  // Waits for the commit of `step`. Errors: Aborted when the generation
  // ends first, DeadlineExceeded after `timeout`.
  absl::StatusOr<v1::CommitCheckpoint> WaitForCommit(int64_t step,
                                                     absl::Duration timeout);
  // Releases WaitForCommit (Cancelled): the generation is ending on this
  // rank and no one will wait for its checkpoint.
  void CancelCommitWaits();
  // Set by the agent when the task's runner returned and its result was sent.
  void MarkDone();
  bool WaitUntilDone(absl::Duration timeout);

  // Ends the generation: a key-value call, a connection being made or a
  // collective pending on the task thread fails promptly with Aborted.
  void Abort();
  bool aborted() const;
  // The task's communicator, so Abort can close it (register it before it
  // connects, so the connection can be aborted too); nullptr to forget it.
  // Registering after Abort aborts it at once.
  void SetCommunicator(Communicator* comm);

 private:
  mutable absl::Mutex mu_;
  bool aborted_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  bool commits_cancelled_ ABSL_GUARDED_BY(mu_) = false;
  Communicator* comm_ ABSL_GUARDED_BY(mu_) = nullptr;
  std::vector<v1::CommitCheckpoint> commits_ ABSL_GUARDED_BY(mu_);
};

}  // namespace lockstep::worker

#endif  // LOCKSTEP_WORKER_TASK_CONTEXT_H_
