// Carrying out the chaos soak's faults and following the job's recovery
// from each (chaos_injector.h).
#include "bench/chaos_injector.h"

#include <signal.h>
#include <string.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"

namespace lockstep::chaos {
namespace {

// kill(2) for one process the soak started. A process that failed to start
// has no pid (-1 or 0), and kill(-1, ...) would signal every process the
// user may signal: such a fault hits nobody.
void Signal(pid_t pid, int number) {
  if (pid > 0) kill(pid, number);
}

// Training steps between the resume of one fault and the next fault.
constexpr int kMinSpacing = 3;
constexpr int kMaxSpacing = 12;
// How long after SIGTERM a preempted worker must have exited.
constexpr double kPreemptWait = kPreemptGrace + 10;

// "generation G trains again after step S with rank R's live state; N
// steps repeated"
void ParseResumed(const std::string& message, Fault& fault) {
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

}  // namespace

std::string HowExited(int status) {
  return WIFEXITED(status)
             ? absl::StrCat("exited ", WEXITSTATUS(status))
             : absl::StrCat("killed by signal ", WTERMSIG(status));
}

FaultInjector::FaultInjector(const Options& options, Cluster& cluster)
    : options_(options), cluster_(cluster), random_(options.seed) {}

void FaultInjector::Start() {
  start_ = absl::Now();
  Plan();
  next_at_step_ = plan_.empty() ? 0 : plan_[0].spacing;
}

double FaultInjector::Elapsed() const {
  return absl::ToDoubleSeconds(absl::Now() - start_);
}

void FaultInjector::RunDueActions() {
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

bool FaultInjector::Exited(const std::string& name, int status) {
  const bool expected = expected_exits_.erase(name) > 0;
  if (name != preempted_ || current_ == nullptr) return expected;
  preempted_.clear();
  preempt_killed_ = false;
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    Note(absl::StrCat(name, " ", HowExited(status), " after SIGTERM, not 0"));
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
  Later(delay, [this, index] { cluster_.RestartWorker(index); });
  return true;
}

void FaultInjector::Advance(const v1::JobStatus& status) {
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
      other_problems_.push_back(
          absl::StrCat("the job neared its end after ", faults_.size(), " of ",
                       options_.faults, " faults; give it more --steps"));
    }
    return;
  }
  Inject(status);
}

void FaultInjector::Note(const std::string& problem) {
  std::fprintf(stderr, "[%7.2f s] %s\n", Elapsed(), problem.c_str());
  if (current_ != nullptr) {
    if (!current_->problem.empty()) current_->problem += "; ";
    current_->problem += problem;
  } else {
    other_problems_.push_back(problem);
  }
}

std::vector<std::string> FaultInjector::Finish() {
  std::vector<std::string> problems = other_problems_;
  if (current_ != nullptr) {
    PrintFault(*current_, faults_.size());
    problems.push_back(absl::StrCat("fault ", faults_.size(), " (",
                                    KindName(current_->kind),
                                    ") never saw training resume"));
  }
  for (size_t i = 0; i < faults_.size(); ++i) {
    if (!faults_[i].problem.empty()) {
      problems.push_back(
          absl::StrCat("fault ", i + 1, ": ", faults_[i].problem));
    }
  }
  return problems;
}

void FaultInjector::ContinueStopped() {
  if (stopped_ > 0) Signal(stopped_, SIGCONT);
}

double FaultInjector::Uniform(double low, double high) {
  return std::uniform_real_distribution<>(low, high)(random_);
}

void FaultInjector::Later(double seconds, std::function<void()> run) {
  actions_.push_back({absl::Now() + absl::Seconds(seconds), std::move(run)});
}

// Draws every fault before the run, so that a seed names the same
// schedule however the run's timing goes: the kinds come from a shuffled
// deck of all six.
void FaultInjector::Plan() {
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
      case FaultKind::kCutShort:
        fault.delay_s = Uniform(0.1, 0.4) * timeout;
        break;
      case FaultKind::kStopLong:
      case FaultKind::kCutLong:
      case FaultKind::kCutCoordinator:
        fault.delay_s = Uniform(1.5, 2.5) * timeout;
        break;
      case FaultKind::kSlowLink:
        fault.delay_s = Uniform(1, 4);
        break;
      default:
        fault.delay_s = Uniform(0, 1.5);
    }
    if (fault.kind != FaultKind::kKillCoordinator &&
        fault.kind != FaultKind::kKillAll &&
        fault.kind != FaultKind::kCutCoordinator) {
      fault.worker = std::uniform_int_distribution<>(0, kWorkers - 1)(random_);
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

void FaultInjector::Inject(const v1::JobStatus& status) {
  faults_.push_back(plan_[faults_.size()]);
  current_ = &faults_.back();
  Fault& fault = *current_;
  fault.at_s = Elapsed();
  fault.step = status.step();
  fault.generation = status.generation();
  fault.held_s = fault.delay_s;
  const int index = fault.worker;
  const pid_t pid =
      index >= 0 ? cluster_.worker_pid(index) : cluster_.coordinator_pid();
  const std::string name =
      index >= 0 ? cluster_.worker_name(index) : cluster_.coordinator_name();
  switch (fault.kind) {
    case FaultKind::kKillWorker:
      expected_exits_.insert(name);
      Signal(pid, SIGKILL);
      Later(fault.delay_s, [this, index] { cluster_.RestartWorker(index); });
      break;
    case FaultKind::kStopShort:
    case FaultKind::kStopLong:
      Signal(pid, SIGSTOP);
      stopped_ = pid;
      Later(fault.delay_s, [this, pid] {
        Signal(pid, SIGCONT);
        stopped_ = -1;
        current_->step_at_cont = last_step_;
      });
      break;
    case FaultKind::kTermWorker:
      preempted_ = name;  // restarted delay_s after it exits
      Signal(pid, SIGTERM);
      break;
    case FaultKind::kKillCoordinator:
      expected_exits_.insert(name);
      Signal(pid, SIGKILL);
      Later(fault.delay_s, [this] {
        if (!cluster_.RestartCoordinator()) {
          Note("the coordinator did not restart");
        }
      });
      break;
    case FaultKind::kKillAll:
      for (int i = 0; i < kWorkers; ++i) {
        expected_exits_.insert(cluster_.worker_name(i));
        Signal(cluster_.worker_pid(i), SIGKILL);
      }
      Later(fault.delay_s, [this] {
        for (int i = 0; i < kWorkers; ++i) cluster_.RestartWorker(i);
      });
      break;
    case FaultKind::kCutShort:
    case FaultKind::kCutLong:
    case FaultKind::kCutCoordinator:
      if (!cluster_.Cut(index)) Note("the cable could not be cut");
      Later(fault.delay_s, [this, index] {
        if (!cluster_.Heal(index)) Note("the cable could not be healed");
        current_->step_at_cont = last_step_;
      });
      break;
    case FaultKind::kSlowLink:
      if (!cluster_.Slow(index)) Note("the link could not be slowed");
      Later(fault.delay_s, [this, index] {
        if (!cluster_.Unslow(index)) Note("the link could not be restored");
        current_->step_at_cont = last_step_;
      });
      break;
  }
}

// Whether the current fault is over (training resumed, or the next fault
// is to hit its recovery); then it is reported and the next one planned.
bool FaultInjector::Settle(const v1::JobStatus& status) {
  if (!preempted_.empty() && !preempt_killed_ &&
      Elapsed() - current_->at_s > kPreemptWait) {
    Note(absl::StrCat(preempted_, " did not exit ", kPreemptWait,
                      " s after SIGTERM; killed"));
    Signal(cluster_.worker_pid(current_->worker), SIGKILL);
    preempt_killed_ = true;  // its exit restarts it
  }
  if (!Resumed(status) && !Overlap(status)) {
    if (Elapsed() - current_->at_s > options_.resume_budget_s && !late_noted_) {
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
bool FaultInjector::Resumed(const v1::JobStatus& status) {
  const double start_s = absl::ToDoubleSeconds(start_ - absl::UnixEpoch());
  for (const v1::JobEvent& event : status.events()) {
    if (current_->detected_s < 0 &&
        event.generation() == current_->generation &&
        (event.kind() == "worker_failed" ||
         event.kind() == "generation_failed") &&
        event.time() - start_s >= current_->at_s) {
      current_->detected_s = event.time() - start_s - current_->at_s;
    }
  }
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
  // Reports of steps trained before the SIGSTOP (or the cut) may still
  // arrive after it: only a step past the one known at the SIGCONT (the
  // heal) counts.
  const FaultKind kind = current_->kind;
  bool stop = kind == FaultKind::kStopShort || kind == FaultKind::kStopLong ||
              kind == FaultKind::kCutShort || kind == FaultKind::kCutLong ||
              kind == FaultKind::kCutCoordinator ||
              kind == FaultKind::kSlowLink;
  if (stop && actions_.empty() && status.state() == v1::JOB_STATE_RUNNING &&
      status.generation() == current_->generation &&
      status.step() > current_->step_at_cont) {
    current_->resumed_s = Elapsed() - current_->at_s;
    current_->repeated = 0;
    current_->resumed_from = "no new generation";
    if (kind == FaultKind::kStopLong || kind == FaultKind::kCutLong ||
        kind == FaultKind::kCutCoordinator) {
      Note(absl::StrFormat(
          "the coordinator did not notice a %s silent for %.1f s, above its "
          "heartbeat timeout of %.1f s",
          kind == FaultKind::kCutCoordinator ? "cluster" : "worker",
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
bool FaultInjector::Overlap(const v1::JobStatus& status) {
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
void FaultInjector::CheckLiveRecovery() {
  Fault& fault = *current_;
  if (fault.kind == FaultKind::kKillAll) chain_lost_live_state_ = true;
  if (fault.resumed_s < 0 || fault.repeated < 0) return;
  if (chain_lost_live_state_) {
    replay_until_ = std::max(replay_until_, fault.resumed_at + fault.repeated);
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

}  // namespace lockstep::chaos
