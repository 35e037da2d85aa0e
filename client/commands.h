// The `lockstep` CLI's commands and what they share: the job spec as the CLI
// reads it, one job's status, following a job, --json output. Exit codes and
// the coordinator connection are in connection.h.
#ifndef LOCKSTEP_CLIENT_COMMANDS_H_
#define LOCKSTEP_CLIENT_COMMANDS_H_

#include <grpcpp/grpcpp.h>

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/connection.h"
#include "lockstep/v1/coordinator.grpc.pb.h"

namespace lockstep::client {

// Loads JOB.json, applies every --set, then the defaults.
absl::StatusOr<v1::JobSpec> LoadSpec(const std::string& path,
                                     const std::vector<std::string>& sets);

// The CLI's --json form of a message: JsonStyle::kCompact.
std::string ToJson(const google::protobuf::Message& message);

// One job's status (with the per-step loss history when `history`).
absl::StatusOr<v1::JobStatus> GetJob(Invocation& call, const std::string& job,
                                     bool history);

// Follows a job until it ends, calling `on_update` for each new status.
// `context` may be cancelled from another thread to give up.
absl::StatusOr<v1::JobStatus> WatchJob(
    v1::Coordinator::Stub* stub, const std::string& job_id,
    grpc::ClientContext* context,
    const std::function<void(const v1::JobStatus&)>& on_update);

// Each command: `argv` is what follows its name; returns the exit code.
int RunSubmit(const std::vector<std::string>& argv);
int RunStatus(const std::vector<std::string>& argv);
int RunStop(const std::vector<std::string>& argv);
int RunDelete(const std::vector<std::string>& argv);
int RunWorkers(const std::vector<std::string>& argv);
// lockstep queue: the queued jobs in the scheduler's order and why each
// waits.
int RunQueue(const std::vector<std::string>& argv);
int RunEvents(const std::vector<std::string>& argv);
int RunCheckpoints(const std::vector<std::string>& argv);
int RunWatch(const std::vector<std::string>& argv);
// lockstep logs: a job's events and progress as plain lines, followed
// with --follow.
int RunLogs(const std::vector<std::string>& argv);
int RunMetrics(const std::vector<std::string>& argv);
int RunCompare(const std::vector<std::string>& argv);
int RunLocal(const std::vector<std::string>& argv, const std::string& bin_dir);
int RunHealth(const std::vector<std::string>& argv);
int RunData(const std::vector<std::string>& argv);
// lockstep artifacts list|get: the models the coordinator keeps.
int RunArtifacts(const std::vector<std::string>& argv);
// lockstep ui: the web console (client/ui_server.h).
int RunUi(const std::vector<std::string>& argv);

}  // namespace lockstep::client

#endif  // LOCKSTEP_CLIENT_COMMANDS_H_
