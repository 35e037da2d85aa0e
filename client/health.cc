// `lockstep health HOST:PORT`: grpc.health.v1 Check over the CLI's TLS, for
// Kubernetes exec probes (Kubernetes' own gRPC probe cannot present a
// client certificate).
#include <google/protobuf/struct.pb.h>

#include <iostream>

#include "client/commands.h"
#include "common/grpc_status.h"
#include "common/terminal_text.h"
#include "common/tls.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace lockstep::client {
namespace {

constexpr char kHealthUsage[] =
    R"(Usage: lockstep health HOST:PORT [--timeout SECS] [--json]

Asks a lockstep-coordinator or a lockstep-worker's --health-listen port
whether it is serving (grpc.health.v1 Check), with this CLI's TLS settings
(--tls-cert/--tls-key/--tls-ca or LOCKSTEP_TLS_*; any certificate from the
daemon's CA whose SPIFFE ID names a lockstep role will do). It asks about
the whole server: the daemons serve no per-service health. Exit 0 when it answers SERVING; 1 otherwise: it
answers NOT_SERVING, refuses the call, or cannot be reached; 2 for a usage
error. For Kubernetes exec probes.

Flags:
  --timeout SECS   give up after this long (default 5)
  --json           print {"status": "SERVING"} and the like

Example:
  lockstep health 127.0.0.1:7070 --tls-cert /etc/lockstep/tls/tls.crt \
      --tls-key /etc/lockstep/tls/tls.key --tls-ca /etc/lockstep/tls/ca.crt
)";

}  // namespace

int RunHealth(const std::vector<std::string>& argv) {
  std::set<std::string> value_flags = {"timeout"};
  value_flags.insert(TlsValueFlags().begin(), TlsValueFlags().end());
  auto args = Args::Parse(argv, value_flags, {"json", "help", kInsecureFlag});
  if (!args.ok()) return Fail(args.status());
  if (args->Has("help")) {
    std::cout << kHealthUsage;
    return kExitOk;
  }
  if (args->positional().size() != 1) {
    std::cerr << kHealthUsage;
    return kExitUsage;
  }
  auto timeout = args->GetDouble("timeout", 5);
  if (!timeout.ok()) return Fail(timeout.status());
  if (!(*timeout > 0 && *timeout <= 3600)) {
    return Fail(absl::InvalidArgumentError(
        "--timeout must be more than 0 and at most 3600 seconds"));
  }
  auto credentials = CliCredentials(*args, ServerCheck::kAnyDaemon);
  if (!credentials.ok()) return Fail(credentials.status());
  const std::string& address = args->positional()[0];
  auto stub = grpc::health::v1::Health::NewStub(
      grpc::CreateChannel(address, *credentials));
  grpc::ClientContext context;
  context.set_deadline(
      std::chrono::system_clock::now() +
      std::chrono::milliseconds(static_cast<int64_t>(*timeout * 1000)));
  grpc::health::v1::HealthCheckRequest request;
  grpc::health::v1::HealthCheckResponse response;
  grpc::Status rpc = stub->Check(&context, request, &response);
  if (!rpc.ok()) {
    absl::Status status = FromGrpcStatus(rpc);
    if (absl::IsUnavailable(status) || absl::IsDeadlineExceeded(status)) {
      std::cerr << "lockstep: cannot reach " << TerminalSafe(address) << " ("
                << TerminalSafe(status.message())
                << "); is the daemon running there, and do both sides' "
                   "certificates come from the same CA?\n";
      return kExitJobFailed;
    }
    std::cerr << "lockstep: " << TerminalSafe(address)
              << " refused the health check: " << TerminalSafe(status.message())
              << "\n";
    return kExitJobFailed;
  }
  const std::string name =
      grpc::health::v1::HealthCheckResponse::ServingStatus_Name(
          response.status());
  if (args->Has("json")) {
    // Not HealthCheckResponse itself: its --json form leaves out a status
    // at the default value (UNKNOWN).
    google::protobuf::Struct out;
    (*out.mutable_fields())["status"].set_string_value(name);
    std::cout << ToJson(out) << std::endl;
  } else {
    std::cout << TerminalSafe(address) << ": " << name << std::endl;
  }
  return response.status() == grpc::health::v1::HealthCheckResponse::SERVING
             ? kExitOk
             : kExitJobFailed;
}

}  // namespace lockstep::client
