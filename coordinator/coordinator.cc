#include "coordinator/coordinator.h"

#include <algorithm>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/job_spec.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "common/tf_config.h"

namespace lockstep::coordinator {
namespace {

constexpr int kDefaultMaxRestarts = 3;
constexpr absl::Duration kPersistProgressEvery = absl::Seconds(5);

bool IsTerminal(v1::JobState state) {
  return state == v1::JOB_STATE_SUCCEEDED || state == v1::JOB_STATE_FAILED ||
         state == v1::JOB_STATE_STOPPED;
}

// Errors that say a peer or the generation went away, not that the job is
// wrong: the job re-forms instead of failing.
bool IsRetryable(int code) {
  auto status_code = static_cast<absl::StatusCode>(code);
  return status_code == absl::StatusCode::kUnavailable ||
         status_code == absl::StatusCode::kAborted ||
         status_code == absl::StatusCode::kDeadlineExceeded ||
         status_code == absl::StatusCode::kCancelled;
}

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

int MaxRestarts(const v1::JobSpec& spec) {
  return spec.has_max_restarts() ? spec.max_restarts() : kDefaultMaxRestarts;
}

}  // namespace

Coordinator::Coordinator(Options options)
    : cluster_(std::move(options.cluster)),
      clock_(options.clock),
      store_(std::move(options.store)),
      heartbeat_timeout_(options.heartbeat_timeout),
      error_grace_(options.error_grace),
      stall_after_(options.stall_after) {}

absl::StatusOr<std::unique_ptr<Coordinator>> Coordinator::Create(
    Options options) {
  if (options.cluster.has_value()) {
    RETURN_IF_ERROR(ValidateCluster(*options.cluster));
  }
  std::unique_ptr<Coordinator> coordinator(new Coordinator(std::move(options)));
  if (coordinator->store_ == nullptr) return coordinator;
  ASSIGN_OR_RETURN(std::vector<v1::JobStatus> saved,
                   coordinator->store_->LoadAll());
  Coordinator& c = *coordinator;
  absl::MutexLock lock(&c.mu_);
  for (v1::JobStatus& status : saved) {
    Job& job = c.jobs_[status.job_id()];
    job.status = std::move(status);
    c.job_order_.push_back(job.status.job_id());
    v1::JobState state = job.status.state();
    if (state == v1::JOB_STATE_QUEUED) {
      c.queue_.push_back(job.status.job_id());
    } else if (state == v1::JOB_STATE_RUNNING ||
               state == v1::JOB_STATE_RECOVERING) {
      if (c.running_job_.empty()) {
        // Its workers still hold the live state; they reconnect and the job
        // re-forms as the next generation.
        c.running_job_ = job.status.job_id();
        job.status.set_state(v1::JOB_STATE_RECOVERING);
        c.AddEventLocked(job, "coordinator_restarted", nullptr,
                         "the coordinator restarted; waiting for the workers "
                         "to reconnect");
      } else {
        job.status.set_state(v1::JOB_STATE_FAILED);
        job.status.set_error(
            "two jobs were running when the coordinator "
            "stopped; only the first is resumed");
      }
      c.PersistLocked(job);
    }
  }
  c.next_job_seq_ = static_cast<int64_t>(c.job_order_.size()) + 1;
  return coordinator;
}

double Coordinator::NowSeconds() const {
  return absl::ToDoubleSeconds(clock_->Now() - absl::UnixEpoch());
}

Coordinator::Job* Coordinator::RunningJobLocked() {
  if (running_job_.empty()) return nullptr;
  return &jobs_[running_job_];
}

// ---- workers ----------------------------------------------------------------

absl::StatusOr<v1::RegisterWorkerResponse> Coordinator::RegisterWorker(
    const v1::RegisterWorkerRequest& request) {
  std::string id;
  if (IsStatic()) {
    if (request.task().type().empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "worker on ", request.host(),
          " registered without a task identity, but this coordinator runs "
          "the static cluster ",
          DescribeCluster(*cluster_),
          "; give the worker TF_CONFIG or --task-type/--task-index"));
    }
    auto rank = RankOf(*cluster_, request.task());
    if (!rank.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("refusing worker on ",
                                                     request.host(), ": ",
                                                     rank.status().message()));
    }
    if (!request.cluster().tasks().empty() &&
        !SameCluster(request.cluster(), *cluster_)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "task ", TaskName(request.task()), " on ", request.host(),
          " has TF_CONFIG cluster ", DescribeCluster(request.cluster()),
          " but the coordinator's cluster is ", DescribeCluster(*cluster_),
          "; give every task and the coordinator the same cluster"));
    }
    id = TaskName(request.task());
  } else if (!request.task().type().empty()) {
    id = TaskName(request.task());
  }

  absl::MutexLock lock(&mu_);
  if (id.empty()) {
    // Free registration: the same process (incarnation) keeps its id.
    for (const auto& [existing_id, worker] : workers_) {
      if (worker.incarnation == request.incarnation() &&
          worker.task.type().empty()) {
        id = existing_id;
      }
    }
    if (id.empty()) id = absl::StrCat("free:", next_worker_order_);
  }
  Worker& worker = workers_[id];
  if (worker.id.empty()) {
    worker.id = id;
    worker.order = next_worker_order_++;
  } else if (worker.incarnation != request.incarnation()) {
    worker.leaving = false;
    WorkerFailedLocked(
        worker, "worker_restarted",
        absl::StrCat("worker ", DescribeWorkerLocked(worker),
                     " restarted (incarnation ", absl::Hex(worker.incarnation),
                     " is now ", absl::Hex(request.incarnation()), ")"));
  }
  worker.task = request.task();
  worker.incarnation = request.incarnation();
  worker.host = request.host();
  worker.last_heartbeat = clock_->Now();
  LogInfo("registered ", id, " (host ", worker.host, ", incarnation ",
          absl::Hex(worker.incarnation), ")");
  v1::RegisterWorkerResponse response;
  response.set_worker_id(id);
  response.set_heartbeat_interval_ms(
      absl::ToInt64Milliseconds(heartbeat_timeout_ / 2));
  return response;
}

absl::Status Coordinator::OpenSession(const std::string& worker_id,
                                      uint64_t incarnation, SessionSink* sink) {
  absl::MutexLock lock(&mu_);
  if (shutdown_) return absl::UnavailableError("the coordinator is stopping");
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) {
    return absl::NotFoundError(absl::StrCat(
        "worker ", worker_id, " opened a session without registering"));
  }
  Worker& worker = it->second;
  if (worker.incarnation != incarnation) {
    return absl::AbortedError(
        absl::StrCat("worker ", worker_id, " session has incarnation ",
                     absl::Hex(incarnation), " but the registered one is ",
                     absl::Hex(worker.incarnation), "; the process restarted"));
  }
  if (worker.sink != nullptr && worker.sink != sink) {
    // The same process reconnected; its previous session is dead.
    WorkerFailedLocked(worker, "worker_reconnected",
                       absl::StrCat("worker ", DescribeWorkerLocked(worker),
                                    " opened a new session"));
  }
  worker.sink = sink;
  worker.last_heartbeat = clock_->Now();
  MaybeStartJobLocked();
  changed_.SignalAll();
  return absl::OkStatus();
}

void Coordinator::CloseSession(const std::string& worker_id,
                               uint64_t incarnation, SessionSink* sink,
                               const absl::Status& cause) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(worker_id);
  if (it == workers_.end() || it->second.sink != sink ||
      it->second.incarnation != incarnation) {
    return;  // already declared failed, or replaced by a newer session
  }
  Worker& worker = it->second;
  WorkerFailedLocked(worker, "worker_failed",
                     absl::StrCat("worker ", DescribeWorkerLocked(worker),
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
  Job* job = RunningJobLocked();
  if (job == nullptr || worker.job_id != job->status.job_id()) return;
  if (job->status.state() != v1::JOB_STATE_RUNNING ||
      worker.generation != job->status.generation()) {
    return;
  }
  AddEventLocked(*job, kind, &worker, cause);
  FailGenerationLocked(*job, cause);
}

absl::Status Coordinator::HandleWorkerMessage(
    const std::string& worker_id, const v1::WorkerMessage& message) {
  absl::MutexLock lock(&mu_);
  auto it = workers_.find(worker_id);
  if (it == workers_.end()) {
    return absl::NotFoundError(absl::StrCat("unknown worker ", worker_id));
  }
  Worker& worker = it->second;
  worker.last_heartbeat = clock_->Now();
  switch (message.kind_case()) {
    case v1::WorkerMessage::kHeartbeat: {
      const v1::Heartbeat& beat = message.heartbeat();
      if (beat.job_id() == worker.job_id &&
          beat.generation() == worker.generation) {
        if (beat.collective_seq() != worker.collective_seq) {
          worker.collective_seq = beat.collective_seq();
          worker.seq_changed = clock_->Now();
        }
        worker.seq_reported = clock_->Now();
      }
      break;
    }
    case v1::WorkerMessage::kProgress:
      if (worker.job_id == message.progress().job_id()) {
        HandleProgressLocked(message.progress());
      }
      break;
    case v1::WorkerMessage::kResult:
      HandleResultLocked(worker, message.result());
      break;
    case v1::WorkerMessage::kPrepared:
      HandlePreparedLocked(worker, message.prepared());
      break;
    case v1::WorkerMessage::kCommitted:
      HandleCommittedLocked(worker, message.committed());
      break;
    case v1::WorkerMessage::kPreempt:
      HandlePreemptLocked(worker, message.preempt());
      break;
    default:
      break;
  }
  return absl::OkStatus();
}

void Coordinator::Sweep() {
  absl::MutexLock lock(&mu_);
  absl::Time now = clock_->Now();
  for (auto& [id, worker] : workers_) {
    if (worker.sink == nullptr) continue;
    absl::Duration silent = now - worker.last_heartbeat;
    if (silent > heartbeat_timeout_) {
      WorkerFailedLocked(worker, "worker_failed",
                         absl::StrCat("worker ", DescribeWorkerLocked(worker),
                                      " missed heartbeats for ",
                                      absl::FormatDuration(absl::Trunc(
                                          silent, absl::Milliseconds(100))),
                                      ": it hung or is partitioned"));
    }
  }
  Job* job = RunningJobLocked();
  if (job != nullptr && job->status.state() == v1::JOB_STATE_RUNNING &&
      now >= job->suspect_deadline) {
    std::string cause = job->suspect;
    AddEventLocked(*job, "generation_failed", nullptr, cause);
    FailGenerationLocked(*job, cause);
  }
}

std::vector<v1::WorkerInfo> Coordinator::ListWorkers() {
  absl::MutexLock lock(&mu_);
  std::vector<v1::WorkerInfo> infos;
  for (const auto& [id, worker] : workers_) {
    v1::WorkerInfo& info = infos.emplace_back();
    info.set_worker_id(id);
    info.set_incarnation(worker.incarnation);
    info.set_host(worker.host);
    info.set_connected(worker.sink != nullptr);
    info.set_job_id(worker.job_id);
    info.set_rank(worker.rank);
    info.set_generation(worker.generation);
    info.set_collective_seq(worker.collective_seq);
    info.set_last_heartbeat(
        absl::ToDoubleSeconds(worker.last_heartbeat - absl::UnixEpoch()));
    info.set_state(worker.sink == nullptr  ? "disconnected"
                   : worker.job_id.empty() ? "idle"
                                           : "training");
  }
  return infos;
}

std::string Coordinator::DescribeWorkerLocked(const Worker& worker) const {
  std::string text = absl::StrCat(worker.id, " (host ", worker.host);
  if (worker.rank >= 0) absl::StrAppend(&text, ", rank ", worker.rank);
  return absl::StrCat(text, ")");
}

// ---- jobs -------------------------------------------------------------------

absl::StatusOr<std::string> Coordinator::SubmitJob(v1::JobSpec spec) {
  ApplyDefaults(&spec);
  int replicas = spec.num_workers();
  if (IsStatic()) {
    int cluster_size = static_cast<int>(TrainingTasks(*cluster_).size());
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
  RETURN_IF_ERROR(ValidateJobSpec(spec, spec.min_workers() > 0 ? 0 : replicas));

  absl::MutexLock lock(&mu_);
  if (shutdown_) return absl::UnavailableError("the coordinator is stopping");
  std::string id = JobIdFor(spec.name(), next_job_seq_++);
  Job& job = jobs_[id];
  job.status.set_job_id(id);
  job.status.set_state(v1::JOB_STATE_QUEUED);
  *job.status.mutable_spec() = std::move(spec);
  job.status.set_submit_time(NowSeconds());
  job_order_.push_back(id);
  queue_.push_back(id);
  LogInfo("job ", id, " queued");
  ChangedLocked(job);
  PersistLocked(job);
  MaybeStartJobLocked();
  return id;
}

std::vector<Coordinator::Worker*> Coordinator::PickWorkersLocked(
    const Job& job) {
  std::vector<Worker*> picked;
  if (IsStatic()) {
    for (const v1::TaskId& task : TrainingTasks(*cluster_)) {
      auto it = workers_.find(TaskName(task));
      if (it == workers_.end() || it->second.sink == nullptr ||
          !it->second.job_id.empty() || it->second.leaving) {
        return {};
      }
      picked.push_back(&it->second);
    }
    return picked;
  }
  for (auto& [id, worker] : workers_) {
    if (worker.sink != nullptr && worker.job_id.empty() && !worker.leaving) {
      picked.push_back(&worker);
    }
  }
  // The previous generation's ranks first, in rank order: they hold the
  // job's state. Then the others by registration.
  const auto& previous = job.rank_workers;
  auto key = [&](const Worker* w) {
    auto it = std::find(previous.begin(), previous.end(), w->id);
    return std::pair<int64_t, int64_t>(
        it == previous.end() ? 1 : 0,
        it == previous.end() ? w->order : it - previous.begin());
  };
  std::sort(picked.begin(), picked.end(),
            [&](const Worker* a, const Worker* b) { return key(a) < key(b); });
  const v1::JobSpec& spec = job.status.spec();
  int wanted = spec.num_workers();
  if (spec.min_workers() > 0) {
    if (static_cast<int>(picked.size()) < spec.min_workers()) return {};
    if (spec.max_workers() > 0 &&
        static_cast<int>(picked.size()) > spec.max_workers()) {
      picked.resize(spec.max_workers());
    }
    return picked;
  }
  if (wanted == 0) return picked;
  if (static_cast<int>(picked.size()) < wanted) return {};
  picked.resize(wanted);
  return picked;
}

void Coordinator::MaybeStartJobLocked() {
  if (shutdown_) return;
  if (Job* job = RunningJobLocked()) {
    if (job->status.state() != v1::JOB_STATE_RECOVERING) return;
    std::vector<Worker*> workers = PickWorkersLocked(*job);
    if (!workers.empty()) StartGenerationLocked(*job, workers);
    return;
  }
  while (!queue_.empty()) {
    Job& job = jobs_[queue_.front()];
    if (job.status.state() != v1::JOB_STATE_QUEUED) {
      queue_.pop_front();
      continue;
    }
    std::vector<Worker*> workers = PickWorkersLocked(job);
    if (workers.empty()) return;
    queue_.pop_front();
    running_job_ = job.status.job_id();
    StartGenerationLocked(job, workers);
    if (!running_job_.empty()) return;
  }
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
  status.set_state(v1::JOB_STATE_RUNNING);
  status.set_generation(status.generation() + 1);
  status.set_generations(status.generations() + 1);
  status.set_world_size(static_cast<int>(workers.size()));
  if (status.start_time() == 0) status.set_start_time(NowSeconds());
  status.clear_ranks();
  job.rank_workers.clear();
  job.results_ok = 0;
  job.suspect.clear();
  job.suspect_deadline = absl::InfiniteFuture();
  job.preempting = false;
  job.prepares.clear();
  job.abandoned_steps.clear();
  kv_.clear();
  barriers_.clear();

  std::vector<std::string> names;
  for (size_t rank = 0; rank < workers.size(); ++rank) {
    Worker& worker = *workers[rank];
    worker.job_id = status.job_id();
    worker.rank = static_cast<int>(rank);
    worker.generation = status.generation();
    worker.collective_seq = 0;
    worker.seq_changed = clock_->Now();
    worker.seq_reported = absl::InfinitePast();
    job.rank_workers.push_back(worker.id);
    v1::RankResult* result = status.add_ranks();
    result->set_rank(worker.rank);
    result->set_worker_id(worker.id);
    result->set_host(worker.host);
    names.push_back(absl::StrCat(rank, "=", worker.id));

    v1::CoordinatorCommand command;
    v1::Assignment* assignment = command.mutable_assignment();
    assignment->set_job_id(status.job_id());
    assignment->set_generation(status.generation());
    assignment->set_rank(worker.rank);
    assignment->set_world_size(status.world_size());
    *assignment->mutable_spec() = status.spec();
    worker.sink->Send(command);
  }
  std::string message =
      absl::StrCat("generation ", status.generation(), " on ", workers.size(),
                   " workers (ranks ", absl::StrJoin(names, ", "), ")");
  LogInfo("job ", status.job_id(), ": ", message);
  AddEventLocked(job, "generation_started", nullptr, message);
  ChangedLocked(job);
  PersistLocked(job);
}

void Coordinator::ReleaseGenerationLocked(Job& job, bool abort,
                                          const std::string& reason) {
  const v1::JobStatus& status = job.status;
  for (const std::string& worker_id : job.rank_workers) {
    Worker& worker = workers_[worker_id];
    if (worker.job_id != status.job_id()) continue;
    if (abort && worker.sink != nullptr) {
      v1::CoordinatorCommand command;
      v1::Abort* message = command.mutable_abort();
      message->set_job_id(status.job_id());
      message->set_generation(status.generation());
      message->set_reason(reason);
      worker.sink->Send(command);
    }
    worker.job_id.clear();
    worker.rank = -1;
  }
  kv_.clear();
  barriers_.clear();
  changed_.SignalAll();  // pending KvGet/Barrier calls see the fence
}

void Coordinator::FailGenerationLocked(Job& job, const std::string& cause) {
  v1::JobStatus& status = job.status;
  int restarts_used = status.generations() - 1 - status.preemptions();
  ReleaseGenerationLocked(job, /*abort=*/true, cause);
  if (restarts_used >= MaxRestarts(status.spec())) {
    EndJobLocked(job, v1::JOB_STATE_FAILED,
                 absl::StrCat(cause, "; giving up after ", restarts_used,
                              " restarts (max_restarts ",
                              MaxRestarts(status.spec()), ")"));
    return;
  }
  status.set_state(v1::JOB_STATE_RECOVERING);
  status.set_error(cause);
  job.suspect.clear();
  job.suspect_deadline = absl::InfiniteFuture();
  LogWarning("job ", status.job_id(), " generation ", status.generation(),
             " ended: ", cause, "; waiting for the group to be whole");
  ChangedLocked(job);
  PersistLocked(job);
  MaybeStartJobLocked();
}

void Coordinator::EndJobLocked(Job& job, v1::JobState state,
                               const std::string& reason) {
  v1::JobStatus& status = job.status;
  ReleaseGenerationLocked(job, state != v1::JOB_STATE_SUCCEEDED, reason);
  status.set_state(state);
  if (!reason.empty()) status.set_error(reason);
  status.set_end_time(NowSeconds());
  if (running_job_ == status.job_id()) running_job_.clear();
  AddEventLocked(job,
                 absl::StrCat("job_", absl::AsciiStrToLower(
                                          v1::JobState_Name(state).substr(10))),
                 nullptr, reason);
  LogInfo("job ", status.job_id(), " ", v1::JobState_Name(state),
          reason.empty() ? "" : ": ", reason);
  ChangedLocked(job);
  PersistLocked(job);
  MaybeStartJobLocked();
}

void Coordinator::HandleProgressLocked(const v1::ProgressReport& report) {
  auto it = jobs_.find(report.job_id());
  if (it == jobs_.end()) return;
  Job& job = it->second;
  v1::JobStatus& status = job.status;
  if (status.state() != v1::JOB_STATE_RUNNING ||
      report.generation() != status.generation()) {
    return;
  }
  // A first generation that starts from scratch did not resume anything.
  if (report.has_resumed_at_step() &&
      (report.resumed_at_step() > 0 || status.generation() > 1)) {
    int64_t known = status.step_losses_size();
    int64_t repeated = std::max<int64_t>(0, known - report.resumed_at_step());
    AddEventLocked(
        job, "resumed", nullptr,
        absl::StrCat(
            "generation ", status.generation(), " trains again after step ",
            report.resumed_at_step(),
            report.state_source_rank() >= 0
                ? absl::StrCat(" with rank ", report.state_source_rank(),
                               "'s live state")
            : !report.restored_checkpoint().empty()
                ? absl::StrCat(" from checkpoint ",
                               report.restored_checkpoint())
                : " from the initial state",
            "; ", repeated, " steps repeated"));
  }
  for (const std::string& warning : report.warnings()) {
    AddEventLocked(job, "warning", nullptr, warning);
  }
  status.set_step(report.step());
  status.set_epoch(report.epoch());
  status.set_total_steps(report.total_steps());
  status.set_samples_per_second(report.samples_per_second());
  if (report.first_step() >= 0 && report.step_losses_size() > 0) {
    auto* losses = status.mutable_step_losses();
    losses->Resize(static_cast<int>(report.first_step()), 0.0f);
    for (float loss : report.step_losses()) losses->Add(loss);
    status.set_loss(report.step_losses(report.step_losses_size() - 1));
  }
  if (report.has_test_accuracy())
    status.set_test_accuracy(report.test_accuracy());
  if (report.has_test_loss()) status.set_test_loss(report.test_loss());
  if (report.has_plan()) *status.mutable_plan() = report.plan();
  if (report.has_test_accuracy()) {
    v1::EvalPoint* eval = status.add_evals();
    eval->set_step(report.step());
    eval->set_epoch(report.epoch());
    eval->set_test_accuracy(report.test_accuracy());
    eval->set_test_loss(report.test_loss());
    eval->set_time(NowSeconds());
  }
  ChangedLocked(job);
}

void Coordinator::HandleResultLocked(Worker& worker,
                                     const v1::TaskResult& result) {
  auto it = jobs_.find(result.job_id());
  if (it == jobs_.end() || worker.job_id != result.job_id()) return;
  Job& job = it->second;
  v1::JobStatus& status = job.status;
  if (result.generation() != status.generation() ||
      status.state() != v1::JOB_STATE_RUNNING) {
    return;
  }
  if (!result.ok()) {
    std::string cause =
        absl::StrCat("rank ", worker.rank, " (", worker.id, " on ", worker.host,
                     ") failed: ", result.error());
    if (!IsRetryable(result.code())) {
      AddEventLocked(job, "rank_failed", &worker, cause);
      EndJobLocked(job, v1::JOB_STATE_FAILED, cause);
    } else if (job.suspect.empty()) {
      // Usually a peer died and its session break is about to name it.
      job.suspect = cause;
      job.suspect_deadline = clock_->Now() + error_grace_;
    }
    return;
  }
  v1::RankResult* rank = status.mutable_ranks(worker.rank);
  rank->set_model_digest(result.model_digest());
  rank->set_steps(result.steps());
  if (worker.rank == 0) {
    status.set_step(result.steps());
    status.set_loss(result.final_loss());
    status.set_test_accuracy(result.test_accuracy());
    status.set_samples_per_second(result.samples_per_second());
    *status.mutable_breakdown() = result.breakdown();
  }
  worker.job_id.clear();
  worker.rank = -1;
  ++job.results_ok;
  ChangedLocked(job);
  if (result.preempted()) job.preempting = true;
  if (job.results_ok == status.world_size()) {
    if (job.preempting && !job.stop_requested) {
      // Every rank stopped at the same saved step; the job goes on when its
      // group is whole again (the preempted worker restarted).
      status.set_preemptions(status.preemptions() + 1);
      ReleaseGenerationLocked(job, /*abort=*/false, "preempted");
      status.set_state(v1::JOB_STATE_RECOVERING);
      std::string message = absl::StrCat(
          "generation ", status.generation(), " stopped after step ",
          status.step(), " for a preemption (", job.preempt_reason,
          status.spec().checkpoint().backup_dir().empty()
              ? "); no checkpoints are configured"
              : "); it was saved",
          "; waiting for the group to be whole");
      status.set_error(message);
      AddEventLocked(job, "preempted", nullptr, message);
      LogInfo("job ", status.job_id(), ": ", message);
      ChangedLocked(job);
      PersistLocked(job);
      MaybeStartJobLocked();
      return;
    }
    bool stopped = result.stopped() || job.stop_requested;
    EndJobLocked(job, stopped ? v1::JOB_STATE_STOPPED : v1::JOB_STATE_SUCCEEDED,
                 stopped ? "stopped on request" : "");
  }
}

Coordinator::Job* Coordinator::GenerationOfLocked(const Worker& worker,
                                                  const std::string& job_id,
                                                  int64_t generation) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end() || worker.job_id != job_id) return nullptr;
  Job& job = it->second;
  if (job.status.state() != v1::JOB_STATE_RUNNING ||
      job.status.generation() != generation || worker.rank < 0) {
    return nullptr;
  }
  return &job;
}

void Coordinator::HandlePreparedLocked(Worker& worker,
                                       const v1::CheckpointPrepared& p) {
  Job* job = GenerationOfLocked(worker, p.job_id(), p.generation());
  if (job == nullptr || p.rank() != worker.rank ||
      job->abandoned_steps.count(p.step()) > 0) {
    return;
  }
  Worker* chief = nullptr;
  if (!job->rank_workers.empty()) {
    auto it = workers_.find(job->rank_workers[0]);
    if (it != workers_.end() && it->second.sink != nullptr) {
      chief = &it->second;
    }
  }
  v1::CoordinatorCommand command;
  v1::CommitCheckpoint* commit = command.mutable_commit();
  commit->set_job_id(p.job_id());
  commit->set_generation(p.generation());
  commit->set_step(p.step());
  if (!p.ok()) {
    AddEventLocked(*job, "checkpoint_failed", &worker,
                   absl::StrCat("step ", p.step(), ": ", p.error()));
    job->abandoned_steps.insert(p.step());
    job->prepares.erase(p.step());
    commit->set_abandoned(p.error());
    if (chief != nullptr) chief->sink->Send(command);
    ChangedLocked(*job);
    return;
  }
  auto& ranks = job->prepares[p.step()];
  ranks[p.rank()] = p;
  if (static_cast<int>(ranks.size()) < job->status.world_size()) return;
  for (auto& [rank, prepared] : ranks) *commit->add_ranks() = prepared;
  job->prepares.erase(job->prepares.begin(),
                      job->prepares.upper_bound(p.step()));
  if (chief != nullptr) chief->sink->Send(command);
}

void Coordinator::HandleCommittedLocked(
    Worker& worker, const v1::CheckpointCommitted& committed) {
  Job* job =
      GenerationOfLocked(worker, committed.job_id(), committed.generation());
  if (job == nullptr || worker.rank != 0) return;
  v1::JobStatus& status = job->status;
  if (!committed.ok()) {
    AddEventLocked(*job, "checkpoint_failed", &worker,
                   absl::StrCat("commit of step ", committed.step(), ": ",
                                committed.error()));
    ChangedLocked(*job);
    return;
  }
  v1::CheckpointInfo* info = status.add_checkpoints();
  info->set_name(committed.name());
  info->set_step(committed.step());
  info->set_epoch(committed.epoch());
  info->set_generation(committed.generation());
  info->set_time(NowSeconds());
  info->set_bytes(committed.bytes());
  constexpr int kKeptInStatus = 100;
  if (status.checkpoints_size() > kKeptInStatus) {
    status.mutable_checkpoints()->DeleteSubrange(
        0, status.checkpoints_size() - kKeptInStatus);
  }
  AddEventLocked(
      *job, "checkpoint_committed", &worker,
      absl::StrCat(committed.name(), ": step ", committed.step(), ", epoch ",
                   committed.epoch() + 1, ", ", committed.bytes(), " bytes"));
  ChangedLocked(*job);
  PersistLocked(*job);
}

void Coordinator::HandlePreemptLocked(Worker& worker,
                                      const v1::PreemptRequest& request) {
  worker.leaving = true;
  Job* job = RunningJobLocked();
  if (job == nullptr || job->status.job_id() != request.job_id() ||
      job->status.state() != v1::JOB_STATE_RUNNING || job->preempting ||
      worker.job_id != request.job_id()) {
    return;
  }
  job->preempting = true;
  job->preempt_reason = request.reason();
  AddEventLocked(*job, "preempt_requested", &worker, request.reason());
  for (const std::string& worker_id : job->rank_workers) {
    Worker& rank_worker = workers_[worker_id];
    if (rank_worker.job_id != request.job_id() || rank_worker.sink == nullptr) {
      continue;
    }
    v1::CoordinatorCommand command;
    v1::Stop* stop = command.mutable_stop();
    stop->set_job_id(request.job_id());
    stop->set_reason(request.reason());
    stop->set_preempt(true);
    rank_worker.sink->Send(command);
  }
  ChangedLocked(*job);
}

std::string Coordinator::StallLocked(const Job& job) const {
  if (job.status.state() != v1::JOB_STATE_RUNNING) return "";
  std::vector<const Worker*> ranks;
  int64_t ahead = 0;
  for (const std::string& id : job.rank_workers) {
    auto it = workers_.find(id);
    if (it == workers_.end() || it->second.job_id != job.status.job_id())
      continue;
    ranks.push_back(&it->second);
    ahead = std::max(ahead, it->second.collective_seq);
  }
  absl::Time now = clock_->Now();
  for (const Worker* worker : ranks) {
    absl::Duration behind = now - worker->seq_changed;
    // Stalled only on the rank's own word: a heartbeat that still reports
    // the count it had stall_after_ earlier. Between heartbeats a rank that
    // has moved on just has not said so yet.
    if (worker->collective_seq < ahead &&
        worker->seq_reported - worker->seq_changed >= stall_after_) {
      return absl::StrFormat(
          "rank %d (%s on %s) stalled at all-reduce #%d for %.0f s",
          worker->rank, worker->id, worker->host, worker->collective_seq + 1,
          absl::ToDoubleSeconds(behind));
    }
  }
  return "";
}

absl::StatusOr<std::vector<v1::JobStatus>> Coordinator::GetJobStatus(
    const std::string& job_id, bool include_history) {
  absl::MutexLock lock(&mu_);
  std::vector<v1::JobStatus> result;
  auto add = [&](const Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    v1::JobStatus& status = result.emplace_back(job.status);
    if (!include_history) status.clear_step_losses();
    status.set_stall(StallLocked(job));
  };
  if (!job_id.empty()) {
    auto it = jobs_.find(job_id);
    if (it == jobs_.end()) {
      return absl::NotFoundError(
          absl::StrCat("no job ", job_id, "; `lockstep status` lists jobs"));
    }
    add(it->second);
    return result;
  }
  for (auto it = job_order_.rbegin(); it != job_order_.rend(); ++it) {
    add(jobs_[*it]);
  }
  return result;
}

absl::StatusOr<v1::JobStatus> Coordinator::WaitForJobChange(
    const std::string& job_id, int64_t after_version, absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  while (true) {
    auto it = jobs_.find(job_id);
    if (it == jobs_.end()) {
      return absl::NotFoundError(absl::StrCat("no job ", job_id));
    }
    if (shutdown_) return absl::CancelledError("the coordinator is stopping");
    if (it->second.status.version() > after_version ||
        absl::Now() >= deadline) {
      v1::JobStatus status = it->second.status;
      status.clear_step_losses();
      status.set_stall(StallLocked(it->second));
      return status;
    }
    changed_.WaitWithDeadline(&mu_, deadline);
  }
}

absl::Status Coordinator::StopJob(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("no job ", job_id));
  }
  Job& job = it->second;
  switch (job.status.state()) {
    case v1::JOB_STATE_QUEUED:
      job.status.set_state(v1::JOB_STATE_STOPPED);
      job.status.set_error("stopped on request before it started");
      job.status.set_end_time(NowSeconds());
      ChangedLocked(job);
      PersistLocked(job);
      return absl::OkStatus();
    case v1::JOB_STATE_RECOVERING:
      EndJobLocked(job, v1::JOB_STATE_STOPPED,
                   "stopped on request while recovering");
      return absl::OkStatus();
    case v1::JOB_STATE_RUNNING:
      job.stop_requested = true;
      for (const std::string& worker_id : job.rank_workers) {
        Worker& worker = workers_[worker_id];
        if (worker.job_id != job_id || worker.sink == nullptr) continue;
        v1::CoordinatorCommand command;
        command.mutable_stop()->set_job_id(job_id);
        command.mutable_stop()->set_reason("stopped on request");
        worker.sink->Send(command);
      }
      return absl::OkStatus();
    default:
      return absl::FailedPreconditionError(
          absl::StrCat("job ", job_id, " already ended (",
                       v1::JobState_Name(job.status.state()), ")"));
  }
}

void Coordinator::AddEventLocked(Job& job, const std::string& kind,
                                 const Worker* worker,
                                 const std::string& message) {
  v1::JobEvent* event = job.status.add_events();
  event->set_time(NowSeconds());
  event->set_generation(job.status.generation());
  event->set_kind(kind);
  event->set_message(message);
  event->set_rank(-1);
  if (worker != nullptr) {
    event->set_worker_id(worker->id);
    event->set_host(worker->host);
    event->set_rank(worker->rank);
  }
}

void Coordinator::ChangedLocked(Job& job) {
  job.status.set_version(job.status.version() + 1);
  changed_.SignalAll();
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

// ---- key-value store and barriers ------------------------------------------

absl::Status Coordinator::CheckGenerationLocked(const std::string& job_id,
                                                int64_t generation) const {
  if (shutdown_) return absl::CancelledError("the coordinator is stopping");
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("no job ", job_id));
  }
  const v1::JobStatus& status = it->second.status;
  if (running_job_ != job_id || status.generation() != generation ||
      status.state() != v1::JOB_STATE_RUNNING) {
    return absl::AbortedError(absl::StrCat(
        "job ", job_id, " generation ", generation, " is over (the job is ",
        v1::JobState_Name(status.state()), " in generation ",
        status.generation(), "): ", status.error()));
  }
  return absl::OkStatus();
}

absl::Status Coordinator::KvSet(const v1::KvSetRequest& request) {
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(
      CheckGenerationLocked(request.job_id(), request.generation()));
  kv_[request.key()] = request.value();
  changed_.SignalAll();
  return absl::OkStatus();
}

absl::StatusOr<std::string> Coordinator::KvGet(
    const v1::KvGetRequest& request) {
  absl::Time deadline = absl::Now() + absl::Milliseconds(request.timeout_ms());
  absl::MutexLock lock(&mu_);
  while (true) {
    RETURN_IF_ERROR(
        CheckGenerationLocked(request.job_id(), request.generation()));
    auto it = kv_.find(request.key());
    if (it != kv_.end()) return it->second;
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "key '", request.key(), "' of job ", request.job_id(), " generation ",
          request.generation(), " was not set within ", request.timeout_ms(),
          " ms; a peer did not reach rendezvous"));
    }
    changed_.WaitWithDeadline(&mu_, deadline);
  }
}

absl::Status Coordinator::Barrier(const v1::BarrierRequest& request) {
  absl::Time deadline = absl::Now() + absl::Milliseconds(request.timeout_ms());
  absl::MutexLock lock(&mu_);
  RETURN_IF_ERROR(
      CheckGenerationLocked(request.job_id(), request.generation()));
  barriers_[request.name()].insert(request.rank());
  changed_.SignalAll();
  while (true) {
    RETURN_IF_ERROR(
        CheckGenerationLocked(request.job_id(), request.generation()));
    const Job& job = jobs_[request.job_id()];
    int world = job.status.world_size();
    std::set<int>& arrived = barriers_[request.name()];
    if (static_cast<int>(arrived.size()) >= world) return absl::OkStatus();
    if (absl::Now() >= deadline) {
      std::vector<std::string> missing;
      for (int rank = 0; rank < world; ++rank) {
        if (!arrived.count(rank)) {
          missing.push_back(
              absl::StrCat("rank ", rank, " (", job.rank_workers[rank], ")"));
        }
      }
      return absl::DeadlineExceededError(
          absl::StrCat("barrier '", request.name(), "' timed out after ",
                       request.timeout_ms(),
                       " ms; missing: ", absl::StrJoin(missing, ", ")));
    }
    changed_.WaitWithDeadline(&mu_, deadline);
  }
}

void Coordinator::Shutdown() {
  absl::MutexLock lock(&mu_);
  shutdown_ = true;
  for (auto& [id, worker] : workers_) {
    if (worker.sink != nullptr) worker.sink->Close();
  }
  changed_.SignalAll();
}

}  // namespace lockstep::coordinator
