// Recovery after a worker is killed: a static cluster of 2 workers trains the
// MLP; in each trial worker 1 is killed with SIGKILL at a random point of a
// step and a replacement process is started at once (as Kubernetes or
// `lockstep local` would). Reported per trial and as the median:
//   detect  - SIGKILL to the coordinator's worker_failed event
//   resume  - SIGKILL to the first completed step of the next generation
//             (the replacement's process start, data load and state
//             transfer included)
//   repeated - steps trained twice
//
// With --restore, every worker is killed (no live state survives), both are
// restarted at once, and the job restores its newest checkpoint (saved every
// 20 steps): resume is then SIGKILL to the first step after the restore.
//
// With --spare, the cluster has a hot spare task (TF_CONFIG type "spare")
// standing by: it takes the killed rank at once, and the killed task is
// restarted only after the job resumed (it then stands by in its turn).
// "start" is then SIGKILL to the start of the next generation.
//
// A trial that does not resume fails the run (exit 1); the run's folder, with
// every process's log, is then kept.
//
//   recovery_bench BIN_DIR [TRIALS] [--restore|--spare]   default 7 trials
//   recovery_bench BIN_DIR 1 [--restore|--spare]          a smoke run (~10 s)
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <stdlib.h>

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/process.h"
#include "common/files.h"
#include "common/job_state.h"
#include "lockstep/v1/coordinator.grpc.pb.h"

namespace lockstep {
namespace {

// The cluster's tasks, as TF_CONFIG's "cluster" value.
std::string Cluster(bool spare) {
  return absl::StrCat(R"({"worker": ["127.0.0.1:1", "127.0.0.1:1"])",
                      spare ? R"(, "spare": ["127.0.0.1:1"])" : "", "}");
}

std::string TfConfig(bool spare, const std::string& type, int index) {
  return absl::StrCat(R"({"cluster": )", Cluster(spare),
                      R"(, "task": {"type": ")", type, R"(", "index": )", index,
                      "}}");
}

struct Trial {
  double detect_s = -1;
  double start_s = -1;
  double resume_s = -1;
  int64_t repeated = -1;
};

class Bench {
 public:
  Bench(std::string bin, bool spare) : bin_(std::move(bin)), spare_(spare) {}

  bool Start() {
    char tmpl[] = "/tmp/lockstep-recovery-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) return false;
    dir_ = tmpl;
    int out = -1;
    auto pid = processes_.Spawn(
        "coordinator",
        {bin_ + "/lockstep-coordinator", "--listen", "127.0.0.1:0",
         "--state-dir", dir_ + "/state", "--cluster",
         absl::StrCat(R"({"cluster": )", Cluster(spare_), "}"),
         // Recovery times without TLS, as measured before it existed.
         "--insecure"},
        {}, dir_ + "/coordinator.log", &out);
    if (!pid.ok()) return false;
    std::string line;
    char c;
    while (read(out, &c, 1) == 1 && c != '\n') line.push_back(c);
    close(out);
    address_ = line.substr(line.rfind(' ') + 1);
    stub_ = v1::Coordinator::NewStub(
        grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
    for (int i = 0; i < 2; ++i) workers_.push_back(StartWorker(i));
    if (spare_) StartTask("spare", 0);
    return true;
  }

  pid_t StartWorker(int index) { return StartTask("worker", index); }

  pid_t StartTask(const std::string& type, int index) {
    auto pid =
        processes_.Spawn(absl::StrCat(type, " ", index, " #", ++spawned_),
                         {bin_ + "/lockstep-worker", "--coordinator", address_,
                          "--threads", "1", "--insecure"},
                         {"TF_CONFIG=" + TfConfig(spare_, type, index),
                          "OMP_NUM_THREADS=1", "OPENBLAS_NUM_THREADS=1"},
                         absl::StrCat(dir_, "/", type, "-", spawned_, ".log"));
    return pid.value_or(-1);
  }

  std::string Submit(const std::string& backup_dir) {
    v1::SubmitJobRequest request;
    v1::JobSpec* spec = request.mutable_spec();
    spec->set_name("recovery");
    spec->mutable_model()->set_name("mlp");
    spec->set_global_batch_size(64);
    spec->set_max_steps(100000);
    spec->set_log_every_steps(1);
    spec->mutable_optimizer()->set_type("adam");
    spec->set_max_restarts(1000);
    if (!backup_dir.empty()) {
      spec->mutable_checkpoint()->set_backup_dir(backup_dir);
      spec->mutable_checkpoint()->set_save_every_steps(20);
    }
    grpc::ClientContext context;
    v1::SubmitJobResponse response;
    if (!stub_->SubmitJob(&context, request, &response).ok()) return "";
    return response.job_id();
  }

  v1::JobStatus WatchUntil(
      const std::string& job,
      const std::function<bool(const v1::JobStatus&)>& done) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::minutes(2));
    v1::WatchJobRequest request;
    request.set_job_id(job);
    auto reader = stub_->WatchJob(&context, request);
    v1::JobStatus status;
    while (reader->Read(&status)) {
      if (done(status)) break;
    }
    context.TryCancel();
    reader->Finish();
    return status;
  }

  Trial RunTrial(std::mt19937& random, bool restore) {
    Trial trial;
    std::string job =
        Submit(restore ? absl::StrCat(dir_, "/backup-", ++jobs_) : "");
    v1::JobStatus warm = WatchUntil(job, [&](const v1::JobStatus& s) {
      return s.step() >= 30 && (!restore || s.checkpoints_size() > 0);
    });
    // Spread the kill over a step: wait a random fraction of one.
    double step_s =
        warm.samples_per_second() > 0 ? 64 / warm.samples_per_second() : 0.005;
    absl::SleepFor(
        absl::Seconds(std::uniform_real_distribution<>(0, step_s)(random)));
    double killed = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
    if (restore) {
      kill(workers_[0], SIGKILL);
      kill(workers_[1], SIGKILL);
      workers_[0] = StartWorker(0);
    } else {
      kill(workers_[1], SIGKILL);
    }
    if (!spare_) workers_[1] = StartWorker(1);
    auto later = [](const v1::JobEvent& e) { return e.generation() > 1; };
    v1::JobStatus resumed = WatchUntil(job, [&](const v1::JobStatus& s) {
      for (const v1::JobEvent& e : s.events()) {
        if (e.kind() == "resumed" && later(e)) return true;
      }
      return false;
    });
    if (spare_) workers_[1] = StartWorker(1);  // it stands by from now on
    for (const v1::JobEvent& e : resumed.events()) {
      if (e.kind() == "generation_started" && later(e) && trial.start_s < 0) {
        trial.start_s = e.time() - killed;
      }
      bool failure = e.kind() == "worker_failed" ||
                     e.kind() == "worker_restarted" ||
                     e.kind() == "generation_failed";
      if (failure && trial.detect_s < 0) {
        trial.detect_s = e.time() - killed;
        if (getenv("RECOVERY_VERBOSE"))
          std::cerr << e.kind() << ": " << e.message() << "\n";
      }
      if (e.kind() == "resumed" && later(e)) {
        trial.resume_s = e.time() - killed;
        size_t at = e.message().rfind("; ");
        absl::SimpleAtoi(
            e.message().substr(at + 2, e.message().find(' ', at + 2) - at - 2),
            &trial.repeated);
      }
    }
    grpc::ClientContext context;
    v1::StopJobRequest stop;
    stop.set_job_id(job);
    v1::StopJobResponse ignored;
    stub_->StopJob(&context, stop, &ignored);
    WatchUntil(job,
               [](const v1::JobStatus& s) { return IsTerminal(s.state()); });
    return trial;
  }

  ~Bench() { processes_.TerminateAll(absl::Seconds(3)); }

  // The run's folder (state, logs, backups): removed after a clean run.
  const std::string& dir() const { return dir_; }

 private:
  const std::string bin_;
  const bool spare_;
  std::string dir_;
  std::string address_;
  int spawned_ = 0;
  int jobs_ = 0;
  client::ProcessGroup processes_;
  std::vector<pid_t> workers_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
};

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

}  // namespace
}  // namespace lockstep

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: recovery_bench BIN_DIR [TRIALS] [--restore|--spare]\n";
    return 2;
  }
  int trials = argc > 2 ? atoi(argv[2]) : 7;
  bool restore = argc > 3 && std::string(argv[3]) == "--restore";
  bool spare = argc > 3 && std::string(argv[3]) == "--spare";
  if (trials < 1) {
    std::cerr << "recovery_bench: TRIALS must be positive\n";
    return 2;
  }
  auto bench = std::make_unique<lockstep::Bench>(argv[1], spare);
  if (!bench->Start()) {
    std::cerr << "cannot start the cluster (logs in " << bench->dir() << ")\n";
    return 1;
  }
  std::mt19937 random(42);
  std::vector<double> detect, start, resume, repeated;
  int failed = 0;
  std::printf("%s\n", restore ? "every worker killed; restore from the newest "
                                "checkpoint (saved every 20 steps)"
                      : spare ? "one worker killed; a hot spare takes its rank"
                              : "one worker killed; live recovery");
  std::printf("%-6s %10s %10s %10s %9s\n", "trial", "detect s", "start s",
              "resume s", "repeated");
  for (int i = 0; i < trials; ++i) {
    lockstep::Trial t = bench->RunTrial(random, restore);
    if (t.detect_s < 0 || t.resume_s < 0) ++failed;
    std::printf("%-6d %10.3f %10.3f %10.3f %9lld\n", i + 1, t.detect_s,
                t.start_s, t.resume_s, static_cast<long long>(t.repeated));
    detect.push_back(t.detect_s);
    start.push_back(t.start_s);
    resume.push_back(t.resume_s);
    repeated.push_back(static_cast<double>(t.repeated));
  }
  std::printf("%-6s %10.3f %10.3f %10.3f %9.0f\n", "median",
              lockstep::Median(detect), lockstep::Median(start),
              lockstep::Median(resume), lockstep::Median(repeated));
  const std::string dir = bench->dir();
  bench.reset();  // stops every process before their folder goes
  if (failed > 0) {
    std::cerr << failed << " of " << trials
              << " trials did not recover (-1 above); logs in " << dir << "\n";
    return 1;
  }
  if (absl::Status removed = lockstep::RemoveRecursively(dir); !removed.ok()) {
    std::cerr << removed << "\n";
  }
  return 0;
}
