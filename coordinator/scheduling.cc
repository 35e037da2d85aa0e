// The coordinator's scheduling: each pass re-forms the recovering jobs,
// asks the scheduler (scheduler.h) which queued jobs start and which running
// ones are preempted or shrunk, carries that out, and shows each waiting
// job its place; a static cluster's queue runs in submission order; idle
// workers stand by. The job state machine that the passes drive is in
// coordinator.cc, the preemptions they ask for in preemption.cc.
#include <algorithm>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/tf_config.h"
#include "coordinator/coordinator.h"
#include "coordinator/job_status.h"
#include "coordinator/scheduler.h"

namespace lockstep::coordinator {

void Coordinator::MaybeStartJobLocked(bool standby) {
  // Not re-entered: a start that fails ends its job, which asks for
  // scheduling again; that runs once this pass is over.
  if (scheduling_) {
    schedule_again_ = true;
    return;
  }
  scheduling_ = true;
  do {
    schedule_again_ = false;
    StartNextGenerationLocked();
  } while (schedule_again_);
  if (standby) StandbyLocked();
  scheduling_ = false;
}

std::vector<Coordinator::Job*> Coordinator::ByPriorityLocked() {
  std::vector<Job*> active = ActiveJobsLocked();
  std::stable_sort(active.begin(), active.end(),
                   [](const Job* a, const Job* b) {
                     return a->status.priority() > b->status.priority();
                   });
  return active;
}

void Coordinator::StandbyLocked() {
  const std::vector<Job*> active = ByPriorityLocked();
  Job* job = active.empty() ? nullptr : active.front();
  v1::CoordinatorCommand command;
  if (job != nullptr) {
    command.mutable_standby()->set_job_id(job->status.job_id());
    command.mutable_standby()->set_submitted_by(job->status.submitted_by());
    *command.mutable_standby()->mutable_spec() = job->status.spec();
  }
  for (Worker* worker : workers_.StandingBy()) {
    if (job == nullptr) {
      worker->standby_job.clear();
    } else if (worker->standby_job != job->status.job_id()) {
      worker->standby_job = job->status.job_id();
      LogInfo(worker->id, " stands by for job ", job->status.job_id());
      worker->sink->Send(command);
    }
  }
}

void Coordinator::StartNextGenerationLocked() {
  if (shutdown_) return;
  std::set<std::string> reserved = ReformRecoveringLocked();
  if (cluster_.has_value()) {
    StartQueuedOnClusterLocked(reserved);
    return;
  }
  ScheduleQueuedLocked(reserved);
  // The workers a preemption released went to the job waiting for them
  // first; a recovering job may take what is left.
  ReformRecoveringLocked();
}

bool Coordinator::PreemptorWaitsLocked(int priority) {
  for (const std::string& id : queue_) {
    const v1::JobStatus& status = jobs_[id].status;
    if (status.state() == v1::JOB_STATE_QUEUED &&
        status.priority() >= priority &&
        status.queue().reason() == WaitReasonName(WaitReason::kPreempting)) {
      return true;
    }
  }
  return false;
}

std::set<std::string> Coordinator::ReformRecoveringLocked() {
  // Recovering jobs first, the highest priority (then the oldest) first: a
  // spare goes to the most important job that lost a rank. Each keeps the
  // workers of its previous generation (after a coordinator restart, as
  // persisted: a spare may hold a rank whose own task never came back):
  // they hold its live state, so no other job is given them while it waits
  // for its group. It takes no worker promised to a queued job nor a rank
  // of a job being preempted, and no new worker at all while a job of its
  // priority or higher waits for a preemption (issue 52: the workers a
  // preemption releases are that job's).
  std::vector<std::pair<std::string, std::vector<std::string>>> recovering;
  std::set<std::string> reserved;
  for (Job* job : ByPriorityLocked()) {
    if (job->status.state() != v1::JOB_STATE_RECOVERING) continue;
    // A worker that has served another job since holds none of this one's
    // state: it is not kept for it (issue 52, simulation seed 1591).
    std::vector<std::string> previous;
    for (std::string& id : RankWorkersLocked(*job)) {
      if (!MovedOnLocked(id, *job)) previous.push_back(std::move(id));
    }
    // A job that shrank keeps only its first ranks.
    if (job->keep_ranks() > 0 &&
        previous.size() > static_cast<size_t>(job->keep_ranks())) {
      previous.resize(job->keep_ranks());
    }
    reserved.insert(previous.begin(), previous.end());
    recovering.emplace_back(job->status.job_id(), std::move(previous));
  }
  for (const auto& [id, previous] : recovering) {
    Job& job = jobs_[id];
    if (job.status.state() != v1::JOB_STATE_RECOVERING) continue;
    std::set<std::string> others = reserved;
    if (!cluster_.has_value() && PreemptorWaitsLocked(job.status.priority())) {
      for (Worker* worker : workers_.Connected()) others.insert(worker->id);
    }
    for (const auto& [worker, promisee] : promised_) others.insert(worker);
    for (const std::string& worker : YieldingRanksLocked()) {
      others.insert(worker);
    }
    for (const std::string& worker : previous) others.erase(worker);
    v1::JobSpec spec = job.status.spec();
    // It does not grow back into the workers it gave up, nor past its
    // owner's quota (issue 52): an elastic job re-forms with at most what
    // the owner's other jobs leave.
    if (job.keep_ranks() > 0) spec.set_max_workers(job.keep_ranks());
    if (spec.min_workers() > 0) {
      const auto& quotas = scheduler_.policy().quotas;
      if (auto quota = quotas.find(job.status.owner()); quota != quotas.end()) {
        const int most = spec.max_workers() > 0
                             ? spec.max_workers()
                             : std::numeric_limits<int>::max();
        const int left = quota->second - OwnerHoldsLocked(job);
        spec.set_max_workers(
            std::max(spec.min_workers(), std::min(most, left)));
      }
    }
    std::vector<Worker*> workers = workers_.Pick(
        spec, previous, WithUnplaceableLocked(spec, std::move(others)));
    if (!workers.empty()) StartGenerationLocked(job, workers);
  }
  return reserved;
}

bool Coordinator::MovedOnLocked(const std::string& worker_id, const Job& job) {
  const Worker* worker = workers_.Find(worker_id);
  return worker != nullptr && !worker->job_id.empty() &&
         worker->job_id != job.status.job_id();
}

std::vector<std::string> Coordinator::RankWorkersLocked(const Job& job) const {
  if (job.generation != nullptr) return job.generation->rank_workers();
  std::vector<std::string> previous;
  for (const v1::RankResult& rank : job.status.ranks()) {
    previous.push_back(rank.worker_id());
  }
  return previous;
}

int Coordinator::OwnerChargeLocked(const Job& job) const {
  const int ranks = static_cast<int>(RankWorkersLocked(job).size());
  return job.keep_ranks() > 0 ? std::min(job.keep_ranks(), ranks) : ranks;
}

int Coordinator::OwnerHoldsLocked(const Job& except) {
  int holds = 0;
  for (Job* job : ActiveJobsLocked()) {
    if (job != &except && job->status.owner() == except.status.owner()) {
      holds += OwnerChargeLocked(*job);
    }
  }
  return holds;
}

void Coordinator::StartQueuedOnClusterLocked(
    const std::set<std::string>& reserved) {
  // Submission order.
  std::vector<std::pair<int64_t, std::string>> order;
  for (const std::string& id : queue_) order.emplace_back(jobs_[id].seq, id);
  std::sort(order.begin(), order.end());
  queue_.clear();
  for (auto& [seq, id] : order) queue_.push_back(std::move(id));
  while (!queue_.empty()) {
    Job& job = jobs_[queue_.front()];
    if (job.status.state() != v1::JOB_STATE_QUEUED) {
      queue_.pop_front();
      continue;
    }
    std::vector<Worker*> workers =
        workers_.Pick(job.status.spec(), {}, reserved);
    if (workers.empty()) break;
    queue_.pop_front();
    active_jobs_[job.seq] = job.status.job_id();
    StartGenerationLocked(job, workers);
  }
  // The rest wait for the tasks, the head first.
  const int tasks = static_cast<int>(TrainingTasks(*cluster_).size());
  int free = 0;
  for (Worker* worker : workers_.StandingBy()) {
    free += reserved.count(worker->id) == 0 && !worker->spare;
  }
  std::vector<std::string> ids;
  std::vector<QueueEntry> entries;
  for (const std::string& id : queue_) {
    if (jobs_[id].status.state() != v1::JOB_STATE_QUEUED) continue;
    QueueEntry entry;
    entry.position = static_cast<int64_t>(entries.size()) + 1;
    entry.reason = entries.empty() ? WaitReason::kNoFit : WaitReason::kPriority;
    entry.needed = tasks;
    entry.free_matching = free;
    ids.push_back(id);
    entries.push_back(std::move(entry));
  }
  ShowWaitingLocked(ids, entries);
}

void Coordinator::ShowWaitingLocked(const std::vector<std::string>& ids,
                                    const std::vector<QueueEntry>& entries) {
  waiting_ = ids;
  waiting_on_time_ = false;
  for (size_t i = 0; i < entries.size(); ++i) {
    const QueueEntry& entry = entries[i];
    waiting_on_time_ |= entry.reason == WaitReason::kMinRunTime;
    Job& job = jobs_[ids[i]];
    const v1::QueuePosition& shown = job.status.queue();
    const std::string message = QueueMessage(entry);
    if (shown.position() == entry.position &&
        shown.reason() == WaitReasonName(entry.reason) &&
        shown.message() == message) {
      continue;
    }
    v1::QueuePosition* queue = job.status.mutable_queue();
    queue->set_position(entry.position);
    queue->set_reason(WaitReasonName(entry.reason));
    queue->set_message(message);
    queue->clear_preempts();
    for (const std::string& id : entry.preempts) queue->add_preempts(id);
    ChangedLocked(job);
  }
}

namespace {

// "cpu" or "cuda" from a device name ("cuda:1").
std::string DeviceKind(const v1::Device& device) {
  return absl::StartsWith(device.name(), "cuda") ? "cuda" : "cpu";
}

Placement PlacementOf(const v1::JobSpec& spec) {
  Placement placement;
  placement.device = spec.placement().device();
  for (const auto& [key, value] : spec.placement().labels()) {
    placement.labels.emplace_back(key, value);
  }
  std::sort(placement.labels.begin(), placement.labels.end());
  return placement;
}

PoolWorker PoolWorkerOf(const Worker& worker) {
  PoolWorker pool_worker;
  pool_worker.id = worker.id;
  pool_worker.device = DeviceKind(worker.device);
  pool_worker.labels = worker.labels;
  pool_worker.spare = worker.spare;
  return pool_worker;
}

}  // namespace

std::set<std::string> Coordinator::WithUnplaceableLocked(
    const v1::JobSpec& spec, std::set<std::string> reserved) {
  const Placement placement = PlacementOf(spec);
  if (placement.empty()) return reserved;
  for (Worker* worker : workers_.Connected()) {
    if (!Matches(placement, PoolWorkerOf(*worker))) reserved.insert(worker->id);
  }
  return reserved;
}

void Coordinator::PromoteStarvedLocked() {
  const SchedulerPolicy& policy = scheduler_.policy();
  next_promotion_ = absl::InfiniteFuture();
  if (policy.starvation_bound == absl::InfiniteDuration()) return;
  const absl::Time now = clock_->Now();
  for (const std::string& id : queue_) {
    Job& job = jobs_[id];
    if (job.status.state() != v1::JOB_STATE_QUEUED || job.promoted() ||
        job.status.priority() >= policy.top_priority) {
      continue;
    }
    const absl::Duration waited = job.Waited(now);
    if (!Starved(policy, job.status.priority(), waited)) {
      next_promotion_ =
          std::min(next_promotion_, now + policy.starvation_bound - waited);
      continue;
    }
    const int from = job.status.priority();
    job.Promote(policy.top_priority);
    AddEventLocked(
        job, "promoted", nullptr,
        absl::StrCat(
            "it has waited ",
            absl::FormatDuration(absl::Trunc(waited, absl::Seconds(1))),
            " in the queue in all, the coordinator's --starvation-bound: it "
            "is scheduled at priority ",
            policy.top_priority, " instead of ", from,
            " until it ends, so that no job of priority ", policy.top_priority,
            " or below passes it or preempts it"));
    ChangedLocked(job);
    PersistLocked(job);
  }
}

void Coordinator::ScheduleQueuedLocked(const std::set<std::string>& reserved) {
  EnforceTimeLimitsLocked();
  PromoteStarvedLocked();
  // The snapshot: every connected worker by registration order, the queued
  // jobs, and the active jobs with the workers they hold.
  std::vector<Worker*> connected = workers_.Connected();
  std::sort(
      connected.begin(), connected.end(),
      [](const Worker* a, const Worker* b) { return a->order < b->order; });
  std::set<const Worker*> idle;
  for (Worker* worker : workers_.StandingBy()) idle.insert(worker);
  // A rank of a yielding job that already reported is idle, but the
  // scheduler counts it among the workers its job releases: it is not also
  // free (issue 52: counted twice, it went to a job of a lower priority).
  const std::set<std::string> yielding_ranks = YieldingRanksLocked();
  // Promises to jobs no longer queued are over.
  for (auto it = promised_.begin(); it != promised_.end();) {
    auto job = jobs_.find(it->second.job_id);
    const bool queued = job != jobs_.end() &&
                        job->second.status.state() == v1::JOB_STATE_QUEUED;
    it = queued ? std::next(it) : promised_.erase(it);
  }
  std::vector<PoolWorker> pool;
  std::map<std::string, int> index;
  for (Worker* worker : connected) {
    PoolWorker pool_worker = PoolWorkerOf(*worker);
    if (auto promise = promised_.find(worker->id); promise != promised_.end()) {
      pool_worker.promised_to = promise->second.job_id;
      pool_worker.promise_outlasts_wait = clock_->Now() < promise->second.until;
    }
    pool_worker.free = idle.count(worker) > 0 &&
                       reserved.count(worker->id) == 0 &&
                       yielding_ranks.count(worker->id) == 0;
    index[worker->id] = static_cast<int>(pool.size());
    pool.push_back(std::move(pool_worker));
  }
  std::vector<QueuedJob> queued;
  for (auto it = queue_.begin(); it != queue_.end();) {
    Job& job = jobs_[*it];
    if (job.status.state() != v1::JOB_STATE_QUEUED) {
      it = queue_.erase(it);
      continue;
    }
    const v1::JobSpec& spec = job.status.spec();
    QueuedJob entry;
    entry.id = job.status.job_id();
    entry.seq = job.seq;
    entry.priority = job.status.priority();
    entry.owner = job.status.owner();
    if (spec.min_workers() > 0) {
      entry.size = spec.min_workers();
      entry.most = spec.max_workers() > 0 ? spec.max_workers()
                                          : std::numeric_limits<int>::max();
    } else {
      entry.size = entry.most = spec.num_workers();
    }
    entry.placement = PlacementOf(spec);
    entry.queued_at = job.queued_at;
    entry.time_limit = job.TimeLimitLeft();
    entry.reserved = entry.id == reserved_for_;
    queued.push_back(std::move(entry));
    ++it;
  }
  std::vector<RunningJob> running;
  for (Job* job : ActiveJobsLocked()) {
    RunningJob entry;
    entry.id = job->status.job_id();
    entry.seq = job->seq;
    entry.priority = job->status.priority();
    entry.owner = job->status.owner();
    entry.started = job->started;
    for (const std::string& id : RankWorkersLocked(*job)) {
      // Not a worker that has moved on to another job since its rank
      // reported, nor one that is free since (the rank of a job that is
      // finishing): each would be counted twice (issue 52, simulation seed
      // 825: a preemption for a job that then still did not fit).
      auto found = index.find(id);
      if (found == index.end() || MovedOnLocked(id, *job) ||
          pool[found->second].free) {
        continue;
      }
      entry.workers.push_back(found->second);
    }
    // A job is charged its whole group until it ends: also the ranks that
    // already reported or whose workers are gone, and a recovering job's
    // group after a coordinator restart (it has no generation yet).
    entry.holds = OwnerChargeLocked(*job);
    const bool running_now = job->status.state() == v1::JOB_STATE_RUNNING &&
                             job->generation != nullptr;
    entry.yielding = job->yielding() && running_now;
    entry.yielding_for = job->yield_for();
    const bool settled = running_now && !job->yielding() &&
                         !job->stop_requested && !job->generation->preempting();
    entry.can_yield =
        settled && !job->status.spec().checkpoint().backup_dir().empty();
    entry.min_workers = job->status.spec().min_workers();
    entry.can_shrink = settled && entry.min_workers > 0 &&
                       job->status.world_size() > entry.min_workers;
    entry.keeps = job->shrink_to();
    entry.ends = job->TimeLimitEnds();
    running.push_back(std::move(entry));
  }
  SchedulingPlan plan = scheduler_.Plan(pool, queued, running, clock_->Now());
  reserved_for_ =
      plan.reservations.empty() ? "" : plan.reservations.front().job_id;
  for (const SchedulingPlan::Hold& hold : plan.holds) {
    for (int i : hold.workers) {
      Promise& promise = promised_[connected[i]->id];
      promise.job_id = hold.job_id;
    }
  }
  for (const SchedulingPlan::Preemption& preemption : plan.preemptions) {
    PreemptForLocked(jobs_[preemption.job_id], jobs_[preemption.for_job],
                     preemption.keep);
  }
  for (const SchedulingPlan::Start& start : plan.starts) {
    Job& job = jobs_[start.job_id];
    std::vector<Worker*> workers;
    for (int i : start.workers) {
      workers.push_back(connected[i]);
      promised_.erase(connected[i]->id);
    }
    queue_.erase(std::find(queue_.begin(), queue_.end(), start.job_id));
    active_jobs_[job.seq] = job.status.job_id();
    const std::string waited = absl::FormatDuration(
        absl::Trunc(clock_->Now() - job.queued_at, absl::Milliseconds(1)));
    if (job.status.yields() > 0 && job.status.generation() > 0) {
      AddEventLocked(job, "resumed_after_preemption", nullptr,
                     absl::StrCat("placed again on ", workers.size(),
                                  " workers after ", job.status.yields(),
                                  job.status.yields() == 1 ? " preemption"
                                                           : " preemptions",
                                  " and ", waited, " in the queue; ",
                                  ContinuesAfterPreemption(job.status)));
    } else {
      AddEventLocked(
          job, "placed", nullptr,
          absl::StrCat("placed on ", workers.size(), " workers after ", waited,
                       " in the queue (priority ", job.status.priority(),
                       job.status.owner().empty()
                           ? ""
                           : absl::StrCat(", owner ", job.status.owner()),
                       ")"));
    }
    StartGenerationLocked(job, workers);
  }
  // Each waiting job's status shows its new place. A job that waits for
  // anything but its preemption keeps no promise (the workers go to whoever
  // fits), except while released workers have time to come back.
  std::map<std::string, WaitReason> reasons;
  std::vector<std::string> ids;
  for (const QueueEntry& entry : plan.waiting) {
    ids.push_back(queued[entry.job].id);
    reasons[queued[entry.job].id] = entry.reason;
  }
  const absl::Time now = clock_->Now();
  bool promise_pending = false;
  for (auto it = promised_.begin(); it != promised_.end();) {
    auto reason = reasons.find(it->second.job_id);
    const bool preempting =
        reason != reasons.end() && reason->second == WaitReason::kPreempting;
    const bool returning = reason != reasons.end() &&
                           reason->second == WaitReason::kNoFit &&
                           now < it->second.until;
    promise_pending |= returning;
    if (preempting || returning) {
      ++it;
      continue;
    }
    // Jobs considered before the promisee in this pass did not see the
    // worker: another pass gives it to whoever fits (simulation seed 376).
    schedule_again_ = true;
    it = promised_.erase(it);
  }
  ShowWaitingLocked(ids, plan.waiting);
  // A pass when a promise runs out gives its workers to whoever fits.
  waiting_on_time_ |= promise_pending;
  CallOffPreemptionsLocked();
}

}  // namespace lockstep::coordinator
