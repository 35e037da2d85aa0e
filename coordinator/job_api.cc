// The Coordinator's job API for clients beside submission: a job's status
// (one job, or the list paged), waiting for a change, stop and delete; and
// how jobs are kept: retention of finished jobs, events, reports to
// watchers and the job store. The queue and state machine are in
// coordinator.cc.
#include <algorithm>
#include <iterator>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/job_state.h"
#include "common/log.h"
#include "common/run_comparison.h"
#include "common/status_macros.h"
#include "coordinator/coordinator.h"
#include "coordinator/coordinator_metrics.h"
#include "coordinator/job_status.h"
#include "coordinator/message_checks.h"

namespace lockstep::coordinator {

// ---- job status -------------------------------------------------------------

absl::StatusOr<v1::GetJobStatusResponse> Coordinator::GetJobStatus(
    const v1::GetJobStatusRequest& request) {
  if (absl::Status bad = CheckStatusRequest(request); !bad.ok()) {
    return Refused(bad);
  }
  v1::GetJobStatusResponse response;
  if (!request.job_id().empty()) {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(request.job_id());
    if (it == jobs_.end()) {
      return absl::NotFoundError(absl::StrCat(
          "no job ", request.job_id(), "; `lockstep status` lists jobs"));
    }
    *response.add_jobs() = ReportLocked(
        it->second, request.include_history(), request.history_offset(),
        request.history_limit() > 0 ? request.history_limit()
                                    : kMaxHistoryPage);
    return response;
  }
  int64_t before = std::numeric_limits<int64_t>::max();
  if (!request.page_token().empty() &&
      (!absl::SimpleAtoi(request.page_token(), &before) || before <= 0)) {
    return Refused(absl::InvalidArgumentError(absl::StrCat(
        "GetJobStatus: page_token '", request.page_token(),
        "' is not a next_page_token this coordinator gave; start again "
        "without one")));
  }
  const int page_size =
      request.page_size() > 0 ? request.page_size() : kDefaultStatusPage;
  absl::MutexLock lock(&mu_);
  size_t bytes = 0;
  for (auto it = std::make_reverse_iterator(job_order_.lower_bound(before));
       it != job_order_.rend(); ++it) {
    v1::JobStatus summary = Summary(ReportLocked(jobs_.at(it->second), false),
                                    kMaxStatusPageBytes, kMaxTextBytes);
    bytes += summary.ByteSizeLong();
    if (response.jobs_size() == page_size ||
        (response.jobs_size() > 0 && bytes > kMaxStatusPageBytes)) {
      response.set_next_page_token(
          absl::StrCat(std::prev(it)->first));  // the last one sent
      break;
    }
    *response.add_jobs() = std::move(summary);
  }
  return response;
}

absl::Status Coordinator::AuthorizeOwnerLocked(const Job& job,
                                               const std::string& by,
                                               absl::string_view what) const {
  const std::string& owner = job.status.owner();
  if (by.empty() || job.status.submitted_by().empty() ||
      by == job.status.submitted_by() || admins_.count(OwnerOf(by)) > 0) {
    return absl::OkStatus();
  }
  return LogRefusal(absl::PermissionDeniedError(absl::StrCat(
      OwnerOf(by), " may not ", what, " job ", job.status.job_id(),
      ": it belongs to ", owner.empty() ? job.status.submitted_by() : owner,
      "; an operator may ", what,
      " only its own jobs unless the coordinator names it with --admin")));
}

absl::Status Coordinator::StopJob(const std::string& job_id,
                                  const std::string& by) {
  if (absl::Status bad = CheckJobId("StopJob", job_id); !bad.ok()) {
    return Refused(bad);
  }
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("no job ", job_id));
  }
  RETURN_IF_ERROR(AuthorizeOwnerLocked(it->second, by, "stop"));
  Job& job = it->second;
  switch (job.status.state()) {
    case v1::JOB_STATE_QUEUED:
      EndJobLocked(job, v1::JOB_STATE_STOPPED,
                   "stopped on request before it started");
      return absl::OkStatus();
    case v1::JOB_STATE_RECOVERING:
      EndJobLocked(job, v1::JOB_STATE_STOPPED,
                   "stopped on request while recovering");
      return absl::OkStatus();
    case v1::JOB_STATE_RUNNING: {
      job.stop_requested = true;
      job.stop_cause = "stopped on request";
      v1::CoordinatorCommand command;
      command.mutable_stop()->set_job_id(job_id);
      command.mutable_stop()->set_reason("stopped on request");
      SendToRanksLocked(job, command);
      return absl::OkStatus();
    }
    default:
      return absl::FailedPreconditionError(
          absl::StrCat("job ", job_id, " already ended (",
                       v1::JobState_Name(job.status.state()), ")"));
  }
}

void Coordinator::EnforceTimeLimitsLocked() {
  const absl::Time now = clock_->Now();
  // A queued job whose limit ran out while it stopped for a preemption
  // (or while the coordinator was down) ends: placed again, it would only
  // be stopped at once.
  std::vector<Job*> used_up;
  for (const std::string& id : queue_) {
    Job& job = jobs_[id];
    if (job.status.state() == v1::JOB_STATE_QUEUED && job.has_time_limit() &&
        job.TimeLimitLeft() <= absl::ZeroDuration()) {
      used_up.push_back(&job);
    }
  }
  for (Job* job : used_up) {
    EndJobLocked(
        *job, v1::JOB_STATE_STOPPED,
        absl::StrCat("used up its time limit of ",
                     absl::FormatDuration(absl::Seconds(
                         job->status.spec().time_limit_seconds())),
                     " (time_limit_seconds) before it could be placed again; "
                     "it keeps its newest committed checkpoint"));
  }
  std::vector<Job*> due;
  for (Job* job : ActiveJobsLocked()) {
    if (!job->stop_requested && now >= job->TimeLimitEnds()) {
      due.push_back(job);
    }
  }
  for (Job* job : due) {
    const std::string limit = absl::FormatDuration(
        absl::Seconds(job->status.spec().time_limit_seconds()));
    if (job->status.state() == v1::JOB_STATE_RECOVERING) {
      EndJobLocked(*job, v1::JOB_STATE_STOPPED,
                   absl::StrCat("reached its time limit of ", limit,
                                " (time_limit_seconds) while recovering; it "
                                "keeps its newest committed checkpoint"));
      continue;
    }
    if (job->status.state() != v1::JOB_STATE_RUNNING) continue;
    job->stop_requested = true;
    job->stop_cause = absl::StrCat("stopped at its time limit of ", limit);
    AddEventLocked(
        *job, "time_limit_reached", nullptr,
        absl::StrCat("it has held workers for its time limit of ", limit,
                     " (time_limit_seconds): every rank stops at "
                     "an agreed step and saves it"));
    v1::CoordinatorCommand command;
    command.mutable_stop()->set_job_id(job->status.job_id());
    command.mutable_stop()->set_reason(job->stop_cause);
    SendToRanksLocked(*job, command);
  }
}

absl::Status Coordinator::DeleteJob(const std::string& job_id,
                                    const std::string& by) {
  if (absl::Status bad = CheckJobId("DeleteJob", job_id); !bad.ok()) {
    return Refused(bad);
  }
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) {
    return absl::NotFoundError(
        absl::StrCat("no job ", job_id, "; `lockstep status` lists jobs"));
  }
  RETURN_IF_ERROR(AuthorizeOwnerLocked(it->second, by, "delete"));
  const v1::JobState state = it->second.status.state();
  if (!IsTerminal(state)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", job_id, " is ", v1::JobState_Name(state),
        "; only a finished job can be deleted: stop it first with `lockstep "
        "stop ",
        job_id, "`"));
  }
  LogInfo("job ", job_id, " deleted on request");
  EraseJobLocked(job_id);
  return absl::OkStatus();
}

absl::StatusOr<v1::ListQueueResponse> Coordinator::ListQueue(
    const v1::ListQueueRequest& request) {
  if (request.page_size() < 0 || request.page_size() > kMaxStatusPage) {
    return Refused(absl::InvalidArgumentError(
        absl::StrCat("ListQueue: page_size ", request.page_size(),
                     " is out of range; give 0 to ", kMaxStatusPage)));
  }
  const int page_size =
      request.page_size() > 0 ? request.page_size() : kMaxStatusPage;
  absl::MutexLock lock(&mu_);
  v1::ListQueueResponse response;
  for (const auto& [name, priority] : priority_classes_) {
    v1::PriorityClass* named = response.add_priority_classes();
    named->set_name(name);
    named->set_priority(priority);
    if (auto grant = priority_grants_.find(name);
        grant != priority_grants_.end()) {
      for (const std::string& owner : grant->second) {
        named->add_granted_to(owner);
      }
    }
  }
  for (const std::string& admin : admins_) response.add_admins(admin);
  const SchedulerPolicy& policy = scheduler_.policy();
  if (policy.starvation_bound != absl::InfiniteDuration()) {
    response.set_starvation_bound_seconds(
        absl::ToDoubleSeconds(policy.starvation_bound));
    response.set_starvation_priority(policy.top_priority);
  }
  size_t bytes = 0;
  for (const std::string& id : waiting_) {
    auto it = jobs_.find(id);
    if (it == jobs_.end() ||
        it->second.status.state() != v1::JOB_STATE_QUEUED) {
      continue;
    }
    v1::JobStatus summary = Summary(ReportLocked(it->second, false),
                                    kMaxStatusPageBytes, kMaxTextBytes);
    bytes += summary.ByteSizeLong();
    if (response.jobs_size() == page_size ||
        (response.jobs_size() > 0 && bytes > kMaxStatusPageBytes)) {
      break;
    }
    *response.add_jobs() = std::move(summary);
  }
  int64_t queued = 0;
  for (const std::string& id : queue_) {
    auto it = jobs_.find(id);
    if (it != jobs_.end() &&
        it->second.status.state() == v1::JOB_STATE_QUEUED) {
      ++queued;
    }
  }
  response.set_queued(queued);
  // What each owner holds against its quota, as the scheduler counts it.
  std::map<std::string, v1::OwnerUse> owners;
  for (Job* job : ActiveJobsLocked()) {
    v1::OwnerUse& use = owners[job->status.owner()];
    use.set_workers(use.workers() + OwnerChargeLocked(*job));
    use.set_active_jobs(use.active_jobs() + 1);
  }
  for (const auto& [id, job] : jobs_) {
    if (job.status.state() != v1::JOB_STATE_QUEUED) continue;
    v1::OwnerUse& use = owners[job.status.owner()];
    use.set_queued_jobs(use.queued_jobs() + 1);
  }
  for (const auto& [owner, quota] : policy.quotas) {
    owners[owner].set_quota(quota);
  }
  for (auto& [owner, use] : owners) {
    use.set_owner(owner);
    *response.add_owners() = std::move(use);
  }
  return response;
}

absl::StatusOr<v1::CompareJobsResponse> Coordinator::CompareJobs(
    const v1::CompareJobsRequest& request) {
  if (request.job_ids_size() < 2 || request.job_ids_size() > 16) {
    return Refused(absl::InvalidArgumentError(absl::StrCat(
        "CompareJobs: ", request.job_ids_size(), " jobs; compare 2 to 16")));
  }
  std::vector<v1::JobStatus> jobs;
  {
    absl::MutexLock lock(&mu_);
    for (const std::string& id : request.job_ids()) {
      if (absl::Status bad = CheckJobId("CompareJobs", id); !bad.ok()) {
        return Refused(bad);
      }
      auto it = jobs_.find(id);
      if (it == jobs_.end()) {
        return absl::NotFoundError(absl::StrCat("no job ", id));
      }
      jobs.push_back(it->second.status);  // with its loss history
    }
  }
  // The comparison itself outside the lock.
  v1::CompareJobsResponse response;
  const std::vector<RunVerdict> verdicts = CompareAllRuns(jobs);
  size_t k = 0;
  for (size_t i = 0; i < jobs.size(); ++i) {
    for (size_t j = i + 1; j < jobs.size(); ++j, ++k) {
      v1::CompareJobsResponse::Verdict* verdict = response.add_verdicts();
      verdict->set_job_a(jobs[i].job_id());
      verdict->set_job_b(jobs[j].job_id());
      verdict->set_same_function(verdicts[k].same_function);
      verdict->set_text(verdicts[k].text);
    }
  }
  for (std::string& warning : CompareWarnings(jobs)) {
    response.add_warnings(std::move(warning));
  }
  return response;
}

// ---- retention --------------------------------------------------------------

Coordinator::Job& Coordinator::AddJobLocked(const std::string& id,
                                            int64_t seq) {
  Job& job = jobs_[id];
  job.seq = seq;
  job_order_[seq] = id;
  return job;
}

void Coordinator::EraseJobLocked(const std::string& id) {
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return;
  job_order_.erase(it->second.seq);
  queue_.erase(std::remove(queue_.begin(), queue_.end(), id), queue_.end());
  jobs_.erase(it);
  if (store_ != nullptr) {
    if (absl::Status deleted = store_->Delete(id); !deleted.ok()) {
      LogError(deleted.message(),
               "; the job comes back on a coordinator restart");
    }
  }
  if (artifacts_ != nullptr) {
    if (absl::Status deleted = artifacts_->Delete(id); !deleted.ok()) {
      LogError("the artifacts of job ", id, ": ", deleted.message(),
               "; they are removed at the next coordinator start");
    }
  }
  EndWatchesLocked(id, absl::NotFoundError(absl::StrCat(
                           "job ", id,
                           " was deleted (`lockstep delete` or "
                           "--keep-finished-jobs/--finished-job-ttl)")));
}

void Coordinator::ForgetFinishedJobsLocked() {
  int64_t finished = 0;
  for (const auto& [id, job] : jobs_) {
    if (IsTerminal(job.status.state())) ++finished;
  }
  const double now = NowSeconds();
  std::vector<std::string> expired;
  for (const auto& [seq, id] : job_order_) {  // oldest first
    const v1::JobStatus& status = jobs_.at(id).status;
    if (!IsTerminal(status.state())) continue;
    const bool too_old =
        finished_job_ttl_ != absl::InfiniteDuration() &&
        now - status.end_time() > absl::ToDoubleSeconds(finished_job_ttl_);
    if (finished > keep_finished_jobs_ || too_old) {
      expired.push_back(id);
      --finished;
    }
  }
  for (const std::string& id : expired) {
    LogInfo("job ", id, " deleted: finished jobs are kept for ",
            absl::FormatDuration(finished_job_ttl_), ", at most ",
            keep_finished_jobs_,
            " of them (--finished-job-ttl, "
            "--keep-finished-jobs)");
    EraseJobLocked(id);
  }
}

v1::JobStatus Coordinator::ReportLocked(const Job& job, bool include_history,
                                        int64_t history_offset,
                                        int history_limit) const {
  v1::JobStatus status = job.status;
  status.clear_step_losses();
  status.clear_step_lrs();
  if (include_history) {
    const auto& history = job.status.step_losses();
    const auto& lrs = job.status.step_lrs();
    const int64_t size = history.size();
    const int64_t from = std::min(history_offset, size);
    // A page holds at most kMaxHistoryPage floats: with learning rates
    // beside the losses, half as many steps.
    const int64_t limit =
        lrs.empty() ? history_limit
                    : std::min<int64_t>(history_limit, kMaxHistoryPage / 2);
    const int64_t to = std::min<int64_t>(size, from + limit);
    status.mutable_step_losses()->Add(history.begin() + from,
                                      history.begin() + to);
    if (lrs.size() == history.size()) {
      status.mutable_step_lrs()->Add(lrs.begin() + from, lrs.begin() + to);
    }
    status.set_history_offset(from);
    status.set_history_size(size);
    status.set_loss_stride(LossStride(job.status));
  }
  if (job.status.state() == v1::JOB_STATE_RUNNING) {
    status.set_stall(workers_.Stall(
        job.status.job_id(), job.generation->rank_workers(), clock_->Now()));
  }
  return status;
}

void Coordinator::AddEventLocked(Job& job, const std::string& kind,
                                 const Worker* worker,
                                 const std::string& message) {
  AddEvent(job.status, NowSeconds(), kind, worker, message);
  if (IsFailureEvent(kind)) ++failures_[kind];
}

void Coordinator::ChangedLocked(Job& job) {
  job.status.set_version(job.status.version() + 1);
  NotifyWatchersLocked(job);
}

void Coordinator::PersistLocked(Job& job) {
  job.last_persisted = clock_->Now();
  if (store_ == nullptr) return;
  absl::Status status = store_->Save(job.status);
  if (!status.ok()) {
    // Keep serving: the job goes on; only its durable record is stale.
    LogError(status.message(),
             "; the job's state will be lost on a "
             "coordinator restart unless the disk recovers");
  }
}

void Coordinator::PersistWorkersLocked() {
  if (store_ == nullptr || unsaved_workers_.empty()) return;
  std::vector<JobStore::WorkerRecord> records;
  for (const std::string& id : unsaved_workers_) {
    const Worker* worker = workers_.Find(id);
    if (worker == nullptr) continue;  // forgotten meanwhile
    records.push_back(
        {worker->id, worker->identity, worker->incarnation, worker->order});
  }
  unsaved_workers_.clear();
  if (absl::Status saved = store_->SaveWorkers(records); !saved.ok()) {
    LogError(saved.message(),
             "; after a coordinator restart these workers get new ids and "
             "the jobs they held re-form without them");
  }
}

void Coordinator::EndWatchesLocked(const std::optional<std::string>& job_id,
                                   const absl::Status& why) {
  for (auto it = watches_.begin(); it != watches_.end();) {
    if (job_id.has_value() && it->second.job_id != *job_id) {
      ++it;
      continue;
    }
    JobWatcher watcher = std::move(it->second.watcher);
    it = watches_.erase(it);
    watcher(why);
  }
}

}  // namespace lockstep::coordinator
