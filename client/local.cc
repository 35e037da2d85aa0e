// `lockstep local`: a coordinator and N workers on 127.0.0.1, one job, then
// everything is torn down. The same binaries and protocol as a cluster.
#include <google/protobuf/struct.pb.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <string>
#include <thread>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "client/commands.h"
#include "client/process.h"
#include "client/views.h"
#include "common/cert_maker.h"
#include "common/files.h"
#include "common/job_spec.h"
#include "common/path_policy.h"
#include "common/status_macros.h"
#include "common/tls.h"

namespace lockstep::client {
namespace {

constexpr char kLocalUsage[] =
    R"(Usage: lockstep local --workers N [--spares N] [--gpus] [--json] [--insecure] [--metrics-port PORT] [--set field=value ...] JOB.json

Runs JOB.json on a coordinator process and N worker processes on this
machine (127.0.0.1), streams progress, and exits 0 when the job succeeds.
A worker process that dies (kill -9, a crash) is restarted, as Kubernetes
would restart its pod, up to 5 times; the job recovers its state from the
surviving workers or, with checkpoint.backup_dir, from the last checkpoint.

Flags:
  --workers N          worker processes (replicas); default 2
  --spares N           extra worker processes started as hot spares
                       (lockstep-worker --spare): they load the job's data
                       and take the rank of a worker that dies at once,
                       instead of waiting for its restart; default 0
  --gpus               train on this machine's GPUs: worker i gets GPU
                       i mod G of the G GPUs (those in CUDA_VISIBLE_DEVICES
                       when it is set, else every GPU nvidia-smi -L lists)
                       through CUDA_VISIBLE_DEVICES, and runs with
                       --device auto. communication.backend "auto" is then
                       NCCL when each worker has a GPU of its own, Gloo when
                       workers share one. Without --gpus the workers train on
                       the CPU (--device cpu)
  --set field=value    override a job-spec field; repeatable
                       (e.g. --set epochs=1 --set per_replica_batch_size=32)
  --json               progress on stderr; the last line of stdout is one JSON
                       object: state, workers, steps, epochs, final_loss,
                       test_accuracy, samples_per_second, generations,
                       backend (gloo or nccl), model_digest, startup_seconds
                       (processes up and registered), first_step_seconds
                       (from submitting the job to its first step), ...
  --metrics-out FILE   write the per-step loss history as CSV (step,loss)
  --metrics-port PORT  serve Prometheus metrics on 127.0.0.1: the
                       coordinator's at http://127.0.0.1:PORT/metrics, worker
                       I's (spares after the workers) at port PORT+1+I
  --threads N          compute threads per worker (default: cores / N)
  --keep-logs          keep the run directory (logs, state) after success
  --insecure           run the daemons without TLS (--insecure): anyone who
                       can reach 127.0.0.1 may call them

The run uses mutual TLS like a cluster: a CA made for the run (its key
never leaves this process) signs a certificate for the coordinator
(spiffe://lockstep/coordinator, for localhost and 127.0.0.1), one per worker
process (spiffe://lockstep/worker/local-worker-I, .../local-spare-I) and one
for this command (spiffe://lockstep/operator/local), in the run directory's
tls/ folder (keys 0600). The command prints the LOCKSTEP_TLS_* exports that
point another lockstep command at the run while it lasts.

The workers may use exactly the paths JOB.json names (data.dir,
model.torchscript, checkpoint.backup_dir, export) and no others: you own
this machine and chose them (lockstep-worker --data-root, --backup-root,
--export-root). export still never replaces a file that is not a lockstep
export, and clean-up after success removes only what lockstep wrote.

Examples:
  lockstep local --workers 2 examples/fashion_mnist_mlp.json
  lockstep local --workers 2 --gpus examples/fashion_mnist_cnn.json
  lockstep local --workers 2 --spares 1 examples/fashion_mnist_mlp.json
)";

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

// The GPUs `lockstep local --gpus` hands out, as CUDA_VISIBLE_DEVICES
// entries: those of our own CUDA_VISIBLE_DEVICES when it is set, else the
// indices of the GPUs `nvidia-smi -L` lists. Errors: InvalidArgument (a
// usage error) when there are none.
absl::StatusOr<std::vector<std::string>> VisibleGpus() {
  std::vector<std::string> gpus;
  if (const char* visible = std::getenv("CUDA_VISIBLE_DEVICES")) {
    for (absl::string_view entry : absl::StrSplit(visible, ',')) {
      entry = absl::StripAsciiWhitespace(entry);
      // CUDA stops at the first invalid entry, such as -1 (no GPU).
      if (entry.empty() || entry[0] == '-') break;
      gpus.emplace_back(entry);
    }
    if (gpus.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--gpus: CUDA_VISIBLE_DEVICES is \"", visible,
          "\", which leaves no GPU; unset it, or run without --gpus"));
    }
    return gpus;
  }
  FILE* pipe = popen("nvidia-smi -L 2>/dev/null", "r");
  if (pipe != nullptr) {
    char line[512];
    while (fgets(line, sizeof(line), pipe) != nullptr) {
      // "GPU 0: NVIDIA H200 (UUID: GPU-...)"; MIG devices are indented.
      if (absl::StartsWith(line, "GPU ")) {
        gpus.push_back(absl::StrCat(gpus.size()));
      }
    }
    pclose(pipe);
  }
  if (gpus.empty()) {
    return absl::InvalidArgumentError(
        "--gpus: nvidia-smi -L lists no GPU on this machine (or nvidia-smi "
        "is not installed); run without --gpus to train on the CPU");
  }
  return gpus;
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

class LocalRun {
 public:
  LocalRun(const Args& args, std::string bin_dir)
      : args_(args), bin_dir_(std::move(bin_dir)) {}
  int Run();

 private:
  absl::Status Prepare();
  // The run's CA, and the coordinator's and this command's certificates.
  absl::Status MakeCertificates();
  // The TLS flags of a daemon whose certificate is `<run>/tls/<name>.*`,
  // issued now when missing (a worker's, at its first start).
  absl::StatusOr<std::vector<std::string>> TlsFlags(const std::string& name,
                                                    const std::string& id);
  absl::Status StartProcesses();
  // Waits until every worker has registered with the coordinator; fails
  // early when a process dies for good.
  absl::Status WaitForWorkers(absl::Duration timeout);
  absl::Status SpawnWorker(int index);
  // Called for every child that exits before the run ends: a worker is
  // restarted (as Kubernetes would), up to kMaxWorkerRestarts times.
  void OnChildExit(const std::string& name, int status);
  int Finish(const absl::StatusOr<v1::JobStatus>& final_status);
  void PrintJson(const v1::JobStatus& status, double wall_seconds);
  // How to point another lockstep command at this run.
  void PrintCliHint();
  std::ostream& progress() { return json_ ? std::cerr : std::cout; }

  const Args& args_;
  const std::string bin_dir_;
  bool json_ = false;
  int workers_ = 2;
  int spares_ = 0;  // worker indexes workers_.. are spares
  int threads_ = 1;
  // --metrics-port: the coordinator's /metrics port, the workers' after it;
  // 0 serves none.
  int metrics_port_ = 0;
  // With --gpus: the CUDA_VISIBLE_DEVICES entries handed out round-robin.
  std::vector<std::string> gpus_;
  v1::JobSpec spec_;
  std::string run_dir_;
  // Without --insecure: the run's CA (its key only in memory) and the
  // operator's credentials this command calls the coordinator with.
  bool insecure_ = false;
  KeyAndCertificate ca_;
  TlsOptions operator_tls_;
  std::string address_;
  ProcessGroup processes_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
  grpc::ClientContext watch_context_;
  std::atomic<bool> finishing_{false};
  absl::Mutex mu_;
  std::string child_failure_ ABSL_GUARDED_BY(mu_);
  std::map<int, int> worker_restarts_ ABSL_GUARDED_BY(mu_);
  absl::Time start_;
  // From starting the processes to every worker registered (their start:
  // mostly loading LibTorch).
  double startup_seconds_ = -1;
  // From submitting the job (every worker ready) to the chief's report of
  // its first step.
  double first_step_seconds_ = -1;
};

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

absl::Status LocalRun::Prepare() {
  json_ = args_.Has("json");
  ASSIGN_OR_RETURN(workers_, args_.GetInt("workers", 2));
  if (workers_ < 1 || workers_ > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("--workers must be between 1 and 64, got ", workers_));
  }
  ASSIGN_OR_RETURN(spares_, args_.GetInt("spares", 0));
  if (spares_ < 0 || spares_ > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("--spares must be between 0 and 64, got ", spares_));
  }
  if (args_.positional().size() != 1) {
    return absl::InvalidArgumentError(
        "lockstep local needs exactly one JOB.json; see --help");
  }
  ASSIGN_OR_RETURN(spec_, LoadSpec(args_.positional()[0], args_.GetAll("set")));
  if (spec_.num_workers() == 0) spec_.set_num_workers(workers_);
  if (spec_.num_workers() != workers_) {
    return absl::InvalidArgumentError(
        absl::StrCat("the job asks for num_workers ", spec_.num_workers(),
                     " but --workers is ", workers_, "; make them agree"));
  }
  RETURN_IF_ERROR(ValidateJobSpec(spec_, workers_));
  if (args_.Has("gpus")) {
    ASSIGN_OR_RETURN(gpus_, VisibleGpus());
  }
  int cores =
      static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  ASSIGN_OR_RETURN(threads_,
                   args_.GetInt("threads", std::max(1, cores / workers_)));
  if (threads_ < 1) return absl::InvalidArgumentError("--threads must be >= 1");
  ASSIGN_OR_RETURN(metrics_port_, args_.GetInt("metrics-port", 0));
  if (args_.Has("metrics-port") &&
      (metrics_port_ < 1 || metrics_port_ > 65535 - workers_ - spares_)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--metrics-port must leave room for ", 1 + workers_ + spares_,
        " ports from 1 to 65535 (the coordinator's, then each worker's), got ",
        metrics_port_));
  }

  std::string tmpl =
      absl::StrCat(std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp",
                   "/lockstep-local-XXXXXX");
  if (mkdtemp(tmpl.data()) == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create a run directory from ", tmpl));
  }
  run_dir_ = tmpl;
  insecure_ = args_.Has(kInsecureFlag);
  return insecure_ ? absl::OkStatus() : MakeCertificates();
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
  std::vector<std::string> command = {bin_dir_ + "/lockstep-coordinator",
                                      "--listen", "127.0.0.1:0", "--state-dir",
                                      run_dir_ + "/state"};
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
  if (metrics_port_ > 0) {
    command.insert(command.end(),
                   {"--metrics-listen",
                    absl::StrCat("127.0.0.1:", metrics_port_ + 1 + index)});
  }
  for (const std::string& flag : RootFlags(spec_)) command.push_back(flag);
  // Each process has an identity of its own; a restart keeps it.
  const std::string name =
      absl::StrCat(index >= workers_ ? "local-spare-" : "local-worker-", index);
  ASSIGN_OR_RETURN(std::vector<std::string> tls,
                   TlsFlags(name, "spiffe://lockstep/worker/" + name));
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
  watch_context_.TryCancel();
}

void LocalRun::PrintCliHint() {
  std::cout << "lockstep local: to use the CLI on this run meanwhile:\n"
            << "  export LOCKSTEP_COORDINATOR=" << address_;
  if (insecure_) {
    std::cout << " LOCKSTEP_INSECURE=1\n";
  } else {
    std::cout << " \\\n    LOCKSTEP_TLS_CERT=" << operator_tls_.cert_file
              << " \\\n    LOCKSTEP_TLS_KEY=" << operator_tls_.key_file
              << " \\\n    LOCKSTEP_TLS_CA=" << operator_tls_.ca_file << "\n";
  }
  std::cout << std::flush;
}

void LocalRun::PrintJson(const v1::JobStatus& status, double wall_seconds) {
  using google::protobuf::Struct;
  using google::protobuf::Value;
  Struct out;
  auto& f = *out.mutable_fields();
  f["state"].set_string_value(StateName(status.state()));
  f["job_id"].set_string_value(status.job_id());
  f["workers"].set_number_value(status.world_size());
  f["steps"].set_number_value(static_cast<double>(status.step()));
  f["epochs"].set_number_value(status.epoch() + 1);
  f["final_loss"].set_number_value(status.loss());
  f["test_accuracy"].set_number_value(status.test_accuracy());
  f["samples_per_second"].set_number_value(status.samples_per_second());
  f["generations"].set_number_value(status.generations());
  f["backend"].set_string_value(status.backend());
  f["wall_seconds"].set_number_value(wall_seconds);
  f["startup_seconds"].set_number_value(startup_seconds_);
  f["first_step_seconds"].set_number_value(first_step_seconds_);
  std::string digest =
      status.ranks_size() ? status.ranks(0).model_digest() : "";
  f["model_digest"].set_string_value(digest);
  auto* digests = f["rank_digests"].mutable_list_value();
  for (const v1::RankResult& rank : status.ranks()) {
    digests->add_values()->set_string_value(rank.model_digest());
  }
  if (status.has_breakdown()) {
    const v1::StepBreakdown& b = status.breakdown();
    auto& split =
        *f["step_breakdown_ms"].mutable_struct_value()->mutable_fields();
    split["data"].set_number_value(b.data_ms());
    split["forward"].set_number_value(b.forward_ms());
    split["backward"].set_number_value(b.backward_ms());
    split["exposed_comm"].set_number_value(b.exposed_comm_ms());
    split["optimizer"].set_number_value(b.optimizer_ms());
    split["saves"].set_number_value(b.saves());
    split["save_stall"].set_number_value(b.save_stall_ms());
  }
  if (!status.error().empty()) f["error"].set_string_value(status.error());
  std::cout << ToJson(out) << std::endl;
}

int LocalRun::Finish(const absl::StatusOr<v1::JobStatus>& final_status) {
  double wall = absl::ToDoubleSeconds(absl::Now() - start_);
  v1::JobStatus status;
  if (final_status.ok()) {
    // The final record, with the loss history.
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(10));
    v1::GetJobStatusRequest request;
    request.set_job_id(final_status->job_id());
    request.set_include_history(true);
    v1::GetJobStatusResponse response;
    status = stub_->GetJobStatus(&context, request, &response).ok() &&
                     response.jobs_size() == 1
                 ? response.jobs(0)
                 : *final_status;
  }
  finishing_ = true;
  processes_.TerminateAll(absl::Seconds(5));

  std::string child_failure;
  {
    absl::MutexLock lock(&mu_);
    child_failure = child_failure_;
  }
  if (!final_status.ok()) {
    std::cerr << "lockstep: "
              << (child_failure.empty()
                      ? std::string(final_status.status().message())
                      : child_failure)
              << "\nlogs are in " << run_dir_ << std::endl;
    return kExitJobFailed;
  }
  if (args_.Has("metrics-out")) {
    std::ofstream out(args_.Get("metrics-out"));
    out << "step,loss\n";
    for (int i = 0; i < status.step_losses_size(); ++i) {
      out << i + 1 << "," << absl::StrFormat("%.9g", status.step_losses(i))
          << "\n";
    }
    if (!out) {
      std::cerr << "lockstep: cannot write " << args_.Get("metrics-out")
                << "\n";
    }
  }
  bool ok = status.state() == v1::JOB_STATE_SUCCEEDED;
  for (const v1::RankResult& rank : status.ranks()) {
    if (ok && rank.model_digest() != status.ranks(0).model_digest()) {
      status.set_state(v1::JOB_STATE_FAILED);
      status.set_error(absl::StrCat(
          "rank ", rank.rank(), " ended with a different model than rank 0"));
      ok = false;
    }
  }
  progress() << absl::StrFormat(
                    "%s %s in %.1f s: %d steps, loss %.4f, test accuracy "
                    "%.2f%%, %.0f samples/s on %d workers",
                    status.job_id(), StateName(status.state()), wall,
                    status.step(), status.loss(), 100 * status.test_accuracy(),
                    status.samples_per_second(), status.world_size())
             << std::endl;
  if (!ok) {
    std::cerr << "lockstep: " << status.error() << "\nlogs are in " << run_dir_
              << std::endl;
  }
  if (json_) PrintJson(status, wall);
  if (ok && !args_.Has("keep-logs")) {
    absl::Status removed = RemoveRecursively(run_dir_);
    if (!removed.ok()) {
      std::cerr << "lockstep: " << removed.message()
                << " (leaving the run's logs behind)" << std::endl;
    }
  }
  return ok ? kExitOk : kExitJobFailed;
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
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(5));
    v1::ListWorkersResponse response;
    if (stub_->ListWorkers(&context, v1::ListWorkersRequest(), &response)
            .ok()) {
      registered = 0;
      for (const v1::WorkerInfo& worker : response.workers()) {
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

int LocalRun::Run() {
  absl::Status prepared = Prepare();
  if (!prepared.ok()) return Fail(prepared);
  start_ = absl::Now();
  absl::Status started = StartProcesses();
  if (!started.ok()) {
    finishing_ = true;
    processes_.TerminateAll(absl::Seconds(2));
    std::cerr << "lockstep: " << started.message() << "\nlogs are in "
              << run_dir_ << std::endl;
    return kExitJobFailed;
  }
  progress() << "lockstep local: coordinator on " << address_ << ", "
             << workers_ << " workers"
             << (spares_ > 0 ? absl::StrCat(" + ", spares_,
                                            spares_ == 1 ? " spare" : " spares")
                             : "")
             << " x " << threads_ << " threads"
             << (gpus_.empty()
                     ? std::string(" on the CPU")
                     : absl::StrCat(" on ", gpus_.size(),
                                    gpus_.size() == 1 ? " GPU" : " GPUs"))
             << (insecure_ ? ", without TLS (--insecure)" : ", mutual TLS")
             << "; logs in " << run_dir_ << std::endl;
  if (metrics_port_ > 0) {
    progress() << "lockstep local: metrics at http://127.0.0.1:"
               << metrics_port_ << "/metrics (coordinator) and ports "
               << metrics_port_ + 1 << "-" << metrics_port_ + workers_ + spares_
               << " (workers)" << std::endl;
  }
  if (!json_) PrintCliHint();
  // The job starts when the workers are up, as on a cluster of running
  // daemons: its time to the first step is then the job's own.
  absl::Status ready = WaitForWorkers(absl::Seconds(60));
  if (!ready.ok()) {
    finishing_ = true;
    processes_.TerminateAll(absl::Seconds(2));
    std::cerr << "lockstep: " << ready.message() << "\nlogs are in " << run_dir_
              << std::endl;
    return kExitJobFailed;
  }
  startup_seconds_ = absl::ToDoubleSeconds(absl::Now() - start_);

  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(10));
  v1::SubmitJobRequest request;
  *request.mutable_spec() = spec_;
  v1::SubmitJobResponse response;
  grpc::Status rpc = stub_->SubmitJob(&context, request, &response);
  if (!rpc.ok()) {
    finishing_ = true;
    processes_.TerminateAll(absl::Seconds(2));
    return Fail(absl::Status(static_cast<absl::StatusCode>(rpc.error_code()),
                             rpc.error_message()));
  }
  ProgressView view(progress(), !json_ && isatty(STDOUT_FILENO));
  const absl::Time submitted = absl::Now();
  auto final_status = WatchJob(
      stub_.get(), response.job_id(), &watch_context_,
      [&](const v1::JobStatus& status) {
        if (first_step_seconds_ < 0 && status.step() >= 1) {
          first_step_seconds_ = absl::ToDoubleSeconds(absl::Now() - submitted);
        }
        view.Update(status);
      });
  if (final_status.ok()) view.Update(*final_status);
  return Finish(final_status);
}

}  // namespace

int RunLocal(const std::vector<std::string>& argv, const std::string& bin_dir) {
  auto args = Args::Parse(
      argv,
      {"workers", "spares", "set", "metrics-out", "threads", "metrics-port"},
      {"json", "keep-logs", "gpus", "help", kInsecureFlag});
  if (!args.ok()) return Fail(args.status());
  if (args->Has("help")) {
    std::cout << kLocalUsage;
    return kExitOk;
  }
  LocalRun run(*args, bin_dir);
  return run.Run();
}

}  // namespace lockstep::client
