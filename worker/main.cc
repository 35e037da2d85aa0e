// lockstep-worker: one replica, one device. See README.md.
#include <arpa/inet.h>
#include <grpcpp/grpcpp.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <optional>
#include <random>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/args.h"
#include "common/health_service.h"
#include "common/labels.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/metrics_http.h"
#include "common/path_policy.h"
#include "common/status_macros.h"
#include "common/terminal_text.h"
#include "common/tf_config.h"
#include "common/tls.h"
#include "worker/agent.h"
#include "worker/compute_setup.h"
#include "worker/data/split_source.h"
#include "worker/rpc/grpc_control_plane.h"
#include "worker/train/trainer.h"
#include "worker/train/vector_isa.h"
#include "worker/worker_metrics.h"

namespace lockstep::worker {
namespace {

constexpr char kUsage[] =
    R"(lockstep-worker: a lockstep training worker (one replica)

Usage:
  lockstep-worker --coordinator HOST:PORT
                  (--tls-cert FILE --tls-key FILE --tls-ca FILE | --insecure)
                  [flags]

Identity comes from the TF_CONFIG environment variable (as Kubeflow's TFJob
injects it) or from --task-type/--task-index; with neither, the worker
registers freely and the coordinator gives it an id.

Flags:
  --coordinator HOST:PORT  the lockstep-coordinator (or $LOCKSTEP_COORDINATOR)
  --tls-cert FILE          this worker's certificate (PEM), which names its
                           identity (below)
  --tls-key FILE           its private key (PEM)
  --tls-ca FILE            the CA the coordinator's certificate and health
                           callers' certificates must be signed by (PEM)
  --insecure               no TLS: the worker's health port and its calls to
                           the coordinator are open and in clear text; for a
                           trusted single-user machine only
  --task-type TYPE         chief, worker or spare (overrides TF_CONFIG's task)
  --task-index N           index of this task among its type
  --spare                  register as a hot spare: stand by for the running
                           job (its data loaded) and take the rank of a worker
                           that fails (also TF_CONFIG task type "spare")
  --label KEY=VALUE        announce a label for placement (repeatable): a
                           job whose spec names placement.labels runs only on
                           workers that have them (--label zone=a; on
                           Kubernetes, from the node's labels)
  --host HOST              address peers reach this worker's data plane on
                           (default: its TF_CONFIG address, else the host name)
  --threads N              compute threads (default: all cores)
  --device DEVICE          what this worker trains on: auto (default; GPU 0
                           of those the process sees, as CUDA_VISIBLE_DEVICES
                           or Kubernetes' device plugin expose them, else the
                           CPU), cpu, or cuda:N (GPU N of those it sees)
  --health-listen HOST:PORT  serve the gRPC health service (grpc.health.v1)
                           there, for Kubernetes probes; port 0 picks one
                           (the address is printed on stdout). With TLS any
                           caller with a certificate from --tls-ca whose
                           SPIFFE ID names a lockstep role may check it (`lockstep health HOST:PORT`); a caller
                           without one is UNAUTHENTICATED
  --metrics-listen HOST:PORT  serve Prometheus metrics over plain HTTP at
                           http://HOST:PORT/metrics (port 0 picks one; the
                           address is printed on stdout); off by default.
                           Step time by phase, collectives, checkpoint
                           writes, device: see README.md, "Metrics"
  --metrics-tls            serve /metrics over HTTPS with --tls-cert and
                           --tls-key, answering only a client certificate of
                           --tls-ca with a viewer or operator identity; the
                           files are read again every 60 s
  --connect-timeout SECS   how long to keep trying to reach the coordinator,
                           at start and after losing it (60)
  --preempt-grace SECS     on SIGTERM, how long to wait for the job to stop at
                           an agreed step and save it before exiting (25; keep
                           it below Kubernetes' terminationGracePeriodSeconds)
  --data-root DIRS         folders a job's data.dir and model.torchscript may
                           lie under (default: /usr/share/datasets,
                           /var/lib/lockstep and $TMPDIR or /tmp)
  --backup-root DIRS       folders a job's checkpoint.backup_dir may lie under
                           (default: /var/lib/lockstep and $TMPDIR or /tmp)
  --export-root DIRS       folders a job's export may lie under (default: as
                           --backup-root)
  --data-plane-encryption on|off  encrypt the CPU collectives' traffic
                           between workers (AES-256-GCM; default on). Either
                           way each connection is authenticated with the key
                           its two ranks share before anything it sends is
                           read. off only where nobody can read the network:
                           gradients and model state then travel in clear
                           text. Every worker of a job must agree
  --data-plane-transport lockstep|gloo  gloo: Gloo's TCP pairs, which
                           authenticate nobody before parsing and encrypt
                           nothing; for comparison benchmarks only (needs
                           --insecure and --data-plane-encryption off)
  --index-cache DIR        where the record index of a TFRecord file, and the
                           column store of a CSV file, go when its own folder
                           is read-only (default: $TMPDIR or /tmp,
                           /lockstep-tfrecord-index)
  --data-threads N         threads that decode a batch's encoded images
                           (JPEG, PNG), 1 to 256 (default: the cores, at
                           most 4)
                           DIRS: absolute paths separated by ':'; each flag
                           may be repeated and replaces that default. A job
                           naming a path elsewhere (after resolving '..' and
                           symbolic links) fails with the field and the roots.

Its certificate (--tls-cert) carries its identity, the SPIFFE ID
spiffe://<trust domain>/worker/<type>/<index> of its task (e.g.
.../worker/worker/1), or .../worker/<name> for a worker without a task; the
coordinator's certificate must name the host in --coordinator.

Example:
  TF_CONFIG='{"cluster":{"worker":["w0:7071","w1:7071"]},"task":{"type":"worker","index":1}}' \
      lockstep-worker --coordinator coord:7070 --tls-cert /etc/lockstep/tls/tls.crt \
      --tls-key /etc/lockstep/tls/tls.key --tls-ca /etc/lockstep/tls/ca.crt
)";

// SIGTERM/SIGINT wake the preemption thread through this pipe; a second
// signal exits at once.
int g_terminate_pipe[2] = {-1, -1};

void OnTerminate(int) {
  static volatile sig_atomic_t signals = 0;
  if (++signals > 1 || g_terminate_pipe[1] < 0) {
    static const char kMessage[] = "lockstep-worker: terminated; exiting\n";
    (void)!write(STDERR_FILENO, kMessage, sizeof(kMessage) - 1);
    _exit(0);
  }
  char byte = 1;
  (void)!write(g_terminate_pipe[1], &byte, 1);
}

int Fail(const absl::Status& status, int code) {
  std::cerr << "lockstep-worker: " << status.message() << "\n";
  return code;
}

uint64_t RandomIncarnation() {
  std::random_device device;
  return (uint64_t{device()} << 32) ^ device();
}

std::string HostOf(const std::string& address) {
  return address.substr(0, address.rfind(':'));
}

// The roots of --data-root, --backup-root and --export-root; a kind whose
// flag is not given keeps its default (common/path_policy.h).
absl::StatusOr<PathRoots> PathRootsOf(const Args& args) {
  PathRoots roots = DefaultPathRoots();
  for (auto [flag, list] : {std::pair{"data-root", &roots.data},
                            std::pair{"backup-root", &roots.backup},
                            std::pair{"export-root", &roots.exports}}) {
    if (!args.Has(flag)) continue;
    ASSIGN_OR_RETURN(*list,
                     ParseRoots(args.GetAll(flag), absl::StrCat("--", flag)));
  }
  LogInfo("jobs may read data under ", absl::StrJoin(roots.data, ":"),
          ", save checkpoints under ", absl::StrJoin(roots.backup, ":"),
          " and export under ", absl::StrJoin(roots.exports, ":"));
  return roots;
}

// The flags once checked: everything Run needs besides the servers.
struct WorkerFlags {
  std::string coordinator;
  TlsMaterial tls;
  v1::RegisterWorkerRequest registration;  // identity, device and host
  int threads = 1;
  absl::Duration connect_timeout;
  absl::Duration preempt_grace;
  PathRoots roots;
  bool data_plane_encryption = true;
  bool data_plane_gloo = false;
};

// Who this worker is: its task (TF_CONFIG, overridden by --task-type and
// --task-index), whether it is a spare, the host its peers reach it on, and
// a fresh incarnation. Errors: InvalidArgument for a malformed TF_CONFIG or
// a --task-index without a task type.
absl::StatusOr<v1::RegisterWorkerRequest> RegistrationOf(
    const Args& args, const v1::Device& device) {
  v1::RegisterWorkerRequest registration;
  registration.set_incarnation(RandomIncarnation());
  *registration.mutable_device() = device;
  std::string host;
  if (const char* tf_config = std::getenv("TF_CONFIG");
      tf_config != nullptr && *tf_config != '\0') {
    ASSIGN_OR_RETURN(TfConfig config, ParseTfConfig(tf_config));
    *registration.mutable_cluster() = config.cluster;
    if (config.task.has_value()) {
      *registration.mutable_task() = *config.task;
      host = HostOf(TaskAddress(config.cluster, *config.task));
    }
  }
  if (args.Has("task-type")) {
    registration.mutable_task()->set_type(args.Get("task-type"));
  }
  ASSIGN_OR_RETURN(int index,
                   args.GetInt("task-index", registration.task().index()));
  registration.mutable_task()->set_index(index);
  if (args.Has("task-index") && registration.task().type().empty()) {
    return absl::InvalidArgumentError(
        "--task-index needs --task-type (or TF_CONFIG)");
  }
  registration.set_spare(args.Has("spare") ||
                         registration.task().type() == "spare");
  for (const std::string& text : args.GetAll("label")) {
    ASSIGN_OR_RETURN(auto label, ParseLabel(text));
    (*registration.mutable_labels())[label.first] = label.second;
  }
  RETURN_IF_ERROR(CheckLabels("--label", registration.labels()));
  host = args.Get("host", host);
  if (host.empty()) {
    char name[256] = {};
    gethostname(name, sizeof(name) - 1);
    host = name;
  }
  registration.set_host(host);
  return registration;
}

// Whether `host` resolves to loopback addresses only (127.0.0.0/8, ::1);
// nothing when it does not resolve.
std::optional<bool> OnlyLoopback(const std::string& host) {
  std::string name = host;
  if (name.size() > 2 && name.front() == '[' && name.back() == ']') {
    name = name.substr(1, name.size() - 2);
  }
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(name.c_str(), nullptr, &hints, &found) != 0) {
    return std::nullopt;
  }
  bool loopback = found != nullptr;
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    if (a->ai_family == AF_INET) {
      const auto* in = reinterpret_cast<const sockaddr_in*>(a->ai_addr);
      loopback &= (ntohl(in->sin_addr.s_addr) >> 24) == 127;
    } else if (a->ai_family == AF_INET6) {
      const auto* in = reinterpret_cast<const sockaddr_in6*>(a->ai_addr);
      loopback &= IN6_IS_ADDR_LOOPBACK(&in->sin6_addr) != 0;
    } else {
      loopback = false;
    }
  }
  freeaddrinfo(found);
  return loopback;
}

// A worker whose data-plane host (--host, TF_CONFIG, else the host name)
// only this machine reaches, while its coordinator is on another: its peers
// could never connect, and the job would fail each generation a minute into
// the rendezvous. Errors: InvalidArgument naming both (exit 2).
absl::Status CheckPeersCanReach(const std::string& host,
                                const std::string& coordinator_host) {
  // Only when both resolve: a coordinator name that does not resolve yet
  // (a pod's first seconds) decides nothing.
  const std::optional<bool> local = OnlyLoopback(host);
  const std::optional<bool> coordinator_local = OnlyLoopback(coordinator_host);
  if (!local.value_or(false) || coordinator_local.value_or(true)) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "this worker's data-plane host '", host,
      "' (from --host, TF_CONFIG's task address or the host name) resolves "
      "to a loopback address, but the coordinator is at '",
      coordinator_host,
      "' on another host: peers elsewhere could never reach this worker; pass "
      "--host with an address they reach (or fix TF_CONFIG or /etc/hosts)"));
}

// Every flag, checked, with TLS material loaded and the device resolved.
// Errors: InvalidArgument naming the flag (exit 2).
absl::StatusOr<WorkerFlags> ParseFlags(const Args& args) {
  WorkerFlags flags;
  const char* env_coordinator = std::getenv("LOCKSTEP_COORDINATOR");
  flags.coordinator =
      args.Get("coordinator", env_coordinator ? env_coordinator : "");
  if (flags.coordinator.empty()) {
    return absl::InvalidArgumentError(
        "--coordinator HOST:PORT is required; see --help");
  }
  ASSIGN_OR_RETURN(TlsOptions tls_options, TlsOptionsFromArgs(args));
  ASSIGN_OR_RETURN(flags.tls, LoadTlsMaterial(tls_options));
  if (args.Has("metrics-tls") &&
      (!args.Has("metrics-listen") || flags.tls.insecure)) {
    return absl::InvalidArgumentError(
        "--metrics-tls needs --metrics-listen and mutual TLS (--tls-cert, "
        "--tls-key, --tls-ca): it serves /metrics with the worker's own "
        "certificate");
  }
  ASSIGN_OR_RETURN(v1::Device device,
                   ResolveDevice(args.Get("device", "auto")));
  ASSIGN_OR_RETURN(flags.registration, RegistrationOf(args, device));
  RETURN_IF_ERROR(
      CheckPeersCanReach(flags.registration.host(), HostOf(flags.coordinator)));
  const int cores =
      static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  ASSIGN_OR_RETURN(flags.threads, args.GetInt("threads", cores));
  if (flags.threads < 1) {
    return absl::InvalidArgumentError("--threads must be at least 1");
  }
  ASSIGN_OR_RETURN(double connect_timeout,
                   args.GetDouble("connect-timeout", 60));
  flags.connect_timeout = absl::Seconds(connect_timeout);
  ASSIGN_OR_RETURN(double preempt_grace, args.GetDouble("preempt-grace", 25));
  flags.preempt_grace = absl::Seconds(preempt_grace);
  ASSIGN_OR_RETURN(flags.roots, PathRootsOf(args));
  const std::string encryption = args.Get("data-plane-encryption", "on");
  const std::string transport = args.Get("data-plane-transport", "lockstep");
  if (encryption != "on" && encryption != "off") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--data-plane-encryption is on or off, not '", encryption, "'"));
  }
  if (transport != "lockstep" && transport != "gloo") {
    return absl::InvalidArgumentError(absl::StrCat(
        "--data-plane-transport is lockstep or gloo, not '", transport, "'"));
  }
  flags.data_plane_encryption = encryption == "on";
  flags.data_plane_gloo = transport == "gloo";
  if (flags.data_plane_gloo && flags.data_plane_encryption) {
    return absl::InvalidArgumentError(
        "--data-plane-transport gloo encrypts nothing: it needs "
        "--data-plane-encryption off");
  }
  if (flags.data_plane_gloo && !flags.tls.insecure) {
    return absl::InvalidArgumentError(
        "--data-plane-transport gloo (Gloo's TCP pairs, which a stranger's "
        "bytes can crash) is for comparison benchmarks only: it needs "
        "--insecure too, so it never runs in a deployment");
  }
  if (flags.data_plane_gloo) {
    LogWarning(
        "--data-plane-transport gloo: the collectives use Gloo's TCP pairs, "
        "which parse a stranger's bytes before any check and carry gradients "
        "in clear text; use it only to compare against lockstep's transport");
  } else if (!flags.data_plane_encryption) {
    LogWarning(
        "--data-plane-encryption off: connections are still authenticated, "
        "but gradients and model state cross the network in clear text");
  }
  return flags;
}

// "worker:1" for a task, "free" for a worker the coordinator names.
std::string TaskLabel(const v1::RegisterWorkerRequest& registration) {
  if (registration.task().type().empty()) return "free";
  return absl::StrCat(registration.task().type(), ":",
                      registration.task().index());
}

// The gRPC health service on --health-listen, when it is given (null
// otherwise); prints the address it serves on. Errors: Unavailable when the
// address cannot be served.
absl::StatusOr<std::unique_ptr<grpc::Server>> StartHealth(
    const Args& args, const TlsMaterial& tls, HealthService& service) {
  if (!args.Has("health-listen")) return std::unique_ptr<grpc::Server>();
  const std::string listen = args.Get("health-listen");
  grpc::ServerBuilder builder;
  builder.RegisterService(&service);
  int port = 0;
  builder.AddListeningPort(listen, ServerCredentials(tls), &port);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    return absl::UnavailableError(absl::StrCat(
        "cannot serve health checks on ", listen, "; is the port in use?"));
  }
  std::cout << "lockstep-worker health service on "
            << listen.substr(0, listen.rfind(':')) << ":" << port << std::endl;
  return server;
}

// The /metrics endpoint when --metrics-listen is given (null otherwise),
// over HTTPS with --metrics-tls. Errors: those of Start.
absl::StatusOr<std::unique_ptr<metrics::HttpServer>> StartMetrics(
    const Args& args, const TlsMaterial& tls, const WorkerMetrics& metrics) {
  if (!args.Has("metrics-listen")) {
    return std::unique_ptr<metrics::HttpServer>();
  }
  std::optional<metrics::HttpsOptions> https;
  if (args.Has("metrics-tls")) {
    https = metrics::MetricsHttps(tls.files.cert_file, tls.files.key_file,
                                  tls.files.ca_file);
  }
  auto server = metrics::HttpServer::Start(
      args.Get("metrics-listen"),
      [&metrics] {
        metrics::Exposition out;
        metrics.Collect(out);
        return out.Take();
      },
      std::move(https));
  if (!server.ok()) return server.status();
  std::cout << "lockstep-worker metrics on " << (*server)->address()
            << std::endl;
  LogInfo("metrics on ", (*server)->scheme(), "://", (*server)->address(),
          "/metrics");
  return server;
}

// SIGTERM (Kubernetes eviction, preemption, lockstep local) stops the job
// at a step every rank agrees on, saves it when checkpoints are configured,
// and exits 0 (Agent::Preempt). A handler and a pipe, not sigwait: LibTorch
// starts threads before main that do not block signals.
void InstallSignalHandlers() {
  if (pipe(g_terminate_pipe) != 0) {
    g_terminate_pipe[0] = g_terminate_pipe[1] = -1;
  }
  struct sigaction action = {};
  action.sa_handler = OnTerminate;
  sigaction(SIGTERM, &action, nullptr);
  sigaction(SIGINT, &action, nullptr);
  // Gloo writes to its sockets without MSG_NOSIGNAL: a peer that closed its
  // end (an aborted generation) must be an error on this rank, not SIGPIPE
  // silently killing the process.
  signal(SIGPIPE, SIG_IGN);
}

// The thread that turns the first SIGTERM into Agent::Preempt and exits.
void StartPreemptionThread(Agent& agent, absl::Duration grace) {
  if (g_terminate_pipe[0] < 0) return;
  std::thread([&agent, grace] {
    char byte;
    while (read(g_terminate_pipe[0], &byte, 1) < 0 && errno == EINTR) {
    }
    agent.Preempt(grace);
    LogInfo("terminated; exiting");
    std::cerr.flush();
    _exit(0);
  }).detach();
}

// Trains what the coordinator assigns until the session ends; never
// returns. Exit 2 when the coordinator refused the registration for good.
[[noreturn]] void Serve(const WorkerFlags& flags, WorkerMetrics& metrics) {
  GrpcControlPlane control(flags.coordinator, ChannelCredentials(flags.tls));
  Agent::Options options;
  options.metrics = &metrics;
  options.registration = flags.registration;
  options.connect_timeout = flags.connect_timeout;
  options.data_plane_encryption = flags.data_plane_encryption;
  options.data_plane_gloo = flags.data_plane_gloo;
  TrainingRunner runner(flags.registration.device().name());
  const std::string cwd = CurrentDirectory();
  options.check_paths = [roots = flags.roots, cwd](const ExportOwner& owner,
                                                   const v1::JobSpec& spec) {
    return CheckJobPaths(spec, roots, cwd, owner);
  };
  options.standby = [&runner, roots = flags.roots,
                     cwd](const v1::Standby& standby) {
    // A spare loads only data it would be allowed to train on.
    if (absl::Status allowed =
            CheckJobPaths(standby.spec(), roots, cwd,
                          {standby.job_id(), standby.submitted_by()});
        !allowed.ok()) {
      LogWarning("not standing by for job ", standby.job_id(), ": ",
                 allowed.message());
      return;
    }
    runner.Standby(standby);
  };
  Agent agent(
      &control, [&runner](TaskContext& task) { return runner.Run(task); },
      options, [&runner] { return runner.SaveLiveState(); });
  StartPreemptionThread(agent, flags.preempt_grace);
  absl::Status status = agent.Run();
  if (absl::IsCancelled(status)) {
    // Preempt() ended the session; its thread exits the process.
    while (true) pause();
  }
  std::cerr << "lockstep-worker: " << status.message() << "\n";
  std::cerr.flush();
  // A task thread may still be blocked in a collective; do not wait for it.
  // A registration the coordinator refuses (a bad task, a certificate that
  // does not name this task) is configuration: restarting cannot fix it.
  const bool refused = absl::IsInvalidArgument(status) ||
                       absl::IsPermissionDenied(status) ||
                       absl::IsUnauthenticated(status);
  std::_Exit(refused ? 2 : 3);
}

int Run(int argc, char** argv) {
  // First: it may start the program again with another BLAS kernel.
  const BlasKernel blas_kernel = EnsureBestBlasKernel(argv);
  KeepLargeBlocksInTheHeap();
  InstallSignalHandlers();
  auto args = Args::Parse(std::vector<std::string>(argv + 1, argv + argc),
                          {"coordinator",
                           "task-type",
                           "task-index",
                           "host",
                           "threads",
                           "connect-timeout",
                           "health-listen",
                           "preempt-grace",
                           "device",
                           "data-root",
                           "backup-root",
                           "export-root",
                           "index-cache",
                           "data-threads",
                           "tls-cert",
                           "data-plane-encryption",
                           "data-plane-transport",
                           "tls-key",
                           "tls-ca",
                           "metrics-listen",
                           "label"},
                          {"help", "spare", "metrics-tls", kInsecureFlag});
  if (!args.ok()) return Fail(args.status(), 2);
  if (args->Has("help")) {
    std::cout << kUsage;
    return 0;
  }
  auto flags = ParseFlags(*args);
  if (!flags.ok()) return Fail(flags.status(), 2);
  if (flags->tls.insecure) LogWarning(InsecureWarning("lockstep-worker"));
  const char* tmp = std::getenv("TMPDIR");
  SetIndexCacheDir(args->Get(
      "index-cache", absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp",
                                  "/lockstep-tfrecord-index")));
  if (args->Has("data-threads")) {
    int data_threads = 0;
    if (!absl::SimpleAtoi(args->Get("data-threads", ""), &data_threads) ||
        data_threads < 1 || data_threads > 256) {
      return Fail(absl::InvalidArgumentError(absl::StrCat(
                      "--data-threads must be a number from 1 to 256, got \"",
                      TerminalSafe(args->Get("data-threads", "")), "\"")),
                  2);
    }
    SetDataThreads(data_threads);
  }
  ConfigureThreads(flags->threads);
  v1::Device& device = *flags->registration.mutable_device();
  device.set_blas_kernel(blas_kernel.kernel);
  device.set_blas_kernel_source(blas_kernel.source);
  const std::string aten_capability = AtenCpuCapability();
  device.set_aten_cpu_capability(aten_capability);
  LogInfo("ATen CPU capability: ", aten_capability);
  device.set_onednn_cpu_isa(OneDnnCpuIsa());
  LogInfo("oneDNN CPU ISA: ", device.onednn_cpu_isa().empty()
                                  ? "unknown"
                                  : device.onednn_cpu_isa());
  LogInfo("device: ", device.name(),
          device.gpu_name().empty()
              ? ""
              : absl::StrCat(" (", device.gpu_name(), ", ", device.gpu_uuid(),
                             ")"));

  HealthService health_service(flags->tls.insecure);
  auto health = StartHealth(*args, flags->tls, health_service);
  if (!health.ok()) return Fail(health.status(), 1);
  WorkerMetrics metrics(device.name(), TaskLabel(flags->registration));
  metrics.SetCompute(BlasLibraryName(LoadedBlas()), blas_kernel.kernel,
                     blas_kernel.source, aten_capability);
  auto metrics_server = StartMetrics(*args, flags->tls, metrics);
  if (!metrics_server.ok()) return Fail(metrics_server.status(), 2);
  Serve(*flags, metrics);
}

}  // namespace
}  // namespace lockstep::worker

int main(int argc, char** argv) { return lockstep::worker::Run(argc, argv); }
