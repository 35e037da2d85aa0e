// lockstep-coordinator: the control-plane daemon. See README.md.
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "common/args.h"
#include "common/deny_list.h"
#include "common/health_service.h"
#include "common/log.h"
#include "common/metrics.h"
#include "common/metrics_http.h"
#include "common/rpc_limits.h"
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
                       [--max-sessions-per-identity N]
                       [--max-watches-per-identity N]
                       [--deny-identities FILE] [--metrics-listen HOST:PORT [--metrics-tls]]
                       [--priority-class NAME=N]...
                       [--priority-grant CLASS=OWNER[,OWNER]]...
                       [--quota OWNER=N]...
                       [--min-run-time SECS] [--age-after SECS]
                       [--starvation-bound SECS] [--starvation-priority N]
                       [--admin OWNER]...
                       [--artifact-dir DIR [--max-artifact-bytes N]
                        [--max-owner-artifact-bytes N]]

Flags:
  --listen HOST:PORT   address to serve gRPC on; port 0 picks a free port
                       (the chosen address is printed on stdout)
  --state-dir DIR      where job state is kept (SQLite); created if missing
  --artifact-dir DIR   keep each job's exported model here (created if
                       missing): the chief uploads it when the job succeeds
                       and its owner, an admin or a viewer downloads it
                       (lockstep artifacts get); it is deleted with the job.
                       Off by default: the export stays where the job wrote it
  --max-artifact-bytes N  the largest artifact kept (default 1073741824,
                       1 GiB); a larger one is refused before it is sent
  --max-owner-artifact-bytes N  what one owner's artifacts may hold in all
                       (default 10737418240, 10 GiB)
  --tls-cert FILE      the coordinator's certificate (PEM): the identity
                       spiffe://DOMAIN/coordinator, and DNS or IP names that
                       match the address clients dial (clients check both).
                       The three files are read again every 60 s, so a
                       renewed certificate serves without a restart
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
  --kv-max-entries N   keys one generation's rendezvous store
                       may hold (default 262144); more is RESOURCE_EXHAUSTED
  --kv-max-bytes N     bytes of keys and values it may hold (default
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
  --max-sessions-per-identity N, --max-watches-per-identity N
                       the same caps for one certificate's identity
                       (defaults 8 and 100), so that no caller takes every
                       slot; callers under --insecure have no identity
  --deny-identities FILE  revoked identities, one SPIFFE ID a line (#
                       comments): their calls are refused as unauthenticated
                       and a worker's session ends. The file is read again
                       when it changes (checked every second); a version
                       that cannot be read keeps the last good list
  --metrics-listen HOST:PORT  serve Prometheus metrics over plain HTTP at
                       http://HOST:PORT/metrics (port 0 picks one; the
                       address is printed on stdout); off by default. Jobs,
                       workers, failures by cause, checkpoint commits: see
                       README.md, "Metrics"
  --priority-class NAME=N  a named priority a job spec may give as
                       priority_class (repeatable): --priority-class urgent=100
  --priority-grant CLASS=OWNER[,OWNER...]  who may use a class above the
                       default priority 0 (repeatable; * for everyone):
                       --priority-grant urgent=operator:alice. A class of 0
                       or below is anyone's; a class above it without a
                       grant, and any raw priority above 0, are for --admin
                       owners only
  --quota OWNER=N      the most workers the running jobs of OWNER
                       ("operator:alice", the role and name of its
                       certificate's identity) may hold at once (repeatable);
                       owners not named have no cap
  --min-run-time S     a running job is not preempted for a job of a higher
                       priority before it has run S seconds since it last
                       started (default 60), so that jobs do not thrash
  --age-after S        a queued job that has waited S seconds may preempt
                       running jobs of its own priority submitted after it
                       (those that passed it), so that small jobs cannot
                       keep a large one waiting for ever (default 0: never;
                       docs/BENCHMARKS.md has the trade-off)
  --starvation-bound S a queued job that has waited S seconds in all
                       (counting its waits before earlier preemptions) is
                       promoted to the highest --priority-class's priority
                       until it ends: no job of a class passes it, preempts
                       it or takes the workers reserved for it (default
                       43200, 12 h; 0: never). It bounds how long a stream of
                       higher-priority jobs can keep a large job waiting;
                       the cost is that the top class may wait for it
  --starvation-priority N  the priority a starved job is promoted to
                       instead (default: the highest class's); one below
                       the top class keeps that class ahead of everything,
                       as a bound on every other class only
  --admin OWNER        an operator ("operator:bob") that may stop and delete
                       every job (repeatable); other operators stop and
                       delete only the jobs they submitted
  --metrics-tls        serve /metrics over HTTPS with --tls-cert and
                       --tls-key, answering only a client certificate of
                       --tls-ca with a viewer or operator identity (and not
                       on --deny-identities); the files are read again every
                       60 s

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

// The daemon's flags beyond TLS (SetUpTls), checked.
struct Flags {
  std::string listen;
  std::string state_dir;
  std::optional<std::string> metrics_listen;  // --metrics-listen, if given
  bool metrics_tls = false;                   // --metrics-tls
  std::shared_ptr<DenyList> deny;             // --deny-identities, if given
  Coordinator::Options coordinator;           // all but the store
  GrpcService::Limits service_limits;
};

// The gRPC server and the services it serves, which must outlive it.
struct GrpcServer {
  GrpcServer(Coordinator* coordinator, GrpcService::Limits limits,
             bool insecure, DenyList* deny)
      : service(coordinator, limits, insecure, deny),
        health(insecure, [deny](const std::string& id) {
          return deny != nullptr && deny->Denies(id);
        }) {}

  // With --insecure nobody is authenticated: every caller may make every
  // call. Otherwise each call is authorized by its client certificate.
  GrpcService service;
  // Answers only callers with a certificate of our CA (gRPC's built-in
  // health service would answer anybody).
  HealthService health;
  std::unique_ptr<grpc::Server> server;
  int port = 0;
};

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
// --finished-job-ttl, --forget-workers-after) and the artifacts'
// (--artifact-dir, --max-*artifact-bytes). Errors: InvalidArgument.
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
  const ArtifactStore::Limits artifact_defaults;
  auto artifact_bytes =
      Bounded(args, "max-artifact-bytes",
              static_cast<double>(artifact_defaults.artifact_bytes), 0, 1e15);
  if (!artifact_bytes.ok()) return artifact_bytes.status();
  auto owner_bytes =
      Bounded(args, "max-owner-artifact-bytes",
              static_cast<double>(artifact_defaults.owner_bytes), 0, 1e15);
  if (!owner_bytes.ok()) return owner_bytes.status();
  options.artifact_dir = args.Get("artifact-dir");
  options.artifact_limits = {*artifact_bytes, *owner_bytes};
  return absl::OkStatus();
}

// "NAME=N" with N a whole number in [low, high]. Errors: InvalidArgument
// naming the flag.
absl::StatusOr<std::pair<std::string, int>> NamedNumber(const std::string& flag,
                                                        const std::string& text,
                                                        int64_t low,
                                                        int64_t high) {
  const size_t equals = text.rfind('=');
  int64_t value = 0;
  if (equals == std::string::npos || equals == 0 ||
      !absl::SimpleAtoi(text.substr(equals + 1), &value) || value < low ||
      value > high) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", flag, " \"", text,
                     "\": write it as NAME=N with N a "
                     "whole number from ",
                     low, " to ", high));
  }
  return std::pair(text.substr(0, equals), static_cast<int>(value));
}

// The scheduling flags (--priority-class, --priority-grant, --quota,
// --min-run-time, --age-after, --starvation-bound, --starvation-priority,
// --admin). Errors: InvalidArgument.
absl::Status ApplySchedulingFlags(const Args& args,
                                  Coordinator::Options& options) {
  for (const std::string& text : args.GetAll("priority-class")) {
    auto named = NamedNumber("priority-class", text, -1'000'000, 1'000'000);
    if (!named.ok()) return named.status();
    options.priority_classes[named->first] = named->second;
  }
  for (const std::string& text : args.GetAll("priority-grant")) {
    const size_t equals = text.find('=');
    const std::string name = text.substr(0, equals);
    if (equals == std::string::npos ||
        options.priority_classes.count(name) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--priority-grant \"", text,
          "\": write it as CLASS=OWNER[,OWNER...] with CLASS one of the "
          "--priority-class names (operator:alice, or * for everyone)"));
    }
    for (absl::string_view owner :
         absl::StrSplit(text.substr(equals + 1), ',')) {
      if (owner != "*" && (owner.find(':') == absl::string_view::npos ||
                           owner.front() == ':' || owner.back() == ':')) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--priority-grant \"", text, "\": name each owner as ROLE:NAME ",
            "(operator:alice), as `lockstep status` shows it, or *"));
      }
      options.priority_grants[name].insert(std::string(owner));
    }
  }
  for (const std::string& text : args.GetAll("quota")) {
    auto named = NamedNumber("quota", text, 0, 1'000'000);
    if (!named.ok()) return named.status();
    if (named->first.find(':') == std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("--quota \"", text,
                       "\": name the owner as ROLE:NAME "
                       "(operator:alice), as `lockstep status` shows it"));
    }
    options.scheduling.quotas[named->first] = named->second;
  }
  auto min_run_time = Bounded(args, "min-run-time", 60, 0, 1e7);
  if (!min_run_time.ok()) return min_run_time.status();
  options.scheduling.min_run_time = absl::Seconds(*min_run_time);
  auto age_after = Bounded(args, "age-after", 0, 0, 1e8);
  if (!age_after.ok()) return age_after.status();
  options.scheduling.age_after =
      *age_after == 0 ? absl::InfiniteDuration() : absl::Seconds(*age_after);
  auto starvation_bound = Bounded(args, "starvation-bound", 43200, 0, 1e8);
  if (!starvation_bound.ok()) return starvation_bound.status();
  options.scheduling.starvation_bound = *starvation_bound == 0
                                            ? absl::InfiniteDuration()
                                            : absl::Seconds(*starvation_bound);
  if (args.Has("starvation-priority")) {
    auto priority =
        Bounded(args, "starvation-priority", 0, -1'000'000'000, 1'000'000'000);
    if (!priority.ok()) return priority.status();
    options.starvation_priority = static_cast<int>(*priority);
  }
  for (const std::string& owner : args.GetAll("admin")) {
    if (owner.find(':') == std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("--admin \"", owner,
                       "\": name the owner as ROLE:NAME (operator:bob)"));
    }
    options.admins.insert(owner);
  }
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

// Signals are taken synchronously by Run's thread (ServeUntilSignal); block
// them before any other thread exists so every thread inherits the mask.
sigset_t BlockShutdownSignals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a client gone mid-write is an error, not death
  return signals;
}

// The command line: known flags, no positional argument, --listen and
// --state-dir given. With --help nothing but the flags' names is checked.
// Errors: InvalidArgument.
absl::StatusOr<Args> ParseArgs(int argc, char** argv) {
  auto args = Args::Parse(std::vector<std::string>(argv + 1, argv + argc),
                          {"listen",
                           "state-dir",
                           "artifact-dir",
                           "max-artifact-bytes",
                           "max-owner-artifact-bytes",
                           "cluster",
                           "heartbeat-timeout",
                           "kv-max-entries",
                           "kv-max-bytes",
                           "keep-finished-jobs",
                           "finished-job-ttl",
                           "forget-workers-after",
                           "max-sessions",
                           "max-watches",
                           "max-sessions-per-identity",
                           "max-watches-per-identity",
                           "tls-cert",
                           "tls-key",
                           "tls-ca",
                           "metrics-listen",
                           "deny-identities",
                           "priority-class",
                           "priority-grant",
                           "quota",
                           "min-run-time",
                           "age-after",
                           "starvation-bound",
                           "starvation-priority",
                           "admin"},
                          {"help", "metrics-tls", kInsecureFlag});
  if (!args.ok() || args->Has("help")) return args;
  if (!args->positional().empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "unexpected argument '", args->positional()[0], "'; see --help"));
  }
  if (!args->Has("listen") || !args->Has("state-dir")) {
    return absl::InvalidArgumentError(
        "--listen and --state-dir are required; see --help");
  }
  return args;
}

// The identity the daemon serves with: its certificate, key and CA, or none
// with --insecure (then it warns). Errors: those of TlsOptionsFromArgs and
// LoadTlsMaterial.
absl::StatusOr<TlsMaterial> SetUpTls(const Args& args) {
  auto tls_options = TlsOptionsFromArgs(args);
  if (!tls_options.ok()) return tls_options.status();
  auto tls = LoadTlsMaterial(*tls_options);
  if (!tls.ok()) return tls.status();
  if (tls->insecure) LogWarning(InsecureWarning("lockstep-coordinator"));
  return tls;
}

// --cluster and --heartbeat-timeout. Errors: those of LoadTfConfig,
// InvalidArgument.
absl::Status ApplyClusterFlags(const Args& args,
                               Coordinator::Options& options) {
  if (args.Has("cluster")) {
    auto config = LoadTfConfig(args.Get("cluster"));
    if (!config.ok()) return config.status();
    options.cluster = config->cluster;
  }
  auto heartbeat_timeout = args.GetDouble("heartbeat-timeout", 10);
  if (!heartbeat_timeout.ok()) return heartbeat_timeout.status();
  if (*heartbeat_timeout <= 0) {
    return absl::InvalidArgumentError("--heartbeat-timeout must be > 0");
  }
  options.heartbeat_timeout = absl::Seconds(*heartbeat_timeout);
  return absl::OkStatus();
}

// --max-sessions, --max-watches and their per-identity forms. Errors:
// InvalidArgument.
absl::Status ApplyServiceFlags(const Args& args, GrpcService::Limits& limits) {
  auto max_sessions =
      Bounded(args, "max-sessions", limits.max_sessions, 1, 1e9);
  if (!max_sessions.ok()) return max_sessions.status();
  limits.max_sessions = static_cast<int>(*max_sessions);
  auto max_watches = Bounded(args, "max-watches", limits.max_watches, 1, 1e9);
  if (!max_watches.ok()) return max_watches.status();
  limits.max_watches = static_cast<int>(*max_watches);
  auto sessions_each = Bounded(args, "max-sessions-per-identity",
                               limits.max_sessions_per_identity, 1, 1e9);
  if (!sessions_each.ok()) return sessions_each.status();
  limits.max_sessions_per_identity = static_cast<int>(*sessions_each);
  auto watches_each = Bounded(args, "max-watches-per-identity",
                              limits.max_watches_per_identity, 1, 1e9);
  if (!watches_each.ok()) return watches_each.status();
  limits.max_watches_per_identity = static_cast<int>(*watches_each);
  return absl::OkStatus();
}

// The flags of ParseArgs' `args` besides TLS, checked. Errors: those of
// ApplyClusterFlags, ApplyLimitFlags and ApplyServiceFlags.
absl::StatusOr<Flags> CheckFlags(const Args& args) {
  Flags flags;
  flags.listen = args.Get("listen");
  flags.state_dir = args.Get("state-dir");
  if (args.Has("metrics-listen")) {
    flags.metrics_listen = args.Get("metrics-listen");
  }
  flags.metrics_tls = args.Has("metrics-tls");
  if (flags.metrics_tls &&
      (!flags.metrics_listen.has_value() || args.Has(kInsecureFlag))) {
    return absl::InvalidArgumentError(
        "--metrics-tls needs --metrics-listen and mutual TLS (--tls-cert, "
        "--tls-key, --tls-ca): it serves /metrics with the daemon's own "
        "certificate");
  }
  absl::Status status = ApplyClusterFlags(args, flags.coordinator);
  if (status.ok()) status = ApplyLimitFlags(args, flags.coordinator);
  if (status.ok()) status = ApplyServiceFlags(args, flags.service_limits);
  if (status.ok()) status = ApplySchedulingFlags(args, flags.coordinator);
  if (!status.ok()) return status;
  if (args.Has("deny-identities")) {
    if (args.Has(kInsecureFlag)) {
      return absl::InvalidArgumentError(
          "--deny-identities needs mutual TLS: under --insecure nobody has "
          "an identity to deny");
    }
    auto deny = DenyList::Open(args.Get("deny-identities"), RealClock::Get());
    if (!deny.ok()) return deny.status();
    flags.deny = std::move(*deny);
    LogInfo("--deny-identities ", args.Get("deny-identities"), ": ",
            flags.deny->size(), " identities are refused");
    flags.coordinator.revoked = [deny = flags.deny](const std::string& id) {
      return deny->Denies(id);
    };
  }
  return flags;
}

// The coordinator, with the jobs the state dir holds. Errors: those of
// JobStore::Open and Coordinator::Create.
absl::StatusOr<std::unique_ptr<Coordinator>> OpenCoordinator(
    const std::string& state_dir, Coordinator::Options options) {
  auto store = JobStore::Open(state_dir);
  if (!store.ok()) return store.status();
  options.store = *std::move(store);
  return Coordinator::Create(std::move(options));
}

// The /metrics endpoint when --metrics-listen is given (null otherwise),
// over HTTPS with --metrics-tls.
absl::StatusOr<std::unique_ptr<metrics::HttpServer>> StartMetrics(
    const Flags& flags, const TlsMaterial& tls, Coordinator* coordinator) {
  if (!flags.metrics_listen.has_value()) {
    return std::unique_ptr<metrics::HttpServer>();
  }
  std::optional<metrics::HttpsOptions> https;
  if (flags.metrics_tls) {
    https = metrics::MetricsHttps(
        tls.files.cert_file, tls.files.key_file, tls.files.ca_file,
        [deny = flags.deny](const std::string& id) {
          return deny != nullptr && deny->Denies(id)
                     ? absl::StrCat(id, " is revoked (--deny-identities)")
                     : std::string();
        });
  }
  auto server = metrics::HttpServer::Start(
      *flags.metrics_listen,
      [coordinator] {
        metrics::Exposition out;
        coordinator->CollectMetrics(out);
        return out.Take();
      },
      std::move(https));
  if (server.ok()) {
    LogInfo("metrics on ", (*server)->scheme(), "://", (*server)->address(),
            "/metrics");
  }
  return server;
}

// The coordinator's gRPC service and the health service on `listen`.
// Errors: Unavailable when it cannot listen there.
absl::StatusOr<std::unique_ptr<GrpcServer>> StartGrpcServer(
    const std::string& listen, const TlsMaterial& tls,
    GrpcService::Limits limits, DenyList* deny, Coordinator* coordinator) {
  auto grpc =
      std::make_unique<GrpcServer>(coordinator, limits, tls.insecure, deny);
  grpc::ServerBuilder builder;
  grpc::ResourceQuota quota("lockstep-coordinator");
  quota.SetMaxThreads(kMaxGrpcThreads);
  builder.SetResourceQuota(quota);
  builder.SetMaxReceiveMessageSize(kMaxRpcMessageBytes);
  builder.SetMaxSendMessageSize(kMaxRpcMessageBytes);
  builder.AddListeningPort(listen, ServerCredentials(tls), &grpc->port);
  builder.RegisterService(&grpc->service);
  builder.RegisterService(&grpc->health);
  grpc->server = builder.BuildAndStart();
  if (grpc->server == nullptr || grpc->port == 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", listen,
                     "; is the port in use or the host name wrong?"));
  }
  return grpc;
}

// The addresses on stdout (tools wait for them), and a log line of what
// the daemon serves.
void Announce(const Flags& flags, int port,
              const metrics::HttpServer* metrics_server, bool static_cluster,
              bool insecure) {
  std::string host = flags.listen.substr(0, flags.listen.rfind(':'));
  std::cout << "lockstep-coordinator listening on " << host << ":" << port
            << std::endl;
  if (metrics_server != nullptr) {
    std::cout << "lockstep-coordinator metrics on " << metrics_server->address()
              << std::endl;
  }
  LogInfo("serving on ", host, ":", port, ", state in ", flags.state_dir,
          static_cluster ? ", static cluster" : ", free registration",
          insecure ? ", without TLS" : ", mutual TLS");
}

// Sweeps the coordinator until SIGTERM or SIGINT (of `signals`, blocked),
// then shuts everything down: health first, the gRPC server last.
void ServeUntilSignal(const sigset_t& signals, Coordinator& coordinator,
                      GrpcServer& grpc,
                      std::unique_ptr<metrics::HttpServer>& metrics_server) {
  // Liveness runs on the coordinator's clock: sweep often so a silent
  // worker is declared failed right after its timeout.
  absl::Notification stopping;
  std::thread sweeper([&] {
    while (!stopping.WaitForNotificationWithTimeout(absl::Milliseconds(100))) {
      coordinator.Sweep();
    }
  });

  int signal = 0;
  sigwait(&signals, &signal);
  LogInfo("signal ", signal, ": shutting down");
  stopping.Notify();
  sweeper.join();
  grpc.health.SetServing(false);
  metrics_server.reset();
  coordinator.Shutdown();
  grpc.server->Shutdown(std::chrono::system_clock::now() +
                        std::chrono::seconds(2));
}

int Run(int argc, char** argv) {
  const sigset_t signals = BlockShutdownSignals();
  auto args = ParseArgs(argc, argv);
  if (!args.ok()) return Fail(args.status(), 2);
  if (args->Has("help")) {
    std::cout << kUsage;
    return 0;
  }
  SetLogTag("coordinator");
  auto tls = SetUpTls(*args);
  if (!tls.ok()) return Fail(tls.status(), 2);
  auto flags = CheckFlags(*args);
  if (!flags.ok()) return Fail(flags.status(), 2);
  RaiseFileLimit();
  const bool static_cluster = flags->coordinator.cluster.has_value();
  auto coordinator =
      OpenCoordinator(flags->state_dir, std::move(flags->coordinator));
  if (!coordinator.ok()) return Fail(coordinator.status(), 1);
  auto metrics_server = StartMetrics(*flags, *tls, coordinator->get());
  if (!metrics_server.ok()) return Fail(metrics_server.status(), 2);
  auto grpc = StartGrpcServer(flags->listen, *tls, flags->service_limits,
                              flags->deny.get(), coordinator->get());
  if (!grpc.ok()) return Fail(grpc.status(), 1);
  Announce(*flags, (*grpc)->port, metrics_server->get(), static_cluster,
           tls->insecure);
  ServeUntilSignal(signals, **coordinator, **grpc, *metrics_server);
  return 0;
}

}  // namespace
}  // namespace lockstep::coordinator

int main(int argc, char** argv) {
  return lockstep::coordinator::Run(argc, argv);
}
