// `lockstep local`: a coordinator and N workers on 127.0.0.1, one job (or
// several sharing the workers), then everything is torn down. The same binaries
// and protocol as a cluster. This file holds the command: its flags, the run
// and its summary (local.h); the processes are in local_processes.cc.
#include "client/local.h"

#include <google/protobuf/struct.pb.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/commands.h"
#include "client/ui_server.h"
#include "client/views.h"
#include "common/files.h"
#include "common/job_spec.h"
#include "common/status_macros.h"
#include "common/tls.h"

namespace lockstep::client {
namespace {

constexpr char kLocalUsage[] =
    R"(Usage: lockstep local --workers N [--spares N] [--gpus] [--json] [--insecure] [--metrics-port PORT] [--set field=value ...] JOB.json [JOB.json ...]
       lockstep local --serve --workers N [--spares N] [--gpus] [--json] [--insecure] [--ui] [--data-root DIR]... [--backup-root DIR]... [--export-root DIR]...

Runs JOB.json on a coordinator process and N worker processes on this
machine (127.0.0.1), streams progress, and exits 0 when the job succeeds.
Given several JOB.json, it submits them all at once to the same N workers:
the coordinator's scheduler runs those that fit side by side and queues the
rest (each job's num_workers, at most N; priority and placement apply as on
a cluster); it follows them in order and exits 0 when every one succeeds.
With --serve (and no JOB.json) it runs the pool until Ctrl-C or SIGTERM
instead: jobs come from `lockstep submit` or Python's lockstep.Client, each
on the workers the scheduler gives it (a pool for a notebook).
A worker process that dies (kill -9, a crash) is restarted, as Kubernetes
would restart its pod, up to 5 times; the job recovers its state from the
surviving workers or, with checkpoint.backup_dir, from the last checkpoint.

Flags:
  --workers N          worker processes (replicas); default 2
  --spares N           extra worker processes started as hot spares
                       (lockstep-worker --spare): they load the job's data
                       and take the rank of a worker that dies at once,
                       instead of waiting for its restart; default 0
  --gpus               train on this machine's GPUs: worker i gets GPU
                       i mod G of the G GPUs (those in CUDA_VISIBLE_DEVICES
                       when it is set, else every GPU nvidia-smi -L lists)
                       through CUDA_VISIBLE_DEVICES, and runs with
                       --device auto. communication.backend "auto" is then
                       NCCL when each worker has a GPU of its own, Gloo when
                       workers share one. Without --gpus the workers train on
                       the CPU (--device cpu)
  --set field=value    override a job-spec field; repeatable
                       (e.g. --set epochs=1 --set per_replica_batch_size=32)
  --json               progress on stderr; the last line of stdout is one JSON
                       object (one line per job with several) with: state, workers, steps, epochs, final_loss,
                       test_loss, the task's test metrics (test_accuracy,
                       test_top5_accuracy, test_mse, test_mae,
                       test_perplexity), samples_per_second (and
                       tokens_per_second), generations,
                       backend (gloo or nccl), model_digest, startup_seconds
                       (processes up and registered), first_step_seconds
                       (from submitting the job to its first step), ...
  --metrics-out FILE   write the per-step loss history as CSV (step,loss);
                       one job only
  --metrics-port PORT  serve Prometheus metrics on 127.0.0.1: the
                       coordinator's at http://127.0.0.1:PORT/metrics, worker
                       I's (spares after the workers) at port PORT+1+I
  --threads N          compute threads per worker (default: cores / N)
  --data-plane-encryption on|off, --data-plane-transport lockstep|gloo
                       passed to each worker (lockstep-worker --help); for
                       comparing the data plane's cost
  --keep-logs          keep the run directory (logs, state) after success
  --serve              run the pool without a job until SIGINT or SIGTERM.
                       Once every worker has registered it prints how to
                       reach it (with --json: one line of JSON on stdout
                       with coordinator, tls_cert, tls_key, tls_ca, an
                       operator's certificate, viewer_tls_cert and
                       viewer_tls_key, a viewer's, and run_dir)
  --ui                 with --serve: also serve the web console of the pool
                       as its operator (`lockstep ui`) on a free port of
                       127.0.0.1, and print its URL (--json: ui_url)
  --data-root DIR, --backup-root DIR, --export-root DIR
                       with --serve: the folders jobs may read data and
                       TorchScript from, keep checkpoints in and export to
                       (repeatable; lockstep-worker --help). Data may also
                       come from /usr/share/datasets/fashion-mnist
  --insecure           run the daemons without TLS (--insecure): anyone who
                       can reach 127.0.0.1 may call them

The run uses mutual TLS like a cluster: a CA made for the run (its key
never leaves this process) signs a certificate for the coordinator
(spiffe://lockstep/coordinator, for localhost and 127.0.0.1), one per worker
process (spiffe://lockstep/worker/local-worker-I, .../spare/local-spare-I) and one
for this command (spiffe://lockstep/operator/local), with --serve also one
for a viewer (spiffe://lockstep/viewer/local), in the run directory's
tls/ folder (keys 0600). The command prints the LOCKSTEP_TLS_* exports that
point another lockstep command at the run while it lasts.

The workers may use exactly the paths JOB.json names (data.dir,
model.torchscript, checkpoint.backup_dir, export) and no others: you own
this machine and chose them (lockstep-worker --data-root, --backup-root,
--export-root). export still never replaces a file that is not a lockstep
export, and clean-up after success removes only what lockstep wrote.

Examples:
  lockstep local --workers 2 examples/fashion_mnist_mlp.json
  lockstep local --workers 2 --gpus examples/fashion_mnist_cnn.json
  lockstep local --workers 2 --spares 1 examples/fashion_mnist_mlp.json
  lockstep local --workers 4 --set num_workers=2 \
      examples/fashion_mnist_mlp.json examples/fashion_mnist_cnn.json
  lockstep local --serve --workers 2 --json
)";

// The GPUs `lockstep local --gpus` hands out, as CUDA_VISIBLE_DEVICES
// entries: those of our own CUDA_VISIBLE_DEVICES when it is set, else the
// indices of the GPUs `nvidia-smi -L` lists. Errors: InvalidArgument (a
// usage error) when there are none.
absl::StatusOr<std::vector<std::string>> VisibleGpus() {
  std::vector<std::string> gpus;
  if (const char* visible = std::getenv("CUDA_VISIBLE_DEVICES")) {
    for (absl::string_view entry : absl::StrSplit(visible, ',')) {
      entry = absl::StripAsciiWhitespace(entry);
      // CUDA stops at the first invalid entry, such as -1 (no GPU).
      if (entry.empty() || entry[0] == '-') break;
      gpus.emplace_back(entry);
    }
    if (gpus.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--gpus: CUDA_VISIBLE_DEVICES is \"", visible,
          "\", which leaves no GPU; unset it, or run without --gpus"));
    }
    return gpus;
  }
  FILE* pipe = popen("nvidia-smi -L 2>/dev/null", "r");
  if (pipe != nullptr) {
    char line[512];
    while (fgets(line, sizeof(line), pipe) != nullptr) {
      // "GPU 0: NVIDIA H200 (UUID: GPU-...)"; MIG devices are indented.
      if (absl::StartsWith(line, "GPU ")) {
        gpus.push_back(absl::StrCat(gpus.size()));
      }
    }
    pclose(pipe);
  }
  if (gpus.empty()) {
    return absl::InvalidArgumentError(
        "--gpus: nvidia-smi -L lists no GPU on this machine (or nvidia-smi "
        "is not installed); run without --gpus to train on the CPU");
  }
  return gpus;
}

}  // namespace

absl::Status LocalRun::Prepare() {
  json_ = args_.Has("json");
  ASSIGN_OR_RETURN(workers_, args_.GetInt("workers", 2));
  if (workers_ < 1 || workers_ > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("--workers must be between 1 and 64, got ", workers_));
  }
  ASSIGN_OR_RETURN(spares_, args_.GetInt("spares", 0));
  if (spares_ < 0 || spares_ > 64) {
    return absl::InvalidArgumentError(
        absl::StrCat("--spares must be between 0 and 64, got ", spares_));
  }
  serve_ = args_.Has("serve");
  if (!serve_ && args_.Has("ui")) {
    return absl::InvalidArgumentError(
        "--ui is for --serve: it serves the web console of the pool; for a "
        "running job use `lockstep ui` with the exports lockstep local prints");
  }
  for (const char* flag : {"data-root", "backup-root", "export-root"}) {
    if (!serve_ && args_.Has(flag)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--", flag,
          " is for --serve; without it the workers may use exactly the "
          "paths JOB.json names"));
    }
  }
  if (serve_) {
    if (!args_.positional().empty()) {
      return absl::InvalidArgumentError(
          "--serve takes no JOB.json: submit jobs to the pool it runs "
          "(lockstep submit, or Python's lockstep.Client)");
    }
    if (args_.Has("metrics-out") || args_.Has("set")) {
      return absl::InvalidArgumentError(
          "--metrics-out and --set are for JOB.json, and --serve runs none: "
          "give overrides to each submit, and use `lockstep metrics JOB "
          "--csv`");
    }
    RETURN_IF_ERROR(ServeRootFlags());
  } else if (args_.positional().empty() || args_.positional().size() > 16) {
    return absl::InvalidArgumentError(
        "lockstep local needs one JOB.json (or up to 16 to share the "
        "workers), or --serve; see --help");
  }
  if (args_.positional().size() > 1 && args_.Has("metrics-out")) {
    return absl::InvalidArgumentError(
        "--metrics-out writes one job's losses: give one JOB.json, or use "
        "`lockstep metrics JOB --csv` with --keep-logs");
  }
  for (const std::string& path : args_.positional()) {
    ASSIGN_OR_RETURN(v1::JobSpec spec, LoadSpec(path, args_.GetAll("set")));
    if (args_.positional().size() == 1) {
      // One job: it runs on every worker.
      if (spec.num_workers() == 0) spec.set_num_workers(workers_);
      if (spec.num_workers() != workers_) {
        return absl::InvalidArgumentError(
            absl::StrCat("the job asks for num_workers ", spec.num_workers(),
                         " but --workers is ", workers_, "; make them agree"));
      }
    } else if (spec.num_workers() > workers_ || spec.min_workers() > workers_) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, " asks for ", std::max(spec.num_workers(), spec.min_workers()),
          " workers but --workers is ", workers_, "; it could never start"));
    }
    RETURN_IF_ERROR(ValidateJobSpec(
        spec, spec.num_workers() > 0 ? spec.num_workers() : workers_));
    specs_.push_back(std::move(spec));
  }
  if (args_.Has("gpus")) {
    ASSIGN_OR_RETURN(gpus_, VisibleGpus());
  }
  int cores =
      static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  ASSIGN_OR_RETURN(threads_,
                   args_.GetInt("threads", std::max(1, cores / workers_)));
  if (threads_ < 1) return absl::InvalidArgumentError("--threads must be >= 1");
  for (const char* flag : {"data-plane-encryption", "data-plane-transport"}) {
    if (!args_.Has(flag)) continue;
    const std::string value = args_.Get(flag);
    const bool known = std::string(flag) == "data-plane-encryption"
                           ? value == "on" || value == "off"
                           : value == "lockstep" || value == "gloo";
    if (!known) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--", flag, " '", value, "' is not a choice; see --help"));
    }
    data_plane_flags_.insert(data_plane_flags_.end(),
                             {absl::StrCat("--", flag), value});
  }
  if (args_.Get("data-plane-transport", "lockstep") == "gloo" &&
      !args_.Has(kInsecureFlag)) {
    return absl::InvalidArgumentError(
        "--data-plane-transport gloo (Gloo's TCP pairs, which a stranger's "
        "bytes can crash) is for comparison benchmarks only: it needs "
        "--insecure");
  }
  ASSIGN_OR_RETURN(metrics_port_, args_.GetInt("metrics-port", 0));
  if (args_.Has("metrics-port") &&
      (metrics_port_ < 1 || metrics_port_ > 65535 - workers_ - spares_)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--metrics-port must leave room for ", 1 + workers_ + spares_,
        " ports from 1 to 65535 (the coordinator's, then each worker's), got ",
        metrics_port_));
  }

  std::string tmpl =
      absl::StrCat(std::getenv("TMPDIR") ? std::getenv("TMPDIR") : "/tmp",
                   "/lockstep-local-XXXXXX");
  if (mkdtemp(tmpl.data()) == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create a run directory from ", tmpl));
  }
  run_dir_ = tmpl;
  insecure_ = args_.Has(kInsecureFlag);
  return insecure_ ? absl::OkStatus() : MakeCertificates();
}

void LocalRun::PrintCliHint() {
  std::cout << "lockstep local: to use the CLI on this run meanwhile:\n"
            << "  export LOCKSTEP_COORDINATOR=" << address_;
  if (insecure_) {
    std::cout << " LOCKSTEP_INSECURE=1\n";
  } else {
    std::cout << " \\\n    LOCKSTEP_TLS_CERT=" << operator_tls_.cert_file
              << " \\\n    LOCKSTEP_TLS_KEY=" << operator_tls_.key_file
              << " \\\n    LOCKSTEP_TLS_CA=" << operator_tls_.ca_file << "\n";
  }
  std::cout << std::flush;
}

void LocalRun::PrintJson(const v1::JobStatus& status, double wall_seconds) {
  using google::protobuf::Struct;
  using google::protobuf::Value;
  Struct out;
  auto& f = *out.mutable_fields();
  f["state"].set_string_value(StateName(status.state()));
  f["job_id"].set_string_value(status.job_id());
  f["workers"].set_number_value(status.world_size());
  f["steps"].set_number_value(static_cast<double>(status.step()));
  f["epochs"].set_number_value(status.epoch() + 1);
  f["final_loss"].set_number_value(status.loss());
  // The task's metrics under their fixed names; a classifier's accuracy
  // also when an older worker reported it alone.
  if (status.has_test_accuracy()) {
    f["test_accuracy"].set_number_value(status.test_accuracy());
  }
  if (status.has_test_loss()) {
    f["test_loss"].set_number_value(status.test_loss());
  }
  for (const auto& [name, value] : status.test_metrics()) {
    f[name].set_number_value(value);
  }
  f["samples_per_second"].set_number_value(status.samples_per_second());
  if (status.tokens_per_second() > 0) {
    f["tokens_per_second"].set_number_value(status.tokens_per_second());
  }
  f["generations"].set_number_value(status.generations());
  if (status.records_skipped() > 0) {
    f["records_skipped"].set_number_value(
        static_cast<double>(status.records_skipped()));
  }
  f["backend"].set_string_value(status.backend());
  f["wall_seconds"].set_number_value(wall_seconds);
  f["startup_seconds"].set_number_value(startup_seconds_);
  f["first_step_seconds"].set_number_value(first_step_seconds_);
  std::string digest =
      status.ranks_size() ? status.ranks(0).model_digest() : "";
  f["model_digest"].set_string_value(digest);
  auto* digests = f["rank_digests"].mutable_list_value();
  for (const v1::RankResult& rank : status.ranks()) {
    digests->add_values()->set_string_value(rank.model_digest());
  }
  if (status.has_breakdown()) {
    const v1::StepBreakdown& b = status.breakdown();
    auto& split =
        *f["step_breakdown_ms"].mutable_struct_value()->mutable_fields();
    split["data"].set_number_value(b.data_ms());
    split["forward"].set_number_value(b.forward_ms());
    split["backward"].set_number_value(b.backward_ms());
    split["exposed_comm"].set_number_value(b.exposed_comm_ms());
    split["optimizer"].set_number_value(b.optimizer_ms());
    split["saves"].set_number_value(b.saves());
    split["save_stall"].set_number_value(b.save_stall_ms());
  }
  if (!status.error().empty()) f["error"].set_string_value(status.error());
  std::cout << ToJson(out) << std::endl;
}

int LocalRun::Finish(const std::vector<absl::StatusOr<v1::JobStatus>>& finals) {
  double wall = absl::ToDoubleSeconds(absl::Now() - start_);
  std::vector<v1::JobStatus> statuses;
  absl::Status failed;
  for (const absl::StatusOr<v1::JobStatus>& final_status : finals) {
    if (!final_status.ok()) {
      failed = final_status.status();
      break;
    }
    // The final record, with the loss history.
    auto full = FetchJob(stub_.get(), address_, final_status->job_id(),
                         /*history=*/true);
    statuses.push_back(full.ok() ? *std::move(full) : *final_status);
  }
  finishing_ = true;
  // Our connection goes first: a coordinator told to stop waits (up to its
  // 2 s grace) for its clients' connections to close, ours included.
  stub_.reset();
  processes_.TerminateAll(absl::Seconds(5));

  std::string child_failure;
  {
    absl::MutexLock lock(&mu_);
    child_failure = child_failure_;
  }
  if (!failed.ok()) {
    std::cerr << "lockstep: "
              << (child_failure.empty() ? std::string(failed.message())
                                        : child_failure)
              << "\nlogs are in " << run_dir_ << std::endl;
    return kExitJobFailed;
  }
  bool all_ok = true;
  for (v1::JobStatus& status : statuses) {
    all_ok &= Summarize(status, wall);
  }
  if (all_ok && !args_.Has("keep-logs")) {
    absl::Status removed = RemoveRecursively(run_dir_);
    if (!removed.ok()) {
      std::cerr << "lockstep: " << removed.message()
                << " (leaving the run's logs behind)" << std::endl;
    }
  }
  return all_ok ? kExitOk : kExitJobFailed;
}

bool LocalRun::Summarize(v1::JobStatus& status, double wall) {
  if (args_.Has("metrics-out")) {
    std::ofstream out(args_.Get("metrics-out"));
    out << "step,loss\n";
    for (int i = 0; i < status.step_losses_size(); ++i) {
      out << HistoryStep(status, i) << ","
          << absl::StrFormat("%.9g", status.step_losses(i)) << "\n";
    }
    if (!out) {
      std::cerr << "lockstep: cannot write " << args_.Get("metrics-out")
                << "\n";
    }
  }
  bool ok = status.state() == v1::JOB_STATE_SUCCEEDED;
  for (const v1::RankResult& rank : status.ranks()) {
    if (ok && rank.model_digest() != status.ranks(0).model_digest()) {
      status.set_state(v1::JOB_STATE_FAILED);
      status.set_error(absl::StrCat(
          "rank ", rank.rank(), " ended with a different model than rank 0"));
      ok = false;
    }
  }
  const std::string metrics = MetricsText(status);
  progress() << absl::StrFormat(
                    "%s %s in %.1f s: %d steps, loss %.4f, %s%s on %d workers",
                    status.job_id(), StateName(status.state()), wall,
                    status.step(), status.loss(),
                    metrics.empty() ? "" : absl::StrCat("test ", metrics, ", "),
                    ThroughputText(status), status.world_size())
             << std::endl;
  if (!ok) {
    std::cerr << "lockstep: " << status.error() << "\nlogs are in " << run_dir_
              << std::endl;
  }
  if (json_) PrintJson(status, wall);
  return ok;
}

absl::StatusOr<std::vector<std::string>> LocalRun::SubmitAll() {
  std::vector<std::string> ids;
  for (const v1::JobSpec& spec : specs_) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(10));
    v1::SubmitJobRequest request;
    *request.mutable_spec() = spec;
    v1::SubmitJobResponse response;
    grpc::Status rpc = stub_->SubmitJob(&context, request, &response);
    if (!rpc.ok()) {
      return absl::Status(static_cast<absl::StatusCode>(rpc.error_code()),
                          rpc.error_message());
    }
    ids.push_back(response.job_id());
  }
  return ids;
}

int LocalRun::Run() {
  absl::Status prepared = Prepare();
  if (!prepared.ok()) return Fail(prepared);
  start_ = absl::Now();
  absl::Status started = StartProcesses();
  if (!started.ok()) {
    finishing_ = true;
    processes_.TerminateAll(absl::Seconds(2));
    std::cerr << "lockstep: " << started.message() << "\nlogs are in "
              << run_dir_ << std::endl;
    return kExitJobFailed;
  }
  progress() << "lockstep local: coordinator on " << address_ << ", "
             << workers_ << " workers"
             << (spares_ > 0 ? absl::StrCat(" + ", spares_,
                                            spares_ == 1 ? " spare" : " spares")
                             : "")
             << " x " << threads_ << " threads"
             << (gpus_.empty()
                     ? std::string(" on the CPU")
                     : absl::StrCat(" on ", gpus_.size(),
                                    gpus_.size() == 1 ? " GPU" : " GPUs"))
             << (insecure_ ? ", without TLS (--insecure)" : ", mutual TLS")
             << "; logs in " << run_dir_ << std::endl;
  if (metrics_port_ > 0) {
    progress() << "lockstep local: metrics at http://127.0.0.1:"
               << metrics_port_ << "/metrics (coordinator) and ports "
               << metrics_port_ + 1 << "-" << metrics_port_ + workers_ + spares_
               << " (workers)" << std::endl;
  }
  if (!json_) PrintCliHint();
  // The job starts when the workers are up, as on a cluster of running
  // daemons: its time to the first step is then the job's own.
  absl::Status ready = WaitForWorkers(absl::Seconds(60));
  if (!ready.ok()) {
    finishing_ = true;
    processes_.TerminateAll(absl::Seconds(2));
    std::cerr << "lockstep: " << ready.message() << "\nlogs are in " << run_dir_
              << std::endl;
    return kExitJobFailed;
  }
  startup_seconds_ = absl::ToDoubleSeconds(absl::Now() - start_);
  if (serve_) return Serve();

  absl::StatusOr<std::vector<std::string>> ids = SubmitAll();
  if (!ids.ok()) {
    finishing_ = true;
    processes_.TerminateAll(absl::Seconds(2));
    return Fail(ids.status());
  }
  if (ids->size() > 1) {
    progress() << "lockstep local: submitted " << absl::StrJoin(*ids, ", ")
               << "; following each in turn (`lockstep queue` shows those "
                  "that wait)"
               << std::endl;
  }
  const absl::Time submitted = absl::Now();
  std::vector<absl::StatusOr<v1::JobStatus>> finals;
  for (const std::string& id : *ids) {
    ProgressView view(progress(), !json_ && isatty(STDOUT_FILENO));
    grpc::ClientContext watch;
    {
      absl::MutexLock lock(&watch_mu_);
      if (watch_cancelled_) watch.TryCancel();
      watch_context_ = &watch;
    }
    auto final_status =
        WatchJob(stub_.get(), id, &watch, [&](const v1::JobStatus& status) {
          if (first_step_seconds_ < 0 && status.step() >= 1) {
            first_step_seconds_ =
                absl::ToDoubleSeconds(absl::Now() - submitted);
          }
          view.Update(status);
        });
    {
      absl::MutexLock lock(&watch_mu_);
      watch_context_ = nullptr;
    }
    if (final_status.ok()) view.Update(*final_status);
    const bool stop = !final_status.ok();
    finals.push_back(std::move(final_status));
    if (stop) break;
  }
  return Finish(finals);
}

void LocalRun::PrintServeJson() {
  google::protobuf::Struct out;
  auto& f = *out.mutable_fields();
  f["coordinator"].set_string_value(address_);
  f["insecure"].set_bool_value(insecure_);
  if (!insecure_) {
    f["tls_cert"].set_string_value(operator_tls_.cert_file);
    f["tls_key"].set_string_value(operator_tls_.key_file);
    f["tls_ca"].set_string_value(operator_tls_.ca_file);
    const std::string viewer = run_dir_ + "/tls/viewer";
    f["viewer_tls_cert"].set_string_value(viewer + ".crt");
    f["viewer_tls_key"].set_string_value(viewer + ".key");
  }
  f["run_dir"].set_string_value(run_dir_);
  f["workers"].set_number_value(workers_);
  f["spares"].set_number_value(spares_);
  f["pid"].set_number_value(getpid());
  if (console_ != nullptr) f["ui_url"].set_string_value(console_->Url());
  std::cout << ToJson(out) << std::endl;
}

int LocalRun::Serve() {
  if (args_.Has("ui")) {
    // The console, as the run's operator, on a port of its own.
    TlsOptions operator_tls = operator_tls_;
    operator_tls.insecure = insecure_;
    auto credentials = LoadChannelCredentials(operator_tls);
    if (!credentials.ok()) return Fail(credentials.status());
    auto console = UiServer::Start("127.0.0.1:0",
                                   Connect(address_, *credentials), address_);
    if (!console.ok()) return Fail(console.status());
    console_ = *std::move(console);
  }
  if (json_) {
    PrintServeJson();
  } else {
    std::cout << "lockstep local: " << workers_ << " workers ready; serving "
              << "until Ctrl-C or SIGTERM" << std::endl;
    if (console_ != nullptr) {
      std::cout << "lockstep local: the console: open " << console_->Url()
                << std::endl;
    }
  }
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  std::string failure;
  while (failure.empty()) {
    // Woken by the signal; a worker that fails for good is seen within
    // the tick.
    const timespec tick = {0, 200'000'000};
    const int signal = sigtimedwait(&signals, nullptr, &tick);
    if (signal == SIGINT || signal == SIGTERM) break;
    absl::MutexLock lock(&mu_);
    failure = child_failure_;
  }
  finishing_ = true;
  console_.reset();
  stub_.reset();
  processes_.TerminateAll(absl::Seconds(5));
  if (!failure.empty()) {
    std::cerr << "lockstep: " << failure << "\nlogs are in " << run_dir_
              << std::endl;
    return kExitJobFailed;
  }
  progress() << "lockstep local: stopped the pool" << std::endl;
  if (!args_.Has("keep-logs")) {
    absl::Status removed = RemoveRecursively(run_dir_);
    if (!removed.ok()) {
      std::cerr << "lockstep: " << removed.message()
                << " (leaving the run's logs behind)" << std::endl;
    }
  }
  return kExitOk;
}

int RunLocal(const std::vector<std::string>& argv, const std::string& bin_dir) {
  auto args = Args::Parse(
      argv,
      {"workers", "spares", "set", "metrics-out", "threads", "metrics-port",
       "data-plane-encryption", "data-plane-transport", "data-root",
       "backup-root", "export-root"},
      {"json", "keep-logs", "gpus", "help", "serve", "ui", kInsecureFlag});
  if (!args.ok()) return Fail(args.status());
  if (args->Has("help")) {
    std::cout << kLocalUsage;
    return kExitOk;
  }
  if (args->Has("serve")) {
    // Serve() waits for them with sigtimedwait: blocked before any thread
    // starts, so that none of them takes the signal (children unblock).
    sigset_t signals;
    sigemptyset(&signals);
    sigaddset(&signals, SIGINT);
    sigaddset(&signals, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  }
  LocalRun run(*args, bin_dir);
  return run.Run();
}

}  // namespace lockstep::client
