// The `lockstep` commands that talk to the coordinator (submit, status,
// workers, events, stop, delete, checkpoints) and the helpers they share
// (commands.h).
#include "client/commands.h"

#include <google/protobuf/struct.pb.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/views.h"
#include "common/grpc_status.h"
#include "common/job_spec.h"
#include "common/job_state.h"
#include "common/proto_json.h"
#include "common/status_macros.h"
#include "common/terminal_text.h"
#include "common/tls.h"
#include "worker/checkpoint/store.h"

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

constexpr char kStatusUsage[] =
    R"(Usage: lockstep status [JOB] [--limit N | --all] [--json]

Shows one job, or the newest jobs first: state, step, workers, the
communication backend of its latest generation (gloo or nccl), loss, test
accuracy, samples/s, and why a job failed. --json gives the full status of
one job, or the summaries of the jobs listed (without loss history, events,
checkpoints and evaluations).

Without JOB it lists the newest 100 jobs and says when there are more.

Flags:
  --limit N   list the newest N jobs
  --all       list every job the coordinator keeps

Examples:
  lockstep status
  lockstep status --all
  lockstep status fashion-mnist-mlp-1 --json
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

constexpr char kWorkersUsage[] = R"(Usage: lockstep workers [--json]

Lists every worker the coordinator knows: id (task type:index), state
(training, standby, idle, disconnected), role ("rank N", or "spare" for a hot
spare without a rank), job (the one it trains, or "for JOB" when it stands by
to take a failed rank of JOB), generation, host, how long ago it was last
heard from, and the device it trains on ("cpu", or "cuda:N" with the
GPU's model; --json adds the GPU's UUID).

Examples:
  lockstep workers
  LOCKSTEP_COORDINATOR=coord:7070 lockstep workers --json
)";

constexpr char kEventsUsage[] = R"(Usage: lockstep events JOB [--json]

Lists what happened to a job: generations started and ended, workers that
failed (task, host, rank, cause), training resumed after a failure (from
which rank's state or checkpoint), checkpoints committed, preemptions.

Examples:
  lockstep events fashion-mnist-mlp-1
)";

constexpr char kCheckpointsUsage[] =
    R"(Usage: lockstep checkpoints JOB [--json]

Lists the job's committed checkpoints, oldest first: step, epoch, commit
time, size, and whether it verifies. Verifying reads checkpoint.backup_dir
from this machine (every file against the SHA-256 in its MANIFEST.json);
where that folder is not reachable, the coordinator's record is shown with
"not checked". A checkpoint pruned by checkpoint.keep or removed after the
job succeeded shows as "removed".

Examples:
  lockstep checkpoints job-3
  lockstep checkpoints job-3 --json
)";

constexpr char kStopUsage[] = R"(Usage: lockstep stop JOB [--json]

Stops a job: a queued job at once, a running job at a step all ranks agree on.
With checkpoint.backup_dir set, that step is saved first, so submitting the
same job again resumes exactly there. Follow it with `lockstep watch JOB`.

Example:
  lockstep stop fashion-mnist-cnn-3
)";

}  // namespace

absl::Status RpcError(const grpc::Status& status, const std::string& address) {
  absl::Status result = FromGrpcStatus(status);
  if (result.code() == absl::StatusCode::kUnavailable ||
      result.code() == absl::StatusCode::kDeadlineExceeded) {
    return absl::UnavailableError(absl::StrCat(
        "cannot reach the coordinator at ", address, " (", result.message(),
        "); is lockstep-coordinator running? Set --coordinator or "
        "LOCKSTEP_COORDINATOR. If it is, the TLS handshake may have failed: "
        "both sides' certificates must come from the same CA (--tls-ca, "
        "LOCKSTEP_TLS_CA) and the coordinator's must name the host dialed"));
  }
  return result;
}

void SetDeadline(grpc::ClientContext* context, int seconds) {
  context->set_deadline(std::chrono::system_clock::now() +
                        std::chrono::seconds(seconds));
}

std::string ToJson(const google::protobuf::Message& message) {
  return lockstep::ToJson(message, JsonStyle::kCompact);
}

std::optional<Invocation> Begin(const std::vector<std::string>& argv,
                                std::set<std::string> value_flags,
                                std::set<std::string> bool_flags,
                                const char* usage, size_t min_positional,
                                size_t max_positional, int* exit) {
  value_flags.insert("coordinator");
  value_flags.insert(TlsValueFlags().begin(), TlsValueFlags().end());
  bool_flags.insert("help");
  bool_flags.insert(kInsecureFlag);
  auto args = Args::Parse(argv, value_flags, bool_flags);
  if (!args.ok()) {
    *exit = Fail(args.status());
    return std::nullopt;
  }
  if (args->Has("help")) {
    std::cout << usage;
    *exit = kExitOk;
    return std::nullopt;
  }
  if (args->positional().size() < min_positional ||
      args->positional().size() > max_positional) {
    std::cerr << usage;
    *exit = kExitUsage;
    return std::nullopt;
  }
  auto address = CoordinatorAddress(*args);
  if (!address.ok()) {
    *exit = Fail(address.status());
    return std::nullopt;
  }
  auto credentials = CliCredentials(*args);
  if (!credentials.ok()) {
    *exit = Fail(credentials.status());
    return std::nullopt;
  }
  Invocation invocation{*std::move(args), *address,
                        Connect(*address, *credentials)};
  return invocation;
}

absl::StatusOr<v1::JobStatus> GetJob(Invocation& call, const std::string& job,
                                     bool history) {
  grpc::ClientContext context;
  SetDeadline(&context, 10);
  v1::GetJobStatusRequest request;
  request.set_job_id(job);
  request.set_include_history(history);
  v1::GetJobStatusResponse response;
  grpc::Status rpc = call.stub->GetJobStatus(&context, request, &response);
  if (!rpc.ok()) return RpcError(rpc, call.address);
  if (response.jobs_size() != 1) {
    return absl::NotFoundError(absl::StrCat("no job ", job));
  }
  return response.jobs(0);
}

int Fail(const absl::Status& status) {
  std::cerr << "lockstep: " << TerminalSafe(status.message()) << "\n";
  switch (status.code()) {
    case absl::StatusCode::kUnavailable:
      return kExitUnreachable;
    case absl::StatusCode::kInvalidArgument:
    case absl::StatusCode::kNotFound:
      return kExitUsage;
    default:
      return kExitJobFailed;
  }
}

absl::StatusOr<std::string> CoordinatorAddress(const Args& args) {
  const char* env = std::getenv("LOCKSTEP_COORDINATOR");
  std::string address = args.Get("coordinator", env ? env : "");
  if (address.empty()) {
    return absl::InvalidArgumentError(
        "no coordinator address: pass --coordinator HOST:PORT or set "
        "LOCKSTEP_COORDINATOR");
  }
  return address;
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>> CliCredentials(
    const Args& args) {
  ASSIGN_OR_RETURN(TlsOptions options, TlsOptionsFromArgsOrEnv(args));
  absl::StatusOr<TlsMaterial> material = LoadTlsMaterial(options);
  if (!material.ok()) {
    // A file the user named is a usage problem (exit 2).
    return absl::InvalidArgumentError(material.status().message());
  }
  return ChannelCredentials(*material);
}

std::unique_ptr<v1::Coordinator::Stub> Connect(
    const std::string& address,
    std::shared_ptr<grpc::ChannelCredentials> credentials) {
  return v1::Coordinator::NewStub(
      grpc::CreateChannel(address, std::move(credentials)));
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

std::string StateName(v1::JobState state) {
  std::string name = v1::JobState_Name(state);
  return absl::AsciiStrToLower(name.substr(std::string("JOB_STATE_").size()));
}

std::string FormatProgress(const v1::JobStatus& status) {
  if (status.state() == v1::JOB_STATE_QUEUED) {
    return absl::StrCat(status.job_id(), "  queued, waiting for workers");
  }
  if (status.state() == v1::JOB_STATE_RECOVERING) {
    return absl::StrCat(status.job_id(), "  recovering after generation ",
                        status.generation(), ": ", status.error());
  }
  if (status.state() == v1::JOB_STATE_RUNNING && status.total_steps() == 0) {
    return absl::StrCat(status.job_id(), "  generation ", status.generation(),
                        " on ", status.world_size(),
                        " workers: loading data, connecting the ranks");
  }
  std::string line = absl::StrFormat(
      "%s  step %d/%d  epoch %d/%d  loss %.4f  %.0f samples/s  gen %d",
      status.job_id(), status.step(), status.total_steps(), status.epoch() + 1,
      status.spec().epochs(), status.loss(), status.samples_per_second(),
      status.generation());
  if (status.has_test_accuracy()) {
    absl::StrAppendFormat(&line, "  test acc %.2f%%",
                          100 * status.test_accuracy());
  }
  if (!status.stall().empty())
    absl::StrAppend(&line, "  [", status.stall(), "]");
  return line;
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
    std::cout << "{\"job_id\":\"" << response.job_id() << "\"}" << std::endl;
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

// The jobs `lockstep status` lists: one job, or the newest `limit` (every
// job when `limit` < 0) page by page. `*more` says whether older ones
// were left out.
absl::StatusOr<v1::GetJobStatusResponse> ListJobs(Invocation& call,
                                                  int64_t limit, bool* more) {
  v1::GetJobStatusResponse all;
  v1::GetJobStatusRequest request;
  if (!call.args.positional().empty()) {
    request.set_job_id(call.args.positional()[0]);
  }
  *more = false;
  do {
    if (limit >= 0) {
      request.set_page_size(
          static_cast<int>(std::min<int64_t>(limit - all.jobs_size(), 1000)));
    }
    grpc::ClientContext context;
    SetDeadline(&context, 10);
    v1::GetJobStatusResponse page;
    grpc::Status rpc = call.stub->GetJobStatus(&context, request, &page);
    if (!rpc.ok()) return RpcError(rpc, call.address);
    for (v1::JobStatus& job : *page.mutable_jobs()) {
      *all.add_jobs() = std::move(job);
    }
    request.set_page_token(page.next_page_token());
  } while (!request.page_token().empty() &&
           (limit < 0 || all.jobs_size() < limit));
  *more = !request.page_token().empty();
  return all;
}

}  // namespace

int RunStatus(const std::vector<std::string>& argv) {
  int exit = kExitOk;
  auto call =
      Begin(argv, {"limit"}, {"json", "all"}, kStatusUsage, 0, 1, &exit);
  if (!call) return exit;
  auto limit = call->args.GetInt("limit", 100);
  if (!limit.ok()) return Fail(limit.status());
  if (*limit < 1) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("--limit is ", *limit, "; give a number of jobs >= 1")));
  }
  bool more = false;
  auto listed = ListJobs(*call, call->args.Has("all") ? -1 : *limit, &more);
  if (!listed.ok()) return Fail(listed.status());
  const v1::GetJobStatusResponse& response = *listed;
  if (more) {
    std::cerr << "lockstep: listing the newest " << response.jobs_size()
              << " jobs; --limit N lists more, --all every job\n";
  }

  if (call->args.Has("json")) {
    std::cout << "[";
    for (int i = 0; i < response.jobs_size(); ++i) {
      std::cout << (i ? "," : "") << ToJson(response.jobs(i));
    }
    std::cout << "]" << std::endl;
    return kExitOk;
  }
  if (response.jobs().empty()) {
    std::cout << "no jobs" << std::endl;
    return kExitOk;
  }
  std::cout << absl::StrFormat("%-28s %-10s %-13s %-7s %-7s %-8s %-9s %s\n",
                               "JOB", "STATE", "STEP", "WORKERS", "BACKEND",
                               "LOSS", "TEST ACC", "SAMPLES/S");
  for (const v1::JobStatus& job : response.jobs()) {
    std::cout << TerminalSafe(absl::StrFormat(
        "%-28s %-10s %-13s %-7d %-7s %-8.4f %-9s %.0f\n", job.job_id(),
        StateName(job.state()),
        absl::StrCat(job.step(), "/", job.total_steps()), job.world_size(),
        job.backend().empty() ? "-" : job.backend(), job.loss(),
        job.has_test_accuracy()
            ? absl::StrFormat("%.2f%%", 100 * job.test_accuracy())
            : "-",
        job.samples_per_second()));
    if (!job.error().empty() && job.state() != v1::JOB_STATE_SUCCEEDED) {
      std::cout << "  " << TerminalSafe(job.error()) << "\n";
    }
    if (!job.stall().empty()) {
      std::cout << "  " << TerminalSafe(job.stall()) << "\n";
    }
  }
  return kExitOk;
}

namespace {

// "rank 1", "spare" (registered as a hot spare, no rank now) or "-".
std::string WorkerRole(const v1::WorkerInfo& w) {
  if (w.rank() >= 0) return absl::StrCat("rank ", w.rank());
  return w.spare() ? "spare" : "-";
}

// The job a worker trains, or "for JOB" when it stands by for one (it takes
// a failed rank of that job).
std::string WorkerJob(const v1::WorkerInfo& w) {
  if (!w.job_id().empty()) return w.job_id();
  if (!w.standby_job_id().empty()) return "for " + w.standby_job_id();
  return "-";
}

}  // namespace

int RunWorkers(const std::vector<std::string>& argv) {
  int exit = kExitOk;
  auto call = Begin(argv, {}, {"json"}, kWorkersUsage, 0, 0, &exit);
  if (!call) return exit;
  grpc::ClientContext context;
  SetDeadline(&context, 10);
  v1::ListWorkersResponse response;
  grpc::Status rpc =
      call->stub->ListWorkers(&context, v1::ListWorkersRequest(), &response);
  if (!rpc.ok()) return Fail(RpcError(rpc, call->address));
  if (call->args.Has("json")) {
    std::cout << ToJson(response) << std::endl;
    return kExitOk;
  }
  std::cout << absl::StrFormat("%-12s %-13s %-8s %-24s %-4s %-16s %-12s %s\n",
                               "WORKER", "STATE", "ROLE", "JOB", "GEN", "HOST",
                               "LAST SEEN", "DEVICE");
  double now = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
  for (const v1::WorkerInfo& w : response.workers()) {
    const v1::Device& device = w.device();
    std::cout << TerminalSafe(absl::StrFormat(
        "%-12s %-13s %-8s %-24s %-4s %-16s %-12s %s\n", w.worker_id(),
        w.state(), WorkerRole(w), WorkerJob(w),
        w.generation() > 0 ? absl::StrCat(w.generation()) : "-", w.host(),
        absl::StrFormat("%.1f s ago", std::max(0.0, now - w.last_heartbeat())),
        device.gpu_name().empty()
            ? (device.name().empty() ? "-" : device.name())
            : absl::StrCat(device.name(), " (", device.gpu_name(), ")")));
  }
  return kExitOk;
}

int RunEvents(const std::vector<std::string>& argv) {
  int exit = kExitOk;
  auto call = Begin(argv, {}, {"json"}, kEventsUsage, 1, 1, &exit);
  if (!call) return exit;
  auto status = GetJob(*call, call->args.positional()[0], /*history=*/false);
  if (!status.ok()) return Fail(status.status());
  const v1::JobStatus& job = *status;
  if (call->args.Has("json")) {
    std::cout << "[";
    for (int i = 0; i < job.events_size(); ++i) {
      std::cout << (i ? "," : "") << ToJson(job.events(i));
    }
    std::cout << "]" << std::endl;
    return kExitOk;
  }
  for (const v1::JobEvent& event : job.events()) {
    absl::Time time = absl::UnixEpoch() + absl::Seconds(event.time());
    std::cout << absl::FormatTime("%Y-%m-%d %H:%M:%E3S", time,
                                  absl::LocalTimeZone())
              << TerminalSafe(absl::StrFormat("  gen %-3d %-22s %s",
                                              event.generation(), event.kind(),
                                              event.message()))
              << "\n";
  }
  return kExitOk;
}

int RunStop(const std::vector<std::string>& argv) {
  int exit = kExitOk;
  auto call = Begin(argv, {}, {"json"}, kStopUsage, 1, 1, &exit);
  if (!call) return exit;
  grpc::ClientContext context;
  SetDeadline(&context, 10);
  v1::StopJobRequest request;
  request.set_job_id(call->args.positional()[0]);
  v1::StopJobResponse response;
  grpc::Status rpc = call->stub->StopJob(&context, request, &response);
  if (!rpc.ok()) return Fail(RpcError(rpc, call->address));
  if (call->args.Has("json")) {
    std::cout << "{\"job_id\":\"" << request.job_id() << "\",\"stopping\":true}"
              << std::endl;
  } else {
    std::cout << "stopping " << request.job_id() << std::endl;
  }
  return kExitOk;
}

int RunDelete(const std::vector<std::string>& argv) {
  int exit = kExitOk;
  auto call = Begin(argv, {}, {"json"}, kDeleteUsage, 1, 1, &exit);
  if (!call) return exit;
  grpc::ClientContext context;
  SetDeadline(&context, 10);
  v1::DeleteJobRequest request;
  request.set_job_id(call->args.positional()[0]);
  v1::DeleteJobResponse response;
  grpc::Status rpc = call->stub->DeleteJob(&context, request, &response);
  if (!rpc.ok()) return Fail(RpcError(rpc, call->address));
  if (call->args.Has("json")) {
    std::cout << "{\"job_id\":\"" << request.job_id() << "\",\"deleted\":true}"
              << std::endl;
  } else {
    std::cout << "deleted " << request.job_id() << std::endl;
  }
  return kExitOk;
}

int RunCheckpoints(const std::vector<std::string>& argv) {
  int exit = kExitOk;
  auto call = Begin(argv, {}, {"json"}, kCheckpointsUsage, 1, 1, &exit);
  if (!call) return exit;
  auto status = GetJob(*call, call->args.positional()[0], /*history=*/false);
  if (!status.ok()) return Fail(status.status());
  const v1::JobStatus& job = *status;
  const std::string& dir = job.spec().checkpoint().backup_dir();
  if (dir.empty()) {
    return Fail(absl::FailedPreconditionError(absl::StrCat(
        "job ", job.job_id(),
        " has no checkpoint.backup_dir, so it saves no checkpoints")));
  }

  struct Row {
    v1::CheckpointInfo info;
    std::string verified;  // "yes", "NO: why", "removed", "not checked"
    bool ok = false;
  };
  std::map<int64_t, Row> rows;
  for (const v1::CheckpointInfo& info : job.checkpoints()) {
    rows[info.step()].info = info;
  }
  auto on_disk = checkpoint::List(dir);
  for (auto& [step, row] : rows) {
    row.verified = on_disk.ok() ? "removed" : "not checked";
  }
  if (on_disk.ok()) {
    for (const checkpoint::Listed& listed : *on_disk) {
      Row& row = rows[listed.step];
      row.info.set_name(listed.name);
      row.info.set_step(listed.step);
      row.info.set_bytes(listed.bytes);
      if (listed.verified.ok()) {
        row.info.set_epoch(listed.manifest.epoch());
        row.info.set_generation(listed.manifest.generation());
        row.info.set_time(listed.manifest.time());
        row.verified = "yes";
        row.ok = true;
      } else {
        row.verified = absl::StrCat("NO: ", listed.verified.message());
      }
    }
  }
  if (call->args.Has("json")) {
    google::protobuf::ListValue list;
    for (const auto& [step, row] : rows) {
      auto& f = *list.add_values()->mutable_struct_value()->mutable_fields();
      f["name"].set_string_value(row.info.name());
      f["step"].set_number_value(static_cast<double>(row.info.step()));
      f["epoch"].set_number_value(row.info.epoch() + 1);
      f["generation"].set_number_value(
          static_cast<double>(row.info.generation()));
      f["time"].set_number_value(row.info.time());
      f["bytes"].set_number_value(static_cast<double>(row.info.bytes()));
      f["verified"].set_bool_value(row.ok);
      f["check"].set_string_value(row.verified);
    }
    std::cout << ToJson(list) << std::endl;
    return kExitOk;
  }
  if (rows.empty()) {
    std::cout << "no checkpoints for " << job.job_id() << " in " << dir
              << (on_disk.ok() ? "" : " (not readable from here)") << "\n";
    return kExitOk;
  }
  std::cout << absl::StrFormat("%-16s %10s %6s %-19s %10s  %s\n", "NAME",
                               "STEP", "EPOCH", "COMMITTED", "SIZE",
                               "VERIFIED");
  for (const auto& [step, row] : rows) {
    absl::Time time = absl::UnixEpoch() + absl::Seconds(row.info.time());
    std::cout << absl::StrFormat(
        "%-16s %10d %6d %-19s %10s  %s\n", row.info.name(), row.info.step(),
        row.info.epoch() + 1,
        row.info.time() > 0
            ? absl::FormatTime("%Y-%m-%d %H:%M:%S", time, absl::LocalTimeZone())
            : "-",
        absl::StrFormat("%.1f MB", row.info.bytes() / 1e6), row.verified);
  }
  std::cout << "in " << dir << "\n";
  return kExitOk;
}

}  // namespace lockstep::client
