// The coordinator's service logic: the job queue and its state machine, and
// the public entry points (worker registration and sessions, the key-value
// store, job submission, status and stop). It knows nothing of gRPC;
// coordinator/rpc/ adapts it. The class is implemented in coordinator.cc
// (queue, state machine, entry points), scheduling.cc (the scheduling
// passes that carry out scheduler.h's plans), preemption.cc (the
// scheduler's preemptions: the stop, promises, calling off, the end of
// one), worker_reports.cc (results,
// progress, checkpoint and preemption reports) and rendezvous_api.cc
// (key-value store, the generation fence, watchers). The pieces it calls
// under its lock live in files of their own: the pending rendezvous calls
// (rendezvous.h), the worker registry (worker_registry.h), the
// job record with its preemption sub-state (job_record.h), one generation
// of a job (generation.h) with its checkpoint commit tally
// (checkpoint_tally.h), and the job status updates (job_status.h).
//
// Job states (v1::JobState) and transitions:
//
// clang-format off
//   QUEUED ────────────────────────── stop ──────────────────────────┐
//     │  ▲                                                           │
//     │  │ preempted for a job of a higher priority: every rank      │
//     │  │ stops at one step, saved; the job waits in the queue      │
//     │  │ (also when a failure or a coordinator restart cuts the    │
//     │  │ stop short)                                               │
//     │  │                                                           │
//     │ the scheduler places it: the next generation                 │
//     ▼  │                                                           ▼
//   RUNNING ── stop, or its time limit: every rank stops at ─────▶ STOPPED
//    │ │  ▲      one step, saved                                   ▲
//    │ │  │ the group is whole again: the next generation            │
//    │ ▼  │                                                          │
//    │ RECOVERING ──────────── stop, or its time limit ──────────────┘
//    │     entered when a worker fails, restarts or is preempted, when a
//    │     rank's retryable error goes unexplained past error_grace, or
//    │     when the coordinator restarts while the job runs
//    │
//    ├── every rank succeeded ───────────────────────────────────▶ SUCCEEDED
//    └── a rank failed for good, or max_restarts are used up ────▶ FAILED
// clang-format on
//
// A start (from QUEUED or RECOVERING) whose workers cannot split the batch,
// or lack the GPUs communication.backend "nccl" needs, also ends in FAILED.
// SUCCEEDED, FAILED and STOPPED are final.
//
// Jobs run at once on disjoint sets of workers. The scheduler
// (scheduler.h) decides which queued jobs start, each with its whole group
// or not at all, on workers that match its placement, by priority, owner
// fairness and quotas, and which running jobs are preempted for a job of a
// higher priority. A recovering job's previous workers are kept for it:
// they hold its live state. A static cluster (TF_CONFIG) runs one job at a
// time, on all its tasks, in submission order. Each start of a job
// is a new generation (a Generation object replaced whole); key-value
// entries and reports of an older generation are fenced off (Aborted), and
// each job's generations and keys are its own.
//
// Thread-safe: every public method may be called from any gRPC thread. One
// lock (mu_) guards all state. No call blocks: the waits (KvGetAsync,
// WatchJob) hold no thread; they register a callback that the
// coordinator calls, with its lock held, when the wait is over, and their
// deadlines are on the injected clock (Sweep times them out). The rpc layer
// serves thousands of sessions and watches this way (coordinator/rpc/); the
// unit tests wait through a synchronous wrapper on a fake clock
// (tests/unit/coordinator_fixture.h).
#ifndef LOCKSTEP_COORDINATOR_COORDINATOR_H_
#define LOCKSTEP_COORDINATOR_COORDINATOR_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/caller.h"
#include "common/clock.h"
#include "common/metrics.h"
#include "coordinator/artifact_store.h"
#include "coordinator/authorization.h"
#include "coordinator/generation.h"
#include "coordinator/job_record.h"
#include "coordinator/job_store.h"
#include "coordinator/rendezvous.h"
#include "coordinator/scheduler.h"
#include "coordinator/session_sink.h"
#include "coordinator/worker_registry.h"
#include "lockstep/v1/cluster.pb.h"
#include "lockstep/v1/coordinator.pb.h"

namespace lockstep::coordinator {

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
    // What one generation's rendezvous store may hold (--kv-max-entries,
    // --kv-max-bytes).
    KvLimits kv_limits;
    // Finished jobs kept (--keep-finished-jobs): past it, the oldest finished
    // jobs are deleted, from memory and the store.
    int64_t keep_finished_jobs = 1000;
    // Finished jobs that ended longer ago are deleted (--finished-job-ttl);
    // infinite: kept until keep_finished_jobs pushes them out.
    absl::Duration finished_job_ttl = absl::InfiniteDuration();
    // A free worker (free:N) without a session and silent this long is
    // forgotten (--forget-workers-after); a static cluster's tasks stay.
    absl::Duration forget_workers_after = absl::Hours(1);
    // Whether an identity has been revoked (--deny-identities; may be
    // empty): Sweep ends the sessions of revoked workers.
    std::function<bool(const std::string& identity)> revoked;
    // The pool scheduler's quotas, minimum run time, aging and starvation
    // bound (--quota, --min-run-time, --age-after, --starvation-bound);
    // its top_priority is starvation_priority when set, else the highest
    // of priority_classes (--starvation-priority).
    SchedulerPolicy scheduling;
    std::optional<int> starvation_priority;
    // Named priorities a spec may give as priority_class
    // (--priority-class urgent=100).
    std::map<std::string, int> priority_classes;
    // Who may use each priority class above the default (0): owners
    // ("operator:alice") or "*" for everyone. A class of 0 or below is
    // anyone's; admins may use every class and any raw priority.
    std::map<std::string, std::set<std::string>> priority_grants;
    // Owners ("operator:bob") who may stop and delete any job
    // (--admin); other operators only their own.
    std::set<std::string> admins;
    // Where the models jobs export are kept (--artifact-dir; empty: none),
    // and their bounds (--max-artifact-bytes, --max-owner-artifact-bytes).
    std::string artifact_dir;
    ArtifactStore::Limits artifact_limits;
  };

  // Loads the jobs the store holds. A job that was running when the previous
  // coordinator stopped is RECOVERING: it re-forms as a new generation when
  // its workers reconnect. Errors: DataLoss for an unreadable store.
  static absl::StatusOr<std::unique_ptr<Coordinator>> Create(Options options);

  // The worker entry points take the caller (common/caller.h) and refuse
  // whom they must (authorization.h): Unauthenticated for no known
  // identity, PermissionDenied for another role or another worker's
  // identity. Role::kInsecure passes every check.
  //
  // Possible errors:
  //   Unauthenticated, PermissionDenied: not a worker identity, or one
  //     claiming a task its certificate does not name.
  //   InvalidArgument: the task is not a training task of the static cluster,
  //     the worker's own cluster view differs from ours, or a static cluster
  //     worker registered without a task identity.
  //   Unavailable: the worker id already has a live session of another
  //     process or identity (logged with both addresses). A restarted
  //     worker retries: the old session ends when its stream breaks, or
  //     after the heartbeat timeout.
  // A known task with a new incarnation and no live session has restarted:
  // its old process is treated as failed.
  absl::StatusOr<v1::RegisterWorkerResponse> RegisterWorker(
      const Caller& caller, const v1::RegisterWorkerRequest& request);

  // Attaches the command sink of a worker's session. The same process (its
  // identity and incarnation) may replace its own live session. Errors:
  //   Unauthenticated, PermissionDenied: not the identity that registered
  //     the worker.
  //   NotFound: the worker never registered.
  //   Aborted: the incarnation is not the registered one (the process
  //     restarted and registered again; this session is stale).
  absl::Status OpenSession(const Caller& caller, const std::string& worker_id,
                           uint64_t incarnation, SessionSink* sink);
  // The session ended (`cause` says how). A worker holding a rank in a running
  // job fails that job's generation.
  void CloseSession(const std::string& worker_id, uint64_t incarnation,
                    SessionSink* sink, const absl::Status& cause);
  // A heartbeat, progress report or result from a connected worker.
  absl::Status HandleWorkerMessage(const std::string& worker_id,
                                   const v1::WorkerMessage& message);

  // Every rendezvous call is range-checked first (message_checks.h):
  // InvalidArgument, logged, for a field out of range. Only a rank of the
  // live generation may use its store: the caller's identity registered a
  // worker whose live session holds a rank of it (for KvGet, the rank it
  // names, with its token); others get Unauthenticated or PermissionDenied.
  //
  // Errors: Aborted if (job, generation) is not the running generation;
  // ResourceExhausted when the generation's store is full (KvLimits, named
  // in the message).
  absl::Status KvSet(const Caller& caller, const v1::KvSetRequest& request);

  // ---- non-blocking waits ----
  // The callbacks below run exactly once (watchers: once per change) with
  // the coordinator's lock held: like SessionSink::Send they must not block
  // and must not call back into the coordinator.
  using WaitId = Rendezvous::WaitId;
  using KvGetDone = Rendezvous::KvGetDone;
  // Waits for a key of the generation: `done` gets its value, at once when
  // the key is set or the call is fenced, else from the KvSet that sets it,
  // the fence (Aborted: the generation is over or replaced), Shutdown
  // (Cancelled), or the first Sweep() at or after the deadline (on the
  // injected clock; DeadlineExceeded naming the key). The id is for
  // CancelWait.
  WaitId KvGetAsync(const Caller& caller, const v1::KvGetRequest& request,
                    KvGetDone done);
  // The caller gave up (its RPC was cancelled): a wait still pending gets
  // Cancelled now; one already done is left alone.
  void CancelWait(WaitId id);

  // A job's status as each change leaves it, shared between its watchers.
  using JobWatcher = absl::AnyInvocable<void(
      absl::StatusOr<std::shared_ptr<const v1::JobStatus>>)>;
  // Calls `watcher` with the job's current status before returning, then
  // after each change of the job, and a last time with Cancelled on
  // Shutdown or NotFound when the job is deleted. Errors: NotFound;
  // Unavailable once stopping.
  absl::StatusOr<WaitId> WatchJob(const std::string& job_id,
                                  JobWatcher watcher);
  // Once this returns the watcher is never called again.
  void Unwatch(WaitId id);

  // Validates and queues a job; returns its id. `submitted_by`: the
  // submitter's SPIFFE ID (JobStatus.submitted_by; its role and name are the
  // job's owner). Errors: InvalidArgument (a bad spec, an unknown
  // priority_class).
  absl::StatusOr<std::string> SubmitJob(v1::JobSpec spec,
                                        const std::string& submitted_by = "");
  // One job (its full status), or without a job id a page of job
  // summaries, newest first: at most page_size jobs and about
  // kMaxStatusPageBytes, with next_page_token set when older jobs follow.
  // Errors: InvalidArgument (a bad id, page size or token), NotFound.
  absl::StatusOr<v1::GetJobStatusResponse> GetJobStatus(
      const v1::GetJobStatusRequest& request);
  // A queued job stops at once; a running one at a step every rank agrees
  // on, saved first when checkpoints are configured. The job's error then
  // says whether that save was committed ("stopped on request after step
  // 120; saved as ckpt-000000120") or failed, and which checkpoint is the
  // newest instead. `by`: the caller's SPIFFE ID ("" under --insecure, and
  // in process): an operator may stop only the jobs it submitted unless its
  // owner name is an admin (Options::admins). Errors: NotFound;
  // FailedPrecondition when the job already ended; PermissionDenied.
  absl::Status StopJob(const std::string& job_id, const std::string& by = "");
  // Forgets a finished job, in memory and in the store; `by` as for
  // StopJob. Errors: InvalidArgument (a bad id), NotFound,
  // FailedPrecondition when the job has not ended (stop it first),
  // PermissionDenied.
  absl::Status DeleteJob(const std::string& job_id, const std::string& by = "");
  // The queued jobs in the scheduler's order, each with its place and why
  // it waits (JobStatus.queue): at most page_size summaries (0: 1000).
  // Errors: InvalidArgument (a bad page size).
  absl::StatusOr<v1::ListQueueResponse> ListQueue(
      const v1::ListQueueRequest& request);
  // Whether 2 to 16 jobs computed the same function
  // (common/run_comparison.h). Errors: InvalidArgument, NotFound.
  absl::StatusOr<v1::CompareJobsResponse> CompareJobs(
      const v1::CompareJobsRequest& request);

  // ---- artifacts (artifacts.cc, issue 53) ----
  // Starts the upload `header` describes: the caller holds rank 0 of the
  // job's live generation (its token), the job exports, and the info names
  // the export's file and format. Errors, naming the job and rank:
  // FailedPrecondition (no --artifact-dir, nothing exported), the fence's
  // (Aborted, NotFound), PermissionDenied, InvalidArgument,
  // ResourceExhausted.
  absl::StatusOr<std::unique_ptr<ArtifactStore::Upload>> BeginArtifactUpload(
      const Caller& caller, const v1::ArtifactUpload::Header& header);
  // How rank `rank`'s upload of artifact `name` of `job_id` ended: the
  // event "artifact_kept", or "artifact_not_kept" with why.
  void ArtifactUploadEnded(const std::string& job_id, int rank,
                           const std::string& name,
                           const absl::StatusOr<v1::ArtifactInfo>& kept);
  // What is kept for a job, for its owner, an admin or a viewer. Errors:
  // InvalidArgument, NotFound, PermissionDenied.
  absl::StatusOr<std::vector<v1::ArtifactInfo>> ListArtifacts(
      const Caller& caller, const std::string& job_id);
  // Opens artifact `name` of a job for the same callers: its descriptor
  // (the caller closes it) and info. Errors: those of ListArtifacts.
  absl::StatusOr<std::pair<int, v1::ArtifactInfo>> OpenArtifact(
      const Caller& caller, const std::string& job_id, const std::string& name);
  // A page of the workers in id order: at most page_size (0: and at most
  // kMaxWorkerPage, message_checks.h), after the worker named by page_token,
  // with next_page_token set when more follow. Errors: InvalidArgument.
  absl::StatusOr<v1::ListWorkersResponse> ListWorkers(
      const v1::ListWorkersRequest& request);

  // Writes the coordinator's numbers in Prometheus' text format
  // (coordinator_metrics.cc; docs/DESIGN.md lists them): jobs by state, the
  // running jobs' progress, workers by state and how long ago each was
  // heard from, failures by cause, checkpoint commits and their latency.
  void CollectMetrics(metrics::Exposition& out);

  // Declares workers that missed heartbeats failed, ends generations whose
  // reported errors went unexplained past the grace period, deletes the
  // finished jobs past the retention limits and forgets free workers gone
  // for forget_workers_after. Call it often (main: every 100 ms).
  void Sweep();

  // Wakes every blocked call; they return Cancelled.
  void Shutdown();

 private:
  // One job: its status, generation and preemption sub-state
  // (job_record.h).
  using Job = JobRecord;

  struct Watch {
    std::string job_id;
    JobWatcher watcher;
  };

  explicit Coordinator(Options options);

  // ---- authorization of the worker calls (worker_sessions.cc,
  // rendezvous_api.cc) ----
  // A worker identity may claim only the task its certificate names, or
  // none; a spare identity registers only as a spare, without a task; in a
  // static cluster only a spare identity (or a spare task's) may register
  // as a spare, since a spare takes a failed task's rank and its secrets.
  // Errors: PermissionDenied.
  absl::Status AuthorizeTaskClaim(
      const Caller& caller, const v1::RegisterWorkerRequest& request) const;
  // The refusal of a registration for a worker id whose session is live.
  absl::Status SessionTaken(const Caller& caller, const Worker& worker) const;
  // The caller holds rank `rank` of the live generation `number` of
  // `job_id` through a worker its identity registered, whose session is
  // live, and proves it with `token`, the rank's Assignment.rank_token:
  // an identity that workers of other jobs share is not enough. Nothing is
  // checked under --insecure. Errors: the fence's (Aborted, NotFound,
  // Cancelled), PermissionDenied.
  absl::Status AuthorizeRankLocked(const Caller& caller, Call call,
                                   const std::string& job_id, int64_t number,
                                   int rank, absl::string_view token)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // ---- the job queue and state machine (coordinator.cc) ----
  // Re-forms each recovering job whose group can be whole again, then
  // starts each queued job whose workers are free; then tells every idle
  // worker to stand by for the active job of the highest priority.
  // `standby` false: the standbys are left to the caller when no job is
  // active (a connecting worker clears only its own).
  void MaybeStartJobLocked(bool standby = true)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void StartNextGenerationLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Re-forms each recovering job whose group can be whole again; returns
  // the workers kept for those still waiting.
  std::set<std::string> ReformRecoveringLocked()
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A queued job of priority `priority` or higher waits for a preemption.
  bool PreemptorWaitsLocked(int priority) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends Standby{the active job of the highest priority, the oldest among
  // equals} to each idle worker not yet standing by
  // for it, so that it loads the job's data and can take a failed rank at
  // once (docs/DESIGN.md §3). Forgets the standbys when no job is active.
  void StandbyLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Records a "rank_replaced" event for each rank that the new generation
  // (`rank_workers`) of a recovering job gives to another worker than the
  // previous one did.
  void NoteReplacementsLocked(Job& job,
                              const std::vector<std::string>& rank_workers)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Replaces the job's generation with a new one on `workers` (rank order),
  // resolves its communication backend from their devices, and sends each
  // its assignment.
  void StartGenerationLocked(Job& job, const std::vector<Worker*>& workers)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the job's generation: releases its workers, telling those still
  // running to abort with `reason` if `abort`, and wakes the calls blocked
  // on it (they see the fence).
  void ReleaseGenerationLocked(Job& job, bool abort, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The one way a job's state changes (the diagram above): checks that
  // the diagram has the move from the job's state to `to`, then records the
  // event `kind` (of `worker`, may be null) saying `reason`, logs it, sets
  // the state, the error (`reason`, for RECOVERING and the final states) and
  // a final state's end time, bumps the version and persists, all together.
  // A move the diagram lacks is a bug in the caller: logged as an error and
  // refused (false), nothing changed.
  bool TransitionLocked(Job& job, v1::JobState to, const std::string& kind,
                        const Worker* worker, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // At load, before anything runs: a stored job that cannot run becomes
  // FAILED with `reason`, persisted; nothing else changes.
  void FailStoredJobLocked(Job& job, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the job for good, persists, and schedules the next job.
  void EndJobLocked(Job& job, v1::JobState state, const std::string& reason)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Ends the current generation after a failure, recorded as the event
  // `kind` (of `worker`, may be null). The job re-forms as the next
  // generation, fails when max_restarts are used up, or stops when a stop
  // was requested (the stop the failed generation did not finish).
  void FailGenerationLocked(Job& job, const std::string& kind,
                            const Worker* worker, const std::string& cause)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A static cluster: the oldest queued job starts when every task is
  // free.
  void StartQueuedOnClusterLocked(const std::set<std::string>& reserved)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A pool: asks the scheduler which queued jobs start and which running
  // jobs are preempted (workers in `reserved` are kept for recovering
  // jobs), carries it out and keeps each waiting job's place for its status.
  void ScheduleQueuedLocked(const std::set<std::string>& reserved)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The starvation bound: each queued job that has waited
  // --starvation-bound in all is promoted to the top class's priority
  // (event "promoted", persisted); next_promotion_ is when the next one
  // is due.
  void PromoteStarvedLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Keeps the waiting jobs' order (`ids`) and shows each its place and
  // reason (`entries`, in the same order) in its status.
  void ShowWaitingLocked(const std::vector<std::string>& ids,
                         const std::vector<QueueEntry>& entries)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The workers of the job's ranks in rank order: its generation's, or
  // (none yet after a coordinator restart) as stored.
  std::vector<std::string> RankWorkersLocked(const Job& job) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Worker `worker_id`, which held a rank of `job`, was given a rank of
  // another job since: it holds none of `job`'s state.
  bool MovedOnLocked(const std::string& worker_id, const Job& job)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The workers an active job counts against its owner's quota: its ranks,
  // or those it keeps when it shrinks.
  int OwnerChargeLocked(const Job& job) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // What the owner of `except` holds in its other active jobs.
  int OwnerHoldsLocked(const Job& except) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The workers not eligible for `spec`'s placement, added to `reserved`.
  std::set<std::string> WithUnplaceableLocked(const v1::JobSpec& spec,
                                              std::set<std::string> reserved)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Whether the caller `by` (a SPIFFE ID, "" in process) may stop or
  // delete `job`. Errors: PermissionDenied naming the owner.
  absl::Status AuthorizeOwnerLocked(const Job& job, const std::string& by,
                                    absl::string_view what) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // `worker` is gone (session broken, silent, restarted): it loses its
  // session and fails the generation it was part of.
  void WorkerFailedLocked(Worker& worker, const std::string& kind,
                          const std::string& cause)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The RUNNING and RECOVERING jobs, in submission order.
  std::vector<Job*> ActiveJobsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The same, the highest priority first (then in submission order): the
  // order in which recovering jobs are re-formed and spares stand by.
  std::vector<Job*> ByPriorityLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The active job `worker` holds a rank of, if any.
  Job* JobOfLocked(const Worker& worker) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job whose live generation `number` holds `worker` as a rank, if any.
  Job* GenerationOfLocked(const Worker& worker, const std::string& job_id,
                          int64_t number) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The fence (rendezvous_api.cc): the live generation `number` of `job_id`;
  // Aborted when it is over or replaced, Cancelled on shutdown, NotFound
  // for an unknown job.
  absl::StatusOr<Generation*> CurrentGenerationLocked(const std::string& job_id,
                                                      int64_t number)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Sends `command` to every worker still holding a rank of the job.
  void SendToRanksLocked(const Job& job, const v1::CoordinatorCommand& command)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // ---- preemptions by the scheduler (preemption.cc) ----
  // Asks the ranks of `job` to stop at an agreed step and save it, so that
  // its workers go to `for_job`; with `keep` > 0 the (elastic) job then
  // re-forms at once on its first `keep` ranks, keeping its live state,
  // and only the others go.
  void PreemptForLocked(Job& job, const Job& for_job, int keep)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The workers of the ranks of jobs being preempted, or whose preemption
  // was called off: promised to the job they yield for, or kept for their
  // own job's next generation; none of them free for another (also once
  // its rank reported).
  std::set<std::string> YieldingRanksLocked()
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Calls off the preemption of each job that yields for a job no longer
  // queued (it started on other workers, stopped or was deleted): Resume
  // to its ranks (issue 52). Ranks that had already agreed to stop report
  // it all the same, and the job then re-forms on its workers.
  void CallOffPreemptionsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Every rank stopped for a preemption: the job waits for its group (a
  // worker's SIGTERM), goes back to the queue (the scheduler's), or re-forms
  // on its workers (the scheduler's, called off too late).
  void PreemptedLocked(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job yielded its workers to yield_for(): it goes back to the queue
  // or (shrink_to() > 0) re-forms on its first ranks, counted as a
  // preemption (no restart), and the workers it gave up are promised to
  // yield_for(). `what` says how its generation ended; `abort`: its ranks
  // are told to abort (a failure cut the stop short). Schedules nothing.
  void YieldedLocked(Job& job, const std::string& what, bool abort)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The workers of the job's ranks from `from` on, released by its
  // preemption, are promised to the job it yielded for.
  void PromiseReleasedLocked(const Job& job, int from)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // ---- worker reports (worker_reports.cc) ----
  // A leaving worker's word on the live state it held (PreemptRequest with
  // live_state_done): the checkpoint it saved it as, or why it did not.
  void HandleLiveStateLocked(Worker& worker, const v1::PreemptRequest& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Raises the job's applied_step from a rank's result, whatever its
  // generation; only for the rank `worker` was last given.
  void NoteAppliedStepLocked(const Worker& worker, const v1::TaskResult& result)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void HandleResultLocked(Worker& worker, const v1::TaskResult& result)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Every rank of the generation reported success: the job succeeds, stops
  // or (preempted) waits for its group.
  void AllRanksDoneLocked(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Only from the chief (rank 0) of the live generation it names.
  void HandleProgressLocked(const Worker& worker,
                            const v1::ProgressReport& report)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The two-phase checkpoint commit: once every rank prepared a step, the
  // chief is told to commit it; a failed prepare abandons the step.
  void HandlePreparedLocked(Worker& worker, const v1::CheckpointPrepared& p)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void HandleCommittedLocked(Worker& worker,
                             const v1::CheckpointCommitted& committed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A rank skipped records of the job's data (data.skip_corrupt): counted
  // once each; past the spec's limit the job fails.
  void HandleSkippedLocked(const Worker& worker,
                           const v1::RecordsSkipped& skipped)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A worker got SIGTERM: every rank stops at an agreed step and saves it.
  void HandlePreemptLocked(Worker& worker, const v1::PreemptRequest& request)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // "stopped on request after step 120; saved as ckpt-000000120", or what
  // became of the final save instead.
  std::string StopReasonLocked(const Job& job) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Jobs past their time limit (JobSpec.time_limit_seconds) stop as a stop
  // on request does: a running one at an agreed step, saved; a recovering
  // one, or a queued one (its limit ran out while it yielded), at once,
  // its newest checkpoint kept (from Sweep and before each pass).
  void EnforceTimeLimitsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // CollectMetrics' part for the scheduler (coordinator_metrics.cc):
  // running and queued jobs, workers held and the longest wait, by owner
  // and by priority; preemptions.
  void WriteSchedulingLocked(metrics::Exposition& out)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // ---- status records ----
  void AddEventLocked(Job& job, const std::string& kind, const Worker* worker,
                      const std::string& message)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The job's status as reported: with the stalled rank, if any, and with
  // `include_history` the page of at most `history_limit` losses from
  // index `history_offset` (JobStatus.history_offset and history_size say
  // where it lies).
  v1::JobStatus ReportLocked(
      const Job& job, bool include_history, int64_t history_offset = 0,
      int history_limit = std::numeric_limits<int>::max()) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Bumps the job's version and wakes its watchers.
  void ChangedLocked(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Calls the job's watchers with its status (rendezvous_api.cc).
  void NotifyWatchersLocked(const Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes the watchers of `job_id` (of every job if nullopt) and calls each
  // a last time with `why`.
  void EndWatchesLocked(const std::optional<std::string>& job_id,
                        const absl::Status& why)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PersistLocked(Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Writes the free workers registered (or restarted) since the last call
  // to the store, in one transaction: from Sweep, and before a generation
  // that names them is persisted.
  void PersistWorkersLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  double NowSeconds() const;

  // ---- retention (coordinator.cc) ----
  // Adds a job (new or loaded) to jobs_ and job_order_ under `seq`.
  Job& AddJobLocked(const std::string& id, int64_t seq)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes a finished job from memory, the store and the artifacts;
  // watchers see NotFound.
  void EraseJobLocked(const std::string& id) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Removes the artifacts of jobs the coordinator no longer has (a crash
  // between forgetting a job and removing its artifacts). From Create.
  void ForgetOrphanArtifactsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // A reader of a job's artifacts making `call` for `name` ("" to list):
  // a viewer, or an operator that owns the job or is an admin. Errors:
  // InvalidArgument, NotFound, PermissionDenied, Unauthenticated.
  absl::Status AuthorizeArtifactReader(const Caller& caller, Call call,
                                       const std::string& job_id,
                                       const std::string& name)
      ABSL_LOCKS_EXCLUDED(mu_);
  // Deletes the oldest finished jobs past keep_finished_jobs_ and those that
  // ended longer than finished_job_ttl_ ago. Called only where no Job& is
  // held (Sweep, SubmitJob, Create).
  void ForgetFinishedJobsLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Constant after construction.
  const std::optional<v1::ClusterSpec> cluster_;
  Clock* const clock_;
  const std::unique_ptr<JobStore> store_;
  const absl::Duration error_grace_;
  const absl::Duration heartbeat_timeout_;
  const KvLimits kv_limits_;
  const int64_t keep_finished_jobs_;
  const absl::Duration finished_job_ttl_;
  const absl::Duration forget_workers_after_;
  const std::function<bool(const std::string& identity)> revoked_;
  const Scheduler scheduler_;
  const std::map<std::string, int> priority_classes_;
  const std::map<std::string, std::set<std::string>> priority_grants_;
  const std::set<std::string> admins_;
  // The artifacts (--artifact-dir); null without. Set once by Create;
  // thread-safe itself.
  std::unique_ptr<ArtifactStore> artifacts_;

  mutable absl::Mutex mu_;
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  WorkerRegistry workers_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, Job> jobs_ ABSL_GUARDED_BY(mu_);
  std::deque<std::string> queue_ ABSL_GUARDED_BY(mu_);
  // Every job by submission order (Job::seq).
  std::map<int64_t, std::string> job_order_ ABSL_GUARDED_BY(mu_);
  int64_t next_job_seq_ ABSL_GUARDED_BY(mu_) = 1;
  // The jobs that are RUNNING or RECOVERING, by Job::seq.
  std::map<int64_t, std::string> active_jobs_ ABSL_GUARDED_BY(mu_);
  // MaybeStartJobLocked is running; a start that ended a job asked for
  // another pass.
  bool scheduling_ ABSL_GUARDED_BY(mu_) = false;
  // Workers promised to a queued job (PoolWorker.promised_to): released
  // by a preemption for it, or held for it by a pass. A promise ends when
  // the worker is given to a job or its job leaves the queue, or when the
  // job waits for anything but its preemption: for workers to come back
  // (no_fit) only until `until` (released workers that died or restarted,
  // or all of them after a coordinator restart, have a heartbeat timeout
  // to reconnect), for other reasons at once.
  struct Promise {
    std::string job_id;
    absl::Time until = absl::InfinitePast();
  };
  std::map<std::string, Promise> promised_ ABSL_GUARDED_BY(mu_);
  // The queued job that held the reservation in the last pass: it keeps it
  // until it starts (QueuedJob.reserved). Not stored: after a restart the
  // first pass chooses again, by the same rule.
  std::string reserved_for_ ABSL_GUARDED_BY(mu_);
  // Free workers whose id the store does not hold yet (PersistWorkersLocked).
  std::set<std::string> unsaved_workers_ ABSL_GUARDED_BY(mu_);
  bool schedule_again_ ABSL_GUARDED_BY(mu_) = false;
  // The queued jobs in the order of the scheduler's last pass (each one's
  // place and reason are in its status), and whether one of them waits
  // only for time to pass (a minimum run time).
  std::vector<std::string> waiting_ ABSL_GUARDED_BY(mu_);
  bool waiting_on_time_ ABSL_GUARDED_BY(mu_) = false;
  // When the next queued job reaches --starvation-bound (Sweep schedules
  // then); infinite future: none will.
  absl::Time next_promotion_ ABSL_GUARDED_BY(mu_) = absl::InfiniteFuture();
  // The pending KvGetAsync calls (they call CurrentGenerationLocked under
  // mu_), and the job watchers.
  WaitId next_wait_id_ ABSL_GUARDED_BY(mu_) = 1;
  Rendezvous rendezvous_ ABSL_GUARDED_BY(mu_);
  std::map<WaitId, Watch> watches_ ABSL_GUARDED_BY(mu_);
  // For CollectMetrics: the events that ended a generation or a save, by
  // kind, and the latency of each committed checkpoint.
  std::map<std::string, int64_t> failures_ ABSL_GUARDED_BY(mu_);
  int64_t commits_ ABSL_GUARDED_BY(mu_) = 0;
  // Jobs the scheduler sent back to the queue for a job of a higher
  // priority.
  int64_t yields_ ABSL_GUARDED_BY(mu_) = 0;
  // Preemptions called off (CallOffPreemptionsLocked).
  int64_t called_off_ ABSL_GUARDED_BY(mu_) = 0;
  metrics::Histogram commit_seconds_ ABSL_GUARDED_BY(mu_);
};

}  // namespace lockstep::coordinator

#endif  // LOCKSTEP_COORDINATOR_COORDINATOR_H_
