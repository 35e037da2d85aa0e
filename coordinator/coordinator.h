// The coordinator's service logic: worker registry, rank assignment, the job
// queue, the (job, generation)-scoped key-value store and barriers. It knows
// nothing of gRPC; coordinator/rpc/ adapts it.
//
// Job states:
//
//   QUEUED ──(enough workers connected)──▶ RUNNING ──(every rank ok)──▶
//   SUCCEEDED
//     │                                     │  │
//     └──(stop)──▶ STOPPED ◀──(stop, ranks agree on a step)──┘  └──(a rank
//     fails or
//                                                                  disconnects)──▶
//                                                                  FAILED
//
// One job runs at a time, on every worker it needs. Each start of a job is a
// new generation; key-value entries and barriers of an older generation are
// fenced off (Aborted).
//
// Thread-safe: every public method may be called from any gRPC thread. The
// blocking calls (KvGet, Barrier, WaitForJobChange) wait on the real time
// deadline they are given and return early on Shutdown().
#ifndef LOCKSTEP_COORDINATOR_COORDINATOR_H_
#define LOCKSTEP_COORDINATOR_COORDINATOR_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"
#include "coordinator/job_store.h"
#include "lockstep/v1/cluster.pb.h"
#include "lockstep/v1/coordinator.pb.h"

namespace lockstep::coordinator {

// Where the coordinator pushes commands for one worker session. Send must not
// block (the rpc layer queues); it is called with the coordinator's lock held.
class SessionSink {
 public:
  virtual ~SessionSink() = default;
  virtual void Send(const v1::CoordinatorCommand& command) = 0;
  // Ends the session from the coordinator's side (a worker declared dead).
  virtual void Close() = 0;
};

class Coordinator {
 public:
  struct Options {
    // Static cluster (TF_CONFIG); absent for free registration.
    std::optional<v1::ClusterSpec> cluster;
    Clock* clock = RealClock::Get();
    // May be null (nothing persisted), as in unit tests.
    std::unique_ptr<JobStore> store;
    // A worker silent this long has failed; it heartbeats every half of it.
    absl::Duration heartbeat_timeout = absl::Seconds(10);
    // How long a rank's collective error waits for a worker failure that
    // explains it before it ends the generation by itself.
    absl::Duration error_grace = absl::Seconds(1);
    // A rank behind the others this long is reported as stalled.
    absl::Duration stall_after = absl::Seconds(3);
  };

  // Loads the jobs the store holds. A job that was running when the previous
  // coordinator stopped is RECOVERING: it re-forms as a new generation when
  // its workers reconnect. Errors: DataLoss for an unreadable store.
  static absl::StatusOr<std::unique_ptr<Coordinator>> Create(Options options);

  // Possible errors:
  //   InvalidArgument: the task is not a training task of the static cluster,
  //     the worker's own cluster view differs from ours, or a static cluster
  //     worker registered without a task identity.
  // A known task with a new incarnation has restarted: its old process is
  // treated as failed.
  absl::StatusOr<v1::RegisterWorkerResponse> RegisterWorker(
      const v1::RegisterWorkerRequest& request);

  // Attaches the command sink of a worker's session. Errors:
  //   NotFound: the worker never registered.
  //   Aborted: the incarnation is not the registered one (the process
  //     restarted and registered again; this session is stale).
  absl::Status OpenSession(const std::string& worker_id, uint64_t incarnation,
                           SessionSink* sink);
  // The session ended (`cause` says how). A worker holding a rank in a running
  // job fails that job's generation.
  void CloseSession(const std::string& worker_id, uint64_t incarnation,
                    SessionSink* sink, const absl::Status& cause);
  // A heartbeat, progress report or result from a connected worker.
  absl::Status HandleWorkerMessage(const std::string& worker_id,
                                   const v1::WorkerMessage& message);

  // Errors: Aborted if (job, generation) is not the running generation.
  absl::Status KvSet(const v1::KvSetRequest& request);
  // Waits until the key is set. Errors: Aborted (fenced or the job ended),
  // DeadlineExceeded naming the key.
  absl::StatusOr<std::string> KvGet(const v1::KvGetRequest& request);
  // Waits until every rank of the generation arrived. Errors: Aborted,
  // DeadlineExceeded naming the ranks that did not arrive.
  absl::Status Barrier(const v1::BarrierRequest& request);

  // Validates and queues a job; returns its id. Errors: InvalidArgument.
  absl::StatusOr<std::string> SubmitJob(v1::JobSpec spec);
  // One job, or every job (newest first) when `job_id` is empty.
  absl::StatusOr<std::vector<v1::JobStatus>> GetJobStatus(
      const std::string& job_id, bool include_history);
  // Returns the job's status once its version is above `after_version`, or
  // the current status at `deadline`. Errors: NotFound, Cancelled on shutdown.
  absl::StatusOr<v1::JobStatus> WaitForJobChange(const std::string& job_id,
                                                 int64_t after_version,
                                                 absl::Time deadline);
  // Errors: NotFound; FailedPrecondition when the job already ended.
  absl::Status StopJob(const std::string& job_id);
  std::vector<v1::WorkerInfo> ListWorkers();

  // Declares workers that missed heartbeats failed and ends generations
  // whose reported errors went unexplained past the grace period. Call it
  // often (main: every 100 ms).
  void Sweep();

  // Wakes every blocked call; they return Cancelled.
  void Shutdown();

 private:
  struct Worker {
    std::string id;
    v1::TaskId task;  // type empty in free registration
    uint64_t incarnation = 0;
    std::string host;
    int64_t order = 0;  // registration order, ranks free workers
    SessionSink* sink = nullptr;
    absl::Time last_heartbeat;
    std::string job_id;  // the job this worker runs, if any
    int rank = -1;
    int64_t generation = 0;
    // Collectives entered in the current generation, when that last
    // changed, and when a heartbeat last reported it: a rank whose count
    // stays below the others' is a straggler. The count is only seen every
    // heartbeat interval, so only the rank's own heartbeats can show that it
    // did not move.
    int64_t collective_seq = 0;
    absl::Time seq_changed;
    absl::Time seq_reported = absl::InfinitePast();
    // Asked to be preempted (SIGTERM): not picked for a generation until it
    // registers again as a new process.
    bool leaving = false;
  };
  struct Job {
    v1::JobStatus status;
    std::vector<std::string> rank_workers;  // worker id of each rank
    int results_ok = 0;
    bool stop_requested = false;
    // A collective error a rank reported, waiting for a worker failure to
    // explain it until `suspect_deadline`.
    std::string suspect;
    absl::Time suspect_deadline = absl::InfiniteFuture();
    absl::Time last_persisted = absl::InfinitePast();
    // A worker asked for a preemption: the generation stops at an agreed,
    // saved step and the job then waits for its group (RECOVERING).
    bool preempting = false;
    std::string preempt_reason;
    // Checkpoint prepares of the running generation: step -> rank -> files.
    std::map<int64_t, std::map<int, v1::CheckpointPrepared>> prepares;
    std::set<int64_t> abandoned_steps;
  };

  explicit Coordinator(Options options);

  bool IsStatic() const { return cluster_.has_value(); }
  // Starts the oldest queued job if its workers are there.
  void MaybeStartJobLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Picks the workers for `job` in rank order; empty if not enough are here.
  std::vector<Worker*> PickWorkersLocked(const Job& job)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StartGenerationLocked(Job& job, const std::vector<Worker*>& workers)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Releases the workers of the job's generation, telling those still
  // running to abort with `reason` unless the job succeeded, and drops the
  // generation's key-value entries and barriers.
  void ReleaseGenerationLocked(Job& job, bool abort, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the job for good, persists, and schedules the next job.
  void EndJobLocked(Job& job, v1::JobState state, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the current generation after a failure. The job re-forms as the
  // next generation, or fails when max_restarts are used up.
  void FailGenerationLocked(Job& job, const std::string& cause)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `worker` is gone (session broken, silent, restarted): it loses its
  // session and fails the generation it was part of.
  void WorkerFailedLocked(Worker& worker, const std::string& kind,
                          const std::string& cause)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void AddEventLocked(Job& job, const std::string& kind, const Worker* worker,
                      const std::string& message)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // "rank 3 (worker:3) stalled at all-reduce #812 for 14 s", or "".
  std::string StallLocked(const Job& job) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  Job* RunningJobLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void HandleResultLocked(Worker& worker, const v1::TaskResult& result)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void HandleProgressLocked(const v1::ProgressReport& report)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The two-phase checkpoint commit: once every rank prepared a step, the
  // chief is told to commit it; a failed prepare abandons the step.
  void HandlePreparedLocked(Worker& worker, const v1::CheckpointPrepared& p)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void HandleCommittedLocked(Worker& worker,
                             const v1::CheckpointCommitted& committed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A worker got SIGTERM: every rank stops at an agreed step and saves it.
  void HandlePreemptLocked(Worker& worker, const v1::PreemptRequest& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job's running generation, if `worker` holds a rank in it.
  Job* GenerationOfLocked(const Worker& worker, const std::string& job_id,
                          int64_t generation)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Checks that (job, generation) is the running generation.
  absl::Status CheckGenerationLocked(const std::string& job_id,
                                     int64_t generation) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void ChangedLocked(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PersistLocked(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  std::string DescribeWorkerLocked(const Worker& worker) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  double NowSeconds() const;

  // Constant after construction.
  const std::optional<v1::ClusterSpec> cluster_;
  Clock* const clock_;
  const std::unique_ptr<JobStore> store_;
  const absl::Duration heartbeat_timeout_;
  const absl::Duration error_grace_;
  const absl::Duration stall_after_;

  mutable absl::Mutex mu_;
  // Signalled on every change a blocked call may wait for.
  absl::CondVar changed_;
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::string, Worker> workers_ ABSL_GUARDED_BY(mu_);
  int64_t next_worker_order_ ABSL_GUARDED_BY(mu_) = 0;
  std::map<std::string, Job> jobs_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> queue_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> job_order_ ABSL_GUARDED_BY(mu_);
  int64_t next_job_seq_ ABSL_GUARDED_BY(mu_) = 1;
  // The job that is RUNNING or RECOVERING, if any.
  std::string running_job_ ABSL_GUARDED_BY(mu_);
  // Key-value store and barrier arrivals of the running generation.
  std::map<std::string, std::string> kv_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::set<int>> barriers_ ABSL_GUARDED_BY(mu_);
};

}  // namespace lockstep::coordinator

#endif  // LOCKSTEP_COORDINATOR_COORDINATOR_H_
