// The coordinator's job queue and state machine: submission, starting and
// ending generations and jobs. The clients' other job calls and how jobs are
// kept are in job_api.cc, workers' registration, sessions and failure
// detection in worker_sessions.cc, what they report in worker_reports.cc,
// the key-value store and barriers in rendezvous.cc.
#include "coordinator/coordinator.h"

#include <algorithm>
#include <iterator>
#include <limits>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/job_spec.h"
#include "common/job_state.h"
#include "common/labels.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "common/tf_config.h"
#include "coordinator/backend_choice.h"
#include "coordinator/job_status.h"
#include "coordinator/message_checks.h"

namespace lockstep::coordinator {
namespace {

constexpr int kDefaultMaxRestarts = 3;

std::string JobIdFor(const std::string& name, int64_t seq) {
  std::string clean;
  for (char c : name) {
    bool ok = std::isalnum(static_cast<unsigned char>(c)) || c == '-' ||
              c == '_' || c == '.';
    clean.push_back(ok ? c : '-');
  }
  if (clean.empty()) clean = "job";
  return absl::StrCat(clean, "-", seq);
}

// The sequence number that ends a job id ("name-<seq>"), or 0 when the id
// does not end in one (a record written by hand).
int64_t SeqOf(const std::string& id) {
  size_t dash = id.rfind('-');
  int64_t seq = 0;
  if (dash == std::string::npos ||
      !absl::SimpleAtoi(absl::string_view(id).substr(dash + 1), &seq) ||
      seq <= 0) {
    return 0;
  }
  return seq;
}

int MaxRestarts(const v1::JobSpec& spec) {
  return spec.has_max_restarts() ? spec.max_restarts() : kDefaultMaxRestarts;
}

// Checks a spec (defaults applied) against the cluster the coordinator runs.
// Errors: InvalidArgument.
absl::Status ValidateSubmission(const v1::JobSpec& spec,
                                const std::optional<v1::ClusterSpec>& cluster) {
  int replicas = spec.num_workers();
  if (cluster.has_value()) {
    int cluster_size = static_cast<int>(TrainingTasks(*cluster).size());
    if (replicas != 0 && replicas != cluster_size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "job spec: num_workers is ", replicas, " but the static cluster has ",
          cluster_size, " training tasks; set num_workers to 0 or ",
          cluster_size));
    }
    if (spec.min_workers() > 0 || spec.max_workers() > 0) {
      return absl::InvalidArgumentError(
          "job spec: min_workers/max_workers (elastic mode) need a "
          "coordinator without a static --cluster");
    }
    replicas = cluster_size;
  }
  if (spec.min_workers() < 0 || spec.max_workers() < 0 ||
      (spec.max_workers() > 0 && spec.max_workers() < spec.min_workers())) {
    return absl::InvalidArgumentError(
        absl::StrCat("job spec: need 0 <= min_workers <= max_workers, got ",
                     spec.min_workers(), " and ", spec.max_workers()));
  }
  if (MaxRestarts(spec) < 0) {
    return absl::InvalidArgumentError("job spec: max_restarts must be >= 0");
  }
  if (cluster.has_value() && !spec.placement().labels().empty()) {
    return absl::InvalidArgumentError(
        "job spec: placement.labels need a coordinator without a static "
        "--cluster (its tasks are the job's workers)");
  }
  return ValidateJobSpec(spec, spec.min_workers() > 0 ? 0 : replicas);
}

// The priority a spec asks for: its integer, or the value of its class.
// Errors: InvalidArgument for a class the coordinator lacks.
absl::StatusOr<int> PriorityOf(const v1::JobSpec& spec,
                               const std::map<std::string, int>& classes) {
  // ValidateJobSpec refused a spec that gives both.
  if (spec.priority_class().empty()) return spec.priority();
  auto it = classes.find(spec.priority_class());
  if (it == classes.end()) {
    std::vector<std::string> known;
    for (const auto& [name, value] : classes) {
      known.push_back(absl::StrCat(name, "=", value));
    }
    return absl::InvalidArgumentError(absl::StrCat(
        "job spec: priority_class \"",
        absl::CHexEscape(spec.priority_class().substr(0, 64)),
        "\" is not one of this coordinator's classes (",
        known.empty() ? "it defines none" : absl::StrJoin(known, ", "),
        "; see lockstep-coordinator --priority-class)"));
  }
  return it->second;
}

v1::CoordinatorCommand AssignmentFor(const v1::JobStatus& status, int rank,
                                     const std::string& data_plane_secret) {
  v1::CoordinatorCommand command;
  v1::Assignment* assignment = command.mutable_assignment();
  assignment->set_job_id(status.job_id());
  assignment->set_submitted_by(status.submitted_by());
  assignment->set_generation(status.generation());
  assignment->set_rank(rank);
  assignment->set_world_size(status.world_size());
  *assignment->mutable_spec() = status.spec();
  assignment->set_backend(status.backend());
  assignment->set_data_plane_secret(data_plane_secret);
  return command;
}

}  // namespace

Coordinator::Coordinator(Options options)
    : cluster_(std::move(options.cluster)),
      clock_(options.clock),
      store_(std::move(options.store)),
      error_grace_(options.error_grace),
      heartbeat_timeout_(options.heartbeat_timeout),
      kv_limits_(options.kv_limits),
      keep_finished_jobs_(options.keep_finished_jobs),
      finished_job_ttl_(options.finished_job_ttl),
      forget_workers_after_(options.forget_workers_after),
      revoked_(std::move(options.revoked)),
      scheduler_(std::move(options.scheduling)),
      priority_classes_(std::move(options.priority_classes)),
      admins_(std::move(options.admins)),
      workers_(cluster_, options.heartbeat_timeout, options.stall_after),
      commit_seconds_(
          {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}) {}

absl::StatusOr<std::unique_ptr<Coordinator>> Coordinator::Create(
    Options options) {
  if (options.cluster.has_value()) {
    RETURN_IF_ERROR(ValidateCluster(*options.cluster));
  }
  std::unique_ptr<Coordinator> coordinator(new Coordinator(std::move(options)));
  if (coordinator->store_ == nullptr) return coordinator;
  ASSIGN_OR_RETURN(std::vector<v1::JobStatus> saved,
                   coordinator->store_->LoadAll());
  ASSIGN_OR_RETURN(std::vector<JobStore::WorkerRecord> workers,
                   coordinator->store_->LoadWorkers());
  Coordinator& c = *coordinator;
  absl::MutexLock lock(&c.mu_);
  // The free workers' ids, so that each process that reconnects gets its
  // own back: the ranks of every job that was running name them.
  for (const JobStore::WorkerRecord& worker : workers) {
    if (!c.workers_.Restore(worker.worker_id, worker.identity,
                            worker.incarnation, worker.order,
                            c.clock_->Now())) {
      LogWarning("ignoring a stored worker record (id \"",
                 absl::CHexEscape(worker.worker_id.substr(0, 64)),
                 "\"): not a free worker's; it registers anew");
    }
  }
  for (v1::JobStatus& status : saved) {
    // Ids keep their number across restarts, so a new job never reuses the
    // id of one that retention deleted.
    int64_t seq = SeqOf(status.job_id());
    if (seq == 0 || c.job_order_.count(seq) > 0 ||
        (!c.job_order_.empty() && seq < c.job_order_.rbegin()->first)) {
      seq = c.job_order_.empty() ? 1 : c.job_order_.rbegin()->first + 1;
    }
    Job& job = c.AddJobLocked(status.job_id(), seq);
    job.status = std::move(status);
    v1::JobState state = job.status.state();
    if (!IsTerminal(state)) {
      // A newer rule or a corrupted row: the job must not start (or crash
      // the coordinator at every restart); it fails with the reason.
      absl::Status valid = ValidateSubmission(job.status.spec(), c.cluster_);
      if (!valid.ok()) {
        c.FailStoredJobLocked(
            job, absl::StrCat("the stored spec no longer validates: ",
                              valid.message()));
        continue;
      }
    }
    if (state == v1::JOB_STATE_QUEUED) {
      c.queue_.push_back(job.status.job_id());
      job.queued_at = c.clock_->Now();
    } else if (state == v1::JOB_STATE_RUNNING ||
               state == v1::JOB_STATE_RECOVERING) {
      // Every job that ran comes back: its workers still hold the live
      // state; they reconnect and it re-forms as the next generation.
      c.active_jobs_[job.seq] = job.status.job_id();
      c.TransitionLocked(job, v1::JOB_STATE_RECOVERING, "coordinator_restarted",
                         nullptr,
                         "the coordinator restarted; waiting for the "
                         "workers to reconnect");
    }
  }
  c.next_job_seq_ = c.job_order_.empty() ? 1 : c.job_order_.rbegin()->first + 1;
  c.ForgetFinishedJobsLocked();
  return coordinator;
}

namespace {

// The moves of the state diagram (coordinator.h). RECOVERING may be entered
// again: a coordinator restart while the job recovers.
bool AllowedMove(v1::JobState from, v1::JobState to) {
  switch (from) {
    case v1::JOB_STATE_QUEUED:
      return to == v1::JOB_STATE_RUNNING || to == v1::JOB_STATE_STOPPED ||
             to == v1::JOB_STATE_FAILED;
    case v1::JOB_STATE_RUNNING:
      return to == v1::JOB_STATE_RECOVERING || to == v1::JOB_STATE_QUEUED ||
             IsTerminal(to);
    case v1::JOB_STATE_RECOVERING:
      return to == v1::JOB_STATE_RUNNING || to == v1::JOB_STATE_RECOVERING ||
             to == v1::JOB_STATE_STOPPED || to == v1::JOB_STATE_FAILED;
    default:
      return false;
  }
}

}  // namespace

bool Coordinator::TransitionLocked(Job& job, v1::JobState to,
                                   const std::string& kind,
                                   const Worker* worker,
                                   const std::string& reason) {
  v1::JobStatus& status = job.status;
  const v1::JobState from = status.state();
  if (!AllowedMove(from, to)) {
    LogError("job ", status.job_id(), ": refused the move from ",
             StateName(from), " to ", StateName(to), " (", kind, ": ", reason,
             "); this is a bug in the coordinator, please report it");
    return false;
  }
  status.set_state(to);
  if (to == v1::JOB_STATE_RECOVERING || IsTerminal(to)) {
    if (!reason.empty()) status.set_error(reason);
  }
  if (IsTerminal(to)) status.set_end_time(NowSeconds());
  AddEventLocked(job, kind, worker, reason);
  const std::string line =
      absl::StrCat("job ", status.job_id(), " ", StateName(to), " (", kind, ")",
                   reason.empty() ? "" : ": ", reason);
  if (to == v1::JOB_STATE_FAILED || to == v1::JOB_STATE_RECOVERING) {
    LogWarning(line);
  } else {
    LogInfo(line);
  }
  ChangedLocked(job);
  PersistLocked(job);
  return true;
}

void Coordinator::FailStoredJobLocked(Job& job, const std::string& reason) {
  TransitionLocked(job, v1::JOB_STATE_FAILED, "job_failed", nullptr, reason);
}

double Coordinator::NowSeconds() const {
  return absl::ToDoubleSeconds(clock_->Now() - absl::UnixEpoch());
}

std::vector<Coordinator::Job*> Coordinator::ActiveJobsLocked() {
  std::vector<Job*> active;
  for (const auto& [seq, id] : active_jobs_) {
    if (auto it = jobs_.find(id); it != jobs_.end()) {
      active.push_back(&it->second);
    }
  }
  return active;
}

Coordinator::Job* Coordinator::JobOfLocked(const Worker& worker) {
  if (!worker.holds_rank) return nullptr;
  auto it = jobs_.find(worker.job_id);
  if (it == jobs_.end() || active_jobs_.count(it->second.seq) == 0) {
    return nullptr;
  }
  return &it->second;
}

// ---- the job queue and state machine ---------------------------------------

absl::StatusOr<std::string> Coordinator::SubmitJob(
    v1::JobSpec spec, const std::string& submitted_by) {
  if (absl::Status bad = CheckSubmission(spec); !bad.ok()) return Refused(bad);
  ApplyDefaults(&spec);
  RETURN_IF_ERROR(ValidateSubmission(spec, cluster_));
  ASSIGN_OR_RETURN(const int priority, PriorityOf(spec, priority_classes_));
  absl::MutexLock lock(&mu_);
  if (shutdown_) return absl::UnavailableError("the coordinator is stopping");
  ForgetFinishedJobsLocked();
  const int64_t seq = next_job_seq_++;
  std::string id = JobIdFor(spec.name(), seq);
  Job& job = AddJobLocked(id, seq);
  job.status.set_job_id(id);
  job.status.set_state(v1::JOB_STATE_QUEUED);
  job.status.set_submitted_by(submitted_by);
  job.status.set_owner(OwnerOf(submitted_by));
  job.status.set_priority(priority);
  *job.status.mutable_spec() = std::move(spec);
  job.status.set_submit_time(NowSeconds());
  job.queued_at = clock_->Now();
  queue_.push_back(id);
  LogInfo("job ", id, " queued",
          priority != 0 ? absl::StrCat(" at priority ", priority) : "",
          job.status.owner().empty()
              ? ""
              : absl::StrCat(" for ", job.status.owner()));
  ChangedLocked(job);
  PersistLocked(job);
  MaybeStartJobLocked();
  return id;
}

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
  // Recovering jobs first, the highest priority (then the oldest) first: a
  // spare goes to the most important job that lost a rank. Each keeps the
  // workers of its previous generation (after a coordinator restart, as
  // persisted: a spare may hold a rank whose own task never came back):
  // they hold its live state, so no other job is given them while it waits
  // for its group.
  std::vector<std::pair<std::string, std::vector<std::string>>> recovering;
  std::set<std::string> reserved;
  for (Job* job : ByPriorityLocked()) {
    if (job->status.state() != v1::JOB_STATE_RECOVERING) continue;
    std::vector<std::string> previous;
    if (job->generation != nullptr) {
      previous = job->generation->rank_workers();
    } else {
      for (const v1::RankResult& rank : job->status.ranks()) {
        previous.push_back(rank.worker_id());
      }
    }
    // A job that shrank keeps only its first ranks.
    if (job->keep_ranks > 0 &&
        previous.size() > static_cast<size_t>(job->keep_ranks)) {
      previous.resize(job->keep_ranks);
    }
    reserved.insert(previous.begin(), previous.end());
    recovering.emplace_back(job->status.job_id(), std::move(previous));
  }
  for (const auto& [id, previous] : recovering) {
    Job& job = jobs_[id];
    if (job.status.state() != v1::JOB_STATE_RECOVERING) continue;
    std::set<std::string> others = reserved;
    for (const std::string& worker : previous) others.erase(worker);
    v1::JobSpec spec = job.status.spec();
    // It does not grow back into the workers it gave up.
    if (job.keep_ranks > 0) spec.set_max_workers(job.keep_ranks);
    std::vector<Worker*> workers = workers_.Pick(
        spec, previous, WithUnplaceableLocked(spec, std::move(others)));
    if (!workers.empty()) StartGenerationLocked(job, workers);
  }
  if (cluster_.has_value()) {
    StartQueuedOnClusterLocked(reserved);
  } else {
    ScheduleQueuedLocked(reserved);
  }
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

void Coordinator::ScheduleQueuedLocked(const std::set<std::string>& reserved) {
  // The snapshot: every connected worker by registration order, the queued
  // jobs, and the active jobs with the workers they hold.
  std::vector<Worker*> connected = workers_.Connected();
  std::sort(
      connected.begin(), connected.end(),
      [](const Worker* a, const Worker* b) { return a->order < b->order; });
  std::set<const Worker*> idle;
  for (Worker* worker : workers_.StandingBy()) idle.insert(worker);
  std::vector<PoolWorker> pool;
  std::map<std::string, int> index;
  for (Worker* worker : connected) {
    PoolWorker pool_worker = PoolWorkerOf(*worker);
    pool_worker.free =
        idle.count(worker) > 0 && reserved.count(worker->id) == 0;
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
    if (job->generation != nullptr) {
      for (const std::string& id : job->generation->rank_workers()) {
        if (auto found = index.find(id); found != index.end()) {
          entry.workers.push_back(found->second);
        }
      }
    }
    const bool running_now = job->status.state() == v1::JOB_STATE_RUNNING &&
                             job->generation != nullptr;
    entry.yielding = job->yielding && running_now;
    entry.yielding_for = job->yield_for;
    const bool settled = running_now && !job->yielding &&
                         !job->stop_requested && !job->generation->preempting();
    entry.can_yield =
        settled && !job->status.spec().checkpoint().backup_dir().empty();
    entry.min_workers = job->status.spec().min_workers();
    entry.can_shrink = settled && entry.min_workers > 0 &&
                       job->status.world_size() > entry.min_workers;
    entry.keeps = job->shrink_to;
    running.push_back(std::move(entry));
  }
  SchedulingPlan plan = scheduler_.Plan(pool, queued, running, clock_->Now());
  for (const SchedulingPlan::Preemption& preemption : plan.preemptions) {
    PreemptForLocked(jobs_[preemption.job_id], jobs_[preemption.for_job],
                     preemption.keep);
  }
  for (const SchedulingPlan::Start& start : plan.starts) {
    Job& job = jobs_[start.job_id];
    std::vector<Worker*> workers;
    for (int i : start.workers) workers.push_back(connected[i]);
    queue_.erase(std::find(queue_.begin(), queue_.end(), start.job_id));
    active_jobs_[job.seq] = job.status.job_id();
    const std::string waited = absl::FormatDuration(
        absl::Trunc(clock_->Now() - job.queued_at, absl::Milliseconds(1)));
    if (job.status.yields() > 0 && job.status.generation() > 0) {
      AddEventLocked(
          job, "resumed_after_preemption", nullptr,
          absl::StrCat(
              "placed again on ", workers.size(), " workers after ",
              job.status.yields(),
              job.status.yields() == 1 ? " preemption" : " preemptions",
              " and ", waited, " in the queue; it continues from step ",
              job.status.applied_step()));
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
  // Each waiting job's status shows its new place.
  std::vector<std::string> ids;
  for (const QueueEntry& entry : plan.waiting) {
    ids.push_back(queued[entry.job].id);
  }
  ShowWaitingLocked(ids, plan.waiting);
}

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
  job.yielding = true;
  job.yield_for = for_job.status.job_id();
  job.shrink_to = keep;
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
}

void Coordinator::StartGenerationLocked(Job& job,
                                        const std::vector<Worker*>& workers) {
  v1::JobStatus& status = job.status;
  auto plan = ResolveBatch(status.spec(), static_cast<int>(workers.size()));
  if (!plan.ok()) {
    EndJobLocked(job, v1::JOB_STATE_FAILED,
                 std::string(plan.status().message()));
    return;
  }
  auto backend =
      ResolveBackend(status.spec().communication().backend(), workers);
  if (!backend.ok()) {
    EndJobLocked(job, v1::JOB_STATE_FAILED,
                 std::string(backend.status().message()));
    return;
  }
  absl::StatusOr<std::string> secret = NewDataPlaneSecret();
  if (!secret.ok()) {
    EndJobLocked(job, v1::JOB_STATE_FAILED,
                 std::string(secret.status().message()));
    return;
  }
  status.set_backend(backend->name);
  status.set_generation(status.generation() + 1);
  status.set_generations(status.generations() + 1);
  status.set_world_size(static_cast<int>(workers.size()));
  status.clear_queue();
  job.started = clock_->Now();
  job.yielding = false;
  job.yield_for.clear();
  job.shrink_to = 0;
  job.keep_ranks = 0;
  if (status.start_time() == 0) status.set_start_time(NowSeconds());
  status.clear_ranks();
  std::vector<std::string> rank_workers, names;
  for (const Worker* worker : workers) rank_workers.push_back(worker->id);
  NoteReplacementsLocked(job, rank_workers);
  // The previous generation, ended already, is dropped whole here.
  job.generation = std::make_unique<Generation>(
      status.job_id(), status.generation(), std::move(rank_workers), kv_limits_,
      *std::move(secret));
  for (size_t rank = 0; rank < workers.size(); ++rank) {
    Worker& worker = *workers[rank];
    workers_.Assign(worker, status.job_id(), status.generation(),
                    static_cast<int>(rank), clock_->Now());
    job.generation->SetRankIdentity(worker.rank, worker.identity);
    v1::RankResult* result = status.add_ranks();
    result->set_rank(worker.rank);
    result->set_worker_id(worker.id);
    result->set_host(worker.host);
    names.push_back(absl::StrCat(rank, "=", worker.id));
    worker.sink->Send(AssignmentFor(status, worker.rank,
                                    job.generation->data_plane_secret()));
  }
  std::string message =
      absl::StrCat("generation ", status.generation(), " on ", workers.size(),
                   " workers (ranks ", absl::StrJoin(names, ", "),
                   "), backend ", backend->name);
  if (!backend->why.empty()) {
    absl::StrAppend(&message, " (auto: ", backend->why, ")");
  }
  // The ranks persisted below name workers whose ids must outlive us.
  PersistWorkersLocked();
  TransitionLocked(job, v1::JOB_STATE_RUNNING, "generation_started", nullptr,
                   message);
}

void Coordinator::NoteReplacementsLocked(
    Job& job, const std::vector<std::string>& rank_workers) {
  // A job placed from the queue (again, after a preemption) replaces
  // nobody: its previous workers were released, not lost.
  if (job.generation == nullptr || job.status.state() == v1::JOB_STATE_QUEUED) {
    return;
  }
  const std::vector<std::string>& previous = job.generation->rank_workers();
  for (size_t rank = 0; rank < rank_workers.size() && rank < previous.size();
       ++rank) {
    if (rank_workers[rank] == previous[rank]) continue;
    const Worker* taker = workers_.Find(rank_workers[rank]);
    if (taker == nullptr) continue;
    std::string message =
        absl::StrCat(taker->spare ? "spare " : "worker ", taker->id, " (host ",
                     taker->host, ") took rank ", rank, " of job ",
                     job.status.job_id(), " after ", previous[rank], " failed",
                     job.status.error().empty()
                         ? ""
                         : absl::StrCat(" (", job.status.error(), ")"));
    LogInfo(message);
    AddEventLocked(job, "rank_replaced", taker, message);
  }
}

void Coordinator::ReleaseGenerationLocked(Job& job, bool abort,
                                          const std::string& reason) {
  if (job.generation != nullptr) {
    if (abort) {
      v1::CoordinatorCommand command;
      v1::Abort* message = command.mutable_abort();
      message->set_job_id(job.status.job_id());
      message->set_generation(job.status.generation());
      message->set_reason(reason);
      SendToRanksLocked(job, command);
    }
    for (Worker* worker : workers_.RanksOf(job.status.job_id(),
                                           job.generation->rank_workers())) {
      WorkerRegistry::Unassign(*worker);
    }
    job.generation->End();
  }
  WakeJobWaitersLocked(job.status.job_id());
}

void Coordinator::FailGenerationLocked(Job& job, const std::string& kind,
                                       const Worker* worker,
                                       const std::string& cause) {
  v1::JobStatus& status = job.status;
  const int restarts_used = RestartsUsed(status);
  // A preemption for another job that a failure cut short: the job recovers
  // as after any failure (its survivors hold its state).
  job.yielding = false;
  job.shrink_to = 0;
  // The cause is recorded while `worker` still holds its rank.
  if (job.stop_requested) {
    // The stop went to the generation that failed: the job stops here, as a
    // stop while recovering does, instead of training on in the next one.
    AddEventLocked(job, kind, worker, cause);
    EndJobLocked(
        job, v1::JOB_STATE_STOPPED,
        absl::StrCat("stopped on request; generation ", status.generation(),
                     " failed before its ranks stopped (", cause, ")"));
    return;
  }
  if (restarts_used >= MaxRestarts(status.spec())) {
    AddEventLocked(job, kind, worker, cause);
    EndJobLocked(job, v1::JOB_STATE_FAILED,
                 absl::StrCat(cause, "; giving up after ", restarts_used,
                              " restarts (max_restarts ",
                              MaxRestarts(status.spec()), ")"));
    return;
  }
  // The job waits for its group to be whole again.
  TransitionLocked(job, v1::JOB_STATE_RECOVERING, kind, worker, cause);
  ReleaseGenerationLocked(job, /*abort=*/true, cause);
  MaybeStartJobLocked();
}

void Coordinator::PreemptedLocked(Job& job) {
  v1::JobStatus& status = job.status;
  if (job.yielding && job.shrink_to > 0) {
    // An elastic job gave up its last ranks: it re-forms at once on the
    // first ones (their live state), and the others go to yield_for.
    status.set_preemptions(status.preemptions() + 1);
    job.keep_ranks = job.shrink_to;
    const std::string message =
        absl::StrCat("generation ", status.generation(), " stopped after step ",
                     status.step(), " (", job.generation->preempt_reason(),
                     "); it goes on with its first ", job.keep_ranks, " ranks");
    ReleaseGenerationLocked(job, /*abort=*/false, "shrunk");
    job.yielding = false;
    job.shrink_to = 0;
    TransitionLocked(job, v1::JOB_STATE_RECOVERING, "shrunk", nullptr, message);
    MaybeStartJobLocked();
    return;
  }
  if (job.yielding) {
    // The scheduler gave its workers to another job: it waits in the queue
    // and resumes from the step it saved, on whichever workers are free.
    status.set_preemptions(status.preemptions() + 1);
    status.set_yields(status.yields() + 1);
    ++yields_;
    const std::string saved =
        FinalSave(status, status.step(),
                  job.generation->checkpoints().FailureOf(status.step()));
    const std::string message =
        absl::StrCat("generation ", status.generation(), " stopped after step ",
                     status.step(), " (", job.generation->preempt_reason(),
                     "); ", saved, "; back in the queue");
    ReleaseGenerationLocked(job, /*abort=*/false, "preempted");
    active_jobs_.erase(job.seq);
    job.yielding = false;
    job.yield_for.clear();
    queue_.push_back(status.job_id());
    job.queued_at = clock_->Now();
    TransitionLocked(job, v1::JOB_STATE_QUEUED, "preempted", nullptr, message);
    MaybeStartJobLocked();
    return;
  }
  // Every rank stopped at the same step; the job goes on when its group is
  // whole again (the preempted worker restarted).
  status.set_preemptions(status.preemptions() + 1);
  std::string saved =
      FinalSave(status, status.step(),
                job.generation->checkpoints().FailureOf(status.step()));
  std::string message = absl::StrCat(
      "generation ", status.generation(), " stopped after step ", status.step(),
      " for a preemption (", job.generation->preempt_reason(),
      saved.empty() ? "); no checkpoints are configured"
                    : absl::StrCat("); ", saved),
      "; waiting for the group to be whole");
  ReleaseGenerationLocked(job, /*abort=*/false, "preempted");
  TransitionLocked(job, v1::JOB_STATE_RECOVERING, "preempted", nullptr,
                   message);
  MaybeStartJobLocked();
}

void Coordinator::EndJobLocked(Job& job, v1::JobState state,
                               const std::string& reason) {
  v1::JobStatus& status = job.status;
  ReleaseGenerationLocked(job, state != v1::JOB_STATE_SUCCEEDED, reason);
  active_jobs_.erase(job.seq);
  job.yielding = false;
  job.status.clear_queue();
  TransitionLocked(job, state, absl::StrCat("job_", StateName(state)), nullptr,
                   reason);
  MaybeStartJobLocked();
}

void Coordinator::SendToRanksLocked(const Job& job,
                                    const v1::CoordinatorCommand& command) {
  if (job.generation == nullptr) return;
  for (Worker* worker :
       workers_.RanksOf(job.status.job_id(), job.generation->rank_workers())) {
    if (worker->sink != nullptr) worker->sink->Send(command);
  }
}

void Coordinator::Shutdown() {
  absl::MutexLock lock(&mu_);
  shutdown_ = true;
  workers_.CloseAll();
  WakeAllWaitersLocked();  // each is Cancelled by the fence
  EndWatchesLocked(std::nullopt,
                   absl::CancelledError("the coordinator is stopping"));
}

}  // namespace lockstep::coordinator
