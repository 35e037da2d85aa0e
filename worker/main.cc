// lockstep-worker: one replica, one device. See README.md.
#include <dlfcn.h>
#include <grpcpp/grpcpp.h>
#include <malloc.h>
#include <signal.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstdlib>
#include <iostream>
#include <random>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/args.h"
#include "common/health_service.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/metrics_http.h"
#include "common/path_policy.h"
#include "common/status_macros.h"
#include "common/tf_config.h"
#include "common/tls.h"
#include "worker/agent.h"
#include "worker/rpc/grpc_control_plane.h"
#include "worker/train/trainer.h"

#ifdef LOCKSTEP_HAVE_NCCL
#include <cuda_runtime.h>

#include "worker/collective/nccl_communicator.h"
#endif

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

// The GPUs this process sees; 0 in a build without CUDA. Counted by the
// CUDA runtime (through the NCCL backend), not LibTorch, whose CPU build
// sees none.
int GpuCount() {
#ifdef LOCKSTEP_HAVE_NCCL
  return NcclCommunicator::DeviceCount();
#else
  return 0;
#endif
}

// GPU `index` of those the process sees, as it is reported: "cuda:N", its
// model and its UUID (as nvidia-smi -L prints it).
v1::Device GpuDevice(int index) {
  v1::Device device;
  device.set_name(absl::StrCat("cuda:", index));
#ifdef LOCKSTEP_HAVE_NCCL
  cudaDeviceProp properties;
  if (cudaGetDeviceProperties(&properties, index) == cudaSuccess) {
    device.set_gpu_name(properties.name);
    const auto* b =
        reinterpret_cast<const unsigned char*>(properties.uuid.bytes);
    device.set_gpu_uuid(absl::StrFormat(
        "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x"
        "%02x",
        b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10],
        b[11], b[12], b[13], b[14], b[15]));
  }
#endif
  return device;
}

// The device of --device `flag`: "auto" (GPU 0 of those the process sees,
// else the CPU), "cpu" or "cuda:N". Errors: InvalidArgument for another
// value, a GPU the process does not see, or a GPU in a build without CUDA.
absl::StatusOr<v1::Device> ResolveDevice(const std::string& flag) {
  v1::Device cpu;
  cpu.set_name("cpu");
  if (flag == "cpu") return cpu;
  // A GPU is of use only to a LibTorch built with CUDA (Debian's is not).
  const bool torch_cuda = torch::cuda::is_available();
  if (flag == "auto") {
    if (GpuCount() > 0 && !torch_cuda) {
      LogWarning(
          "a GPU is visible but this LibTorch has no CUDA support; "
          "training on the CPU (link a CUDA LibTorch to use the GPU)");
    }
    return GpuCount() > 0 && torch_cuda ? GpuDevice(0) : cpu;
  }
  int index = -1;
  if (!absl::StartsWith(flag, "cuda:") ||
      !absl::SimpleAtoi(flag.substr(5), &index) || index < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--device must be auto, cpu or cuda:N (N a GPU index), got \"", flag,
        "\""));
  }
#ifndef LOCKSTEP_HAVE_NCCL
  return absl::InvalidArgumentError(absl::StrCat(
      "--device ", flag,
      ": this lockstep-worker was built without CUDA support (no NCCL "
      "backend); use --device cpu, or build it where CUDA and NCCL are found "
      "(LOCKSTEP_CUDA=ON)"));
#else
  const int count = GpuCount();
  if (index >= count) {
    const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
    std::string fix = "use --device cpu, or run it where a GPU is visible";
    if (count == 1) fix = "use cuda:0";
    if (count > 1) fix = absl::StrCat("use cuda:0 to cuda:", count - 1);
    return absl::InvalidArgumentError(absl::StrCat(
        "--device ", flag, ": this process sees ", count,
        count == 1 ? " GPU" : " GPUs", " (CUDA_VISIBLE_DEVICES ",
        visible ? absl::StrCat("is \"", visible, "\"") : "is not set", "); ",
        fix));
  }
  if (!torch_cuda) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--device ", flag,
        ": this lockstep-worker's LibTorch was built without CUDA; use "
        "--device cpu, or build lockstep against a CUDA LibTorch (see "
        "bench/gpu_check.sh)"));
  }
  return GpuDevice(index);
#endif
}

// Limits LibTorch and OpenBLAS to `threads` and says which BLAS is loaded:
// the reference BLAS is ~10x slower than OpenBLAS.
void ConfigureThreads(int threads) {
  torch::set_num_threads(threads);
  using SetThreads = void (*)(int);
  if (auto set = reinterpret_cast<SetThreads>(
          dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) {
    set(threads);
  }
  std::string blas = "unknown";
  Dl_info info;
  if (void* sgemm = dlsym(RTLD_DEFAULT, "sgemm_");
      sgemm != nullptr && dladdr(sgemm, &info) != 0 && info.dli_fname) {
    // libblas.so.3 is Debian's alternatives link; name what it points at.
    char resolved[PATH_MAX];
    blas = realpath(info.dli_fname, resolved) ? resolved : info.dli_fname;
  }
  LogInfo("compute threads: ", threads, "; BLAS: ", blas);
  if (blas.find("openblas") == std::string::npos) {
    LogWarning(
        "the loaded BLAS is not OpenBLAS; training will be slow. Run "
        "scripts/install-deps as root to select OpenBLAS");
  }
}

// Training allocates and frees the same large activation and gradient
// buffers every step. By default glibc serves blocks over 128 KiB with fresh
// mmap pages and gives them back on free, so every step pays first-touch
// page faults for all its activations: on this project's VMs the CNN's
// forward and backward ran 4x slower for it (docs/BENCHMARKS.md). Keep such
// blocks in the heap, as jemalloc or tcmalloc would; the worker's memory
// stays at its peak, which every step reaches anyway. Variables the user set
// (MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_) win.
void KeepLargeBlocksInTheHeap() {
  if (std::getenv("MALLOC_MMAP_THRESHOLD_") == nullptr) {
    mallopt(M_MMAP_THRESHOLD, 32 << 20);  // glibc's maximum on 64-bit
  }
  if (std::getenv("MALLOC_TRIM_THRESHOLD_") == nullptr) {
    mallopt(M_TRIM_THRESHOLD, 1 << 30);
  }
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

// "worker:1" for a task, "free" for a worker the coordinator names.
std::string TaskLabel(const v1::RegisterWorkerRequest& registration) {
  if (registration.task().type().empty()) return "free";
  return absl::StrCat(registration.task().type(), ":",
                      registration.task().index());
}

// The /metrics endpoint when --metrics-listen is given (null otherwise).
absl::StatusOr<std::unique_ptr<metrics::HttpServer>> StartMetrics(
    const Args& args, const WorkerMetrics& metrics) {
  if (!args.Has("metrics-listen")) {
    return std::unique_ptr<metrics::HttpServer>();
  }
  auto server =
      metrics::HttpServer::Start(args.Get("metrics-listen"), [&metrics] {
        metrics::Exposition out;
        metrics.Collect(out);
        return out.Take();
      });
  if (!server.ok()) return server.status();
  std::cout << "lockstep-worker metrics on " << (*server)->address()
            << std::endl;
  LogInfo("metrics on http://", (*server)->address(), "/metrics");
  return server;
}

int Run(int argc, char** argv) {
  KeepLargeBlocksInTheHeap();
  // SIGTERM (Kubernetes eviction, preemption, lockstep local) stops the job
  // at a step every rank agrees on, saves it when checkpoints are
  // configured, and exits 0 (Agent::Preempt). A handler and a pipe, not
  // sigwait: LibTorch starts threads before main that do not block signals.
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
  auto args =
      Args::Parse(std::vector<std::string>(argv + 1, argv + argc),
                  {"coordinator", "task-type", "task-index", "host", "threads",
                   "connect-timeout", "health-listen", "preempt-grace",
                   "device", "data-root", "backup-root", "export-root",
                   "tls-cert", "tls-key", "tls-ca", "metrics-listen"},
                  {"help", "spare", kInsecureFlag});
  if (!args.ok()) return Fail(args.status(), 2);
  if (args->Has("help")) {
    std::cout << kUsage;
    return 0;
  }
  const char* env_coordinator = std::getenv("LOCKSTEP_COORDINATOR");
  std::string coordinator =
      args->Get("coordinator", env_coordinator ? env_coordinator : "");
  if (coordinator.empty()) {
    return Fail(absl::InvalidArgumentError(
                    "--coordinator HOST:PORT is required; see --help"),
                2);
  }
  auto tls_options = TlsOptionsFromArgs(*args);
  if (!tls_options.ok()) return Fail(tls_options.status(), 2);
  auto tls = LoadTlsMaterial(*tls_options);
  if (!tls.ok()) return Fail(tls.status(), 2);
  if (tls->insecure) LogWarning(InsecureWarning("lockstep-worker"));

  v1::RegisterWorkerRequest registration;
  registration.set_incarnation(RandomIncarnation());
  auto device = ResolveDevice(args->Get("device", "auto"));
  if (!device.ok()) return Fail(device.status(), 2);
  *registration.mutable_device() = *device;
  std::string host;
  if (const char* tf_config = std::getenv("TF_CONFIG");
      tf_config != nullptr && *tf_config != '\0') {
    auto config = ParseTfConfig(tf_config);
    if (!config.ok()) return Fail(config.status(), 2);
    *registration.mutable_cluster() = config->cluster;
    if (config->task.has_value()) {
      *registration.mutable_task() = *config->task;
      host = HostOf(TaskAddress(config->cluster, *config->task));
    }
  }
  if (args->Has("task-type")) {
    registration.mutable_task()->set_type(args->Get("task-type"));
  }
  auto index = args->GetInt("task-index", registration.task().index());
  if (!index.ok()) return Fail(index.status(), 2);
  registration.mutable_task()->set_index(*index);
  if (args->Has("task-index") && registration.task().type().empty()) {
    return Fail(absl::InvalidArgumentError(
                    "--task-index needs --task-type (or TF_CONFIG)"),
                2);
  }
  registration.set_spare(args->Has("spare") ||
                         registration.task().type() == "spare");
  host = args->Get("host", host);
  if (host.empty()) {
    char name[256] = {};
    gethostname(name, sizeof(name) - 1);
    host = name;
  }
  registration.set_host(host);

  int cores =
      static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  auto threads = args->GetInt("threads", cores);
  if (!threads.ok()) return Fail(threads.status(), 2);
  if (*threads < 1) {
    return Fail(absl::InvalidArgumentError("--threads must be at least 1"), 2);
  }
  auto connect_timeout = args->GetDouble("connect-timeout", 60);
  if (!connect_timeout.ok()) return Fail(connect_timeout.status(), 2);
  auto preempt_grace = args->GetDouble("preempt-grace", 25);
  if (!preempt_grace.ok()) return Fail(preempt_grace.status(), 2);
  auto roots = PathRootsOf(*args);
  if (!roots.ok()) return Fail(roots.status(), 2);
  ConfigureThreads(*threads);
  LogInfo("device: ", device->name(),
          device->gpu_name().empty()
              ? ""
              : absl::StrCat(" (", device->gpu_name(), ", ", device->gpu_uuid(),
                             ")"));

  HealthService health_service(tls->insecure);
  std::unique_ptr<grpc::Server> health;
  if (args->Has("health-listen")) {
    grpc::ServerBuilder builder;
    builder.RegisterService(&health_service);
    int port = 0;
    builder.AddListeningPort(args->Get("health-listen"),
                             ServerCredentials(*tls), &port);
    health = builder.BuildAndStart();
    if (health == nullptr || port == 0) {
      return Fail(absl::UnavailableError(absl::StrCat(
                      "cannot serve health checks on ",
                      args->Get("health-listen"), "; is the port in use?")),
                  1);
    }
    std::string listen = args->Get("health-listen");
    std::cout << "lockstep-worker health service on "
              << listen.substr(0, listen.rfind(':')) << ":" << port
              << std::endl;
  }

  WorkerMetrics metrics(device->name(), TaskLabel(registration));
  auto metrics_server = StartMetrics(*args, metrics);
  if (!metrics_server.ok()) return Fail(metrics_server.status(), 2);

  GrpcControlPlane control(coordinator, ChannelCredentials(*tls));
  Agent::Options options;
  options.metrics = &metrics;
  options.registration = registration;
  options.connect_timeout = absl::Seconds(*connect_timeout);
  TrainingRunner runner(device->name());
  const std::string cwd = CurrentDirectory();
  options.check_paths = [roots = *roots, cwd](const v1::JobSpec& spec) {
    return CheckJobPaths(spec, roots, cwd);
  };
  options.standby = [&runner, roots = *roots, cwd](const v1::Standby& standby) {
    // A spare loads only data it would be allowed to train on.
    if (absl::Status allowed = CheckJobPaths(standby.spec(), roots, cwd);
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
  if (g_terminate_pipe[0] >= 0) {
    std::thread([&agent, grace = absl::Seconds(*preempt_grace)] {
      char byte;
      while (read(g_terminate_pipe[0], &byte, 1) < 0 && errno == EINTR) {
      }
      agent.Preempt(grace);
      LogInfo("terminated; exiting");
      std::cerr.flush();
      _exit(0);
    }).detach();
  }
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

}  // namespace
}  // namespace lockstep::worker

int main(int argc, char** argv) { return lockstep::worker::Run(argc, argv); }
