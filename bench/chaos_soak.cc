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
//
// --netbed runs every daemon in a host of its own on the network test bed
// (tests/netbed/: network namespaces joined by a bridge, as root; exit 77
// when the process cannot build one): the coordinator, and this process,
// in host 0, worker I in host I + 1. Four network faults join the deck:
//
//   cut-short  a worker's cable pulled at the switch, plugged back before
//              the heartbeat timeout (0.1-0.4 of it): training goes on
//   cut-long   pulled for 1.5-2.5 heartbeat timeouts, the worker's process
//              living on: a partition that heals after the job re-formed
//              without it
//   cut-coord  the coordinator's host cut off for 1.5-2.5 timeouts
//   slow-link  a worker's link capped to 20 Mbit/s both ways for 1-4 s
//
// The table then also says when the coordinator named a failure (detected
// s), and a summary per fault kind follows it.
#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <poll.h>
#include <sched.h>
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
#include "tests/netbed/netbed.h"

namespace lockstep::chaos {
namespace {

// How often the supervisor looks at the job and its processes.
constexpr absl::Duration kPollInterval = absl::Milliseconds(50);
// A slow link's rate (slow-link).
constexpr char kSlowRate[] = "20mbit";

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
    // Back to where it came from: the bed's teardown kills every process in
    // its hosts, this one too if it stayed in host 0.
    if (home_ns_ >= 0) {
      setns(home_ns_, CLONE_NEWNET);
      close(home_ns_);
    }
    bed_.reset();  // kills what is left in its hosts, deletes them
  }

  // The run's folder: state dir, backups and every process's log.
  const std::string& dir() const { return dir_; }

  bool Start() {
    char tmpl[] = "/tmp/lockstep-soak-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) return false;
    dir_ = tmpl;
    if (options_.netbed && !StartBed()) return false;
    if (!StartCoordinator(Host(-1) + ":0")) return false;
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
  bool Cut(int index) override { return Done(bed_->Cut(BedHost(index))); }
  bool Heal(int index) override { return Done(bed_->Heal(BedHost(index))); }
  bool Slow(int index) override {
    return Done(bed_->Cap(BedHost(index), kSlowRate));
  }
  bool Unslow(int index) override { return Done(bed_->Uncap(BedHost(index))); }

 private:
  // --- the network test bed ------------------------------------------------

  // Builds the bed (a host for the coordinator and one per worker) and moves
  // this process into the coordinator's host, before any thread or channel
  // exists, so that it reaches the coordinator there.
  bool StartBed() {
    if (const std::string left = netbed::Leftovers(); !left.empty()) {
      std::cerr << "removing what an earlier run left:\n" << left;
      netbed::RemoveLeftovers();
    }
    auto bed = netbed::Bed::Up("soak", 1 + kWorkers);
    if (!bed.ok()) {
      std::cerr << bed.status() << "\n";
      return false;
    }
    bed_ = *std::move(bed);
    home_ns_ = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
    const std::string path = "/run/netns/" + bed_->Namespace(0);
    const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0 || setns(fd, CLONE_NEWNET) != 0) {
      std::cerr << "cannot enter " << path << ": " << strerror(errno) << "\n";
      if (fd >= 0) close(fd);
      return false;
    }
    close(fd);
    return true;
  }

  // The bed's host of worker `index` (-1: the coordinator's).
  static int BedHost(int index) { return index < 0 ? 0 : index + 1; }

  // Where worker `index` (-1: the coordinator) runs.
  std::string Host(int index) const {
    return bed_ != nullptr ? bed_->Address(BedHost(index)) : "127.0.0.1";
  }

  bool Done(const absl::Status& status) {
    if (!status.ok()) std::cerr << status << "\n";
    return status.ok();
  }

  std::string WorkerList() const {
    std::string list;
    for (int i = 0; i < kWorkers; ++i) {
      absl::StrAppend(&list, i ? ", " : "", "\"", Host(i), ":1\"");
    }
    return list;
  }
  std::string ClusterJson() const {
    return absl::StrCat(R"({"cluster": {"worker": [)", WorkerList(), "]}}");
  }
  std::string TfConfig(int index) const {
    return absl::StrCat(R"({"cluster": {"worker": [)", WorkerList(),
                        R"(]}, "task": {"type": "worker", "index": )", index,
                        "}}");
  }

  // --- processes -----------------------------------------------------------

  // Starts the coordinator on `listen` and waits for its address.
  bool StartCoordinator(const std::string& listen) {
    int out = -1;
    auto pid = processes_.Spawn(
        absl::StrCat("coordinator #", ++coordinators_),
        {options_.bin + "/lockstep-coordinator", "--listen", listen,
         "--state-dir", dir_ + "/state", "--cluster", ClusterJson(),
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
    if (bed_ != nullptr) command = bed_->Exec(BedHost(index), command);
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
    PrintKinds(injector_.faults());
    PrintSummary(options_.seed, injector_.faults(), job_, last,
                 injector_.Elapsed(), reference_s_);
    if (!failures.empty() && last) PrintEvents(*last, injector_.start());
    for (const std::string& failure : failures) {
      std::printf("FAILED: %s\n", failure.c_str());
    }
    return failures.empty();
  }

  const Options options_;
  std::unique_ptr<netbed::Bed> bed_;  // with --netbed
  int home_ns_ = -1;                  // the network namespace it started in
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
  if (options->netbed) {
    if (const std::string why = lockstep::netbed::WhyUnavailable();
        !why.empty()) {
      std::printf("chaos_soak --netbed: %s\n", why.c_str());
      return 77;  // ctest's SKIP_RETURN_CODE
    }
  }
  std::printf(
      "chaos soak: seed %u, %d faults (overlap %.2f), %d steps, 3 workers%s, "
      "heartbeat timeout %.1f s (rerun with --seed %u%s)\n",
      options->seed, options->faults, options->overlap, options->steps,
      options->netbed ? " on their own hosts (network test bed)" : "",
      options->heartbeat_timeout_s, options->seed,
      options->netbed ? " --netbed" : "");
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
