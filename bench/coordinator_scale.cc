// The control plane at scale: N simulated workers against a real
// lockstep-coordinator process. For each N the bench starts a coordinator
// (ephemeral port, temporary state dir, --heartbeat-timeout 2 unless
// the bench is given another), then, in this
// process and on gRPC's callback client API (no thread per stream; the
// streams spread over a few channels, each its own HTTP/2 connection):
//   register - N free RegisterWorker calls
//   connect  - N worker sessions opened, until all are listed as connected;
//              each then heartbeats at the rate the real worker does (half
//              the heartbeat timeout), naming its generation once assigned
//   start    - a job with num_workers = N submitted, until every simulated
//              worker holds its Assignment
//   kv       - each rank sets its key and reads rank 0's (the bootstrap a
//              real rank does), until all N reads returned
//   detect   - one rank's stream cancelled, as a SIGKILLed process's would
//              be, until every other rank received the Abort
// and reports the coordinator's threads and resident memory with every
// session open, and the CPU seconds it used over the run.
//
//   coordinator_scale COORDINATOR_BINARY [--heartbeat-timeout S] N...
//     e.g. coordinator_scale bin/lockstep-coordinator 100 1000 5000
//
// A run that does not reach a phase's end within kPhaseLimit fails (exit 1);
// its folder, with the coordinator's log, is then kept.
#include <grpcpp/grpcpp.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "client/process.h"
#include "lockstep/v1/coordinator.grpc.pb.h"

namespace lockstep {
namespace {

constexpr int kChannels = 16;
// lockstep-coordinator --heartbeat-timeout, unless --heartbeat-timeout S.
double heartbeat_timeout_s = 2;
// A safety net against a coordinator that stopped answering, not a target.
constexpr absl::Duration kPhaseLimit = absl::Seconds(120);

// What the simulated workers saw, counted across all of them.
class Tally {
 public:
  void Add(int Tally::*field) {
    absl::MutexLock lock(&mu_);
    ++(this->*field);
    if (field == &Tally::aborted) last_abort_ = absl::Now();
  }
  // Waits until `field` reaches `count`; false once a rendezvous call
  // failed (the generation was aborted) or after kPhaseLimit.
  bool Await(int Tally::*field, int count) {
    absl::MutexLock lock(&mu_);
    auto over = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return this->*field >= count || errors > 0;
    };
    mu_.AwaitWithTimeout(absl::Condition(&over), kPhaseLimit);
    return this->*field >= count;
  }
  // When the last Abort arrived.
  absl::Time last_abort() {
    absl::MutexLock lock(&mu_);
    return last_abort_;
  }

  int assigned = 0;
  int aborted = 0;
  int rendezvous = 0;
  int errors = 0;
  int done = 0;

 private:
  absl::Mutex mu_;
  absl::Time last_abort_;
};

// One simulated worker: its session stream and its rendezvous calls.
class SimWorker final : public grpc::ClientBidiReactor<v1::WorkerMessage,
                                                       v1::CoordinatorCommand> {
 public:
  SimWorker(v1::Coordinator::Stub* stub, Tally* tally, std::string id,
            uint64_t incarnation)
      : stub_(stub), tally_(tally), id_(std::move(id)) {
    outgoing_.mutable_hello()->set_worker_id(id_);
    outgoing_.mutable_hello()->set_incarnation(incarnation);
  }

  void Start() {
    stub_->async()->WorkerSession(&context_, this);
    absl::MutexLock lock(&mu_);
    writing_ = true;
    StartWrite(&outgoing_);
    beat_pending_ = true;  // the real worker beats as soon as it is in
    StartRead(&incoming_);
    StartCall();
  }

  // A heartbeat: now, or as soon as the previous write is done (as the real
  // worker's blocking send would).
  void Heartbeat() {
    absl::MutexLock lock(&mu_);
    if (ended_) return;
    if (writing_) {
      beat_pending_ = true;
      return;
    }
    WriteHeartbeatLocked();
  }

  // Sets this rank's key, then reads rank 0's.
  void Rendezvous() {
    absl::MutexLock lock(&mu_);
    set_.set_job_id(assignment_.job_id());
    set_.set_generation(assignment_.generation());
    set_.set_key(absl::StrCat("bench/", assignment_.rank()));
    set_.set_value(id_);
    set_.set_rank(assignment_.rank());
    set_.set_rank_token(assignment_.rank_token());
    stub_->async()->KvSet(&set_context_, &set_, &set_response_,
                          [this](grpc::Status status) { OnSet(status); });
  }

  // As a killed process's stream ends.
  void Kill() { context_.TryCancel(); }

  void OnReadDone(bool ok) override {
    if (!ok) return;
    if (incoming_.has_assignment()) {
      {
        absl::MutexLock lock(&mu_);
        assignment_ = incoming_.assignment();
      }
      tally_->Add(&Tally::assigned);
    } else if (incoming_.has_abort()) {
      tally_->Add(&Tally::aborted);
    }
    StartRead(&incoming_);
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    if (!ok) ended_ = true;
    if (beat_pending_ && !ended_) WriteHeartbeatLocked();
  }

  void OnDone(const grpc::Status&) override {
    {
      absl::MutexLock lock(&mu_);
      ended_ = true;
    }
    tally_->Add(&Tally::done);
  }

 private:
  void WriteHeartbeatLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    beat_pending_ = false;
    outgoing_.Clear();
    v1::Heartbeat* beat = outgoing_.mutable_heartbeat();
    beat->set_job_id(assignment_.job_id());
    beat->set_generation(assignment_.generation());
    writing_ = true;
    StartWrite(&outgoing_);
  }

  void OnSet(const grpc::Status& status) {
    if (!status.ok()) {
      tally_->Add(&Tally::errors);
      return;
    }
    get_.set_job_id(set_.job_id());
    get_.set_generation(set_.generation());
    get_.set_key("bench/0");
    get_.set_timeout_ms(absl::ToInt64Milliseconds(kPhaseLimit));
    stub_->async()->KvGet(
        &get_context_, &get_, &get_response_, [this](grpc::Status status) {
          tally_->Add(status.ok() ? &Tally::rendezvous : &Tally::errors);
        });
  }

  v1::Coordinator::Stub* const stub_;
  Tally* const tally_;
  const std::string id_;
  grpc::ClientContext context_;
  v1::CoordinatorCommand incoming_;  // touched by the reads only

  grpc::ClientContext set_context_, get_context_;
  v1::KvSetRequest set_;
  v1::KvSetResponse set_response_;
  v1::KvGetRequest get_;
  v1::KvGetResponse get_response_;

  absl::Mutex mu_;
  v1::WorkerMessage outgoing_ ABSL_GUARDED_BY(mu_);
  v1::Assignment assignment_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool beat_pending_ ABSL_GUARDED_BY(mu_) = false;
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
};

// A /proc/PID/status field ("Threads", "VmRSS") as its first number.
int64_t ProcStatus(pid_t pid, const std::string& field) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(field + ":", 0) != 0) continue;
    std::istringstream rest(line.substr(field.size() + 1));
    int64_t value = -1;
    rest >> value;
    return value;
  }
  return -1;
}

// utime + stime of `pid`, in seconds.
double CpuSeconds(pid_t pid) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string text((std::istreambuf_iterator<char>(in)),
                   std::istreambuf_iterator<char>());
  size_t close = text.rfind(')');
  if (close == std::string::npos) return -1;
  std::istringstream fields(text.substr(close + 2));
  std::string skip;
  for (int i = 3; i < 14; ++i) fields >> skip;  // state .. cmajflt
  double utime = 0, stime = 0;
  fields >> utime >> stime;
  return (utime + stime) / sysconf(_SC_CLK_TCK);
}

std::string LoadAverage() {
  std::ifstream in("/proc/loadavg");
  std::string one, five;
  in >> one >> five;
  return absl::StrCat(one, " ", five);
}

struct Result {
  bool ok = false;
  std::string failed_at;
  int64_t threads = -1, rss_kb = -1;
  double cpu_s = -1, register_s = -1, connect_s = -1, start_s = -1, kv_s = -1,
         detect_ms = -1;
};

class Run {
 public:
  Run(std::string coordinator, int n)
      : coordinator_(std::move(coordinator)), n_(n) {}
  ~Run() {
    StopHeartbeats();
    for (auto& worker : workers_) worker->Kill();
    if (!workers_.empty()) tally_.Await(&Tally::done, started_);
    processes_.TerminateAll(absl::Seconds(5));
  }

  const std::string& dir() const { return dir_; }

  Result Go() {
    Result r;
    if (!StartCoordinator()) return Fail(r, "starting the coordinator");
    const double cpu_start = CpuSeconds(pid_);
    absl::Time t = absl::Now();
    if (!RegisterAll()) return Fail(r, "register");
    r.register_s = Seconds(t);

    t = absl::Now();
    for (auto& worker : workers_) {
      worker->Start();
      ++started_;
    }
    heartbeats_ = std::thread([this] { Heartbeats(); });
    if (!AwaitConnected()) return Fail(r, "connect");
    r.connect_s = Seconds(t);

    t = absl::Now();
    if (!Submit()) return Fail(r, "submit");
    if (!tally_.Await(&Tally::assigned, n_)) return Fail(r, "start");
    r.start_s = Seconds(t);

    t = absl::Now();
    for (auto& worker : workers_) worker->Rendezvous();
    if (!tally_.Await(&Tally::rendezvous, n_)) return Fail(r, "kv");
    r.kv_s = Seconds(t);
    r.threads = ProcStatus(pid_, "Threads");
    r.rss_kb = ProcStatus(pid_, "VmRSS");

    t = absl::Now();
    workers_[n_ / 2]->Kill();
    if (!tally_.Await(&Tally::aborted, n_ - 1)) return Fail(r, "detect");
    r.detect_ms = absl::ToDoubleMilliseconds(tally_.last_abort() - t);
    r.cpu_s = CpuSeconds(pid_) - cpu_start;
    r.ok = true;
    return r;
  }

 private:
  static double Seconds(absl::Time since) {
    return absl::ToDoubleSeconds(absl::Now() - since);
  }

  Result Fail(Result r, const std::string& phase) {
    r.failed_at = phase;
    return r;
  }

  bool StartCoordinator() {
    char tmpl[] = "/tmp/lockstep-scale-XXXXXX";
    if (mkdtemp(tmpl) == nullptr) return false;
    dir_ = tmpl;
    int out = -1;
    auto pid =
        processes_.Spawn("coordinator",
                         {coordinator_, "--listen", "127.0.0.1:0",
                          "--state-dir", dir_ + "/state", "--heartbeat-timeout",
                          absl::StrCat(heartbeat_timeout_s),
                          // Thousands of simulated workers, each registering
                          // freely: the coordinator's state machine without
                          // a certificate per worker.
                          "--insecure"},
                         {}, dir_ + "/coordinator.log", &out);
    if (!pid.ok()) return false;
    pid_ = *pid;
    std::string line;
    char c;
    while (read(out, &c, 1) == 1 && c != '\n') line.push_back(c);
    close(out);
    if (line.find(' ') == std::string::npos) return false;
    std::string address = line.substr(line.rfind(' ') + 1);
    for (int i = 0; i < kChannels; ++i) {
      // Distinct arguments: each channel gets its own connection.
      grpc::ChannelArguments args;
      args.SetInt("lockstep.bench_channel", i);
      stubs_.push_back(v1::Coordinator::NewStub(grpc::CreateCustomChannel(
          address, grpc::InsecureChannelCredentials(), args)));
    }
    return true;
  }

  bool RegisterAll() {
    for (int i = 0; i < n_; ++i) {
      v1::Coordinator::Stub* stub = stubs_[i % kChannels].get();
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(absl::Now() + kPhaseLimit));
      v1::RegisterWorkerRequest request;
      request.set_incarnation(1000 + i);
      request.set_host(absl::StrCat("sim-", i));
      v1::RegisterWorkerResponse response;
      grpc::Status status = stub->RegisterWorker(&context, request, &response);
      if (!status.ok()) {
        std::cerr << "register " << i << ": " << status.error_message() << "\n";
        return false;
      }
      workers_.push_back(std::make_unique<SimWorker>(
          stub, &tally_, response.worker_id(), 1000 + i));
    }
    return true;
  }

  bool AwaitConnected() {
    for (absl::Time give_up = absl::Now() + kPhaseLimit;
         absl::Now() < give_up;) {
      // ListWorkers is paged: every page, or the count falls short.
      int connected = 0;
      v1::ListWorkersRequest request;
      bool listed = true;
      do {
        grpc::ClientContext context;
        v1::ListWorkersResponse response;
        if (!stubs_[0]->ListWorkers(&context, request, &response).ok()) {
          listed = false;
          break;
        }
        for (const v1::WorkerInfo& info : response.workers()) {
          connected += info.connected();
        }
        request.set_page_token(response.next_page_token());
      } while (!request.page_token().empty());
      if (listed && connected == n_) return true;
      // A poll interval: a listing of 5,000 workers is not free, and polling
      // faster would load the coordinator the bench measures.
      absl::SleepFor(absl::Milliseconds(200));
    }
    return false;
  }

  bool Submit() {
    grpc::ClientContext context;
    v1::SubmitJobRequest request;
    request.mutable_spec()->set_name("scale");
    request.mutable_spec()->set_num_workers(n_);
    request.mutable_spec()->set_global_batch_size(n_);
    v1::SubmitJobResponse response;
    grpc::Status status = stubs_[0]->SubmitJob(&context, request, &response);
    if (!status.ok()) std::cerr << "submit: " << status.error_message() << "\n";
    return status.ok();
  }

  // As the real worker: a heartbeat every half of the heartbeat timeout.
  void Heartbeats() {
    const absl::Duration interval = absl::Seconds(heartbeat_timeout_s / 2);
    while (!stop_.WaitForNotificationWithTimeout(interval)) {
      for (auto& worker : workers_) worker->Heartbeat();
    }
  }

  void StopHeartbeats() {
    if (!heartbeats_.joinable()) return;
    stop_.Notify();
    heartbeats_.join();
  }

  const std::string coordinator_;
  const int n_;
  std::string dir_;
  client::ProcessGroup processes_;
  pid_t pid_ = -1;
  std::vector<std::unique_ptr<v1::Coordinator::Stub>> stubs_;
  Tally tally_;
  std::vector<std::unique_ptr<SimWorker>> workers_;
  int started_ = 0;
  absl::Notification stop_;
  std::thread heartbeats_;
};

}  // namespace
}  // namespace lockstep

int main(int argc, char** argv) {
  std::vector<std::string> sizes(argv + 2, argv + argc);
  if (sizes.size() >= 2 && sizes[0] == "--heartbeat-timeout") {
    if (!absl::SimpleAtod(sizes[1], &lockstep::heartbeat_timeout_s) ||
        !(lockstep::heartbeat_timeout_s > 0)) {
      std::cerr << "coordinator_scale: --heartbeat-timeout must be > 0\n";
      return 2;
    }
    sizes.erase(sizes.begin(), sizes.begin() + 2);
  }
  if (argc < 3 || sizes.empty()) {
    std::cerr << "usage: coordinator_scale COORDINATOR_BINARY "
                 "[--heartbeat-timeout S] N...\n";
    return 2;
  }
  std::printf(
      "coordinator %s; heartbeat timeout %gs; load average %s; %ld cores\n",
      argv[1], lockstep::heartbeat_timeout_s, lockstep::LoadAverage().c_str(),
      sysconf(_SC_NPROCESSORS_ONLN));
  std::printf("%6s %8s %8s %8s %10s %10s %8s %8s %10s\n", "N", "threads",
              "RSS MiB", "CPU s", "register s", "connect s", "start s", "kv s",
              "detect ms");
  int failed = 0;
  for (const std::string& size : sizes) {
    int n = 0;
    if (!absl::SimpleAtoi(size, &n) || n < 2) {
      std::cerr << "coordinator_scale: N must be a whole number >= 2\n";
      return 2;
    }
    auto run = std::make_unique<lockstep::Run>(argv[1], n);
    lockstep::Result r = run->Go();
    if (!r.ok) {
      std::printf("%6d failed at %s (coordinator log in %s)\n", n,
                  r.failed_at.c_str(), run->dir().c_str());
      ++failed;
      continue;
    }
    std::printf("%6d %8lld %8.1f %8.2f %10.2f %10.2f %8.2f %8.2f %10.1f\n", n,
                static_cast<long long>(r.threads), r.rss_kb / 1024.0, r.cpu_s,
                r.register_s, r.connect_s, r.start_s, r.kv_s, r.detect_ms);
    std::fflush(stdout);
    std::string dir = run->dir();
    run.reset();
    std::system(absl::StrCat("rm -rf '", dir, "'").c_str());
  }
  return failed == 0 ? 0 : 1;
}
