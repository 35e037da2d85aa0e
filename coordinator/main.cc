// lockstep-coordinator: the control-plane daemon. See README.md.
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <signal.h>
#include <sys/resource.h>

#include <cstdio>
#include <iostream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/args.h"
#include "common/log.h"
#include "common/tf_config.h"
#include "coordinator/coordinator.h"
#include "coordinator/job_store.h"
#include "coordinator/rpc/grpc_service.h"

namespace lockstep::coordinator {
namespace {

constexpr char kUsage[] =
    R"(lockstep-coordinator: the lockstep control-plane daemon

Usage:
  lockstep-coordinator --listen HOST:PORT --state-dir DIR [--cluster TF_CONFIG]
                       [--heartbeat-timeout SECS]
                       [--max-sessions N] [--max-watches N]

Flags:
  --listen HOST:PORT   address to serve gRPC on; port 0 picks a free port
                       (the chosen address is printed on stdout)
  --state-dir DIR      where job state is kept (SQLite); created if missing
  --cluster JSON|FILE  static cluster in TF_CONFIG form; the coordinator then
                       waits for exactly those chief/worker tasks. Without it,
                       workers register freely.
  --heartbeat-timeout S a worker silent this long has failed (default 10);
                       workers send a heartbeat every S/2
  --max-sessions N     worker sessions served at once (default 10000); one
                       more is refused with RESOURCE_EXHAUSTED
  --max-watches N      `lockstep status --watch` streams served at once
                       (default 1000); one more is refused likewise

Sessions and watches hold no thread each (gRPC's callback API); gRPC's
own threads are capped. At start the open-file limit is raised to its hard
limit: each client connection takes a descriptor.
Serves the standard gRPC health service (grpc.health.v1) for probes.
SIGTERM or SIGINT shuts it down cleanly; jobs and their state stay in the
state dir and a running job re-forms when the coordinator comes back.

Example:
  lockstep-coordinator --listen 0.0.0.0:7070 --state-dir /var/lib/lockstep \
      --cluster '{"cluster":{"worker":["w0:7071","w1:7071"]}}'
)";

// gRPC's threads for the whole server: the callback API needs few, however
// many sessions and watches are open.
constexpr int kMaxGrpcThreads = 64;

int Fail(const absl::Status& status, int code) {
  std::cerr << "lockstep-coordinator: " << status.message() << "\n";
  return code;
}

// A positive integer flag with a default. Errors: InvalidArgument naming it.
absl::StatusOr<int> PositiveFlag(const Args& args, const std::string& name,
                                 int fallback) {
  auto value = args.GetDouble(name, fallback);
  if (!value.ok()) return value.status();
  if (!(*value >= 1 && *value <= 1e9) || *value != static_cast<int>(*value)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--", name, " must be a whole number from 1 to 1000000000"));
  }
  return static_cast<int>(*value);
}

// Every client connection takes a descriptor: allow as many as the hard
// limit does (often 1024 soft against 1048576 hard).
void RaiseFileLimit() {
  rlimit limit;
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur >= limit.rlim_max)
    return;
  limit.rlim_cur = limit.rlim_max;
  if (setrlimit(RLIMIT_NOFILE, &limit) != 0) {
    LogWarning("cannot raise the open-file limit to ", limit.rlim_max,
               "; many workers may exhaust it");
  }
}

int Run(int argc, char** argv) {
  // Signals are taken synchronously by this thread; block them before any
  // other thread exists so every thread inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a client gone mid-write is an error, not death
  auto args = Args::Parse(std::vector<std::string>(argv + 1, argv + argc),
                          {"listen", "state-dir", "cluster",
                           "heartbeat-timeout", "max-sessions", "max-watches"},
                          {"help"});
  if (!args.ok()) return Fail(args.status(), 2);
  if (args->Has("help")) {
    std::cout << kUsage;
    return 0;
  }
  if (!args->positional().empty()) {
    return Fail(
        absl::InvalidArgumentError(absl::StrCat(
            "unexpected argument '", args->positional()[0], "'; see --help")),
        2);
  }
  if (!args->Has("listen") || !args->Has("state-dir")) {
    return Fail(absl::InvalidArgumentError(
                    "--listen and --state-dir are required; see --help"),
                2);
  }
  SetLogTag("coordinator");

  Coordinator::Options options;
  if (args->Has("cluster")) {
    auto config = LoadTfConfig(args->Get("cluster"));
    if (!config.ok()) return Fail(config.status(), 2);
    options.cluster = config->cluster;
  }
  auto heartbeat_timeout = args->GetDouble("heartbeat-timeout", 10);
  if (!heartbeat_timeout.ok()) return Fail(heartbeat_timeout.status(), 2);
  if (*heartbeat_timeout <= 0) {
    return Fail(absl::InvalidArgumentError("--heartbeat-timeout must be > 0"),
                2);
  }
  options.heartbeat_timeout = absl::Seconds(*heartbeat_timeout);
  GrpcService::Limits limits;
  auto max_sessions = PositiveFlag(*args, "max-sessions", limits.max_sessions);
  if (!max_sessions.ok()) return Fail(max_sessions.status(), 2);
  limits.max_sessions = *max_sessions;
  auto max_watches = PositiveFlag(*args, "max-watches", limits.max_watches);
  if (!max_watches.ok()) return Fail(max_watches.status(), 2);
  limits.max_watches = *max_watches;
  RaiseFileLimit();
  auto store = JobStore::Open(args->Get("state-dir"));
  if (!store.ok()) return Fail(store.status(), 1);
  options.store = *std::move(store);
  const bool static_cluster = options.cluster.has_value();
  auto coordinator = Coordinator::Create(std::move(options));
  if (!coordinator.ok()) return Fail(coordinator.status(), 1);

  GrpcService service(coordinator->get(), limits);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  grpc::ResourceQuota quota("lockstep-coordinator");
  quota.SetMaxThreads(kMaxGrpcThreads);
  builder.SetResourceQuota(quota);
  int port = 0;
  builder.AddListeningPort(args->Get("listen"),
                           grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) {
    return Fail(absl::UnavailableError(absl::StrCat(
                    "cannot listen on ", args->Get("listen"),
                    "; is the port in use or the host name wrong?")),
                1);
  }
  std::string listen = args->Get("listen");
  std::string host = listen.substr(0, listen.rfind(':'));
  std::cout << "lockstep-coordinator listening on " << host << ":" << port
            << std::endl;
  LogInfo("serving on ", host, ":", port, ", state in ", args->Get("state-dir"),
          static_cluster ? ", static cluster" : ", free registration");

  // Liveness runs on the coordinator's clock: sweep often so a silent
  // worker is declared failed right after its timeout.
  absl::Notification stopping;
  std::thread sweeper([&] {
    while (!stopping.WaitForNotificationWithTimeout(absl::Milliseconds(100))) {
      (*coordinator)->Sweep();
    }
  });

  int signal = 0;
  sigwait(&signals, &signal);
  LogInfo("signal ", signal, ": shutting down");
  stopping.Notify();
  sweeper.join();
  server->GetHealthCheckService()->Shutdown();
  (*coordinator)->Shutdown();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  return 0;
}

}  // namespace
}  // namespace lockstep::coordinator

int main(int argc, char** argv) {
  return lockstep::coordinator::Run(argc, argv);
}
