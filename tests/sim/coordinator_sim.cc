// The simulation of the real Coordinator (coordinator_sim.h). The
// simulated workers do what lockstep-worker does with each command, in
// messages: an assignment starts a replica at the newest committed
// checkpoint of the job (the files it would find in backup_dir); a stop
// agrees on the chief's step, saves it with the two-phase commit and
// reports; training advances the chief's step and commits a checkpoint
// every kCheckpointEvery steps. Results wait in a pool of pending messages
// that are delivered one at a time in random order.
#include "tests/sim/coordinator_sim.h"

#include <algorithm>
#include <cstdlib>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/caller.h"
#include "common/clock.h"
#include "common/job_state.h"
#include "common/log.h"
#include "coordinator/coordinator.h"
#include "coordinator/job_store.h"
#include "tests/unit/fake_sink.h"

namespace lockstep::coordinator::sim {
namespace {

constexpr int64_t kCheckpointEvery = 10;
constexpr int kMaxActiveJobs = 8;
constexpr int kHeartbeatTimeoutSeconds = 10;

// Owners and their quotas; "carol" has none.
const char* const kOwners[] = {"alice", "bob", "carol"};
const std::map<std::string, int>& Quotas() {
  static const auto* quotas = new std::map<std::string, int>{
      {"operator:alice", 4}, {"operator:bob", 3}};
  return *quotas;
}

std::string IdentityOf(const std::string& owner) {
  return absl::StrCat("spiffe://lockstep/operator/", owner);
}

struct SimWorker {
  std::string id;
  uint64_t incarnation = 0;
  std::unique_ptr<FakeSink> sink;
  bool up = false;
  size_t read = 0;  // commands of `sink` handled
  // The rank it holds, if any.
  std::string job;
  int64_t generation = 0;
  int rank = -1;
  // The replica it holds in memory (its live state): of which job, at
  // which step. A new generation's ranks adopt the most advanced one.
  std::string live_job;
  int64_t live_step = 0;
};

struct SimJob {
  std::string id;
  std::string owner;  // "alice"
  v1::JobSpec spec;
  int64_t max_steps = 0;
  bool saving = false;
  // The current generation as the workers run it.
  int64_t generation = 0;
  int world = 0;
  int assigned = 0;
  int64_t step = 0;
  bool stopping = false;
  // The scheduler asked it to yield: its ranks vote at their next step, and
  // a Resume before that calls the stop off.
  bool stop_pending = false;
  bool done = false;  // its ranks reported
  // What a worker finds in backup_dir: committed checkpoints.
  std::set<int64_t> committed;
  // The step its ranks last stopped at for a preemption, and, once the
  // coordinator says it yielded, the step it must resume from.
  int64_t stopped_at = 0;
  std::vector<std::string> stopped_workers;
  std::optional<int64_t> yielded_at;
  // The preemption under way: for whom, and the disturbance count then.
  std::string preempted_for;
  int64_t preempted_disturbances = 0;
  int64_t preempted_event = 0;
  // The event at which its current generation formed, and the step it
  // resumed from.
  int64_t formed_event = 0;
  int64_t formed_step = 0;
  int seen_preempted = 0;  // "preempted" events seen so far
  int seen_requested = 0;  // "preemption_requested" events seen
  // Results at the plan's end delivered for generation `ended_generation`:
  // when every rank's is, the job is done.
  int64_t ended_generation = 0;
  int ended_ranks = 0;
  bool promoted = false;  // the starvation bound raised its priority
};

struct Pending {
  size_t worker;
  uint64_t incarnation;
  v1::WorkerMessage message;
};

class Simulation {
 public:
  explicit Simulation(const SimOptions& options)
      : options_(options),
        rng_(options.seed),
        side_rng_(options.seed ^ 0x9e3779b97f4a7c15ULL),
        limit_rng_(options.seed ^ 0x2545f4914f6cdd1dULL) {}

  SimResult Run() {
    if (!MakeCoordinator()) return std::move(result_);
    for (int i = 0; i < options_.workers; ++i) {
      workers_.emplace_back();
      Register(workers_.size() - 1, /*fresh=*/true);
    }
    Drain();
    for (event_ = 1; event_ <= options_.events; ++event_) {
      Step();
      Drain();
      Check();
      ++result_.events;
      if (options_.stop_at_first && !result_.violations.empty()) break;
    }
    if (coordinator_ != nullptr) coordinator_->Shutdown();
    return std::move(result_);
  }

 private:
  // ---- the world ----
  bool MakeCoordinator() {
    Coordinator::Options options;
    options.clock = &clock_;
    options.heartbeat_timeout = absl::Seconds(kHeartbeatTimeoutSeconds);
    options.error_grace = absl::Seconds(1);
    options.scheduling.quotas = Quotas();
    options.scheduling.min_run_time = absl::Seconds(20);
    // Every other seed has a starvation bound, short enough to be reached
    // (jobs run for minutes here): promoted jobs cross everything else.
    if (options_.seed % 2 == 1) {
      options.scheduling.starvation_bound =
          absl::Seconds(60 + static_cast<int64_t>(options_.seed % 541));
    }
    options.admins.insert("operator:admin");
    options.priority_classes = {{"high", 5}, {"urgent", 10}};
    options.priority_grants["high"] = {"*"};
    options.priority_grants["urgent"] = {"operator:alice", "operator:bob",
                                         "operator:carol"};
    if (!options_.state_dir.empty()) {
      auto store = JobStore::Open(options_.state_dir);
      if (!store.ok()) {
        Violation(absl::StrCat("the store did not open: ",
                               store.status().ToString()));
        return false;
      }
      options.store = *std::move(store);
    }
    auto created = Coordinator::Create(std::move(options));
    if (!created.ok()) {
      Violation(absl::StrCat("the coordinator did not start: ",
                             created.status().ToString()));
      return false;
    }
    coordinator_ = *std::move(created);
    return true;
  }

  void Register(size_t w, bool fresh) {
    SimWorker& worker = workers_[w];
    if (fresh) worker.incarnation = next_incarnation_++;
    worker.sink = std::make_unique<FakeSink>();
    worker.read = 0;
    worker.job.clear();
    worker.rank = -1;
    v1::RegisterWorkerRequest request;
    request.set_incarnation(worker.incarnation);
    request.set_host(absl::StrCat("host", w));
    Caller caller;
    caller.role = Role::kInsecure;
    caller.id = "--insecure";
    auto registered = coordinator_->RegisterWorker(caller, request);
    if (!registered.ok()) {
      Violation(absl::StrCat("worker ", w, " could not register: ",
                             registered.status().ToString()));
      return;
    }
    worker.id = registered->worker_id();
    absl::Status opened = coordinator_->OpenSession(
        caller, worker.id, worker.incarnation, worker.sink.get());
    if (!opened.ok()) {
      Violation(
          absl::StrCat("worker ", worker.id,
                       " could not open its session: ", opened.ToString()));
      return;
    }
    worker.up = true;
  }

  void Send(size_t w, const v1::WorkerMessage& message) {
    SimWorker& worker = workers_[w];
    if (!worker.up) return;
    // A refused report is the coordinator's business (it logs it); the
    // invariants say whether it mattered.
    coordinator_->HandleWorkerMessage(worker.id, message).IgnoreError();
  }

  void Enqueue(size_t w, v1::WorkerMessage message) {
    pending_.push_back({w, workers_[w].incarnation, std::move(message)});
  }

  // ---- what the workers do with their commands ----
  void Drain() {
    for (bool more = true; more;) {
      more = false;
      for (size_t w = 0; w < workers_.size(); ++w) {
        SimWorker& worker = workers_[w];
        if (!worker.up || worker.sink == nullptr) continue;
        while (worker.read < worker.sink->commands.size()) {
          const v1::CoordinatorCommand command =
              worker.sink->commands[worker.read++];
          Handle(w, command);
          more = true;
        }
      }
    }
  }

  void Handle(size_t w, const v1::CoordinatorCommand& command) {
    SimWorker& worker = workers_[w];
    switch (command.kind_case()) {
      case v1::CoordinatorCommand::kAssignment:
        Assigned(w, command.assignment());
        break;
      case v1::CoordinatorCommand::kAbort:
        if (command.abort().job_id() == worker.job) worker.job.clear();
        break;
      case v1::CoordinatorCommand::kStop:
        Stopped(w, command.stop());
        break;
      case v1::CoordinatorCommand::kResume: {
        SimJob* job = Find(command.resume().job_id());
        if (job != nullptr && job->stop_pending &&
            job->generation == command.resume().generation()) {
          job->stop_pending = false;
          Trace(absl::StrCat("(coordinator) calls off the preemption of ",
                             job->id, " before its ranks voted"));
        }
        break;
      }
      case v1::CoordinatorCommand::kCommit: {
        const v1::CommitCheckpoint& commit = command.commit();
        SimJob* job = Find(commit.job_id());
        if (job == nullptr || worker.job != commit.job_id() ||
            worker.generation != commit.generation() || worker.rank != 0) {
          break;
        }
        job->committed.insert(commit.step());
        v1::WorkerMessage message;
        v1::CheckpointCommitted* committed = message.mutable_committed();
        committed->set_job_id(commit.job_id());
        committed->set_generation(commit.generation());
        committed->set_step(commit.step());
        committed->set_ok(true);
        committed->set_name(absl::StrFormat("ckpt-%09d", commit.step()));
        committed->set_epoch(1);
        committed->set_bytes(4096);
        Send(w, message);
        break;
      }
      default:
        break;
    }
  }

  void Assigned(size_t w, const v1::Assignment& assignment) {
    SimWorker& worker = workers_[w];
    worker.job = assignment.job_id();
    worker.generation = assignment.generation();
    worker.rank = assignment.rank();
    SimJob* job = Find(assignment.job_id());
    if (job == nullptr) return;
    if (job->generation != assignment.generation()) {
      job->generation = assignment.generation();
      job->world = assignment.world_size();
      job->assigned = 0;
      job->stopping = false;
      job->stop_pending = false;
      job->done = false;
    }
    if (++job->assigned == job->world) Form(*job);
  }

  // Every rank of the generation has its assignment: they agree on the
  // most advanced state among the newest committed checkpoint and their
  // live replicas, as lockstep-worker's state agreement does.
  void Form(SimJob& job) {
    job.formed_event = event_;
    job.step = job.committed.empty() ? 0 : *job.committed.rbegin();
    const std::vector<size_t> ranks = RanksOf(job);
    for (size_t w : ranks) {
      if (workers_[w].live_job == job.id) {
        job.step = std::max(job.step, workers_[w].live_step);
      }
    }
    for (size_t w : ranks) {
      workers_[w].live_job = job.id;
      workers_[w].live_step = job.step;
    }
    job.formed_step = job.step;
    if (job.yielded_at.has_value()) {
      if (disturbances_ == job.preempted_disturbances) CheckResume(job);
      job.yielded_at.reset();
    }
  }

  // 3. The generation formed after a clean yield resumes where it stopped.
  void CheckResume(const SimJob& job) {
    if (job.formed_step != job.stopped_at) {
      Violation(absl::StrCat("invariant 3: job ", job.id, " yielded at step ",
                             job.stopped_at, " but generation ", job.generation,
                             " resumes from step ", job.formed_step));
    }
  }

  // The ranks of `job`'s generation, by worker index.
  std::vector<size_t> RanksOf(const SimJob& job) const {
    std::vector<size_t> ranks;
    for (size_t w = 0; w < workers_.size(); ++w) {
      const SimWorker& worker = workers_[w];
      if (worker.up && worker.job == job.id &&
          worker.generation == job.generation) {
        ranks.push_back(w);
      }
    }
    return ranks;
  }

  // The two-phase commit of `step`: every rank prepares, the chief commits
  // when told (Handle, kCommit).
  void Checkpoint(SimJob& job, int64_t step) {
    for (size_t w : RanksOf(job)) {
      v1::WorkerMessage message;
      v1::CheckpointPrepared* prepared = message.mutable_prepared();
      prepared->set_job_id(job.id);
      prepared->set_generation(job.generation);
      prepared->set_rank(workers_[w].rank);
      prepared->set_step(step);
      prepared->set_ok(true);
      prepared->set_dir(absl::StrFormat(".tmp/worker-%05d/ckpt-%09d",
                                        workers_[w].rank, step));
      v1::CheckpointFile* file = prepared->add_files();
      file->set_name(absl::StrFormat("rank-%05d.state", workers_[w].rank));
      file->set_size(100);
      file->set_sha256(std::string(64, 'a'));
      Send(w, message);
    }
    Drain();
  }

  // Each rank's result, pending.
  void Report(SimJob& job, bool stopped, bool preempted) {
    job.done = true;
    for (size_t w : RanksOf(job)) {
      SimWorker& worker = workers_[w];
      v1::WorkerMessage message;
      v1::TaskResult* result = message.mutable_result();
      result->set_job_id(job.id);
      result->set_generation(job.generation);
      result->set_rank(worker.rank);
      result->set_ok(true);
      result->set_steps(job.step);
      result->set_total_steps(job.max_steps);
      result->set_model_digest(absl::StrCat("digest-", job.step));
      result->set_stopped(stopped);
      result->set_preempted(preempted);
      Enqueue(w, std::move(message));
    }
  }

  void Stopped(size_t w, const v1::Stop& stop) {
    SimJob* job = Find(stop.job_id());
    const SimWorker& worker = workers_[w];
    if (job == nullptr || worker.job != stop.job_id() ||
        worker.generation != job->generation || job->done || job->stopping) {
      return;
    }
    if (stop.preempt()) {
      // The ranks vote at their next step (Train).
      job->stop_pending = true;
      return;
    }
    StopNow(*job, /*preempt=*/false);
  }

  // The ranks agree on the chief's step and save it.
  void StopNow(SimJob& job, bool preempt) {
    job.stop_pending = false;
    job.stopping = true;
    job.stopped_at = job.step;
    job.stopped_workers.clear();
    for (size_t r : RanksOf(job)) job.stopped_workers.push_back(workers_[r].id);
    if (job.saving && job.step > 0) Checkpoint(job, job.step);
    Report(job, /*stopped=*/true, preempt);
  }

  // ---- events ----
  void Step() {
    clock_.Advance(absl::Milliseconds(100));
    const int roll = static_cast<int>(Uniform(0, 99));
    if (roll < 14) {
      Submit();
    } else if (roll < 40) {
      Train();
    } else if (roll < 64) {
      Deliver();
    } else if (roll < 70) {
      Kill();
    } else if (roll < 76) {
      Revive();
    } else if (roll < 88) {
      Tick();
    } else if (roll < 93) {
      StopSome();
    } else if (roll < 96) {
      DeleteSome();
    } else if (roll < 98 && !options_.state_dir.empty()) {
      Restart();
    } else {
      Tick();
    }
  }

  void Submit() {
    if (ActiveSimJobs() >= kMaxActiveJobs) return Tick();
    SimJob job;
    job.owner = kOwners[Uniform(0, 2)];
    job.spec.set_name("sim");
    job.spec.set_global_batch_size(48);  // divides by 1 to 4
    const bool elastic = Uniform(0, 4) == 0;
    int size;
    if (elastic) {
      const int least = static_cast<int>(Uniform(1, 2));
      job.spec.set_min_workers(least);
      job.spec.set_max_workers(static_cast<int>(Uniform(least + 1, 4)));
      size = least;
    } else {
      size = static_cast<int>(Uniform(1, 4));
      job.spec.set_num_workers(size);
    }
    // Above the default only through a class granted to the owner (the
    // raw number would be refused: invariant 2).
    static constexpr int kPriorities[] = {0, 0, 5, 10};
    const int priority = kPriorities[Uniform(0, 3)];
    if (priority > 0) job.spec.set_priority_class(ClassOf(priority));
    job.saving = Uniform(0, 4) != 0;
    if (job.saving) {
      job.spec.mutable_checkpoint()->set_backup_dir("/sim/backup");
    }
    job.max_steps = Uniform(20, 80);
    job.spec.set_max_steps(job.max_steps);
    // A third of the jobs have a time limit, some too short for their
    // steps: they stop at it, saved, as on request.
    if (std::uniform_int_distribution<int>(0, 2)(limit_rng_) == 0) {
      job.spec.set_time_limit_seconds(
          std::uniform_int_distribution<int>(5, 120)(limit_rng_));
    }
    TryForbiddenPriority(job.spec);
    auto id = coordinator_->SubmitJob(job.spec, IdentityOf(job.owner));
    if (!id.ok()) {
      Violation(
          absl::StrCat("a valid job was refused: ", id.status().ToString()));
      return;
    }
    job.id = *id;
    Trace(absl::StrCat(
        "submit ", job.id, " owner ", job.owner, " priority ", priority, " ",
        elastic ? absl::StrCat("elastic ", size, "..", job.spec.max_workers())
                : absl::StrCat(size, " workers"),
        job.saving ? " saving" : "", " max_steps ", job.max_steps,
        job.spec.time_limit_seconds() > 0
            ? absl::StrCat(" time limit ", job.spec.time_limit_seconds(), "s")
            : ""));
    ++result_.jobs_submitted;
    index_[job.id] = jobs_.size();
    order_.push_back(job.id);
    jobs_.push_back(std::move(job));
  }

  static const char* ClassOf(int priority) {
    return priority >= 10 ? "urgent" : "high";
  }

  // Now and then, from a random stream of its own (the scenario stays the
  // seed's): the same job asked for by someone not allowed its priority,
  // which must be refused (invariant 2).
  void TryForbiddenPriority(const v1::JobSpec& spec) {
    if (std::uniform_int_distribution<int>(0, 7)(side_rng_) != 0) return;
    v1::JobSpec forbidden = spec;
    std::string who = "dave";  // granted no class
    if (forbidden.priority_class() != "urgent") {
      forbidden.clear_priority_class();
      forbidden.set_priority(10);  // a raw priority: admins only
      who = kOwners[std::uniform_int_distribution<int>(0, 2)(side_rng_)];
    }
    auto id = coordinator_->SubmitJob(forbidden, IdentityOf(who));
    if (id.status().code() != absl::StatusCode::kPermissionDenied) {
      Violation(absl::StrCat("invariant 2: operator:", who, " asked for ",
                             forbidden.priority_class().empty()
                                 ? "priority 10"
                                 : "priority_class urgent",
                             " and got ", id.status().ToString()));
    }
  }

  // The chief of a formed generation trains a few steps.
  void Train() {
    std::vector<SimJob*> formed;
    for (SimJob& job : jobs_) {
      if (job.generation > 0 && !job.done && !job.stopping &&
          job.assigned == job.world &&
          static_cast<int>(RanksOf(job).size()) == job.world) {
        formed.push_back(&job);
      }
    }
    if (formed.empty()) return Deliver();
    SimJob& job = *formed[Uniform(0, formed.size() - 1)];
    if (job.stop_pending) {
      Trace(absl::StrCat("ranks of ", job.id, " agree to stop at step ",
                         job.step));
      return StopNow(job, /*preempt=*/true);
    }
    const int64_t from = job.step;
    job.step = std::min(job.max_steps, job.step + Uniform(1, 15));
    Trace(absl::StrCat("train ", job.id, " generation ", job.generation,
                       " steps ", from, " -> ", job.step));
    for (size_t w : RanksOf(job)) workers_[w].live_step = job.step;
    for (size_t w : RanksOf(job)) {
      if (workers_[w].rank != 0) continue;
      v1::WorkerMessage message;
      v1::ProgressReport* progress = message.mutable_progress();
      progress->set_job_id(job.id);
      progress->set_generation(job.generation);
      progress->set_step(job.step);
      progress->set_total_steps(job.max_steps);
      Send(w, message);
    }
    if (job.saving && job.step / kCheckpointEvery > from / kCheckpointEvery) {
      Checkpoint(job, job.step);
    }
    if (job.step == job.max_steps) {
      Report(job, /*stopped=*/false, /*preempted=*/false);
    }
  }

  void Deliver() {
    if (pending_.empty()) return Tick();
    const size_t k = Uniform(0, pending_.size() - 1);
    Pending pending = std::move(pending_[k]);
    pending_.erase(pending_.begin() + k);
    const SimWorker& worker = workers_[pending.worker];
    if (!worker.up || worker.incarnation != pending.incarnation) return;
    const v1::TaskResult& result = pending.message.result();
    Trace(absl::StrCat("deliver ", worker.id, " rank ", result.rank(), " of ",
                       result.job_id(), " generation ", result.generation(),
                       " at step ", result.steps(),
                       result.preempted() ? " preempted"
                       : result.stopped() ? " stopped"
                                          : " done"));
    if (SimJob* job = Find(result.job_id());
        job != nullptr && result.steps() == job->max_steps) {
      if (job->ended_generation != result.generation()) {
        job->ended_generation = result.generation();
        job->ended_ranks = 0;
      }
      ++job->ended_ranks;
    }
    Send(pending.worker, pending.message);
  }

  void Kill() {
    std::vector<size_t> up;
    for (size_t w = 0; w < workers_.size(); ++w) {
      if (workers_[w].up) up.push_back(w);
    }
    if (up.size() <= 1) return Revive();
    const size_t w = up[Uniform(0, up.size() - 1)];
    SimWorker& worker = workers_[w];
    Trace(absl::StrCat("kill ", worker.id, worker.job.empty() ? "" : " of ",
                       worker.job));
    worker.up = false;
    worker.live_job.clear();
    ++disturbances_;
    coordinator_->CloseSession(worker.id, worker.incarnation, worker.sink.get(),
                               absl::UnavailableError("killed (SIGKILL)"));
    worker.job.clear();
  }

  void Revive() {
    std::vector<size_t> down;
    for (size_t w = 0; w < workers_.size(); ++w) {
      if (!workers_[w].up) down.push_back(w);
    }
    if (down.empty()) return Tick();
    const size_t w = down[Uniform(0, down.size() - 1)];
    Register(w, /*fresh=*/true);
    Trace(absl::StrCat("start worker ", workers_[w].id));
  }

  // Time passes; every live worker beats.
  void Tick() {
    const int64_t seconds = Uniform(1, 8);
    Trace(absl::StrCat("time +", seconds, "s"));
    for (int64_t s = 0; s < seconds; ++s) {
      clock_.Advance(absl::Seconds(1));
      for (size_t w = 0; w < workers_.size(); ++w) {
        const SimWorker& worker = workers_[w];
        if (!worker.up) continue;
        v1::WorkerMessage message;
        if (!worker.job.empty()) {
          message.mutable_heartbeat()->set_job_id(worker.job);
          message.mutable_heartbeat()->set_generation(worker.generation);
        }
        message.mutable_heartbeat();
        Send(w, message);
      }
      coordinator_->Sweep();
      Drain();
    }
  }

  void StopSome() {
    std::vector<std::string> live;
    for (const std::string& id : order_) {
      if (auto status = StatusOf(id); status && !IsTerminal(status->state())) {
        live.push_back(id);
      }
    }
    if (live.empty()) return Tick();
    const std::string& id = live[Uniform(0, live.size() - 1)];
    Trace(absl::StrCat("stop ", id));
    absl::Status stopped =
        coordinator_->StopJob(id, IdentityOf(Find(id)->owner));
    if (!stopped.ok() &&
        stopped.code() != absl::StatusCode::kFailedPrecondition) {
      Violation(absl::StrCat("its owner could not stop ", id, ": ",
                             stopped.ToString()));
    }
  }

  void DeleteSome() {
    std::vector<std::string> ended;
    for (const std::string& id : order_) {
      if (auto status = StatusOf(id); status && IsTerminal(status->state())) {
        ended.push_back(id);
      }
    }
    if (ended.empty()) return Tick();
    const std::string id = ended[Uniform(0, ended.size() - 1)];
    Trace(absl::StrCat("delete ", id));
    absl::Status deleted =
        coordinator_->DeleteJob(id, IdentityOf(Find(id)->owner));
    if (!deleted.ok()) {
      Violation(absl::StrCat("its owner could not delete ", id, ": ",
                             deleted.ToString()));
    }
    order_.erase(std::find(order_.begin(), order_.end(), id));
  }

  // The coordinator is killed and starts again on its store; every live
  // worker registers again (the same process: the same incarnation). The
  // generations in flight are over: their messages are lost.
  void Restart() {
    Trace("restart the coordinator");
    ++result_.restarts;
    ++disturbances_;
    std::map<std::string, v1::JobStatus> before;
    for (const std::string& id : order_) {
      if (auto status = StatusOf(id)) before[id] = *status;
    }
    coordinator_->Shutdown();
    coordinator_.reset();
    pending_.clear();
    for (SimJob& job : jobs_) job.assigned = 0;
    if (!MakeCoordinator()) return;
    for (const auto& [id, was] : before) {
      std::optional<v1::JobStatus> now = StatusOf(id);
      if (!now.has_value()) {
        Violation(absl::StrCat("invariant 5: job ", id,
                               " is gone after the restart"));
        continue;
      }
      const bool ended = IsTerminal(was.state());
      if ((ended && now->state() != was.state()) ||
          (!ended && IsTerminal(now->state())) ||
          now->checkpoints_size() < was.checkpoints_size()) {
        Violation(absl::StrCat(
            "invariant 5: job ", id, " was ", StateName(was.state()), " with ",
            was.checkpoints_size(), " checkpoints, and after the restart is ",
            StateName(now->state()), " with ", now->checkpoints_size()));
      }
    }
    for (size_t w = 0; w < workers_.size(); ++w) {
      if (workers_[w].up) Register(w, /*fresh=*/false);
    }
  }

  // ---- invariants ----
  void Check() {
    std::map<std::string, v1::JobStatus> statuses;
    for (const std::string& id : order_) {
      if (auto status = StatusOf(id)) statuses[id] = *std::move(status);
    }
    // 1. No worker in two running jobs, no rank on two workers.
    std::map<std::string, std::string> holder;
    std::map<std::string, int> holds;
    std::map<std::string, std::string> held_by;
    for (const auto& [id, status] : statuses) {
      const bool active = status.state() == v1::JOB_STATE_RUNNING ||
                          status.state() == v1::JOB_STATE_RECOVERING;
      if (active) {
        holds[status.owner()] += status.world_size();
        absl::StrAppend(&held_by[status.owner()], " ", id, " (",
                        StateName(status.state()), ", ", status.world_size(),
                        ")");
      }
      if (status.state() != v1::JOB_STATE_RUNNING) continue;
      std::set<int> ranks;
      for (const v1::RankResult& rank : status.ranks()) {
        if (!ranks.insert(rank.rank()).second) {
          Violation(absl::StrCat("invariant 1: rank ", rank.rank(), " of ", id,
                                 " is held twice"));
        }
        // A rank that reported its result is done with its worker.
        if (!rank.model_digest().empty()) continue;
        auto [it, fresh] = holder.emplace(rank.worker_id(), id);
        if (!fresh) {
          Violation(absl::StrCat("invariant 1: worker ", rank.worker_id(),
                                 " serves ", it->second, " and ", id));
        }
      }
    }
    // 2. Quotas.
    for (const auto& [owner, quota] : Quotas()) {
      if (holds[owner] > quota) {
        Violation(absl::StrCat("invariant 2: owner ", owner, " holds ",
                               holds[owner], " workers, quota ", quota, ":",
                               held_by[owner]));
      }
    }
    for (SimJob& job : jobs_) {
      auto it = statuses.find(job.id);
      if (it == statuses.end()) continue;
      const v1::JobStatus& status = it->second;
      // 3. A job whose every rank reported the plan's end is not queued
      // again.
      if (status.state() == v1::JOB_STATE_QUEUED && job.ended_generation > 0 &&
          job.ended_generation == status.generation() &&
          job.ended_ranks == status.world_size()) {
        Violation(absl::StrCat("invariant 3: every rank of job ", job.id,
                               " reported its last step ", job.max_steps,
                               " and it is queued to train again"));
      }
      CheckPreemption(job, status, statuses);
      // 2. Only the starvation bound raises a priority, and only to the
      // top class's.
      if (status.has_promoted_from() && !job.promoted) {
        job.promoted = true;
        ++result_.promotions;
        Trace(absl::StrCat("(coordinator) ", job.id, " promoted from ",
                           status.promoted_from(), " to ", status.priority()));
        if (options_.seed % 2 == 0 || status.priority() != 10 ||
            status.promoted_from() >= 10) {
          Violation(absl::StrCat(
              "invariant 2: job ", job.id, " was promoted from priority ",
              status.promoted_from(), " to ", status.priority(),
              " (only to the top class's 10, and only "
              "with a starvation bound)"));
        }
      }
    }
    CheckIdlePool(statuses);
  }

  // 4. A preemption is never for nothing.
  void CheckPreemption(SimJob& job, const v1::JobStatus& status,
                       const std::map<std::string, v1::JobStatus>& statuses) {
    int requested = 0;
    int preempted = 0;
    std::string last_for;
    for (const v1::JobEvent& event : status.events()) {
      if (event.kind() == "preemption_requested") {
        ++requested;
        const size_t at = event.message().find("for job ");
        if (at != std::string::npos) {
          const std::string rest = event.message().substr(at + 8);
          last_for = rest.substr(0, rest.find(' '));
        }
      } else if (event.kind() == "preempted") {
        ++preempted;
      }
    }
    if (requested > job.seen_requested) {
      job.seen_requested = requested;
      job.preempted_for = last_for;
      job.preempted_disturbances = disturbances_;
      job.preempted_event = event_;
      Trace(absl::StrCat("(coordinator) ", job.id, " is asked to yield for ",
                         last_for));
      ++result_.preemptions;
    }
    if (preempted > job.seen_preempted) {
      job.seen_preempted = preempted;
      // A yield without a failure or restart since it was asked for: its
      // next generation resumes from the step it stopped at. That one may
      // have formed already, in the same event.
      if (disturbances_ == job.preempted_disturbances) {
        if (job.formed_event > job.preempted_event) {
          CheckResume(job);
        } else {
          job.yielded_at = job.stopped_at;
        }
      }
      const std::string& for_job = job.preempted_for;
      auto it = statuses.find(for_job);
      if (for_job.empty() || disturbances_ != job.preempted_disturbances) {
        return;
      }
      if (it == statuses.end()) {
        if (options_.strict_preemptions) {
          Violation(absl::StrCat("invariant 4: job ", job.id, " yielded for ",
                                 for_job, ", which is gone"));
        }
        return;
      }
      const v1::JobStatus& other = it->second;
      if (other.state() == v1::JOB_STATE_QUEUED) {
        bool only_yielding = other.queue().reason() == "preempting";
        for (const std::string& victim : other.queue().preempts()) {
          auto v = statuses.find(victim);
          const SimJob* sim = Find(victim);
          only_yielding &= v != statuses.end() && sim != nullptr &&
                           sim->preempted_for == for_job &&
                           v->second.state() == v1::JOB_STATE_RUNNING;
        }
        if (only_yielding) return;
        const std::string why =
            absl::StrCat("invariant 4: job ", job.id, " yielded for ", for_job,
                         ", which still waits: ", other.queue().reason(), " (",
                         other.queue().message(), ")");
        // Checked always: its owner's quota, or a job of a lower priority
        // on a worker it released. Otherwise (a job of a higher priority
        // took them) only in the strict mode: open in issue 52.
        // A job of a higher priority that started since or now waits for
        // a preemption (its claim comes first), or for a quota a job of the
        // same owner, may have taken what it needed: the preemption is
        // then not redirected (open in issue 52).
        const bool quota = other.queue().reason() == "quota";
        for (const SimJob& started : jobs_) {
          auto st = statuses.find(started.id);
          if (st == statuses.end() || started.id == other.job_id() ||
              IsTerminal(st->second.state())) {
            continue;
          }
          const bool since = started.formed_event >= job.preempted_event &&
                             st->second.state() == v1::JOB_STATE_RUNNING;
          const bool same_owner = st->second.owner() == other.owner();
          const bool claims = st->second.state() == v1::JOB_STATE_QUEUED &&
                              st->second.queue().reason() == "preempting";
          if (((since || claims) && st->second.priority() > other.priority()) ||
              (quota && same_owner &&
               (since || st->second.queue().reason() == "preempting"))) {
            if (options_.strict_preemptions) Violation(why);
            return;
          }
        }
        if (quota) return Violation(why);
        for (const std::string& released : job.stopped_workers) {
          const std::string holder = HolderOf(released);
          auto h = statuses.find(holder);
          if (h != statuses.end() && h->second.priority() < other.priority()) {
            return Violation(absl::StrCat(why, "; ", holder, " of priority ",
                                          h->second.priority(), " took ",
                                          released));
          }
        }
        if (options_.strict_preemptions) Violation(why);
      } else if (options_.strict_preemptions && IsTerminal(other.state()) &&
                 other.state() != v1::JOB_STATE_SUCCEEDED &&
                 other.state() != v1::JOB_STATE_FAILED) {
        Violation(absl::StrCat("invariant 4: job ", job.id, " yielded for ",
                               for_job, ", which ended ",
                               StateName(other.state()),
                               " before it could use the workers"));
      }
    }
  }

  // The job the coordinator lists worker `id` under, or "".
  std::string HolderOf(const std::string& id) {
    v1::ListWorkersRequest request;
    auto page = coordinator_->ListWorkers(request);
    if (!page.ok()) return "";
    for (const v1::WorkerInfo& worker : page->workers()) {
      if (worker.worker_id() == id && worker.connected()) {
        return worker.job_id();
      }
    }
    return "";
  }

  // 4. An idle pool leaves no job waiting that fits it.
  void CheckIdlePool(const std::map<std::string, v1::JobStatus>& statuses) {
    int up = 0;
    for (const SimWorker& worker : workers_) up += worker.up;
    for (const auto& [id, status] : statuses) {
      if (status.state() == v1::JOB_STATE_RUNNING ||
          status.state() == v1::JOB_STATE_RECOVERING) {
        return;
      }
    }
    // Workers promised to a job that waits for other released workers to
    // come back are held for it, for at most the heartbeat timeout.
    v1::ListWorkersRequest request;
    auto page = coordinator_->ListWorkers(request);
    const double now = absl::ToDoubleSeconds(clock_.Now() - absl::UnixEpoch());
    int held = 0;
    if (page.ok()) {
      for (const v1::WorkerInfo& worker : page->workers()) {
        if (!worker.connected() || worker.promised_until() <= now) continue;
        ++held;
        if (worker.promised_until() - now > kHeartbeatTimeoutSeconds + 1e-3) {
          Violation(absl::StrCat("invariant 4: worker ", worker.worker_id(),
                                 " is promised to ", worker.promised_to(),
                                 " for ", worker.promised_until() - now,
                                 " s, past the heartbeat timeout"));
        }
      }
    }
    for (const auto& [id, status] : statuses) {
      if (status.state() != v1::JOB_STATE_QUEUED) continue;
      const v1::JobSpec& spec = status.spec();
      const int size =
          spec.min_workers() > 0 ? spec.min_workers() : spec.num_workers();
      auto quota = Quotas().find(status.owner());
      if (size <= up - held &&
          (quota == Quotas().end() || size <= quota->second)) {
        Violation(absl::StrCat("invariant 4: no job runs, ", up,
                               " workers are up, and job ", id, " (", size,
                               " workers) waits: ", status.queue().reason()));
        return;
      }
    }
  }

  // ---- helpers ----
  std::optional<v1::JobStatus> StatusOf(const std::string& id) {
    v1::GetJobStatusRequest request;
    request.set_job_id(id);
    auto response = coordinator_->GetJobStatus(request);
    if (!response.ok() || response->jobs().empty()) return std::nullopt;
    return response->jobs(0);
  }

  SimJob* Find(const std::string& id) {
    auto it = index_.find(id);
    return it == index_.end() ? nullptr : &jobs_[it->second];
  }

  int ActiveSimJobs() {
    int n = 0;
    for (const std::string& id : order_) {
      if (auto status = StatusOf(id); status && !IsTerminal(status->state())) {
        ++n;
      }
    }
    return n;
  }

  int64_t Uniform(int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng_);
  }

  void Trace(std::string line) {
    result_.trace.push_back(
        absl::StrCat("event ", event_, " t=", absl::ToUnixSeconds(clock_.Now()),
                     "s: ", line));
  }

  void Violation(std::string what) {
    result_.violations.push_back(
        absl::StrCat("event ", event_, ": ", what, "; pool:", PoolPicture()));
  }

  // " free:1 sim-3/1, free:2 idle, ..." as the coordinator lists them.
  std::string PoolPicture() {
    if (coordinator_ == nullptr) return " none";
    std::string out;
    v1::ListWorkersRequest request;
    auto page = coordinator_->ListWorkers(request);
    if (!page.ok()) return " unlisted";
    for (const v1::WorkerInfo& worker : page->workers()) {
      if (!worker.connected()) continue;
      absl::StrAppend(&out, " ", worker.worker_id(), " ",
                      worker.job_id().empty()
                          ? std::string("idle")
                          : absl::StrCat(worker.job_id(), "/", worker.rank()));
    }
    return out;
  }

  const SimOptions options_;
  std::mt19937_64 rng_;
  std::mt19937_64 side_rng_;
  // Time limits, from a stream of their own: the other events of a seed
  // stay as they were before there were limits.
  std::mt19937_64 limit_rng_;
  FakeClock clock_;
  std::unique_ptr<Coordinator> coordinator_;
  std::vector<SimWorker> workers_;
  std::vector<SimJob> jobs_;
  std::map<std::string, size_t> index_;
  // The jobs the coordinator still holds, in submission order.
  std::vector<std::string> order_;
  std::vector<Pending> pending_;
  uint64_t next_incarnation_ = 1;
  // Worker deaths and restarts so far: a preemption they cross may end
  // otherwise than planned.
  int64_t disturbances_ = 0;
  int64_t event_ = 0;
  SimResult result_;
};

}  // namespace

SimResult RunSimulation(const SimOptions& options) {
  // The coordinator logs every transition: millions of lines, of which
  // only an error (a refused transition) says something here. To replay
  // one seed with them all: LOCKSTEP_SIM_LOG=1.
  SetMinLogLevel(std::getenv("LOCKSTEP_SIM_LOG") != nullptr ? 'I' : 'E');
  SimResult result = Simulation(options).Run();
  SetMinLogLevel('I');
  return result;
}

std::string Describe(const SimOptions& options, const SimResult& result,
                     int lines) {
  std::string out = absl::StrCat(
      "seed ", options.seed, " (", options.workers, " workers, ", result.events,
      " events); replay: coordinator_sim --seed ", options.seed, " --workers ",
      options.workers, " --per-seed ", options.events,
      options.strict_preemptions ? "" : " --tested", " --trace\n");
  const size_t from = result.trace.size() > static_cast<size_t>(lines)
                          ? result.trace.size() - lines
                          : 0;
  for (size_t i = from; i < result.trace.size(); ++i) {
    absl::StrAppend(&out, "  ", result.trace[i], "\n");
  }
  for (const std::string& violation : result.violations) {
    absl::StrAppend(&out, "VIOLATION ", violation, "\n");
  }
  return out;
}

}  // namespace lockstep::coordinator::sim
