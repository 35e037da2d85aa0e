// The coordinator's job queue and state machine: submission, starting and
// ending generations and jobs. The clients' other job calls and how jobs are
// kept are in job_api.cc, workers' registration, sessions and failure
// detection in worker_sessions.cc, what they report in worker_reports.cc,
// the key-value store in rendezvous_api.cc.
#include "coordinator/coordinator.h"

#include <algorithm>
#include <iterator>
#include <limits>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/job_spec.h"
#include "common/job_state.h"
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

// Whether `submitted_by` may run a job at `priority` (issue 52: a priority
// is a permission). Anyone may use the default or lower; above it, a class
// granted to the owner (or to "*"), and a raw priority only an admin.
// In-process and --insecure callers ("") are not told apart: allowed.
// Errors: PermissionDenied naming the caller, the class or priority, and
// what to do.
absl::Status AuthorizePriority(
    const v1::JobSpec& spec, int priority, const std::string& submitted_by,
    const std::set<std::string>& admins,
    const std::map<std::string, std::set<std::string>>& grants) {
  if (priority <= 0 || submitted_by.empty()) return absl::OkStatus();
  const std::string owner = OwnerOf(submitted_by);
  if (admins.count(owner) > 0) return absl::OkStatus();
  if (spec.priority_class().empty()) {
    return absl::PermissionDeniedError(absl::StrCat(
        owner, " may not give a job priority ", priority,
        ": a priority above the default (0) is for admins "
        "(lockstep-coordinator --admin); use a priority_class granted to you "
        "(lockstep queue lists them) or ask an admin"));
  }
  auto granted = grants.find(spec.priority_class());
  if (granted != grants.end() &&
      (granted->second.count(owner) > 0 || granted->second.count("*") > 0)) {
    return absl::OkStatus();
  }
  return absl::PermissionDeniedError(absl::StrCat(
      owner, " may not use priority_class \"", spec.priority_class(),
      "\" (priority ", priority, "): it is granted to ",
      granted == grants.end() || granted->second.empty()
          ? std::string("admins only")
          : absl::StrJoin(granted->second, ", "),
      " (lockstep-coordinator --priority-grant ", spec.priority_class(),
      "=OWNER); submit without it or ask an admin"));
}

// Rank `rank`'s assignment in `generation`. It carries the generation's
// secret only for NCCL (whose proofs all ranks check); the CPU data plane
// gets the rank's pair keys instead. Errors: Internal when OpenSSL fails.
absl::StatusOr<v1::CoordinatorCommand> AssignmentFor(
    const v1::JobStatus& status, int rank, const Generation& generation) {
  v1::CoordinatorCommand command;
  v1::Assignment* assignment = command.mutable_assignment();
  assignment->set_job_id(status.job_id());
  assignment->set_submitted_by(status.submitted_by());
  assignment->set_generation(status.generation());
  assignment->set_rank(rank);
  assignment->set_world_size(status.world_size());
  *assignment->mutable_spec() = status.spec();
  assignment->set_backend(status.backend());
  if (status.backend() == "nccl") {
    assignment->set_data_plane_secret(generation.data_plane_secret());
  } else {
    ASSIGN_OR_RETURN(std::vector<std::string> keys,
                     generation.PairKeysOf(rank));
    for (std::string& key : keys) {
      assignment->add_data_plane_pair_keys(std::move(key));
    }
  }
  ASSIGN_OR_RETURN(*assignment->mutable_rank_token(),
                   generation.RankToken(rank));
  return command;
}

}  // namespace

namespace {

// The scheduler's policy with the priority a starved job is promoted to:
// `chosen` (--starvation-priority), or the highest class's (0, the default
// priority, without classes above it).
SchedulerPolicy WithTopPriority(SchedulerPolicy policy,
                                const std::map<std::string, int>& classes,
                                std::optional<int> chosen) {
  policy.top_priority = 0;
  for (const auto& [name, priority] : classes) {
    policy.top_priority = std::max(policy.top_priority, priority);
  }
  if (chosen.has_value()) policy.top_priority = *chosen;
  return policy;
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
      scheduler_(WithTopPriority(std::move(options.scheduling),
                                 options.priority_classes,
                                 options.starvation_priority)),
      priority_classes_(std::move(options.priority_classes)),
      priority_grants_(std::move(options.priority_grants)),
      admins_(std::move(options.admins)),
      workers_(cluster_, options.heartbeat_timeout, options.stall_after),
      rendezvous_(clock_,
                  [this](const std::string& job_id, int64_t number) {
                    mu_.AssertHeld();  // Rendezvous is called under mu_
                    return CurrentGenerationLocked(job_id, number);
                  }),
      commit_seconds_(
          {0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}) {}

absl::StatusOr<std::unique_ptr<Coordinator>> Coordinator::Create(
    Options options) {
  if (options.cluster.has_value()) {
    RETURN_IF_ERROR(ValidateCluster(*options.cluster));
  }
  std::unique_ptr<ArtifactStore> artifacts;
  if (!options.artifact_dir.empty()) {
    ASSIGN_OR_RETURN(artifacts, ArtifactStore::Open(options.artifact_dir,
                                                    options.artifact_limits));
  }
  std::unique_ptr<Coordinator> coordinator(new Coordinator(std::move(options)));
  coordinator->artifacts_ = std::move(artifacts);
  if (coordinator->store_ == nullptr) {
    // No job survives: neither do their artifacts.
    absl::MutexLock lock(&coordinator->mu_);
    coordinator->ForgetOrphanArtifactsLocked();
    return coordinator;
  }
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
      // Its age in the queue is kept across the restart (--age-after).
      const double queued = job.status.queued_time();
      job.queued_at = queued > 0 && queued <= c.NowSeconds()
                          ? absl::UnixEpoch() + absl::Seconds(queued)
                          : c.clock_->Now();
    } else if (state == v1::JOB_STATE_RUNNING && job.yielding()) {
      // Preempted when the coordinator stopped (issue 52): the preemption
      // is finished, as if its ranks had stopped (their sessions broke, so
      // they did), and charges no restart. Its final save could not be
      // committed without the coordinator unless it already was.
      c.active_jobs_[job.seq] = job.status.job_id();
      const std::string resumes = ResumePoint(job.status);
      c.YieldedLocked(
          job,
          absl::StrCat("the coordinator restarted while generation ",
                       job.status.generation(), " stopped for job ",
                       job.yield_for(), resumes.empty() ? "" : "; ", resumes),
          /*abort=*/false);
    } else if (state == v1::JOB_STATE_RUNNING ||
               state == v1::JOB_STATE_RECOVERING) {
      // Every job that ran comes back: its workers still hold the live
      // state; they reconnect and it re-forms as the next generation, which
      // charges no restart (a recovering one's next generation is charged
      // for the failure it recovers from).
      c.active_jobs_[job.seq] = job.status.job_id();
      if (state == v1::JOB_STATE_RUNNING) {
        job.status.set_coordinator_restarts(job.status.coordinator_restarts() +
                                            1);
      }
      c.TransitionLocked(job, v1::JOB_STATE_RECOVERING, "coordinator_restarted",
                         nullptr,
                         "the coordinator restarted; waiting for the "
                         "workers to reconnect");
    }
  }
  c.next_job_seq_ = c.job_order_.empty() ? 1 : c.job_order_.rbegin()->first + 1;
  c.ForgetFinishedJobsLocked();
  c.ForgetOrphanArtifactsLocked();
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
  RETURN_IF_ERROR(AuthorizePriority(spec, priority, submitted_by, admins_,
                                    priority_grants_));
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
  queue_.push_back(id);
  job.Queued(clock_->Now());
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

void Coordinator::StartGenerationLocked(Job& job,
                                        const std::vector<Worker*>& workers) {
  v1::JobStatus& status = job.status;
  auto plan = ResolveBatch(status.spec(), static_cast<int>(workers.size()));
  if (!plan.ok()) {
    EndJobLocked(job, v1::JOB_STATE_FAILED,
                 std::string(plan.status().message()));
    return;
  }
  auto backend = ResolveBackend(status.spec().communication(), workers);
  if (!backend.ok()) {
    EndJobLocked(job, v1::JOB_STATE_FAILED,
                 std::string(backend.status().message()));
    return;
  }
  if (absl::Status kernels = CheckKernels(status.spec(), workers);
      !kernels.ok()) {
    EndJobLocked(job, v1::JOB_STATE_FAILED, std::string(kernels.message()));
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
  if (status.state() == v1::JOB_STATE_QUEUED) job.Placed(clock_->Now());
  status.clear_queue();
  job.started = clock_->Now();
  job.EndYield();
  job.KeepRanks(0);
  status.set_queued_time(0);
  if (status.start_time() == 0) status.set_start_time(NowSeconds());
  status.clear_ranks();
  std::vector<std::string> rank_workers, names;
  for (const Worker* worker : workers) rank_workers.push_back(worker->id);
  NoteReplacementsLocked(job, rank_workers);
  // The previous generation, ended already, is dropped whole here.
  job.generation = std::make_unique<Generation>(
      status.job_id(), status.generation(), std::move(rank_workers), kv_limits_,
      *std::move(secret));
  std::vector<v1::CoordinatorCommand> assignments;
  for (size_t rank = 0; rank < workers.size(); ++rank) {
    absl::StatusOr<v1::CoordinatorCommand> assignment =
        AssignmentFor(status, static_cast<int>(rank), *job.generation);
    // The chief hands the export (and the checkpoint, when the job asks)
    // over when the coordinator keeps artifacts.
    if (assignment.ok() && rank == 0 && artifacts_ != nullptr) {
      const v1::JobSpec& spec = status.spec();
      assignment->mutable_assignment()->set_upload_export(
          !spec.export_path().empty());
      assignment->mutable_assignment()->set_upload_checkpoint(
          spec.checkpoint().upload_last() &&
          !spec.checkpoint().backup_dir().empty());
    }
    if (!assignment.ok()) {
      job.generation->End();
      EndJobLocked(job, v1::JOB_STATE_FAILED,
                   std::string(assignment.status().message()));
      return;
    }
    assignments.push_back(*std::move(assignment));
  }
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
    worker.sink->Send(assignments[rank]);
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
  rendezvous_.FenceMoved(job.status.job_id());
}

void Coordinator::FailGenerationLocked(Job& job, const std::string& kind,
                                       const Worker* worker,
                                       const std::string& cause) {
  v1::JobStatus& status = job.status;
  const int restarts_used = RestartsUsed(status);
  // The cause is recorded while `worker` still holds its rank.
  if (job.stop_requested) {
    // The stop went to the generation that failed: the job stops here, as a
    // stop while recovering does, instead of training on in the next one.
    job.EndYield();
    AddEventLocked(job, kind, worker, cause);
    EndJobLocked(
        job, v1::JOB_STATE_STOPPED,
        absl::StrCat(
            job.stop_cause.empty() ? "stopped on request" : job.stop_cause,
            "; generation ", status.generation(),
            " failed before its ranks stopped (", cause, ")"));
    return;
  }
  if (job.yielding()) {
    // A failure cut a preemption short, but the preemption stands (issue
    // 52): the job it was for gets the workers now, instead of waiting for
    // this job to recover and run min_run_time again, or preempting another
    // job. This one resumes from what it saved; no restart is charged.
    AddEventLocked(job, kind, worker, cause);
    const std::string resumes = ResumePoint(status);
    YieldedLocked(
        job,
        absl::StrCat("generation ", status.generation(),
                     " failed while it stopped for job ", job.yield_for(), " (",
                     cause, ")", resumes.empty() ? "" : "; ", resumes),
        /*abort=*/true);
    MaybeStartJobLocked();
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

void Coordinator::EndJobLocked(Job& job, v1::JobState state,
                               const std::string& reason) {
  v1::JobStatus& status = job.status;
  ReleaseGenerationLocked(job, state != v1::JOB_STATE_SUCCEEDED, reason);
  active_jobs_.erase(job.seq);
  job.EndYield();
  job.status.clear_queue();
  job.status.set_queued_time(0);
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
  rendezvous_.AnswerDue();  // each is Cancelled by the fence
  EndWatchesLocked(std::nullopt,
                   absl::CancelledError("the coordinator is stopping"));
}

}  // namespace lockstep::coordinator
