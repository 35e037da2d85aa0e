// The `lockstep` CLI's commands. Exit codes: 0 success, 1 the job failed,
// 2 usage error, 3 cannot reach the coordinator.
#ifndef LOCKSTEP_CLIENT_COMMANDS_H_
#define LOCKSTEP_CLIENT_COMMANDS_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/args.h"
#include "lockstep/v1/coordinator.grpc.pb.h"

namespace lockstep::client {

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
// Errors: InvalidArgument (a usage error), FailedPrecondition for a file.
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> CliCredentials(
    const Args& args);
std::unique_ptr<v1::Coordinator::Stub> Connect(
    const std::string& address,
    std::shared_ptr<grpc::ChannelCredentials> credentials);

// Loads JOB.json, applies every --set, then the defaults.
absl::StatusOr<v1::JobSpec> LoadSpec(const std::string& path,
                                     const std::vector<std::string>& sets);

// A coordinator error as the CLI reports it: unreachable (Unavailable,
// naming `address` and what to do) or the coordinator's own status.
absl::Status RpcError(const grpc::Status& status, const std::string& address);
void SetDeadline(grpc::ClientContext* context, int seconds);
// The CLI's --json form of a message: JsonStyle::kCompact.
std::string ToJson(const google::protobuf::Message& message);

// A parsed command line with its coordinator connection.
struct Invocation {
  Args args;
  std::string address;
  std::unique_ptr<v1::Coordinator::Stub> stub;
};

// Parses `argv` (with --coordinator, the TLS flags and --help added to the
// flags), checks
// the number of positional arguments, and connects. Returns nothing when the
// command is already over: --help was printed, or a usage error was; `*exit`
// then holds the exit code.
std::optional<Invocation> Begin(const std::vector<std::string>& argv,
                                std::set<std::string> value_flags,
                                std::set<std::string> bool_flags,
                                const char* usage, size_t min_positional,
                                size_t max_positional, int* exit);

// One job's status (with the per-step loss history when `history`).
absl::StatusOr<v1::JobStatus> GetJob(Invocation& call, const std::string& job,
                                     bool history);

// One line of progress: "step 120/936  epoch 1  loss 0.5234 ...".
std::string FormatProgress(const v1::JobStatus& status);

// Follows a job until it ends, calling `on_update` for each new status.
// `context` may be cancelled from another thread to give up.
absl::StatusOr<v1::JobStatus> WatchJob(
    v1::Coordinator::Stub* stub, const std::string& job_id,
    grpc::ClientContext* context,
    const std::function<void(const v1::JobStatus&)>& on_update);

// "succeeded", "failed", ...
std::string StateName(v1::JobState state);

int RunSubmit(const std::vector<std::string>& argv);
int RunStatus(const std::vector<std::string>& argv);
int RunStop(const std::vector<std::string>& argv);
int RunDelete(const std::vector<std::string>& argv);
int RunWorkers(const std::vector<std::string>& argv);
int RunEvents(const std::vector<std::string>& argv);
int RunCheckpoints(const std::vector<std::string>& argv);
int RunWatch(const std::vector<std::string>& argv);
int RunMetrics(const std::vector<std::string>& argv);
int RunCompare(const std::vector<std::string>& argv);
int RunLocal(const std::vector<std::string>& argv, const std::string& bin_dir);
int RunHealth(const std::vector<std::string>& argv);

}  // namespace lockstep::client

#endif  // LOCKSTEP_CLIENT_COMMANDS_H_
