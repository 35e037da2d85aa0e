// How every `lockstep` command reaches the coordinator and reports failure:
// the address and TLS credentials, argument handling, errors and exit codes.
#ifndef LOCKSTEP_CLIENT_CONNECTION_H_
#define LOCKSTEP_CLIENT_CONNECTION_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/args.h"
#include "common/tls.h"
#include "lockstep/v1/coordinator.grpc.pb.h"

namespace lockstep::client {

// Exit codes: 0 success, 1 the job failed, 2 usage error, 3 cannot reach the
// coordinator.
inline constexpr int kExitOk = 0;
inline constexpr int kExitJobFailed = 1;
inline constexpr int kExitUsage = 2;
inline constexpr int kExitUnreachable = 3;

// Prints "lockstep: <message>" on stderr and returns the exit code that fits
// the status: 3 when the coordinator cannot be reached, 2 for bad input, 1
// otherwise.
int Fail(const absl::Status& status);

// The coordinator address from --coordinator, else $LOCKSTEP_COORDINATOR.
absl::StatusOr<std::string> CoordinatorAddress(const Args& args);
// The CLI's channel credentials from --tls-cert/--tls-key/--tls-ca or
// --insecure, else LOCKSTEP_TLS_* or LOCKSTEP_INSECURE=1 (common/tls.h).
// `check` says whom the channel must reach (the coordinator, unless a
// health probe). Errors: InvalidArgument (a usage error), FailedPrecondition
// for a file.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> CliCredentials(
    const Args& args, ServerCheck check = ServerCheck::kCoordinator);
std::unique_ptr<v1::Coordinator::Stub> Connect(
    const std::string& address,
    std::shared_ptr<grpc::ChannelCredentials> credentials);

// A coordinator error as the CLI reports it: unreachable (Unavailable,
// naming `address` and what to do) or the coordinator's own status.
absl::Status RpcError(const grpc::Status& status, const std::string& address);
void SetDeadline(grpc::ClientContext* context, int seconds);

// One job's status from the coordinator at `address`; with `history`, its
// whole loss history, fetched page by page (each page its own call of at
// most `seconds`). Errors: those of RpcError; NotFound.
absl::StatusOr<v1::JobStatus> FetchJob(v1::Coordinator::Stub* stub,
                                       const std::string& address,
                                       const std::string& job, bool history,
                                       int seconds = 10);

// Every worker the coordinator knows, page by page. Errors: those of
// RpcError.
absl::StatusOr<std::vector<v1::WorkerInfo>> FetchWorkers(
    v1::Coordinator::Stub* stub, const std::string& address, int seconds = 10);

// A parsed command line with its coordinator connection.
struct Invocation {
  Args args;
  std::string address;
  std::unique_ptr<v1::Coordinator::Stub> stub;
};

// Parses `argv` (with --coordinator, the TLS flags and --help added to the
// flags), checks the number of positional arguments, and connects. Returns
// nothing when the command is already over: --help was printed, or a usage
// error was; `*exit` then holds the exit code.
std::optional<Invocation> Begin(const std::vector<std::string>& argv,
                                std::set<std::string> value_flags,
                                std::set<std::string> bool_flags,
                                const char* usage, size_t min_positional,
                                size_t max_positional, int* exit);

}  // namespace lockstep::client

#endif  // LOCKSTEP_CLIENT_CONNECTION_H_
