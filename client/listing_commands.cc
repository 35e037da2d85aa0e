// The `lockstep` commands that list what the coordinator knows: jobs
// (status), workers, and one job's events and checkpoints.
#include <google/protobuf/struct.pb.h>

#include <algorithm>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "checkpoint/store.h"
#include "client/commands.h"
#include "client/views.h"
#include "common/terminal_text.h"

namespace lockstep::client {
namespace {

constexpr char kStatusUsage[] =
    R"(Usage: lockstep status [JOB] [--limit N | --all] [--json]

Shows one job, or the newest jobs first: state, step, workers, the
communication backend of its latest generation (gloo or nccl), loss, test
accuracy, samples/s, and why a job failed. --json gives the full status of
one job, or the summaries of the jobs listed (without loss history, events,
checkpoints and evaluations).

Without JOB it lists the newest 100 jobs and says when there are more. A
job the starvation bound promoted says so. The last line says who may use
which priority class, the admins and the starvation bound (as `lockstep
queue` does).

Flags:
  --limit N   list the newest N jobs
  --all       list every job the coordinator keeps

Examples:
  lockstep status
  lockstep status --all
  lockstep status fashion-mnist-mlp-1 --json
)";

constexpr char kWorkersUsage[] = R"(Usage: lockstep workers [--json]

Lists every worker the coordinator knows: id (task type:index), state
(training, standby, idle, disconnected), role ("rank N", or "spare" for a hot
spare without a rank), job (the one it trains, or "for JOB" when it stands by
to take a failed rank of JOB), generation, host, how long ago it was last
heard from, the device it trains on ("cpu", or "cuda:N" with the GPU's
model; --json adds the GPU's UUID), and the OpenBLAS kernel set its CPU
path runs with who chose it: openblas (OpenBLAS' own detection), lockstep
(OpenBLAS fell back to an older kernel and the worker chose the best its CPU
supports), environment (OPENBLAS_CORETYPE), fallback (slower than the CPU
allows; the worker's log says what to set). --json also gives the labels
each worker announced for placement (lockstep-worker --label).

Examples:
  lockstep workers
  LOCKSTEP_COORDINATOR=coord:7070 lockstep workers --json
)";

constexpr char kQueueUsage[] = R"(Usage: lockstep queue [--limit N] [--json]

Lists the queued jobs in the order the scheduler considers them: position,
job, priority, owner, workers it needs, its age (since it was submitted),
why it waits and the running jobs it preempts (or would, once they have run
the coordinator's --min-run-time). The reasons:
  no_fit        not enough free workers match its placement
  quota         its owner's running jobs hold the owner's --quota
  priority      it would fit, but jobs ahead of it (a higher priority, or an
                owner holding fewer workers) took the free workers first
  preempting    the jobs it preempted are stopping at an agreed step
  min_run_time  the jobs it would preempt have not run --min-run-time
  whole_pool    a job without num_workers waits until no other job runs
  reserved      the free workers are held for the job holding the
                reservation (it has waited longest), and this job's
                time_limit_seconds would run past that job's start
A job's message also says when it holds the reservation, and when it
starts at the latest. A job that has waited the coordinator's
--starvation-bound in all shows its new priority and the one it had:
100 (was 0). Under the list: the priority classes and who may use each,
the admins, and the starvation bound.

Flags:
  --limit N   list the first N (default and most: 1000)

Examples:
  lockstep queue
  lockstep queue --json
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

// "rank 1", "spare" (registered as a hot spare, no rank now) or "-".
std::string WorkerRole(const v1::WorkerInfo& w) {
  if (w.rank() >= 0) return absl::StrCat("rank ", w.rank());
  return w.spare() ? "spare" : "-";
}

// The job a worker trains, "promised to JOB" when a preemption released it
// for that queued job, or "for JOB" when it stands by for one (it takes a
// failed rank of that job).
std::string WorkerJob(const v1::WorkerInfo& w) {
  if (!w.job_id().empty()) return w.job_id();
  if (!w.promised_to().empty()) return "promised to " + w.promised_to();
  if (!w.standby_job_id().empty()) return "for " + w.standby_job_id();
  return "-";
}

}  // namespace

// Who may use which priority, the admins and the starvation bound
// (issue 52), as `lockstep queue` and `lockstep status` end.
std::string RightsLine(const v1::ListQueueResponse& response) {
  std::vector<std::string> grants;
  for (const v1::PriorityClass& named : response.priority_classes()) {
    grants.push_back(absl::StrCat(named.name(), "=", named.priority(), " (",
                                  named.priority() <= 0 ? std::string("anyone")
                                  : named.granted_to().empty()
                                      ? std::string("admins")
                                      : absl::StrJoin(named.granted_to(), ", "),
                                  ")"));
  }
  return TerminalSafe(absl::StrCat(
      "priority classes: ",
      grants.empty() ? std::string("none") : absl::StrJoin(grants, ", "),
      "; admins (any priority): ",
      response.admins().empty() ? std::string("none")
                                : absl::StrJoin(response.admins(), ", "),
      "; starvation bound: ",
      response.starvation_bound_seconds() > 0
          ? absl::StrCat("a job that has waited ",
                         absl::FormatDuration(absl::Seconds(
                             response.starvation_bound_seconds())),
                         " in all is promoted to priority ",
                         response.starvation_priority())
          : std::string("none"),
      "\n"));
}

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
                               "LOSS", "TEST", "SAMPLES/S");
  for (const v1::JobStatus& job : response.jobs()) {
    std::cout << TerminalSafe(absl::StrFormat(
        "%-28s %-10s %-13s %-7d %-7s %-8.4f %-9s %.0f\n", job.job_id(),
        StateName(job.state()),
        absl::StrCat(job.step(), "/", job.total_steps()), job.world_size(),
        job.backend().empty() ? "-" : job.backend(), job.loss(),
        MetricsText(job).empty() ? "-" : MetricsText(job),
        job.samples_per_second()));
    if (!job.error().empty() && job.state() != v1::JOB_STATE_SUCCEEDED) {
      std::cout << "  " << TerminalSafe(job.error()) << "\n";
    }
    if (!job.stall().empty()) {
      std::cout << "  " << TerminalSafe(job.stall()) << "\n";
    }
    if (job.state() == v1::JOB_STATE_QUEUED && job.has_queue()) {
      std::cout << "  "
                << TerminalSafe(absl::StrCat("queued #", job.queue().position(),
                                             " (", job.queue().reason(),
                                             "): ", job.queue().message()))
                << "\n";
    }
    if (job.records_skipped() > 0) {
      std::cout << "  "
                << absl::StrCat(job.records_skipped(), " unreadable record",
                                job.records_skipped() == 1 ? "" : "s",
                                " skipped (data.skip_corrupt ",
                                job.spec().data().skip_corrupt(),
                                "; lockstep events ", job.job_id(), ")")
                << "\n";
    }
    if (job.has_promoted_from()) {
      std::cout << "  "
                << absl::StrCat("priority ", job.priority(), " (was ",
                                job.promoted_from(),
                                ": promoted by the starvation bound)")
                << "\n";
    }
  }
  // Who may use which priority, as the queue says it (one small call).
  v1::ListQueueRequest request;
  request.set_page_size(1);
  v1::ListQueueResponse queue;
  grpc::ClientContext context;
  SetDeadline(&context, 10);
  if (call->stub->ListQueue(&context, request, &queue).ok()) {
    std::cout << RightsLine(queue);
  }
  return kExitOk;
}

int RunWorkers(const std::vector<std::string>& argv) {
  int exit = kExitOk;
  auto call = Begin(argv, {}, {"json"}, kWorkersUsage, 0, 0, &exit);
  if (!call) return exit;
  auto workers = FetchWorkers(call->stub.get(), call->address);
  if (!workers.ok()) return Fail(workers.status());
  v1::ListWorkersResponse response;
  for (v1::WorkerInfo& worker : *workers) {
    *response.add_workers() = std::move(worker);
  }
  if (call->args.Has("json")) {
    std::cout << ToJson(response) << std::endl;
    return kExitOk;
  }
  std::cout << absl::StrFormat(
      "%-12s %-13s %-8s %-24s %-4s %-16s %-12s %-10s %s\n", "WORKER", "STATE",
      "ROLE", "JOB", "GEN", "HOST", "LAST SEEN", "DEVICE", "BLAS KERNEL");
  double now = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
  for (const v1::WorkerInfo& w : response.workers()) {
    const v1::Device& device = w.device();
    std::cout << TerminalSafe(absl::StrFormat(
        "%-12s %-13s %-8s %-24s %-4s %-16s %-12s %-10s %s\n", w.worker_id(),
        w.state(), WorkerRole(w), WorkerJob(w),
        w.generation() > 0 ? absl::StrCat(w.generation()) : "-", w.host(),
        absl::StrFormat("%.1f s ago", std::max(0.0, now - w.last_heartbeat())),
        device.gpu_name().empty()
            ? (device.name().empty() ? "-" : device.name())
            : absl::StrCat(device.name(), " (", device.gpu_name(), ")"),
        device.blas_kernel().empty()
            ? "-"
            : absl::StrCat(device.blas_kernel(), " (",
                           device.blas_kernel_source(), ")")));
  }
  return kExitOk;
}

int RunQueue(const std::vector<std::string>& argv) {
  int exit = kExitOk;
  auto call = Begin(argv, {"limit"}, {"json"}, kQueueUsage, 0, 0, &exit);
  if (!call) return exit;
  auto limit = call->args.GetInt("limit", 1000);
  if (!limit.ok()) return Fail(limit.status());
  if (*limit < 1 || *limit > 1000) {
    return Fail(absl::InvalidArgumentError(
        absl::StrCat("--limit is ", *limit, "; give 1 to 1000 jobs")));
  }
  v1::ListQueueRequest request;
  request.set_page_size(*limit);
  v1::ListQueueResponse response;
  grpc::ClientContext context;
  SetDeadline(&context, 10);
  grpc::Status rpc = call->stub->ListQueue(&context, request, &response);
  if (!rpc.ok()) return Fail(RpcError(rpc, call->address));
  if (call->args.Has("json")) {
    std::cout << ToJson(response) << std::endl;
    return kExitOk;
  }
  // Who may use which priority (issue 52), under the list or alone.
  const std::string rights = RightsLine(response);
  if (response.jobs().empty()) {
    std::cout << "no queued jobs\n" << rights << std::flush;
    return kExitOk;
  }
  std::cout << absl::StrFormat("%-4s %-28s %-12s %-18s %-7s %-9s %s\n", "POS",
                               "JOB", "PRIORITY", "OWNER", "NEEDS", "AGE",
                               "WHY");
  const double now = absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch());
  for (const v1::JobStatus& job : response.jobs()) {
    const v1::JobSpec& spec = job.spec();
    const int needs =
        spec.min_workers() > 0 ? spec.min_workers() : spec.num_workers();
    std::cout << TerminalSafe(absl::StrFormat(
        "%-4d %-28s %-12s %-18s %-7s %-9s %s: %s\n", job.queue().position(),
        job.job_id(),
        job.has_promoted_from()  // by the starvation bound
            ? absl::StrCat(job.priority(), " (was ", job.promoted_from(), ")")
            : absl::StrCat(job.priority()),
        job.owner().empty() ? "-" : job.owner(),
        needs > 0 ? absl::StrCat(needs) : "all",
        absl::StrFormat("%.0f s", std::max(0.0, now - job.submit_time())),
        job.queue().reason(), job.queue().message()));
  }
  if (response.queued() > response.jobs_size()) {
    std::cout << "(" << response.queued() - response.jobs_size()
              << " more queued jobs not listed)\n";
  }
  std::cout << rights << std::flush;
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

namespace {

// One checkpoint as `lockstep checkpoints` lists it.
struct CheckpointRow {
  v1::CheckpointInfo info;
  std::string verified;  // "yes", "NO: why", "removed", "not checked"
  bool ok = false;
};

// The coordinator's record of `job`'s checkpoints, by step, checked against
// what lies in `dir`. `*readable` says whether `dir` could be listed from
// here.
std::map<int64_t, CheckpointRow> CheckpointRows(const v1::JobStatus& job,
                                                const std::string& dir,
                                                bool* readable) {
  std::map<int64_t, CheckpointRow> rows;
  for (const v1::CheckpointInfo& info : job.checkpoints()) {
    rows[info.step()].info = info;
  }
  auto on_disk = checkpoint::List(dir);
  *readable = on_disk.ok();
  for (auto& [step, row] : rows) {
    row.verified = on_disk.ok() ? "removed" : "not checked";
  }
  if (!on_disk.ok()) return rows;
  for (const checkpoint::Listed& listed : *on_disk) {
    CheckpointRow& row = rows[listed.step];
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
  return rows;
}

std::string CheckpointsJson(const std::map<int64_t, CheckpointRow>& rows) {
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
  return ToJson(list);
}

}  // namespace

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
  bool readable = false;
  const std::map<int64_t, CheckpointRow> rows =
      CheckpointRows(job, dir, &readable);
  if (call->args.Has("json")) {
    std::cout << CheckpointsJson(rows) << std::endl;
    return kExitOk;
  }
  if (rows.empty()) {
    std::cout << "no checkpoints for " << job.job_id() << " in " << dir
              << (readable ? "" : " (not readable from here)") << "\n";
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
