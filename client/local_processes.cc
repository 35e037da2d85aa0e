// The processes of `lockstep local`: the run's certificates, starting the
// coordinator and the workers, restarting a worker that dies, waiting for
// them to register (local.h).
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/connection.h"
#include "client/local.h"
#include "common/files.h"
#include "common/job_spec.h"
#include "common/path_policy.h"
#include "common/status_macros.h"

namespace lockstep::client {
namespace {

// Reads the coordinator's "listening on HOST:PORT" line from its stdout.
absl::StatusOr<std::string> ReadListenAddress(int fd, absl::Duration timeout) {
  std::string line;
  absl::Time deadline = absl::Now() + timeout;
  while (line.find('\n') == std::string::npos) {
    int left =
        static_cast<int>(absl::ToInt64Milliseconds(deadline - absl::Now()));
    pollfd p{fd, POLLIN, 0};
    if (left <= 0 || poll(&p, 1, left) <= 0) {
      return absl::DeadlineExceededError(
          "the coordinator did not report its address in time");
    }
    char buffer[256];
    ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n <= 0) {
      return absl::UnavailableError("the coordinator exited at start");
    }
    line.append(buffer, static_cast<size_t>(n));
  }
  line = line.substr(0, line.find('\n'));
  size_t space = line.rfind(' ');
  return line.substr(space + 1);
}

std::string DescribeExit(int status) {
  if (WIFEXITED(status))
    return absl::StrCat("exited with code ", WEXITSTATUS(status));
  if (WIFSIGNALED(status))
    return absl::StrCat("was killed by signal ", WTERMSIG(status));
  return "ended";
}

// The run's CA and certificates die with the run (the CA's key is never
// written), so they may outlive any job: a worker restarted late in a long
// run must still load its certificate.
constexpr absl::Duration kLocalCertificateLifetime = absl::Hours(24 * 365);

// A worker that keeps dying is a bug to show, not to hide.
constexpr int kMaxWorkerRestarts = 5;

// The worker flags that let a local worker use exactly the paths `spec`
// names, made absolute against this folder (the workers inherit it): on
// their own machine the person running `lockstep local` chose them. An
// export must lie strictly below its root, so its root is its folder.
std::vector<std::string> RootFlags(const v1::JobSpec& spec) {
  const std::string cwd = CurrentDirectory();
  auto absolute = [&cwd](const std::string& path) {
    return path[0] == '/' ? path : cwd + "/" + path;
  };
  std::string export_folder;
  if (!spec.export_path().empty()) {
    const std::string path = absolute(spec.export_path());
    const size_t slash = path.find_last_of('/');
    export_folder = slash == 0 ? "/" : path.substr(0, slash);
  }
  std::vector<std::string> flags = {
      "--data-root", absolute(spec.data().dir().empty() ? kDefaultDataDir
                                                        : spec.data().dir())};
  for (auto [flag, path] :
       {std::pair{"--data-root", &spec.model().torchscript()},
        std::pair{"--backup-root", &spec.checkpoint().backup_dir()},
        std::pair{"--export-root", &std::as_const(export_folder)}}) {
    if (!path->empty()) flags.insert(flags.end(), {flag, absolute(*path)});
  }
  return flags;
}

}  // namespace

absl::Status LocalRun::ServeRootFlags() {
  const std::string cwd = CurrentDirectory();
  // Fashion-MNIST's Debian folder always: the examples read it.
  serve_root_flags_ = {"--data-root", kDefaultDataDir};
  for (const char* flag : {"data-root", "backup-root", "export-root"}) {
    for (const std::string& path : args_.GetAll(flag)) {
      if (path.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--", flag, " wants a folder, got an empty path"));
      }
      serve_root_flags_.insert(
          serve_root_flags_.end(),
          {absl::StrCat("--", flag), path[0] == '/' ? path : cwd + "/" + path});
    }
  }
  return absl::OkStatus();
}

absl::Status LocalRun::MakeCertificates() {
  RETURN_IF_ERROR(MakeDirectories(run_dir_ + "/tls"));
  ASSIGN_OR_RETURN(ca_, MakeCertificateAuthority(
                            absl::StrCat("lockstep local CA ", run_dir_),
                            kLocalCertificateLifetime));
  RETURN_IF_ERROR(
      TlsFlags("coordinator", "spiffe://lockstep/coordinator").status());
  RETURN_IF_ERROR(
      TlsFlags("operator", "spiffe://lockstep/operator/local").status());
  if (serve_) {
    // A read-only identity for whatever watches the pool (a dashboard).
    RETURN_IF_ERROR(
        TlsFlags("viewer", "spiffe://lockstep/viewer/local").status());
  }
  const std::string base = run_dir_ + "/tls/operator";
  operator_tls_ = {base + ".crt", base + ".key", base + "-ca.crt"};
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> LocalRun::TlsFlags(
    const std::string& name, const std::string& id) {
  if (insecure_) return std::vector<std::string>{"--insecure"};
  const std::string base = absl::StrCat(run_dir_, "/tls/", name);
  if (!PathExists(base + ".crt")) {
    CertificateSpec spec;
    spec.spiffe_id = id;
    spec.lifetime = kLocalCertificateLifetime;
    RETURN_IF_ERROR(IssueTlsFiles(ca_, spec, run_dir_ + "/tls", name).status());
  }
  return std::vector<std::string>{"--tls-cert", base + ".crt",
                                  "--tls-key",  base + ".key",
                                  "--tls-ca",   base + "-ca.crt"};
}

absl::Status LocalRun::StartProcesses() {
  int coordinator_stdout = -1;
  // This command's identity owns the machine: the local pool's admin, who
  // may give any priority (a cluster grants it, issue 52).
  std::vector<std::string> command = {
      bin_dir_ + "/lockstep-coordinator", "--listen", "127.0.0.1:0",
      "--state-dir", run_dir_ + "/state", "--admin", "operator:local",
      // Exported models come back through
      // the coordinator (issue 53).
      "--artifact-dir", run_dir_ + "/artifacts"};
  ASSIGN_OR_RETURN(std::vector<std::string> tls,
                   TlsFlags("coordinator", "spiffe://lockstep/coordinator"));
  command.insert(command.end(), tls.begin(), tls.end());
  if (metrics_port_ > 0) {
    command.insert(command.end(), {"--metrics-listen",
                                   absl::StrCat("127.0.0.1:", metrics_port_)});
  }
  RETURN_IF_ERROR(processes_
                      .Spawn("coordinator", command, {},
                             run_dir_ + "/coordinator.log", &coordinator_stdout)
                      .status());
  auto address = ReadListenAddress(coordinator_stdout, absl::Seconds(30));
  close(coordinator_stdout);
  if (!address.ok()) {
    return absl::UnavailableError(
        absl::StrCat(address.status().message(), "; its log:\n",
                     TailOfFile(run_dir_ + "/coordinator.log", 20)));
  }
  address_ = *address;
  for (int i = 0; i < workers_ + spares_; ++i) {
    RETURN_IF_ERROR(SpawnWorker(i));
  }
  processes_.StartReaper([this](const std::string& name, int status) {
    OnChildExit(name, status);
  });
  TlsOptions operator_tls = operator_tls_;
  operator_tls.insecure = insecure_;
  ASSIGN_OR_RETURN(auto credentials, LoadChannelCredentials(operator_tls));
  stub_ = Connect(address_, credentials);
  return absl::OkStatus();
}

absl::Status LocalRun::SpawnWorker(int index) {
  std::string threads = absl::StrCat(threads_);
  std::vector<std::string> env = {"OMP_NUM_THREADS=" + threads,
                                  "OPENBLAS_NUM_THREADS=" + threads};
  // Only when the workers' threads outnumber the cores: keep idle OpenMP
  // threads from spinning on cores another worker needs. Otherwise the
  // default (spin briefly, then sleep) is right: sleeping between the many
  // short parallel regions of a convolution made the CNN 2.5x slower here.
  const int cores =
      static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  if (workers_ * threads_ > cores) env.push_back("OMP_WAIT_POLICY=PASSIVE");
  // Worker i sees one GPU, i mod G, as its GPU 0; without --gpus it trains
  // on the CPU even where there is a GPU.
  std::string device = "cpu";
  if (!gpus_.empty()) {
    env.push_back("CUDA_VISIBLE_DEVICES=" + gpus_[index % gpus_.size()]);
    device = "auto";
  }
  std::vector<std::string> command = {bin_dir_ + "/lockstep-worker",
                                      "--coordinator",
                                      address_,
                                      "--host",
                                      "127.0.0.1",
                                      "--threads",
                                      threads,
                                      "--device",
                                      device};
  if (index >= workers_) command.push_back("--spare");
  command.insert(command.end(), data_plane_flags_.begin(),
                 data_plane_flags_.end());
  if (metrics_port_ > 0) {
    command.insert(command.end(),
                   {"--metrics-listen",
                    absl::StrCat("127.0.0.1:", metrics_port_ + 1 + index)});
  }
  for (const v1::JobSpec& spec : specs_) {
    for (const std::string& flag : RootFlags(spec)) command.push_back(flag);
  }
  command.insert(command.end(), serve_root_flags_.begin(),
                 serve_root_flags_.end());
  // Each process has an identity of its own; a restart keeps it.
  const std::string name =
      absl::StrCat(index >= workers_ ? "local-spare-" : "local-worker-", index);
  ASSIGN_OR_RETURN(
      std::vector<std::string> tls,
      TlsFlags(name,
               absl::StrCat("spiffe://lockstep/",
                            index >= workers_ ? "spare/" : "worker/", name)));
  command.insert(command.end(), tls.begin(), tls.end());
  return processes_
      .Spawn(absl::StrCat("worker ", index), command, env,
             absl::StrCat(run_dir_, "/worker-", index, ".log"))
      .status();
}

void LocalRun::OnChildExit(const std::string& name, int status) {
  if (finishing_) return;
  const bool worker = name != "coordinator";
  const std::string log =
      worker ? absl::StrCat(run_dir_, "/worker-",
                            name.substr(name.find(' ') + 1), ".log")
             : run_dir_ + "/coordinator.log";
  if (worker) {
    int index = std::stoi(name.substr(name.find(' ') + 1));
    bool restart;
    {
      absl::MutexLock lock(&mu_);
      restart = ++worker_restarts_[index] <= kMaxWorkerRestarts;
    }
    if (restart) {
      progress() << "lockstep local: " << name << " " << DescribeExit(status)
                 << "; restarting it" << std::endl;
      absl::Status spawned = SpawnWorker(index);
      if (spawned.ok()) return;
      absl::MutexLock lock(&mu_);
      if (child_failure_.empty()) {
        child_failure_ =
            absl::StrCat("cannot restart ", name, ": ", spawned.message());
      }
    }
  }
  {
    absl::MutexLock lock(&mu_);
    if (!child_failure_.empty()) return;
    child_failure_ = absl::StrCat(
        name, " ", DescribeExit(status),
        worker ? absl::StrCat(" after ", kMaxWorkerRestarts, " restarts") : "",
        "; the end of its log (", log, "):\n", TailOfFile(log, 15));
  }
  absl::MutexLock lock(&watch_mu_);
  watch_cancelled_ = true;
  if (watch_context_ != nullptr) watch_context_->TryCancel();
}

absl::Status LocalRun::WaitForWorkers(absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  int registered = 0;
  while (absl::Now() < deadline) {
    {
      absl::MutexLock lock(&mu_);
      if (!child_failure_.empty()) {
        return absl::UnavailableError(child_failure_);
      }
    }
    if (serve_) {
      // --serve blocks SIGINT and SIGTERM (RunLocal): one that arrives
      // before the pool is up ends it here.
      sigset_t signals;
      sigemptyset(&signals);
      sigaddset(&signals, SIGINT);
      sigaddset(&signals, SIGTERM);
      const timespec now = {0, 0};
      if (sigtimedwait(&signals, nullptr, &now) > 0) {
        return absl::CancelledError(
            "stopped by a signal before every worker registered");
      }
    }
    auto workers = FetchWorkers(stub_.get(), address_, 5);
    if (workers.ok()) {
      registered = 0;
      for (const v1::WorkerInfo& worker : *workers) {
        if (worker.connected()) ++registered;
      }
      if (registered >= workers_ + spares_) return absl::OkStatus();
    }
    absl::SleepFor(absl::Milliseconds(10));  // a poll, not a wait for time
  }
  return absl::DeadlineExceededError(
      absl::StrCat("only ", registered, " of ", workers_ + spares_,
                   " workers registered within ", absl::FormatDuration(timeout),
                   "; see their logs"));
}

}  // namespace lockstep::client
