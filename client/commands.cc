// What the `lockstep` commands share: the job spec as the CLI reads it, one
// job's status, following a job, --json output (commands.h).
#include "client/commands.h"

#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/job_spec.h"
#include "common/job_state.h"
#include "common/proto_json.h"
#include "common/status_macros.h"

namespace lockstep::client {

std::string ToJson(const google::protobuf::Message& message) {
  return lockstep::ToJson(message, JsonStyle::kCompact);
}

absl::StatusOr<v1::JobSpec> LoadSpec(const std::string& path,
                                     const std::vector<std::string>& sets) {
  ASSIGN_OR_RETURN(v1::JobSpec spec, LoadJobSpec(path));
  for (const std::string& set : sets)
    RETURN_IF_ERROR(ApplyOverride(set, &spec));
  ApplyDefaults(&spec);
  // Paths are the CLI user's: make them absolute before a daemon sees them.
  auto absolute = [](const std::string& path) {
    if (path.empty() || path[0] == '/') return path;
    std::error_code error;
    std::filesystem::path full = std::filesystem::absolute(path, error);
    return error ? path : full.lexically_normal().string();
  };
  spec.mutable_checkpoint()->set_backup_dir(
      absolute(spec.checkpoint().backup_dir()));
  spec.set_export_path(absolute(spec.export_path()));
  return spec;
}

absl::StatusOr<v1::JobStatus> GetJob(Invocation& call, const std::string& job,
                                     bool history) {
  return FetchJob(call.stub.get(), call.address, job, history);
}

absl::StatusOr<v1::JobStatus> WatchJob(
    v1::Coordinator::Stub* stub, const std::string& job_id,
    grpc::ClientContext* context,
    const std::function<void(const v1::JobStatus&)>& on_update) {
  v1::WatchJobRequest request;
  request.set_job_id(job_id);
  auto reader = stub->WatchJob(context, request);
  v1::JobStatus status;
  v1::JobStatus last;
  while (reader->Read(&status)) {
    on_update(status);
    last = status;
    if (IsTerminal(status.state())) break;
  }
  grpc::Status finished = reader->Finish();
  if (IsTerminal(last.state())) return last;
  if (!finished.ok()) return FromGrpcStatus(finished);
  return absl::UnavailableError(
      absl::StrCat("the coordinator stopped streaming job ", job_id));
}

}  // namespace lockstep::client
