// The Coordinator's side of the workers: registration, the session of each
// worker process, its messages, and failure detection (a broken session, a
// new incarnation, silence past the heartbeat timeout, a rank that never
// joins its generation).
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "common/tf_config.h"
#include "coordinator/authorization.h"
#include "coordinator/coordinator.h"
#include "coordinator/message_checks.h"

namespace lockstep::coordinator {

absl::StatusOr<v1::RegisterWorkerResponse> Coordinator::RegisterWorker(
    const Caller& caller, const v1::RegisterWorkerRequest& request) {
  RETURN_IF_ERROR(AuthorizeRole(caller, Call::kRegisterWorker));
  if (absl::Status bad = CheckRegistration(request); !bad.ok()) {
    LogRefusal(
        absl::Status(bad.code(),
                     absl::StrCat("refusing a registration: ", bad.message())))
        .IgnoreError();
    return bad;
  }
  RETURN_IF_ERROR(AuthorizeTaskClaim(caller, request));
  ASSIGN_OR_RETURN(std::string id, RegistrationId(cluster_, request));
  absl::MutexLock lock(&mu_);
  if (id.empty()) id = workers_.FreeId(request.incarnation(), caller.id);
  Worker* worker = workers_.Find(id);
  if (worker == nullptr) {
    worker = &workers_.Add(id);
  } else if (worker->sink != nullptr &&
             (worker->incarnation != request.incarnation() ||
              worker->identity != caller.id)) {
    return SessionTaken(caller, *worker);
  } else if (worker->incarnation != request.incarnation()) {
    worker->leaving = false;
    WorkerFailedLocked(
        *worker, "worker_restarted",
        absl::StrCat("worker ", WorkerRegistry::Describe(*worker),
                     " restarted (a new process registered)"));
  }
  workers_.Register(*worker, request, clock_->Now());
  worker->identity = caller.id;
  worker->peer = caller.peer;
  // A free worker's id outlives this coordinator: the same process gets it
  // back after a restart, where jobs' ranks name it. Written in batches.
  if (worker->task.type().empty() && store_ != nullptr) {
    unsaved_workers_.insert(id);
  }
  LogInfo("registered ", id, " (host ", worker->host, ", device ",
          worker->device.name(),
          worker->device.gpu_name().empty()
              ? ""
              : absl::StrCat(" ", worker->device.gpu_name()),
          ", ", caller.ToString(), ")");
  v1::RegisterWorkerResponse response;
  response.set_worker_id(id);
  response.set_heartbeat_interval_ms(
      absl::ToInt64Milliseconds(heartbeat_timeout_ / 2));
  return response;
}

absl::Status Coordinator::AuthorizeTaskClaim(
    const Caller& caller, const v1::RegisterWorkerRequest& request) const {
  if (caller.role == Role::kInsecure) return absl::OkStatus();
  const bool free = request.task().type().empty();
  if (caller.role == Role::kSpare) {
    if (free && request.spare()) return absl::OkStatus();
    return Denied(caller, Call::kRegisterWorker,
                  "a spare's certificate registers only as a hot spare, "
                  "without a task (lockstep-worker --spare); a worker of a "
                  "task needs that task's certificate");
  }
  if (free && request.spare() && cluster_.has_value()) {
    // A static cluster's spare takes a failed task's rank, with the
    // generation's secret: not for any task-less worker identity.
    return Denied(
        caller, Call::kRegisterWorker,
        absl::StrCat(
            "it registered as a hot spare of the static cluster, but its "
            "certificate is not a spare's",
            caller.task.empty() ? ""
                                : absl::StrCat(" (it is task ", caller.task,
                                               "'s: register as that task)"),
            "; give it a spare identity (spiffe://<trust domain>/spare/NAME: "
            "lockstep-certs spare NAME)"));
  }
  // Free registration in an elastic cluster takes no task's place: any
  // worker identity may register so.
  if (free) return absl::OkStatus();
  const std::string claimed = TaskName(request.task());
  if (claimed == caller.task) return absl::OkStatus();
  return Denied(
      caller, Call::kRegisterWorker,
      caller.task.empty()
          ? absl::StrCat("it registered as task ", claimed,
                         ", but its certificate names no task, so it may "
                         "only register without one (free registration, or "
                         "--spare); give it the certificate of ",
                         claimed, " (spiffe://<trust domain>/worker/",
                         request.task().type(), "/", request.task().index(),
                         ")")
          : absl::StrCat("it registered as task ", claimed,
                         ", but its certificate is task ", caller.task,
                         "'s; a worker may register only as its own task"));
}

absl::Status Coordinator::SessionTaken(const Caller& caller,
                                       const Worker& worker) const {
  return LogRefusal(absl::UnavailableError(absl::StrCat(
      caller.ToString(), " registered as ", worker.id,
      ", which already has a live session from ", worker.peer,
      "; refusing it so that the live session is not taken over. If that "
      "process is gone, its session ends when its stream breaks or after ",
      absl::FormatDuration(heartbeat_timeout_),
      " without heartbeats (--heartbeat-timeout): register again then")));
}

absl::Status Coordinator::OpenSession(const Caller& caller,
                                      const std::string& worker_id,
                                      uint64_t incarnation, SessionSink* sink) {
  RETURN_IF_ERROR(AuthorizeRole(caller, Call::kWorkerSession));
  absl::MutexLock lock(&mu_);
  if (shutdown_) return absl::UnavailableError("the coordinator is stopping");
  Worker* worker = workers_.Find(worker_id);
  if (worker == nullptr) {
    return absl::NotFoundError(absl::StrCat(
        "worker ", worker_id, " opened a session without registering"));
  }
  if (caller.role != Role::kInsecure && worker->identity != caller.id) {
    return Denied(caller, Call::kWorkerSession,
                  absl::StrCat("worker ", worker_id,
                               " was registered by another identity; a "
                               "worker's session is its registrant's only"));
  }
  if (worker->incarnation != incarnation) {
    // The incarnations stay out of the message: they are the session's
    // secret.
    return absl::AbortedError(absl::StrCat(
        "worker ", worker_id,
        " session names an incarnation that is not "
        "the registered one; the process restarted: register again"));
  }
  if (worker->sink != nullptr && worker->sink != sink) {
    // The same process (its identity, its incarnation) reconnected: its
    // previous session is dead to it. Nobody else can name both.
    WorkerFailedLocked(
        *worker, "worker_reconnected",
        absl::StrCat("worker ", WorkerRegistry::Describe(*worker),
                     " opened a new session from ", caller.peer,
                     "; its session from ", worker->peer, " is dead"));
  }
  worker->sink = sink;
  worker->peer = caller.peer;
  worker->last_heartbeat = clock_->Now();
  MaybeStartJobLocked(/*standby=*/false);
  if (!active_jobs_.empty()) {
    StandbyLocked();
  } else {
    // What StandbyLocked would do with no job running, for this worker only:
    // a scan of every worker per session made connecting N workers O(N^2).
    worker->standby_job.clear();
  }
  return absl::OkStatus();
}

void Coordinator::CloseSession(const std::string& worker_id,
                               uint64_t incarnation, SessionSink* sink,
                               const absl::Status& cause) {
  absl::MutexLock lock(&mu_);
  Worker* worker = workers_.Find(worker_id);
  if (worker == nullptr || worker->sink != sink ||
      worker->incarnation != incarnation) {
    return;  // already declared failed, or replaced by a newer session
  }
  if (shutdown_) {
    // The coordinator itself is stopping and closed every session: that is
    // no worker's failure, and must not spend one of the job's restarts. A
    // restarted coordinator marks the running job RECOVERING (§1).
    worker->sink = nullptr;
    return;
  }
  WorkerFailedLocked(*worker, "worker_failed",
                     absl::StrCat("worker ", WorkerRegistry::Describe(*worker),
                                  " lost its session: the process exited or "
                                  "its network broke (",
                                  cause.message(), ")"));
}

void Coordinator::WorkerFailedLocked(Worker& worker, const std::string& kind,
                                     const std::string& cause) {
  LogWarning(cause);
  if (worker.sink != nullptr) {
    worker.sink->Close();
    worker.sink = nullptr;
  }
  Job* job = JobOfLocked(worker);
  if (job == nullptr) return;
  if (job->status.state() != v1::JOB_STATE_RUNNING ||
      worker.generation != job->status.generation()) {
    return;
  }
  FailGenerationLocked(*job, kind, &worker, cause);
}

absl::Status Coordinator::HandleWorkerMessage(
    const std::string& worker_id, const v1::WorkerMessage& message) {
  absl::MutexLock lock(&mu_);
  Worker* worker = workers_.Find(worker_id);
  if (worker == nullptr) {
    return absl::NotFoundError(absl::StrCat("unknown worker ", worker_id));
  }
  if (absl::Status bad = CheckWorkerMessage(message); !bad.ok()) {
    LogWarning("refusing a message from ", WorkerRegistry::Describe(*worker),
               ": ", bad.message());
    return bad;
  }
  worker->last_heartbeat = clock_->Now();
  switch (message.kind_case()) {
    case v1::WorkerMessage::kHeartbeat:
      workers_.Heartbeat(*worker, message.heartbeat(), clock_->Now());
      break;
    case v1::WorkerMessage::kProgress:
      HandleProgressLocked(*worker, message.progress());
      break;
    case v1::WorkerMessage::kResult:
      HandleResultLocked(*worker, message.result());
      break;
    case v1::WorkerMessage::kPrepared:
      HandlePreparedLocked(*worker, message.prepared());
      break;
    case v1::WorkerMessage::kCommitted:
      HandleCommittedLocked(*worker, message.committed());
      break;
    case v1::WorkerMessage::kPreempt:
      HandlePreemptLocked(*worker, message.preempt());
      break;
    case v1::WorkerMessage::kSkipped:
      HandleSkippedLocked(*worker, message.skipped());
      break;
    default:
      break;
  }
  return absl::OkStatus();
}

void Coordinator::Sweep() {
  absl::MutexLock lock(&mu_);
  absl::Time now = clock_->Now();
  if (revoked_) {
    for (Worker* worker : workers_.Connected()) {
      if (worker->identity.empty() || !revoked_(worker->identity)) continue;
      WorkerFailedLocked(
          *worker, "identity_revoked",
          absl::StrCat("worker ", WorkerRegistry::Describe(*worker),
                       ": its identity ", worker->identity,
                       " was revoked (--deny-identities); its session is "
                       "ended and it may not register again"));
    }
  }
  for (Worker* worker : workers_.Silent(now)) {
    if (worker->sink == nullptr) continue;  // failed by an earlier one
    absl::Duration silent = now - worker->last_heartbeat;
    WorkerFailedLocked(
        *worker, "worker_failed",
        absl::StrCat(
            "worker ", WorkerRegistry::Describe(*worker),
            " missed heartbeats for ",
            absl::FormatDuration(absl::Trunc(silent, absl::Milliseconds(100))),
            ": it hung or is partitioned"));
  }
  std::vector<std::string> active;
  for (const Job* job : ActiveJobsLocked())
    active.push_back(job->status.job_id());
  for (const std::string& id : active) {
    auto found = jobs_.find(id);
    if (found == jobs_.end()) continue;
    Job* job = &found->second;
    if (job->status.state() == v1::JOB_STATE_RUNNING) {
      // A rank that never started its part (its previous task could not
      // unwind, or the assignment was lost) is named, rather than left to
      // time the other ranks' rendezvous out.
      for (Worker* worker : workers_.NotJoined(
               job->status.job_id(), job->generation->rank_workers(), now)) {
        WorkerFailedLocked(
            *worker, "worker_failed",
            absl::StrCat(WorkerRegistry::Describe(*worker),
                         " did not join generation ", job->status.generation(),
                         " within ", absl::FormatDuration(heartbeat_timeout_),
                         " of its assignment: its previous part of the job "
                         "has not ended (see its log); the job re-forms"));
        if (job->status.state() != v1::JOB_STATE_RUNNING) break;
      }
    }
    if (job->status.state() == v1::JOB_STATE_RUNNING &&
        job->generation->SuspectDue(now)) {
      std::string cause = job->generation->suspect();
      FailGenerationLocked(*job, "generation_failed", nullptr, cause);
    }
  }
  EnforceTimeLimitsLocked();
  // A job waiting for running jobs to reach the minimum run time preempts
  // them once they have, and a job that reached the starvation bound is
  // promoted: only time changed.
  if (waiting_on_time_ || now >= next_promotion_) MaybeStartJobLocked();
  ForgetFinishedJobsLocked();
  PersistWorkersLocked();
  for (const std::string& id :
       workers_.ForgetVanished(now, forget_workers_after_)) {
    if (store_ != nullptr) {
      if (absl::Status deleted = store_->DeleteWorker(id); !deleted.ok()) {
        LogError(deleted.message());
      }
    }
    LogInfo("forgot free worker ", id, ": no session for ",
            absl::FormatDuration(forget_workers_after_),
            " (--forget-workers-after)");
  }
  rendezvous_.AnswerDue();  // those past their deadline time out
}

absl::StatusOr<v1::ListWorkersResponse> Coordinator::ListWorkers(
    const v1::ListWorkersRequest& request) {
  if (absl::Status bad = CheckListWorkers(request); !bad.ok()) {
    return Refused(bad);
  }
  const int page_size =
      request.page_size() > 0 ? request.page_size() : kMaxWorkerPage;
  v1::ListWorkersResponse response;
  bool more = false;
  absl::MutexLock lock(&mu_);
  for (v1::WorkerInfo& info :
       workers_.List(request.page_token(), page_size, &more)) {
    if (auto promise = promised_.find(info.worker_id());
        promise != promised_.end() && info.job_id().empty()) {
      info.set_promised_to(promise->second.job_id);
      if (promise->second.until > clock_->Now()) {
        info.set_promised_until(
            absl::ToDoubleSeconds(promise->second.until - absl::UnixEpoch()));
      }
    }
    *response.add_workers() = std::move(info);
  }
  if (more) {
    response.set_next_page_token(
        response.workers(response.workers_size() - 1).worker_id());
  }
  return response;
}

}  // namespace lockstep::coordinator
