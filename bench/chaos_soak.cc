// The chaos soak's supervisor and main(): runs the daemons, restarts what
// exits on its own, submits the job and polls it (faults: chaos_injector.h).
//
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
#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <deque>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "bench/chaos_faults.h"
#include "bench/chaos_injector.h"
#include "bench/chaos_report.h"
#include "client/process.h"
#include "common/files.h"
#include "common/job_state.h"
#include "lockstep/v1/coordinator.grpc.pb.h"

namespace lockstep::chaos {
namespace {

constexpr char kCluster[] =
    R"({"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:1", "127.0.0.1:1"]}})";
// How often the supervisor looks at the job and its processes.
constexpr absl::Duration kPollInterval = absl::Milliseconds(50);

std::string TfConfig(int index) {
  return absl::StrCat(
      R"({"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:1", "127.0.0.1:1"]}, "task": {"type": "worker", "index": )",
      index, "}}");
}

// The supervisor. Start() runs the cluster, RunReference() the job without
// faults, RunFaulted() the job under the planned faults (FaultInjector) and
// the verdict; the destructor stops every process it started (by pid:
// SIGTERM, then SIGKILL). Everything runs on the calling thread, which polls
// the coordinator and the processes every 50 ms; only the reaper thread's
// exit reports cross threads (exits_).
class Soak : public Cluster {
 public:
  explicit Soak(Options options)
      : options_(std::move(options)), injector_(options_, *this) {}

  ~Soak() override {
    injector_.ContinueStopped();  // so that it can exit
    processes_.TerminateAll(absl::Seconds(3));
  }

  // The run's folder: state dir, backups and every process's log.
  const std::string& dir() const { return dir_; }

  bool Start() {
    char tmpl[] = "/tmp/lockstep-soak-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) return false;
    dir_ = tmpl;
    if (!StartCoordinator("127.0.0.1:0")) return false;
    for (int i = 0; i < kWorkers; ++i) StartWorker(i);
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
    injector_.Start();
    job_ = Submit("faulted");
    if (job_.empty()) return false;
    std::optional<v1::JobStatus> last;
    while (injector_.Elapsed() < options_.budget_s) {
      injector_.RunDueActions();
      HandleExits();
      if (std::optional<v1::JobStatus> status = Poll(job_)) {
        last = status;
        injector_.Advance(*status);  // a terminal one may hold `resumed`
        if (IsTerminal(status->state())) break;
      }
      absl::SleepFor(kPollInterval);
    }
    return Verdict(last, reference);
  }

  // --- Cluster: what the faults act on -------------------------------------

  pid_t worker_pid(int index) const override { return workers_[index]; }
  const std::string& worker_name(int index) const override {
    return worker_names_[index];
  }
  pid_t coordinator_pid() const override { return coordinator_; }
  std::string coordinator_name() const override {
    return absl::StrCat("coordinator #", coordinators_);
  }
  void RestartWorker(int index) override { StartWorker(index); }
  bool RestartCoordinator() override { return StartCoordinator(address_); }

 private:
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

  void StartWorker(int index) {
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
    workers_[index] = pid.value_or(-1);
  }

  // Restarts, as a supervisor would, every process that exited without the
  // soak killing it, and notes it as a problem; the injector restarts what
  // its faults stopped.
  void HandleExits() {
    std::deque<std::pair<std::string, int>> exits;
    {
      absl::MutexLock lock(&exits_mu_);
      exits.swap(exits_);
    }
    for (const auto& [name, status] : exits) {
      if (injector_.Exited(name, status)) continue;
      injector_.Note(absl::StrCat(name, " ", HowExited(status), " on its own"));
      if (name.rfind("worker ", 0) == 0) {
        StartWorker(name[7] - '0');
      } else if (name.rfind("coordinator", 0) == 0) {
        StartCoordinator(address_);
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

  // --- the verdict ---------------------------------------------------------

  bool Verdict(const std::optional<v1::JobStatus>& last,
               const std::string& reference) {
    std::vector<std::string> failures = injector_.Finish();
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
    PrintSummary(options_.seed, injector_.faults(), job_, last,
                 injector_.Elapsed(), reference_s_);
    if (!failures.empty() && last) PrintEvents(*last, injector_.start());
    for (const std::string& failure : failures) {
      std::printf("FAILED: %s\n", failure.c_str());
    }
    return failures.empty();
  }

  const Options options_;
  std::string dir_;
  std::string address_;
  client::ProcessGroup processes_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
  pid_t coordinator_ = -1;
  int coordinators_ = 0;
  std::vector<pid_t> workers_ = std::vector<pid_t>(kWorkers, -1);
  int spawned_ = 0;
  std::string worker_names_[kWorkers];  // process names, for exits

  absl::Mutex exits_mu_;
  // Process exits reported by the reaper thread: name and wait status.
  std::deque<std::pair<std::string, int>> exits_ ABSL_GUARDED_BY(exits_mu_);

  // Only the main thread touches the rest.
  FaultInjector injector_;
  std::string job_;
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
