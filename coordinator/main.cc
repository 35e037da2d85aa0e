// lockstep-coordinator: the control-plane daemon. See README.md.
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/resource.h>

#include <cstdio>
#include <iostream>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/args.h"
#include "common/health_service.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/metrics_http.h"
#include "common/tf_config.h"
#include "common/tls.h"
#include "coordinator/coordinator.h"
#include "coordinator/job_store.h"
#include "coordinator/rpc/grpc_service.h"

namespace lockstep::coordinator {
namespace {

constexpr char kUsage[] =
    R"(lockstep-coordinator: the lockstep control-plane daemon

Usage:
  lockstep-coordinator --listen HOST:PORT --state-dir DIR [--cluster TF_CONFIG]
                       (--tls-cert FILE --tls-key FILE --tls-ca FILE |
                        --insecure)
                       [--heartbeat-timeout SECS] [--kv-max-entries N]
                       [--kv-max-bytes N] [--keep-finished-jobs N]
                       [--finished-job-ttl SECS] [--forget-workers-after SECS]
                       [--max-sessions N] [--max-watches N]
                       [--metrics-listen HOST:PORT]

Flags:
  --listen HOST:PORT   address to serve gRPC on; port 0 picks a free port
                       (the chosen address is printed on stdout)
  --state-dir DIR      where job state is kept (SQLite); created if missing
  --tls-cert FILE      the coordinator's certificate (PEM); its DNS or IP
                       names must match the address clients dial
  --tls-key FILE       its private key (PEM)
  --tls-ca FILE        the CA that workers', operators' and viewers'
                       certificates must be signed by (PEM). Every call is
                       then mutual TLS: the identity in the caller's
                       certificate (a SPIFFE ID, see README.md) says what it
                       may do; a certificate from another CA fails the
                       handshake
  --insecure           no TLS: every endpoint is open to anyone who can
                       reach the port, who can submit and stop jobs or pose
                       as a worker; for a trusted single-user machine only
  --cluster JSON|FILE  static cluster in TF_CONFIG form; the coordinator then
                       waits for exactly those chief/worker tasks. Without it,
                       workers register freely.
  --heartbeat-timeout S a worker silent this long has failed (default 10);
                       workers send a heartbeat every S/2
  --kv-max-entries N   keys and barriers one generation's rendezvous store
                       may hold (default 262144); more is RESOURCE_EXHAUSTED
  --kv-max-bytes N     bytes of keys, names and values it may hold (default
                       268435456, 256 MiB: a Gloo full mesh of ~1,400 ranks)
  --keep-finished-jobs N  finished jobs kept (default 1000); the oldest
                       beyond it are deleted, from memory and the state dir
  --finished-job-ttl S finished jobs that ended longer ago are deleted
                       (default 0: kept until --keep-finished-jobs)
  --forget-workers-after S  a free worker (free:N) without a session for S
                       seconds is forgotten (default 3600); cluster tasks stay
  --max-sessions N     worker sessions served at once (default 10000); one
                       more is refused with RESOURCE_EXHAUSTED
  --max-watches N      WatchJob streams (lockstep watch, submit --watch,
                       lockstep local) served at once (default 1000); one
                       more is refused likewise
  --metrics-listen HOST:PORT  serve Prometheus metrics over plain HTTP at
                       http://HOST:PORT/metrics (port 0 picks one; the
                       address is printed on stdout); off by default. Jobs,
                       workers, failures by cause, checkpoint commits: see
                       README.md, "Metrics"

Sessions and watches hold no thread each (gRPC's callback API); gRPC's
own threads are capped. At start the open-file limit is raised to its hard
limit: each client connection takes a descriptor.
Serves the standard gRPC health service (grpc.health.v1) for probes, over
the same TLS (`lockstep health HOST:PORT` checks it with a certificate).
SIGTERM or SIGINT shuts it down cleanly; jobs and their state stay in the
state dir and a running job re-forms when the coordinator comes back.

Example:
  lockstep-coordinator --listen 0.0.0.0:7070 --state-dir /var/lib/lockstep \
      --cluster '{"cluster":{"worker":["w0:7071","w1:7071"]}}' \
      --tls-cert /etc/lockstep/tls/tls.crt --tls-key /etc/lockstep/tls/tls.key \
      --tls-ca /etc/lockstep/tls/ca.crt
)";

// A bound on the threads of gRPC's synchronous-server machinery. The
// callback API's reactions run on gRPC's own small pool, which this quota
// does not size; they never block, so few are needed however many sessions
// and watches are open.
constexpr int kMaxGrpcThreads = 64;

// A flag holding a whole number in [low, high], or `fallback` when absent.
absl::StatusOr<int64_t> Bounded(const Args& args, const std::string& flag,
                                double fallback, double low, double high) {
  auto value = args.GetDouble(flag, fallback);
  if (!value.ok()) return value.status();
  if (*value < low || *value > high || *value != static_cast<int64_t>(*value)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " is ", *value, "; give a whole number from ",
                     low, " to ", high));
  }
  return static_cast<int64_t>(*value);
}

// The caps and retention flags (--kv-max-*, --keep-finished-jobs,
// --finished-job-ttl, --forget-workers-after). Errors: InvalidArgument.
absl::Status ApplyLimitFlags(const Args& args, Coordinator::Options& options) {
  const KvLimits defaults;
  auto entries = Bounded(args, "kv-max-entries", defaults.max_entries, 1, 1e9);
  if (!entries.ok()) return entries.status();
  auto bytes = Bounded(args, "kv-max-bytes", defaults.max_bytes, 1, 1e12);
  if (!bytes.ok()) return bytes.status();
  auto keep = Bounded(args, "keep-finished-jobs", 1000, 1, 1e7);
  if (!keep.ok()) return keep.status();
  auto ttl = Bounded(args, "finished-job-ttl", 0, 0, 1e9);
  if (!ttl.ok()) return ttl.status();
  auto forget = Bounded(args, "forget-workers-after", 3600, 1, 1e9);
  if (!forget.ok()) return forget.status();
  options.kv_limits = {*entries, *bytes};
  options.keep_finished_jobs = *keep;
  options.finished_job_ttl =
      *ttl == 0 ? absl::InfiniteDuration() : absl::Seconds(*ttl);
  options.forget_workers_after = absl::Seconds(*forget);
  return absl::OkStatus();
}

int Fail(const absl::Status& status, int code) {
  std::cerr << "lockstep-coordinator: " << status.message() << "\n";
  return code;
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

// The /metrics endpoint when --metrics-listen is given (null otherwise).
absl::StatusOr<std::unique_ptr<metrics::HttpServer>> StartMetrics(
    const Args& args, Coordinator* coordinator) {
  if (!args.Has("metrics-listen")) {
    return std::unique_ptr<metrics::HttpServer>();
  }
  auto server =
      metrics::HttpServer::Start(args.Get("metrics-listen"), [coordinator] {
        metrics::Exposition out;
        coordinator->CollectMetrics(out);
        return out.Take();
      });
  if (server.ok()) {
    LogInfo("metrics on http://", (*server)->address(), "/metrics");
  }
  return server;
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
  auto args = Args::Parse(
      std::vector<std::string>(argv + 1, argv + argc),
      {"listen", "state-dir", "cluster", "heartbeat-timeout", "kv-max-entries",
       "kv-max-bytes", "keep-finished-jobs", "finished-job-ttl",
       "forget-workers-after", "max-sessions", "max-watches", "tls-cert",
       "tls-key", "tls-ca", "metrics-listen"},
      {"help", kInsecureFlag});
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
  auto tls_options = TlsOptionsFromArgs(*args);
  if (!tls_options.ok()) return Fail(tls_options.status(), 2);
  auto tls = LoadTlsMaterial(*tls_options);
  if (!tls.ok()) return Fail(tls.status(), 2);
  if (tls->insecure) LogWarning(InsecureWarning("lockstep-coordinator"));

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
  if (absl::Status limits = ApplyLimitFlags(*args, options); !limits.ok()) {
    return Fail(limits, 2);
  }
  GrpcService::Limits limits;
  auto max_sessions =
      Bounded(*args, "max-sessions", limits.max_sessions, 1, 1e9);
  if (!max_sessions.ok()) return Fail(max_sessions.status(), 2);
  limits.max_sessions = static_cast<int>(*max_sessions);
  auto max_watches = Bounded(*args, "max-watches", limits.max_watches, 1, 1e9);
  if (!max_watches.ok()) return Fail(max_watches.status(), 2);
  limits.max_watches = static_cast<int>(*max_watches);
  RaiseFileLimit();
  auto store = JobStore::Open(args->Get("state-dir"));
  if (!store.ok()) return Fail(store.status(), 1);
  options.store = *std::move(store);
  const bool static_cluster = options.cluster.has_value();
  auto coordinator = Coordinator::Create(std::move(options));
  if (!coordinator.ok()) return Fail(coordinator.status(), 1);

  auto metrics_server = StartMetrics(*args, coordinator->get());
  if (!metrics_server.ok()) return Fail(metrics_server.status(), 2);

  // With --insecure nobody is authenticated: every caller may make every
  // call. Otherwise each call is authorized by its client certificate.
  GrpcService service(coordinator->get(), limits, tls->insecure);
  // Answers only callers with a certificate of our CA (gRPC's built-in
  // health service would answer anybody).
  HealthService health(tls->insecure);
  grpc::ServerBuilder builder;
  grpc::ResourceQuota quota("lockstep-coordinator");
  quota.SetMaxThreads(kMaxGrpcThreads);
  builder.SetResourceQuota(quota);
  int port = 0;
  builder.AddListeningPort(args->Get("listen"), ServerCredentials(*tls), &port);
  builder.RegisterService(&service);
  builder.RegisterService(&health);
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
  if (*metrics_server != nullptr) {
    std::cout << "lockstep-coordinator metrics on "
              << (*metrics_server)->address() << std::endl;
  }
  LogInfo("serving on ", host, ":", port, ", state in ", args->Get("state-dir"),
          static_cluster ? ", static cluster" : ", free registration",
          tls->insecure ? ", without TLS" : ", mutual TLS");

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
  health.SetServing(false);
  metrics_server->reset();
  (*coordinator)->Shutdown();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  return 0;
}

}  // namespace
}  // namespace lockstep::coordinator

int main(int argc, char** argv) {
  return lockstep::coordinator::Run(argc, argv);
}
