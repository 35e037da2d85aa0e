// The `lockstep` commands that act on one job: submit it, watch it, stop it,
// delete it.
#include <google/protobuf/struct.pb.h>
#include <unistd.h>

#include <functional>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "client/commands.h"
#include "client/views.h"
#include "common/job_spec.h"

namespace lockstep::client {
namespace {

constexpr char kSubmitUsage[] =
    R"(Usage: lockstep submit JOB.json [--set field=value ...] [--watch] [--json]

Validates JOB.json (with the overrides), queues it on the coordinator and
prints its id. With --watch, follows it as `lockstep watch` does and exits 0
if it succeeded, 1 if it failed or was stopped.

Flags:
  --set field=value   override a job-spec field; repeatable; dotted for
                      nested fields (optimizer.type=adam)
  --watch             follow the job to its end
  --json              print {"job_id": ...} (without --watch)

Examples:
  lockstep submit examples/fashion_mnist_mlp.json --set epochs=3 --watch
  lockstep submit job.json --set checkpoint.backup_dir=/backup/run1 --json
)";

constexpr char kWatchUsage[] = R"(Usage: lockstep watch JOB [--json]

Follows a job until it ends. On a terminal, a progress bar for the current
epoch is redrawn in place: steps, loss, test accuracy, samples/s, time left
(ETA) and generation; each evaluation and each event (a failed worker, a
resume, a checkpoint) is printed on a line of its own. Piped or redirected,
it prints plain lines instead. Exits 0 if the job succeeded, 1 otherwise.

Flags:
  --json   one JSON object (the job's status) per line, at each change

Examples:
  lockstep watch fashion-mnist-cnn-3
  lockstep watch fashion-mnist-cnn-3 --json | jq .step
)";

constexpr char kLogsUsage[] = R"(Usage: lockstep logs JOB [--follow]

A job's log as plain lines, for a file or a pipe: each event (a placement,
a failed worker, a resume, a checkpoint, a preemption) and each evaluation
on a line of its own, then its progress. --follow keeps going until the job
ends, with a progress line every 2 s (what `lockstep watch` prints when its
output is not a terminal) and exits as watch does: 0 if the job succeeded,
1 otherwise. Without --follow it prints what happened so far and exits 0.

Examples:
  lockstep logs fashion-mnist-cnn-3
  lockstep logs fashion-mnist-cnn-3 --follow > cnn-3.log
)";

constexpr char kStopUsage[] = R"(Usage: lockstep stop JOB [--json]

Stops a job: a queued job at once, a running job at a step all ranks agree on.
With checkpoint.backup_dir set, that step is saved first, so submitting the
same job again resumes exactly there. Follow it with `lockstep watch JOB`.

Example:
  lockstep stop fashion-mnist-cnn-3
)";

constexpr char kDeleteUsage[] = R"(Usage: lockstep delete JOB [--json]

Deletes a finished job (succeeded, failed or stopped) from the coordinator:
its status, events and stored record. Its checkpoints in backup_dir stay. A
job that has not ended is refused: stop it first with `lockstep stop JOB`.
The coordinator also deletes old finished jobs by itself
(--keep-finished-jobs, --finished-job-ttl).

Example:
  lockstep delete fashion-mnist-cnn-3
)";

// One call about one job, made with `context` on `stub`.
using JobCall = std::function<grpc::Status(v1::Coordinator::Stub* stub,
                                           grpc::ClientContext* context,
                                           const std::string& job)>;

// `lockstep stop` and `lockstep delete`: makes `rpc` about the job named on
// the command line, then prints "<done> JOB", or with --json
// {"job_id": JOB, "<done>": true}.
int RunJobCall(const std::vector<std::string>& argv, const char* usage,
               const std::string& done, const JobCall& rpc) {
  int exit = kExitOk;
  auto call = Begin(argv, {}, {"json"}, usage, 1, 1, &exit);
  if (!call) return exit;
  const std::string& job = call->args.positional()[0];
  grpc::ClientContext context;
  SetDeadline(&context, 10);
  grpc::Status status = rpc(call->stub.get(), &context, job);
  if (!status.ok()) return Fail(RpcError(status, call->address));
  if (call->args.Has("json")) {
    google::protobuf::Struct out;
    auto& f = *out.mutable_fields();
    f["job_id"].set_string_value(job);
    f[done].set_bool_value(true);
    std::cout << ToJson(out) << std::endl;
  } else {
    std::cout << done << " " << job << std::endl;
  }
  return kExitOk;
}

}  // namespace

int RunSubmit(const std::vector<std::string>& argv) {
  int exit = kExitOk;
  auto call =
      Begin(argv, {"set"}, {"watch", "json"}, kSubmitUsage, 1, 1, &exit);
  if (!call) return exit;
  const Args& args = call->args;
  const std::string& address = call->address;
  v1::Coordinator::Stub* stub = call->stub.get();
  auto spec = LoadSpec(args.positional()[0], args.GetAll("set"));
  if (!spec.ok()) return Fail(spec.status());
  absl::Status valid = ValidateJobSpec(*spec, spec->num_workers());
  if (!valid.ok()) return Fail(valid);

  grpc::ClientContext context;
  SetDeadline(&context, 10);
  v1::SubmitJobRequest request;
  *request.mutable_spec() = *spec;
  v1::SubmitJobResponse response;
  grpc::Status rpc = stub->SubmitJob(&context, request, &response);
  if (!rpc.ok()) return Fail(RpcError(rpc, address));
  if (args.Has("json") && !args.Has("watch")) {
    std::cout << ToJson(response) << std::endl;
    return kExitOk;
  }
  std::cout << response.job_id() << std::endl;
  if (!args.Has("watch")) return kExitOk;

  grpc::ClientContext watch_context;
  ProgressView view(std::cout, isatty(STDOUT_FILENO));
  auto final_status =
      WatchJob(stub, response.job_id(), &watch_context,
               [&view](const v1::JobStatus& status) { view.Update(status); });
  if (!final_status.ok()) return Fail(final_status.status());
  view.Finish(*final_status);
  return final_status->state() == v1::JOB_STATE_SUCCEEDED ? kExitOk
                                                          : kExitJobFailed;
}

namespace {

// Follows `job` to its end on `view` (or as JSON lines); the exit code.
int Follow(Invocation& call, const std::string& job, bool json,
           ProgressView& view) {
  grpc::ClientContext context;
  auto final_status = WatchJob(call.stub.get(), job, &context,
                               [&](const v1::JobStatus& status) {
                                 if (json) {
                                   std::cout << ToJson(status) << std::endl;
                                 } else {
                                   view.Update(status);
                                 }
                               });
  if (!final_status.ok()) {
    if (absl::IsUnavailable(final_status.status())) {
      return Fail(absl::UnavailableError(absl::StrCat(
          "cannot reach the coordinator at ", call.address, " (",
          final_status.status().message(),
          "); is lockstep-coordinator running? Set --coordinator or "
          "LOCKSTEP_COORDINATOR")));
    }
    return Fail(final_status.status());
  }
  if (!json) view.Finish(*final_status);
  return final_status->state() == v1::JOB_STATE_SUCCEEDED ? kExitOk
                                                          : kExitJobFailed;
}

}  // namespace

int RunWatch(const std::vector<std::string>& argv) {
  int exit = kExitOk;
  auto call = Begin(argv, {}, {"json"}, kWatchUsage, 1, 1, &exit);
  if (!call) return exit;
  ProgressView view(std::cout, isatty(STDOUT_FILENO));
  return Follow(*call, call->args.positional()[0], call->args.Has("json"),
                view);
}

int RunLogs(const std::vector<std::string>& argv) {
  int exit = kExitOk;
  auto call = Begin(argv, {}, {"follow"}, kLogsUsage, 1, 1, &exit);
  if (!call) return exit;
  const std::string& job = call->args.positional()[0];
  ProgressView view(std::cout, /*tty=*/false);
  if (call->args.Has("follow")) return Follow(*call, job, false, view);
  auto status = GetJob(*call, job, /*history=*/false);
  if (!status.ok()) return Fail(status.status());
  view.Update(*status);
  return kExitOk;
}

int RunStop(const std::vector<std::string>& argv) {
  return RunJobCall(argv, kStopUsage, "stopping",
                    [](v1::Coordinator::Stub* stub,
                       grpc::ClientContext* context, const std::string& job) {
                      v1::StopJobRequest request;
                      request.set_job_id(job);
                      v1::StopJobResponse response;
                      return stub->StopJob(context, request, &response);
                    });
}

int RunDelete(const std::vector<std::string>& argv) {
  return RunJobCall(argv, kDeleteUsage, "deleted",
                    [](v1::Coordinator::Stub* stub,
                       grpc::ClientContext* context, const std::string& job) {
                      v1::DeleteJobRequest request;
                      request.set_job_id(job);
                      v1::DeleteJobResponse response;
                      return stub->DeleteJob(context, request, &response);
                    });
}

}  // namespace lockstep::client
