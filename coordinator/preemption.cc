// The coordinator's preemptions by the scheduler (issue 52): asking a job's
// ranks to stop at an agreed step for a queued job, the workers that are
// then its preemptor's (promises), calling a preemption off when its job
// no longer waits, and the end of one, whether every rank stopped, a
// failure cut the stop short, or the coordinator restarted. The sub-state
// itself is in job_record.h; the scheduler (scheduler.h) decides who is
// preempted, scheduling.cc carries the plan out.
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/job_state.h"
#include "common/log.h"
#include "coordinator/coordinator.h"
#include "coordinator/job_status.h"

namespace lockstep::coordinator {

void Coordinator::PreemptForLocked(Job& job, const Job& for_job, int keep) {
  if (job.generation == nullptr) return;
  const std::string reason =
      keep > 0
          ? absl::StrCat("shrinking from ", job.status.world_size(), " to ",
                         keep, " workers for job ", for_job.status.job_id(),
                         " (priority ", for_job.status.priority(), " > ",
                         job.status.priority(), ")")
          : absl::StrCat("preempted for job ", for_job.status.job_id(),
                         " (priority ", for_job.status.priority(), " > ",
                         job.status.priority(), ")");
  if (!job.generation->StartPreemption(reason)) return;
  job.BeginYield(for_job.status.job_id(), keep, NowSeconds());
  AddEventLocked(
      job, "preemption_requested", nullptr,
      absl::StrCat(reason, keep > 0
                               ? ": its ranks stop at an agreed step, then "
                                 "its first ranks go on from their live state"
                               : ": its ranks stop at an agreed step and "
                                 "save it; then it waits in the queue"));
  LogInfo("job ", job.status.job_id(), " ", reason);
  v1::CoordinatorCommand command;
  v1::Stop* stop = command.mutable_stop();
  stop->set_job_id(job.status.job_id());
  stop->set_reason(reason);
  stop->set_preempt(true);
  SendToRanksLocked(job, command);
  ChangedLocked(job);
  // Stored: a coordinator restarted before the ranks stop finishes it.
  PersistLocked(job);
}

std::set<std::string> Coordinator::YieldingRanksLocked() {
  std::set<std::string> ranks;
  for (Job* job : ActiveJobsLocked()) {
    // Also a job whose preemption was called off: ranks that had already
    // voted report the stop, and it re-forms on the same workers.
    if (job->generation != nullptr &&
        (job->yielding() || job->generation->called_off())) {
      for (const std::string& id : job->generation->rank_workers()) {
        ranks.insert(id);
      }
    }
  }
  return ranks;
}

void Coordinator::CallOffPreemptionsLocked() {
  for (Job* job : ActiveJobsLocked()) {
    if (!job->yielding() || job->stop_requested || job->generation == nullptr) {
      continue;
    }
    auto it = jobs_.find(job->yield_for());
    if (it != jobs_.end() &&
        it->second.status.state() == v1::JOB_STATE_QUEUED) {
      continue;
    }
    const std::string why =
        it == jobs_.end()
            ? "was deleted"
            : (it->second.status.state() == v1::JOB_STATE_RUNNING ||
                       it->second.status.state() == v1::JOB_STATE_RECOVERING
                   ? "started on other workers"
                   : absl::StrCat("ended ",
                                  StateName(it->second.status.state())));
    v1::CoordinatorCommand command;
    command.mutable_resume()->set_job_id(job->status.job_id());
    command.mutable_resume()->set_generation(job->status.generation());
    SendToRanksLocked(*job, command);
    job->generation->CallOffPreemption();
    ++called_off_;
    const std::string message = absl::StrCat(
        "job ", job->yield_for(), " ", why,
        " before this one yielded: the preemption is called off; its ranks "
        "train on, or, if they had already agreed to stop, it re-forms on "
        "its workers from their live state");
    LogInfo("job ", job->status.job_id(), ": ", message);
    job->EndYield();
    AddEventLocked(*job, "preemption_called_off", nullptr, message);
    ChangedLocked(*job);
    PersistLocked(*job);
  }
}

void Coordinator::PreemptedLocked(Job& job) {
  v1::JobStatus& status = job.status;
  if (job.yielding()) {
    // The scheduler gave its workers (or its last ranks) to another job.
    std::string what = absl::StrCat("generation ", status.generation(),
                                    " stopped after step ", status.step(), " (",
                                    job.generation->preempt_reason(), ")");
    if (job.shrink_to() == 0) {
      absl::StrAppend(
          &what, "; ",
          FinalSave(status, status.step(),
                    job.generation->checkpoints().FailureOf(status.step())));
    }
    YieldedLocked(job, what, /*abort=*/false);
    MaybeStartJobLocked();
    return;
  }
  // Every rank stopped at the same step, and the job spends no restart. A
  // worker asked for it (SIGTERM): the job goes on when its group is whole
  // again (the preempted worker restarted). Or the ranks had agreed to stop
  // before the scheduler called its preemption off: it re-forms at once on
  // the same workers, from their live state.
  status.set_preemptions(status.preemptions() + 1);
  std::string kind = "preempted";
  std::string message = absl::StrCat("generation ", status.generation(),
                                     " stopped after step ", status.step());
  if (job.generation->called_off()) {
    kind = "preemption_called_off";
    absl::StrAppend(&message,
                    ": its ranks had agreed to stop before the preemption was "
                    "called off; it re-forms on its workers");
  } else {
    const std::string saved =
        FinalSave(status, status.step(),
                  job.generation->checkpoints().FailureOf(status.step()));
    absl::StrAppend(&message, " for a preemption (",
                    job.generation->preempt_reason(),
                    saved.empty() ? "); no checkpoints are configured"
                                  : absl::StrCat("); ", saved),
                    "; waiting for the group to be whole");
  }
  ReleaseGenerationLocked(job, /*abort=*/false, "preempted");
  TransitionLocked(job, v1::JOB_STATE_RECOVERING, kind, nullptr, message);
  MaybeStartJobLocked();
}

void Coordinator::YieldedLocked(Job& job, const std::string& what, bool abort) {
  v1::JobStatus& status = job.status;
  status.set_preemptions(status.preemptions() + 1);
  if (job.shrink_to() > 0) {
    // An elastic job gave up its last ranks: it re-forms at once on the
    // first ones (their live state), and the others go to yield_for().
    const int keep = job.shrink_to();
    job.KeepRanks(keep);
    PromiseReleasedLocked(job, keep);
    ReleaseGenerationLocked(job, abort, "shrunk");
    job.EndYield();
    TransitionLocked(
        job, v1::JOB_STATE_RECOVERING, "shrunk", nullptr,
        absl::StrCat(what, "; it goes on with its first ", keep, " ranks"));
    return;
  }
  // It waits in the queue and resumes from the step it saved, on whichever
  // workers are free.
  status.set_yields(status.yields() + 1);
  ++yields_;
  PromiseReleasedLocked(job, 0);
  ReleaseGenerationLocked(job, abort, "preempted");
  active_jobs_.erase(job.seq);
  job.EndYield();
  queue_.push_back(status.job_id());
  job.Queued(clock_->Now());
  TransitionLocked(job, v1::JOB_STATE_QUEUED, "preempted", nullptr,
                   absl::StrCat(what, "; back in the queue"));
}

void Coordinator::PromiseReleasedLocked(const Job& job, int from) {
  if (!job.yielding()) return;
  const std::vector<std::string> ranks = RankWorkersLocked(job);
  for (size_t rank = from; rank < ranks.size(); ++rank) {
    promised_[ranks[rank]] = {job.yield_for(),
                              clock_->Now() + heartbeat_timeout_};
  }
}

}  // namespace lockstep::coordinator
