// How the Coordinator acts on what the ranks of a generation report: task
// results, progress, checkpoint prepares and commits, and preemption
// requests. Each is accepted only from the session of a worker holding a
// rank of the job's live generation, only for that generation's number and
// only for that rank (progress and commits: only the chief, rank 0). Two
// come from outside a live generation, and are accepted only for the rank
// the worker was last given: a late result's applied step, and a leaving
// worker's report on its live state (the job is recovering).
#include <limits>
#include <optional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/job_state.h"
#include "common/log.h"
#include "coordinator/authorization.h"
#include "coordinator/coordinator.h"
#include "coordinator/job_status.h"

namespace lockstep::coordinator {
namespace {

// At most one progress write to the job store per job this often: enough
// that a coordinator restart keeps the loss history of a long generation,
// bounded so that frequent reports do not turn into frequent fsyncs.
constexpr absl::Duration kPersistProgressEvery = absl::Seconds(5);

// Errors that say a peer or the generation went away, not that the job is
// wrong: the job re-forms instead of failing.
bool IsRetryable(int code) {
  auto status_code = static_cast<absl::StatusCode>(code);
  return status_code == absl::StatusCode::kUnavailable ||
         status_code == absl::StatusCode::kAborted ||
         status_code == absl::StatusCode::kDeadlineExceeded ||
         status_code == absl::StatusCode::kCancelled;
}

// Only a worker that held a rank of the job holds its live state: one given
// a rank by this coordinator, or listed among the ranks of the job's latest
// generation (stored, so also after a coordinator restart).
// A worker that has been given a rank of another job since holds none of
// this one's state (issue 52 §3): it holds a rank of it only when its last
// job is this one (or, after a coordinator restart, none yet).
bool HeldRankOf(const Worker& worker, const v1::JobStatus& status) {
  if (worker.job_id == status.job_id()) return true;
  if (!worker.job_id.empty()) return false;
  for (const v1::RankResult& rank : status.ranks()) {
    if (rank.worker_id() == worker.id) return true;
  }
  return false;
}

// A rank of the live generation reported for a rank it does not hold (or,
// for progress and commits, is not the chief): nothing a correct worker
// sends, so the report is dropped and the refusal logged (rate-limited),
// naming the worker, its identity and address. A late report of a
// generation that already ended is no refusal: it is dropped quietly
// before this.
void RefuseReport(const Worker& worker, absl::string_view what,
                  absl::string_view why) {
  LogRefusal(absl::PermissionDeniedError(absl::StrCat(
                 "worker ", worker.id, " (", worker.identity, " at ",
                 worker.peer, "), rank ", worker.rank, " of job ",
                 worker.job_id, " generation ", worker.generation, ", sent ",
                 what, " over its session: ", why, "; ignored")))
      .IgnoreError();
}

// The most steps the job may train, by what the coordinator itself knows:
// its spec's max_steps (the plan a chief reports is the chief's word).
int64_t StepLimit(const v1::JobStatus& status) {
  return status.spec().max_steps() > 0 ? status.spec().max_steps()
                                       : std::numeric_limits<int64_t>::max();
}

}  // namespace

Coordinator::Job* Coordinator::GenerationOfLocked(const Worker& worker,
                                                  const std::string& job_id,
                                                  int64_t number) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end() || !worker.holds_rank || worker.job_id != job_id) {
    return nullptr;
  }
  Job& job = it->second;
  if (job.generation == nullptr || !job.generation->Admits(number)) {
    return nullptr;
  }
  return &job;
}

void Coordinator::NoteAppliedStepLocked(const Worker& worker,
                                        const v1::TaskResult& result) {
  // Also from a generation that already ended: its ranks say where they
  // stopped, which a later resume may repeat.
  if (worker.job_id != result.job_id() ||
      worker.generation != result.generation() ||
      worker.rank != result.rank()) {
    return;
  }
  auto it = jobs_.find(result.job_id());
  if (it == jobs_.end()) return;
  v1::JobStatus& status = it->second.status;
  if (result.generation() < 1 || result.generation() > status.generation()) {
    return;
  }
  if (result.steps() > status.applied_step()) {
    NoteAppliedStep(status, result.steps());
    ChangedLocked(it->second);
    PersistLocked(it->second);
  }
}

void Coordinator::HandleResultLocked(Worker& worker,
                                     const v1::TaskResult& result) {
  NoteAppliedStepLocked(worker, result);
  Job* job = GenerationOfLocked(worker, result.job_id(), result.generation());
  if (job == nullptr) return;
  if (result.rank() != worker.rank) {
    RefuseReport(worker, absl::StrCat("a result for rank ", result.rank()),
                 "a rank reports only its own result");
    return;
  }
  if (!result.ok()) {
    std::string cause =
        absl::StrCat("rank ", worker.rank, " (", worker.id, " on ", worker.host,
                     ") failed: ", result.error());
    if (!IsRetryable(result.code())) {
      AddEventLocked(*job, "rank_failed", &worker, cause);
      EndJobLocked(*job, v1::JOB_STATE_FAILED, cause);
    } else {
      // Usually a peer died and its session break is about to name it.
      job->generation->Suspect(cause, clock_->Now() + error_grace_);
    }
    return;
  }
  if (result.steps() > StepLimit(job->status)) {
    const std::string cause = absl::StrCat(
        "rank ", worker.rank, " (", worker.id, " as ", worker.identity, " at ",
        worker.peer, ") reported its result at step ", result.steps(),
        ", past the job's max_steps ", StepLimit(job->status),
        ": no rank trains past it, so its reports cannot be trusted (check who "
        "holds that worker's certificate)");
    AddEventLocked(*job, "rank_result_refused", &worker, cause);
    EndJobLocked(*job, v1::JOB_STATE_FAILED, cause);
    return;
  }
  if (!result.stop_save_error().empty()) {
    job->generation->checkpoints().StopSaveFailed(
        result.steps(),
        absl::StrCat("rank ", worker.rank, ": ", result.stop_save_error()));
  }
  ApplyResult(job->status, worker.rank, result);
  WorkerRegistry::Unassign(worker);  // its part is done
  ChangedLocked(*job);
  if (result.preempted()) job->generation->MarkPreempted();
  if (job->generation->AddOkResult(result.rank(), result.model_digest(),
                                   result.steps(), result.stopped(),
                                   result.total_steps())) {
    AllRanksDoneLocked(*job);
  }
}

void Coordinator::AllRanksDoneLocked(Job& job) {
  // No rank decides the outcome alone: the replicas are bit-identical, so
  // every rank ends with the same digest at the same step.
  if (std::string differ = job.generation->Disagreement(); !differ.empty()) {
    const std::string cause = absl::StrCat(
        "the ranks of generation ", job.generation->number(),
        " ended with different models: ", differ,
        "; the replicas must be bit-identical, so a rank is faulty or forged "
        "(check the named workers and who holds their certificates)");
    AddEventLocked(job, "ranks_disagree", nullptr, cause);
    EndJobLocked(job, v1::JOB_STATE_FAILED, cause);
    return;
  }
  // Every rank's word, not the last one's: a rank that stopped early makes
  // the job stopped (never succeeded), and the plan's end is the one every
  // rank computed, or else the one the chief's progress reported.
  const bool stopped = job.generation->AnyStopped();
  const int64_t step = job.status.step();
  const int64_t end = job.generation->PlannedEnd() > 0
                          ? job.generation->PlannedEnd()
                          : job.status.total_steps();
  // A preemption asks every rank to stop at an agreed step, and a rank that
  // did says so (stopped). Ranks that reached the plan's end first, or
  // stopped exactly there, finished the job, which a preemption must not
  // send back to the queue to train again (issue 52).
  const bool finished = end > 0 && step == end;
  const bool preempting = job.generation->preempting();
  const bool yielded = preempting && stopped && !finished;
  const bool to_the_end = !stopped && !job.stop_requested;
  if (to_the_end && end > 0 && step != end) {
    const std::string cause = absl::StrCat(
        "every rank of generation ", job.generation->number(),
        " reported success at step ", step, ", but the plan ends at step ", end,
        "; the job is not done");
    EndJobLocked(job, v1::JOB_STATE_FAILED, cause);
    return;
  }
  if (yielded && !job.stop_requested) {
    PreemptedLocked(job);
    return;
  }
  if (job.stop_requested || (stopped && !(preempting && finished))) {
    EndJobLocked(job, v1::JOB_STATE_STOPPED, StopReasonLocked(job));
  } else {
    EndJobLocked(job, v1::JOB_STATE_SUCCEEDED, "");
  }
}

std::string Coordinator::StopReasonLocked(const Job& job) const {
  const int64_t step = job.status.step();
  std::string saved = FinalSave(job.status, step,
                                job.generation->checkpoints().FailureOf(step));
  const std::string cause =
      job.stop_cause.empty() ? "stopped on request" : job.stop_cause;
  if (saved.empty()) return cause;
  return absl::StrCat(cause, " after step ", step, "; ", saved);
}

void Coordinator::HandleProgressLocked(const Worker& worker,
                                       const v1::ProgressReport& report) {
  Job* found = GenerationOfLocked(worker, report.job_id(), report.generation());
  if (found == nullptr) return;
  if (worker.rank != 0) {
    RefuseReport(worker, "progress", "only the chief (rank 0) reports it");
    return;
  }
  Job& job = *found;
  const int64_t limit = StepLimit(job.status);
  if (report.step() > limit || report.total_steps() > limit ||
      report.plan().total_steps() > limit) {
    RefuseReport(worker,
                 absl::StrCat("progress at step ", report.step(), "/",
                              report.total_steps()),
                 absl::StrCat("the job's max_steps is ", limit));
    return;
  }
  ApplyProgress(job.status, report, NowSeconds());
  ChangedLocked(job);
  if (clock_->Now() - job.last_persisted >= kPersistProgressEvery) {
    PersistLocked(job);
  }
}

void Coordinator::HandleSkippedLocked(const Worker& worker,
                                      const v1::RecordsSkipped& skipped) {
  Job* job = GenerationOfLocked(worker, skipped.job_id(), skipped.generation());
  if (job == nullptr) return;
  const int64_t limit = job->status.spec().data().skip_corrupt();
  if (limit <= 0) {
    RefuseReport(worker, "skipped records",
                 "the job's data.skip_corrupt is 0: its ranks skip nothing");
    return;
  }
  if (NoteSkippedRecords(job->status, skipped, worker, NowSeconds()) == 0) {
    return;
  }
  ChangedLocked(*job);
  if (job->status.records_skipped() > limit) {
    const std::string cause = absl::StrCat(
        "more than ", limit, " record", limit == 1 ? "" : "s",
        " of the job's data could not be read (data.skip_corrupt: ", limit,
        "); the last: ", job->status.events().rbegin()->message(),
        "; repair or rewrite the damaged files, or allow more");
    EndJobLocked(*job, v1::JOB_STATE_FAILED, cause);
    return;
  }
  PersistLocked(*job);
}

void Coordinator::HandlePreparedLocked(Worker& worker,
                                       const v1::CheckpointPrepared& p) {
  Job* job = GenerationOfLocked(worker, p.job_id(), p.generation());
  if (job == nullptr) return;
  if (p.rank() != worker.rank) {
    RefuseReport(worker,
                 absl::StrCat("a checkpoint prepare for rank ", p.rank()),
                 "a rank prepares only its own files");
    return;
  }
  std::optional<v1::CommitCheckpoint> commit =
      job->generation->checkpoints().Prepare(p, clock_->Now());
  if (!commit.has_value()) return;  // ranks missing, or the step abandoned
  v1::CoordinatorCommand command;
  *command.mutable_commit() = *std::move(commit);
  Worker* chief = workers_.Find(job->generation->rank_workers().front());
  if (chief != nullptr && chief->sink != nullptr) chief->sink->Send(command);
  if (!p.ok()) {
    AddEventLocked(*job, "checkpoint_failed", &worker,
                   absl::StrCat("step ", p.step(), ": ", p.error()));
    ChangedLocked(*job);
  }
}

void Coordinator::HandleCommittedLocked(
    Worker& worker, const v1::CheckpointCommitted& committed) {
  Job* job =
      GenerationOfLocked(worker, committed.job_id(), committed.generation());
  if (job == nullptr) return;
  if (worker.rank != 0) {
    RefuseReport(worker, "a checkpoint commit",
                 "only the chief (rank 0) commits checkpoints");
    return;
  }
  if (committed.ok() &&
      (job->status.spec().checkpoint().backup_dir().empty() ||
       !job->generation->checkpoints().CommitSent(committed.step()))) {
    RefuseReport(worker,
                 absl::StrCat("a commit of checkpoint step ", committed.step()),
                 job->status.spec().checkpoint().backup_dir().empty()
                     ? "the job saves no checkpoints (no backup_dir)"
                     : "not every rank prepared that step, so no commit of it "
                       "was asked for");
    return;
  }
  const std::optional<absl::Duration> latency =
      job->generation->checkpoints().Committed(committed, clock_->Now());
  if (!committed.ok()) {
    AddEventLocked(*job, "checkpoint_failed", &worker,
                   absl::StrCat("commit of step ", committed.step(), ": ",
                                committed.error()));
    ChangedLocked(*job);
    return;
  }
  ++commits_;
  if (latency.has_value()) {
    commit_seconds_.Observe(absl::ToDoubleSeconds(*latency));
  }
  AddCheckpoint(job->status, committed, worker, NowSeconds());
  ChangedLocked(*job);
  PersistLocked(*job);
}

void Coordinator::HandlePreemptLocked(Worker& worker,
                                      const v1::PreemptRequest& request) {
  worker.leaving = true;
  if (request.live_state_done()) {
    HandleLiveStateLocked(worker, request);
    return;
  }
  Job* job = JobOfLocked(worker);
  if (job == nullptr || job->status.job_id() != request.job_id() ||
      job->status.state() != v1::JOB_STATE_RUNNING ||
      !job->generation->StartPreemption(request.reason())) {
    return;
  }
  AddEventLocked(*job, "preempt_requested", &worker, request.reason());
  v1::CoordinatorCommand command;
  v1::Stop* stop = command.mutable_stop();
  stop->set_job_id(request.job_id());
  stop->set_reason(request.reason());
  stop->set_preempt(true);
  SendToRanksLocked(*job, command);
  ChangedLocked(*job);
}

void Coordinator::HandleLiveStateLocked(Worker& worker,
                                        const v1::PreemptRequest& request) {
  auto it = jobs_.find(request.job_id());
  if (it == jobs_.end() || IsTerminal(it->second.status.state())) return;
  Job& job = it->second;
  if (!HeldRankOf(worker, job.status)) return;
  const int64_t step = request.live_step();
  const std::string& saved = request.saved_checkpoint();
  // A worker saves its live state only when no generation runs on it, into
  // the job's backup_dir, at a step the job can reach.
  std::string refused;
  if (job.status.state() == v1::JOB_STATE_RUNNING) {
    refused = "a generation of the job is running";
  } else if (step > StepLimit(job.status)) {
    refused = absl::StrCat("the job's max_steps is ", StepLimit(job.status));
  } else if (!saved.empty() &&
             job.status.spec().checkpoint().backup_dir().empty()) {
    refused = "the job saves no checkpoints (no backup_dir)";
  }
  if (!refused.empty()) {
    RefuseReport(worker,
                 absl::StrCat("its live state at step ", step,
                              saved.empty() ? "" : " as " + saved),
                 refused);
    return;
  }
  // Its numbers and name were checked with the message (message_checks.h).
  const std::string who =
      absl::StrCat(WorkerRegistry::Describe(worker), " received SIGTERM while ",
                   job.status.state() == v1::JOB_STATE_RECOVERING
                       ? "the job was recovering"
                       : "no generation of the job ran on it");
  if (step > 0) NoteAppliedStep(job.status, step);
  if (!saved.empty()) {
    v1::CheckpointCommitted committed;
    committed.set_job_id(request.job_id());
    committed.set_generation(job.status.generation());
    committed.set_step(step);
    committed.set_ok(true);
    committed.set_name(saved);
    committed.set_epoch(request.saved_epoch());
    committed.set_bytes(request.saved_bytes());
    AddCheckpoint(job.status, committed, worker, NowSeconds());
    AddEventLocked(job, "live_state_saved", &worker,
                   absl::StrCat(who, " and saved its live state at step ", step,
                                " as ", saved, ": the job resumes from it"));
  } else {
    AddEventLocked(job, "live_state_not_saved", &worker,
                   absl::StrCat(who, ": ", request.note()));
  }
  ChangedLocked(job);
  PersistLocked(job);
}

}  // namespace lockstep::coordinator
