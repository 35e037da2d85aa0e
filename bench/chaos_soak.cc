// A chaos soak of the real daemons: a supervisor, as Kubernetes would be,
// runs a coordinator (with a state dir, so it survives restarts) and a static
// cluster of 3 CPU workers, trains one job uninterrupted to get its reference
// `model_digest`, then trains the same job again while injecting random
// faults drawn from a seeded RNG:
//
//   kill-worker   SIGKILL a worker; restart it after a random short delay
//   stop-short    SIGSTOP a worker, SIGCONT before the heartbeat timeout
//   stop-long     SIGSTOP a worker, SIGCONT after 1.5-2.5 heartbeat timeouts
//   term-worker   SIGTERM a worker (a preemption: it stops the job at an
//                 agreed, saved step and exits 0); restart it once it exited
//   kill-coord    SIGKILL the coordinator; restart it on the same port and
//                 state dir after a random short delay
//   kill-all      SIGKILL every worker and restart them after a random short
//                 delay: no live state survives, the job restores its
//                 newest checkpoint (saved every 10 steps)
//
// The whole schedule is drawn from the seed before the run: kinds from a
// shuffled deck (every 6 faults cover all six), targets, delays, and the
// steps trained between the job's resume and the next fault (3..12). With
// probability --overlap a fault does not wait for that: it goes in while the
// generation recovering from the previous one sets up (connects, agrees on
// the state), the window where a rank dies right after a generation started.
//
// The run passes when the faulted job succeeds within --budget seconds with
// the reference digest and training resumed within --resume-budget seconds
// of every fault. These are liveness bounds, far above a normal recovery
// (seconds), so that a hang fails the run instead of stalling it. A table
// gives per fault its time, kind, target, how long the process was held
// (restart delay or stop length), how long until training resumed, the
// steps repeated (from the job's `resumed` event) and the state the job
// resumed from.
//
// Exit 0 on success (the run's folder is removed), 1 on any failure (the
// folder, with every process's log, the state dir and the backups, is kept
// and named, and the job's events are printed), 2 on bad flags.
//
//   chaos_soak BIN_DIR [--seed N] [--faults N] [--steps N] [--data DIR]
//              [--budget SECS] [--resume-budget SECS]
//              [--heartbeat-timeout SECS] [--overlap P] [--kinds K,K..]
//              [--keep]
//
// --data defaults to $BENCH_DATA_DIR, else the job's default data set;
// --kinds limits the deck (e.g. --kinds kill-coord,kill-all).
#include <grpcpp/grpcpp.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <deque>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "bench/chaos_faults.h"
#include "bench/chaos_report.h"
#include "client/process.h"
#include "common/args.h"
#include "common/files.h"
#include "common/job_state.h"
#include "lockstep/v1/coordinator.grpc.pb.h"

namespace lockstep::chaos {
namespace {

constexpr int kWorkers = 3;
constexpr char kCluster[] =
    R"({"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:1", "127.0.0.1:1"]}})";
// Training steps between the resume of one fault and the next fault.
constexpr int kMinSpacing = 3;
constexpr int kMaxSpacing = 12;
// A worker's --preempt-grace, and how long after SIGTERM it must have exited.
constexpr int kPreemptGrace = 15;
constexpr double kPreemptWait = kPreemptGrace + 10;
// How often the supervisor looks at the job and its processes.
constexpr absl::Duration kPollInterval = absl::Milliseconds(50);

std::string TfConfig(int index) {
  return absl::StrCat(
      R"({"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:1", "127.0.0.1:1"]}, "task": {"type": "worker", "index": )",
      index, "}}");
}

// A task the supervisor does later: a restart, a SIGCONT.
struct Action {
  absl::Time when;
  std::function<void()> run;
};

// The supervisor. Start() runs the cluster, RunReference() the job without
// faults, RunFaulted() the job under the planned faults and the verdict; the
// destructor stops every process it started (by pid: SIGTERM, then SIGKILL).
// Everything runs on the calling thread, which polls the coordinator and
// the processes every 50 ms; only the reaper thread's exit reports cross
// threads (exits_).
class Soak {
 public:
  explicit Soak(Options options)
      : options_(std::move(options)), random_(options_.seed) {}

  ~Soak() {
    if (stopped_ > 0) kill(stopped_, SIGCONT);  // so that it can exit
    processes_.TerminateAll(absl::Seconds(3));
  }

  // The run's folder: state dir, backups and every process's log.
  const std::string& dir() const { return dir_; }

  bool Start() {
    char tmpl[] = "/tmp/lockstep-soak-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) return false;
    dir_ = tmpl;
    if (!StartCoordinator("127.0.0.1:0")) return false;
    for (int i = 0; i < kWorkers; ++i) workers_.push_back(StartWorker(i));
    // Only now: the reaper ends when it finds no child at all. The
    // coordinator and the workers are never all down at once (each fault
    // waits for the restarts of the one before), so some child always runs.
    processes_.StartReaper([this](const std::string& name, int status) {
      absl::MutexLock lock(&exits_mu_);
      exits_.push_back({name, status});
    });
    return true;
  }

  // Trains the job without faults; its digest, or "" on failure.
  std::string RunReference() {
    absl::Time start = absl::Now();
    std::string job = Submit("reference");
    if (job.empty()) return "";
    std::optional<v1::JobStatus> status;
    while (absl::Now() - start < absl::Seconds(options_.budget_s)) {
      HandleExits();
      status = Poll(job);
      if (status && IsTerminal(status->state())) break;
      absl::SleepFor(kPollInterval);
    }
    if (!status || status->state() != v1::JOB_STATE_SUCCEEDED) {
      std::cerr << "the uninterrupted job " << job << " did not succeed: "
                << (status ? status->error() : "no status") << "\n";
      return "";
    }
    reference_s_ = absl::ToDoubleSeconds(absl::Now() - start);
    std::printf("reference: %s, %lld steps in %.1f s, digest %s\n", job.c_str(),
                static_cast<long long>(status->step()), reference_s_,
                Digest(*status).c_str());
    return Digest(*status);
  }

  // Trains the job again under faults; true if it passed.
  bool RunFaulted(const std::string& reference) {
    start_ = absl::Now();
    Plan();
    next_at_step_ = plan_.empty() ? 0 : plan_[0].spacing;
    job_ = Submit("faulted");
    if (job_.empty()) return false;
    std::optional<v1::JobStatus> last;
    while (Elapsed() < options_.budget_s) {
      RunDueActions();
      HandleExits();
      if (std::optional<v1::JobStatus> status = Poll(job_)) {
        last = status;
        Advance(*status);  // a terminal status may hold the last `resumed`
        if (IsTerminal(status->state())) break;
      }
      absl::SleepFor(kPollInterval);
    }
    return Verdict(last, reference);
  }

 private:
  double Elapsed() const { return absl::ToDoubleSeconds(absl::Now() - start_); }

  double Uniform(double low, double high) {
    return std::uniform_real_distribution<>(low, high)(random_);
  }

  // --- processes -----------------------------------------------------------

  // Starts the coordinator on `listen` and waits for its address.
  bool StartCoordinator(const std::string& listen) {
    int out = -1;
    auto pid = processes_.Spawn(
        absl::StrCat("coordinator #", ++coordinators_),
        {options_.bin + "/lockstep-coordinator", "--listen", listen,
         "--state-dir", dir_ + "/state", "--cluster", kCluster,
         "--heartbeat-timeout", absl::StrCat(options_.heartbeat_timeout_s),
         // Faults, not certificates, are what the soak is about.
         "--insecure"},
        {}, dir_ + "/coordinator.log", &out);
    if (!pid.ok()) {
      std::cerr << pid.status() << "\n";
      return false;
    }
    coordinator_ = *pid;
    std::string line;
    pollfd ready = {out, POLLIN, 0};
    char c;
    while (poll(&ready, 1, 30000) == 1 && read(out, &c, 1) == 1 && c != '\n') {
      line.push_back(c);
    }
    close(out);
    if (line.find(' ') == std::string::npos) {
      std::cerr << "coordinator #" << coordinators_ << " did not start on "
                << listen << "; see " << dir_ << "/coordinator.log\n";
      return false;
    }
    address_ = line.substr(line.rfind(' ') + 1);
    // A new channel for each coordinator: the old one would wait out its
    // reconnect backoff (seconds) before it saw the restarted process.
    stub_ = v1::Coordinator::NewStub(
        grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
    return true;
  }

  pid_t StartWorker(int index) {
    worker_names_[index] = absl::StrCat("worker ", index, " #", ++spawned_);
    std::vector<std::string> command = {options_.bin + "/lockstep-worker",
                                        "--coordinator",
                                        address_,
                                        "--threads",
                                        "1",
                                        "--device",
                                        "cpu",
                                        "--preempt-grace",
                                        absl::StrCat(kPreemptGrace),
                                        "--insecure"};
    // The soak's data set lies outside the workers' default data roots.
    if (!options_.data.empty()) {
      command.insert(command.end(), {"--data-root", options_.data});
    }
    auto pid = processes_.Spawn(worker_names_[index], command,
                                {"TF_CONFIG=" + TfConfig(index),
                                 "OMP_NUM_THREADS=1", "OPENBLAS_NUM_THREADS=1"},
                                absl::StrCat(dir_, "/worker-", index, ".log"));
    if (!pid.ok()) std::cerr << pid.status() << "\n";
    return pid.value_or(-1);
  }

  // Restarts, as a supervisor would, every process that exited without the
  // soak killing it, and a preempted worker once it exited; notes anything
  // unexpected on `fault` (the current one) or stderr.
  void HandleExits() {
    std::deque<std::pair<std::string, int>> exits;
    {
      absl::MutexLock lock(&exits_mu_);
      exits.swap(exits_);
    }
    for (const auto& [name, status] : exits) {
      bool expected = expected_exits_.erase(name) > 0;
      std::string how =
          WIFEXITED(status)
              ? absl::StrCat("exited ", WEXITSTATUS(status))
              : absl::StrCat("killed by signal ", WTERMSIG(status));
      if (name == preempted_ && current_ != nullptr) {
        preempted_.clear();
        preempt_killed_ = false;
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
          Note(absl::StrCat(name, " ", how, " after SIGTERM, not 0"));
        }
        // A preemption stops at the next step; a worker that waited out its
        // grace never saw the job stop ("did not reach a saved step").
        const double took = Elapsed() - current_->at_s;
        if (took >= kPreemptGrace) {
          Note(absl::StrFormat(
              "%s exited %.1f s after SIGTERM, its whole --preempt-grace: "
              "the job did not stop at an agreed step",
              name, took));
        }
        int index = current_->worker;
        const double delay = current_->delay_s;
        current_->held_s = Elapsed() - current_->at_s + delay;
        Later(delay, [this, index] { workers_[index] = StartWorker(index); });
        continue;
      }
      if (expected) continue;
      std::string note = absl::StrCat(name, " ", how, " on its own");
      Note(note);
      if (name.rfind("worker ", 0) == 0) {
        int index = name[7] - '0';
        workers_[index] = StartWorker(index);
      } else if (name.rfind("coordinator", 0) == 0) {
        StartCoordinator(address_);
      }
    }
  }

  void Note(const std::string& problem) {
    std::fprintf(stderr, "[%7.2f s] %s\n", Elapsed(), problem.c_str());
    if (current_ != nullptr) {
      if (!current_->problem.empty()) current_->problem += "; ";
      current_->problem += problem;
    } else {
      other_problems_.push_back(problem);
    }
  }

  void Later(double seconds, std::function<void()> run) {
    actions_.push_back({absl::Now() + absl::Seconds(seconds), std::move(run)});
  }

  void RunDueActions() {
    absl::Time now = absl::Now();
    for (size_t i = 0; i < actions_.size();) {
      if (actions_[i].when <= now) {
        std::function<void()> run = std::move(actions_[i].run);
        actions_.erase(actions_.begin() + i);
        run();
      } else {
        ++i;
      }
    }
  }

  // --- the job -------------------------------------------------------------

  std::string Submit(const std::string& name) {
    v1::SubmitJobRequest request;
    v1::JobSpec* spec = request.mutable_spec();
    spec->set_name("soak");
    spec->mutable_model()->set_name("mlp");
    if (!options_.data.empty()) spec->mutable_data()->set_dir(options_.data);
    spec->set_global_batch_size(48);
    spec->set_max_steps(options_.steps);
    spec->set_epochs(1000000);  // max_steps ends it
    spec->set_log_every_steps(1);
    spec->mutable_optimizer()->set_type("adam");
    spec->set_max_restarts(1000);
    spec->mutable_checkpoint()->set_backup_dir(dir_ + "/backup-" + name);
    spec->mutable_checkpoint()->set_save_every_steps(10);
    spec->mutable_checkpoint()->set_keep_backups(true);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(10));
    v1::SubmitJobResponse response;
    grpc::Status status = stub_->SubmitJob(&context, request, &response);
    if (!status.ok()) {
      std::cerr << "cannot submit the " << name
                << " job: " << status.error_message() << "\n";
      return "";
    }
    return response.job_id();
  }

  // The job's status, or nothing while the coordinator is not answering.
  std::optional<v1::JobStatus> Poll(const std::string& job) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(2));
    v1::GetJobStatusRequest request;
    request.set_job_id(job);
    v1::GetJobStatusResponse response;
    if (!stub_->GetJobStatus(&context, request, &response).ok() ||
        response.jobs_size() != 1) {
      return std::nullopt;
    }
    return response.jobs(0);
  }

  static std::string Digest(const v1::JobStatus& status) {
    std::string digest;
    for (const v1::RankResult& rank : status.ranks()) {
      if (digest.empty()) digest = rank.model_digest();
      if (rank.model_digest() != digest) return "ranks differ";
    }
    return digest;
  }

  // --- faults --------------------------------------------------------------

  // One step of the fault schedule: see whether the current fault is over,
  // and inject the next once the job trained enough since.
  void Advance(const v1::JobStatus& status) {
    last_step_ = status.step();
    if (current_ != nullptr && !Settle(status)) return;
    if (static_cast<int>(faults_.size()) >= options_.faults ||
        !actions_.empty() || status.state() != v1::JOB_STATE_RUNNING ||
        status.step() < next_at_step_) {
      return;
    }
    if (status.step() + kMaxSpacing >= options_.steps) {
      if (!near_end_noted_) {
        near_end_noted_ = true;
        other_problems_.push_back(absl::StrCat(
            "the job neared its end after ", faults_.size(), " of ",
            options_.faults, " faults; give it more --steps"));
      }
      return;
    }
    Inject(status);
  }

  // Whether the current fault is over (training resumed, or the next fault
  // is to hit its recovery); then it is reported and the next one planned.
  bool Settle(const v1::JobStatus& status) {
    if (!preempted_.empty() && !preempt_killed_ &&
        Elapsed() - current_->at_s > kPreemptWait) {
      Note(absl::StrCat(preempted_, " did not exit ", kPreemptWait,
                        " s after SIGTERM; killed"));
      kill(workers_[current_->worker], SIGKILL);
      preempt_killed_ = true;  // its exit restarts it
    }
    if (!Resumed(status) && !Overlap(status)) {
      if (Elapsed() - current_->at_s > options_.resume_budget_s &&
          !late_noted_) {
        late_noted_ = true;
        Note(absl::StrCat("training did not resume within ",
                          options_.resume_budget_s, " s"));
      }
      return false;
    }
    CheckLiveRecovery();
    PrintFault(*current_, faults_.size());
    const size_t next = faults_.size();
    next_at_step_ = status.step();
    if (current_->resumed_s >= 0 && next < plan_.size()) {
      next_at_step_ += plan_[next].spacing;
    }
    if (current_->resumed_s >= 0) chain_lost_live_state_ = false;
    current_ = nullptr;
    late_noted_ = false;
    return true;
  }

  // Whether training resumed after the current fault: a `resumed` event of
  // a later generation, or (a stop the coordinator did not notice) steps
  // trained in the same generation after the worker continued.
  bool Resumed(const v1::JobStatus& status) {
    for (const v1::JobEvent& event : status.events()) {
      if (event.kind() != "resumed" ||
          event.generation() <= current_->generation) {
        continue;
      }
      current_->resumed_s = event.time() -
                            absl::ToDoubleSeconds(start_ - absl::UnixEpoch()) -
                            current_->at_s;
      ParseResumed(event.message(), *current_);
      return true;
    }
    // Reports of steps trained before the SIGSTOP may still arrive after
    // it: only a step past the one known at the SIGCONT counts.
    bool stop = current_->kind == FaultKind::kStopShort ||
                current_->kind == FaultKind::kStopLong;
    if (stop && actions_.empty() && status.state() == v1::JOB_STATE_RUNNING &&
        status.generation() == current_->generation &&
        status.step() > current_->step_at_cont) {
      current_->resumed_s = Elapsed() - current_->at_s;
      current_->repeated = 0;
      current_->resumed_from = "no new generation";
      if (current_->kind == FaultKind::kStopLong) {
        Note(absl::StrFormat(
            "the coordinator did not notice a worker silent for %.1f s, "
            "above its heartbeat timeout of %.1f s",
            current_->delay_s, options_.heartbeat_timeout_s));
      }
      return true;
    }
    return false;
  }

  // Whether the next fault goes in now, while the generation that recovers
  // from the current one sets up (connects, agrees on the state), as the
  // current fault's draw decided: the window where a rank dies right after
  // a generation started.
  bool Overlap(const v1::JobStatus& status) {
    if (!current_->overlap ||
        static_cast<int>(faults_.size()) >= options_.faults ||
        !actions_.empty() || !preempted_.empty() ||
        status.state() != v1::JOB_STATE_RUNNING ||
        status.generation() <= current_->generation) {
      return false;
    }
    current_->resumed_from = absl::StrCat("(next fault as generation ",
                                          status.generation(), " set up)");
    return true;
  }

  // Live recovery repeats no step (docs/DESIGN.md §3): only a kill-all, or
  // a fault that hit the recovery from one, may resume from a checkpoint.
  // The event counts repeats against the most advanced step ever applied,
  // so a fault while the job still re-trains the steps a restore repeated
  // counts those again: that many are not this fault's doing.
  void CheckLiveRecovery() {
    Fault& fault = *current_;
    if (fault.kind == FaultKind::kKillAll) chain_lost_live_state_ = true;
    if (fault.resumed_s < 0 || fault.repeated < 0) return;
    if (chain_lost_live_state_) {
      replay_until_ =
          std::max(replay_until_, fault.resumed_at + fault.repeated);
      return;
    }
    const int64_t replaying =
        std::max<int64_t>(0, replay_until_ - fault.resumed_at);
    if (fault.repeated > replaying) {
      Note(absl::StrCat(fault.repeated, " steps repeated (resumed after step ",
                        fault.resumed_at, " ", fault.resumed_from,
                        ") although a worker kept its live state"));
    }
  }

  // "generation G trains again after step S with rank R's live state; N
  // steps repeated"
  static void ParseResumed(const std::string& message, Fault& fault) {
    size_t with = message.find(" with ");
    size_t from = message.find(" from ");
    size_t source = std::min(with, from);
    size_t semicolon = message.rfind("; ");
    if (source != std::string::npos && semicolon != std::string::npos &&
        source < semicolon) {
      fault.resumed_from = message.substr(source + 1, semicolon - source - 1);
    }
    size_t after = message.find("after step ");
    if (after != std::string::npos) {
      after += strlen("after step ");
      absl::SimpleAtoi(message.substr(after, message.find(' ', after) - after),
                       &fault.resumed_at);
    }
    if (semicolon != std::string::npos) {
      size_t end = message.find(' ', semicolon + 2);
      absl::SimpleAtoi(message.substr(semicolon + 2, end - semicolon - 2),
                       &fault.repeated);
    }
  }

  // Draws every fault before the run, so that a seed names the same
  // schedule however the run's timing goes: the kinds come from a shuffled
  // deck of all six.
  void Plan() {
    std::vector<FaultKind> deck;
    for (int i = 0; i < options_.faults; ++i) {
      if (deck.empty()) {
        deck = options_.kinds;
        std::shuffle(deck.begin(), deck.end(), random_);
      }
      Fault fault{deck.back()};
      deck.pop_back();
      fault.spacing =
          std::uniform_int_distribution<>(kMinSpacing, kMaxSpacing)(random_);
      fault.overlap = std::bernoulli_distribution(options_.overlap)(random_);
      const double timeout = options_.heartbeat_timeout_s;
      switch (fault.kind) {
        case FaultKind::kStopShort:
          fault.delay_s = Uniform(0.1, 0.4) * timeout;
          break;
        case FaultKind::kStopLong:
          fault.delay_s = Uniform(1.5, 2.5) * timeout;
          break;
        default:
          fault.delay_s = Uniform(0, 1.5);
      }
      if (fault.kind != FaultKind::kKillCoordinator &&
          fault.kind != FaultKind::kKillAll) {
        fault.worker =
            std::uniform_int_distribution<>(0, kWorkers - 1)(random_);
      }
      plan_.push_back(fault);
    }
    std::printf("plan (* = the next fault hits its recovery):");
    for (const Fault& fault : plan_) {
      std::printf(
          " %s%s%s", KindName(fault.kind),
          fault.worker < 0 ? "" : absl::StrCat("/w", fault.worker).c_str(),
          fault.overlap ? "*" : "");
    }
    std::printf("\n");
  }

  void Inject(const v1::JobStatus& status) {
    faults_.push_back(plan_[faults_.size()]);
    current_ = &faults_.back();
    Fault& fault = *current_;
    fault.at_s = Elapsed();
    fault.step = status.step();
    fault.generation = status.generation();
    fault.held_s = fault.delay_s;
    const int index = fault.worker;
    const pid_t pid = index >= 0 ? workers_[index] : coordinator_;
    const std::string name = index >= 0
                                 ? worker_names_[index]
                                 : absl::StrCat("coordinator #", coordinators_);
    switch (fault.kind) {
      case FaultKind::kKillWorker:
        expected_exits_.insert(name);
        kill(pid, SIGKILL);
        Later(fault.delay_s,
              [this, index] { workers_[index] = StartWorker(index); });
        break;
      case FaultKind::kStopShort:
      case FaultKind::kStopLong:
        kill(pid, SIGSTOP);
        stopped_ = pid;
        Later(fault.delay_s, [this, pid] {
          kill(pid, SIGCONT);
          stopped_ = -1;
          current_->step_at_cont = last_step_;
        });
        break;
      case FaultKind::kTermWorker:
        preempted_ = name;  // restarted delay_s after it exits
        kill(pid, SIGTERM);
        break;
      case FaultKind::kKillCoordinator:
        expected_exits_.insert(name);
        kill(pid, SIGKILL);
        Later(fault.delay_s, [this] {
          if (!StartCoordinator(address_)) {
            Note("the coordinator did not restart");
          }
        });
        break;
      case FaultKind::kKillAll:
        for (int i = 0; i < kWorkers; ++i) {
          expected_exits_.insert(worker_names_[i]);
          kill(workers_[i], SIGKILL);
        }
        Later(fault.delay_s, [this] {
          for (int i = 0; i < kWorkers; ++i) workers_[i] = StartWorker(i);
        });
        break;
    }
  }

  // --- the verdict ---------------------------------------------------------

  bool Verdict(const std::optional<v1::JobStatus>& last,
               const std::string& reference) {
    std::vector<std::string> failures = other_problems_;
    if (current_ != nullptr) {
      PrintFault(*current_, faults_.size());
      failures.push_back(absl::StrCat("fault ", faults_.size(), " (",
                                      KindName(current_->kind),
                                      ") never saw training resume"));
    }
    for (size_t i = 0; i < faults_.size(); ++i) {
      if (!faults_[i].problem.empty()) {
        failures.push_back(
            absl::StrCat("fault ", i + 1, ": ", faults_[i].problem));
      }
    }
    if (!last || !IsTerminal(last->state())) {
      failures.push_back(absl::StrCat("the job did not finish within ",
                                      options_.budget_s, " s"));
    } else if (last->state() != v1::JOB_STATE_SUCCEEDED) {
      failures.push_back(absl::StrCat("the job ended ",
                                      v1::JobState_Name(last->state()), ": ",
                                      last->error()));
    } else if (Digest(*last) != reference) {
      failures.push_back(absl::StrCat(
          "digest ", Digest(*last), " differs from the reference ", reference));
    }
    PrintSummary(options_.seed, faults_, job_, last, Elapsed(), reference_s_);
    if (!failures.empty() && last) PrintEvents(*last, start_);
    for (const std::string& failure : failures) {
      std::printf("FAILED: %s\n", failure.c_str());
    }
    return failures.empty();
  }

  const Options options_;
  std::mt19937 random_;
  std::string dir_;
  std::string address_;
  client::ProcessGroup processes_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
  pid_t coordinator_ = -1;
  int coordinators_ = 0;
  std::vector<pid_t> workers_;
  pid_t stopped_ = -1;     // the worker held by SIGSTOP, if any
  int64_t last_step_ = 0;  // the job's step in the last status
  int spawned_ = 0;
  std::string worker_names_[kWorkers];  // process names, for exits

  absl::Mutex exits_mu_;
  // Process exits reported by the reaper thread: name and wait status.
  std::deque<std::pair<std::string, int>> exits_ ABSL_GUARDED_BY(exits_mu_);

  // Only the main thread touches the rest.
  std::set<std::string> expected_exits_;
  std::string preempted_;  // the SIGTERMed worker until it exits
  bool preempt_killed_ = false;
  std::vector<Action> actions_;
  std::vector<Fault> plan_;   // drawn before the run (Plan)
  std::deque<Fault> faults_;  // a deque: current_ points into it
  Fault* current_ = nullptr;  // the fault the job has not resumed from
  bool late_noted_ = false;
  // A kill-all since the last fault the job resumed from.
  bool chain_lost_live_state_ = false;
  // The most advanced step before the last restore: until the job passes it
  // again, it re-trains steps a kill-all repeated.
  int64_t replay_until_ = 0;
  bool near_end_noted_ = false;
  int64_t next_at_step_ = 0;
  std::vector<std::string> other_problems_;
  std::string job_;
  absl::Time start_;
  double reference_s_ = 0;
};

}  // namespace
}  // namespace lockstep::chaos

int main(int argc, char** argv) {
  absl::StatusOr<lockstep::chaos::Options> options =
      lockstep::chaos::ParseOptions(argc, argv);
  if (!options.ok()) {
    std::cerr << "chaos_soak: " << options.status().message() << "\n"
              << lockstep::chaos::kUsage;
    return 2;
  }
  std::printf(
      "chaos soak: seed %u, %d faults (overlap %.2f), %d steps, 3 workers, "
      "heartbeat timeout %.1f s (rerun with --seed %u)\n",
      options->seed, options->faults, options->overlap, options->steps,
      options->heartbeat_timeout_s, options->seed);
  std::fflush(stdout);

  auto soak = std::make_unique<lockstep::chaos::Soak>(*options);
  bool passed = false;
  if (soak->Start()) {
    std::string reference = soak->RunReference();
    passed = !reference.empty() && soak->RunFaulted(reference);
  }
  const std::string dir = soak->dir();
  soak.reset();  // stops every process before their folder goes
  if (!passed || options->keep) {
    std::printf("%s; the run's folder (logs, state, backups) is %s\n",
                passed ? "passed" : "FAILED", dir.c_str());
    return passed ? 0 : 1;
  }
  if (absl::Status removed = lockstep::RemoveRecursively(dir); !removed.ok()) {
    std::cerr << removed << "\n";
  }
  std::printf("passed\n");
  return 0;
}
