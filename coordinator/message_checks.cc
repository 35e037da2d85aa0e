// The request checks of message_checks.h: one check per worker message kind,
// registration, the rendezvous calls and the job calls. Rates, times and
// losses are only shown, never acted on, so a non-finite one (a diverged
// loss) is let through rather than losing the message.
#include "coordinator/message_checks.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "checkpoint/store.h"
#include "common/labels.h"
#include "common/log.h"

namespace lockstep::coordinator {
namespace {

constexpr char kWorkerHint[] =
    "the worker runs another lockstep build or is not a lockstep-worker";
constexpr char kClientHint[] =
    "the client runs another lockstep build or is not a lockstep client";

// Accumulates the first failed check of a message.
class Checker {
 public:
  explicit Checker(absl::string_view message,
                   absl::string_view hint = kWorkerHint)
      : message_(message), hint_(hint) {}

  void Range(absl::string_view field, int64_t value, int64_t low,
             int64_t high) {
    if (status_.ok() && (value < low || value > high)) {
      status_ = Refuse(
          message_, field,
          absl::StrCat("is ", value, ", outside [", low, ", ", high, "]"));
    }
  }
  void Text(absl::string_view field, const std::string& value) {
    if (status_.ok() && value.size() > kMaxTextBytes) {
      status_ = Refuse(message_, field,
                       absl::StrCat("has ", value.size(), " bytes, more than ",
                                    kMaxTextBytes));
    }
  }
  // Printable ASCII without spaces (spaces too when `spaces`), at most
  // `max` bytes.
  void Printable(absl::string_view field, const std::string& value, size_t max,
                 bool spaces) {
    bool printable = value.size() <= max;
    for (char c : value) {
      printable = printable && c >= (spaces ? 0x20 : 0x21) && c <= 0x7e;
    }
    if (status_.ok() && !printable) {
      status_ = Refuse(
          message_, field,
          absl::StrCat("is not printable text of at most ", max, " bytes"));
    }
  }
  void That(bool holds, absl::string_view field, absl::string_view why) {
    if (status_.ok() && !holds) status_ = Refuse(message_, field, why);
  }
  absl::Status status() const { return status_; }

 private:
  absl::Status Refuse(absl::string_view message, absl::string_view field,
                      absl::string_view why) const {
    return absl::InvalidArgumentError(
        absl::StrCat(message, ": ", field, " ", why, "; ", hint_));
  }

  const std::string message_;
  const std::string hint_;
  absl::Status status_;
};

// A job id: letters, digits and "-_.", as JobIdFor makes them.
void JobId(Checker& check, const std::string& job_id, bool may_be_empty) {
  bool valid = (may_be_empty || !job_id.empty()) &&
               job_id.size() <= kMaxJobIdBytes &&
               job_id.find_first_not_of(
                   "abcdefghijklmnopqrstuvwxyz"
                   "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
                   "0123456789-_.") == std::string::npos;
  check.That(valid, "job_id",
             absl::StrCat("is not a job id (1 to ", kMaxJobIdBytes,
                          " letters, digits, '-', '_' or '.')"));
}

// What every rendezvous call names: the job, its generation and a key.
void Rendezvous(Checker& check, const std::string& job_id, int64_t generation,
                absl::string_view key_field, const std::string& key) {
  JobId(check, job_id, /*may_be_empty=*/false);
  // Generation 0 is no generation's: the fence answers it (Aborted).
  check.Range("generation", generation, 0, kMaxGeneration);
  check.That(!key.empty(), key_field, "is empty");
  check.Printable(key_field, key, kMaxKeyBytes, /*spaces=*/false);
}

// A task's metrics by name: at most kMaxMetrics, each name a short
// identifier ("test_mse").
void Metrics(Checker& check,
             const google::protobuf::Map<std::string, double>& metrics) {
  check.Range("test_metrics", static_cast<int64_t>(metrics.size()), 0,
              kMaxMetrics);
  for (const auto& [name, value] : metrics) {
    check.That(!name.empty() && name.size() <= kMaxMetricNameBytes &&
                   name.find_first_not_of("abcdefghijklmnopqrstuvwxyz"
                                          "0123456789_") == std::string::npos,
               "test_metrics",
               absl::StrCat("has a name that is not 1 to ", kMaxMetricNameBytes,
                            " lower-case letters, digits or '_'"));
  }
}

absl::Status CheckProgress(const v1::ProgressReport& report) {
  Checker check("progress report");
  check.Range("generation", report.generation(), 1, kMaxGeneration);
  check.Range("step", report.step(), 0, kMaxStep);
  check.Range("total_steps", report.total_steps(), 0, kMaxStep);
  check.Range("epoch", report.epoch(), 0, kMaxStep);
  check.Range("first_step", report.first_step(), 0, report.step());
  check.Range("step_losses", report.step_losses_size(), 0, kMaxLossesPerReport);
  // The losses are those of steps first_step + 1 ... step.
  check.That(
      report.step_losses_size() == 0 ||
          report.first_step() + report.step_losses_size() == report.step(),
      "step_losses",
      absl::StrCat("holds ", report.step_losses_size(), " losses, but steps ",
                   report.first_step() + 1, " to ", report.step(), " are ",
                   report.step() - report.first_step()));
  check.That(report.step_lrs_size() == 0 ||
                 report.step_lrs_size() == report.step_losses_size(),
             "step_lrs",
             absl::StrCat("holds ", report.step_lrs_size(),
                          " learning rates for ", report.step_losses_size(),
                          " losses; send one per loss or none"));
  if (report.has_resumed_at_step()) {
    check.Range("resumed_at_step", report.resumed_at_step(), 0, report.step());
  }
  check.Range("state_source_rank", report.state_source_rank(), -1, kMaxRank);
  check.Text("restored_checkpoint", report.restored_checkpoint());
  check.Range("warnings", report.warnings_size(), 0, kMaxWarningsPerReport);
  for (const std::string& warning : report.warnings()) {
    check.Text("warning", warning);
  }
  const v1::TrainingPlan& plan = report.plan();
  check.Range("plan.replicas", plan.replicas(), 0, kMaxRank);
  check.Range("plan.per_replica_batch_size", plan.per_replica_batch_size(), 0,
              int64_t{1} << 30);
  check.Range("plan.global_batch_size", plan.global_batch_size(), 0,
              int64_t{1} << 30);
  check.Range("plan.steps_per_epoch", plan.steps_per_epoch(), 0, kMaxStep);
  check.Range("plan.total_steps", plan.total_steps(), 0, kMaxStep);
  check.Range("plan.warmup_steps", plan.warmup_steps(), 0, kMaxStep);
  check.Text("plan.lr_scaling", plan.lr_scaling());
  const std::string& algorithm = plan.all_reduce_algorithm();
  check.That(algorithm.empty() || algorithm == "direct" || algorithm == "ring",
             "plan.all_reduce_algorithm",
             "is not \"direct\", \"ring\" or empty");
  const v1::AllReduceProbe& probe = plan.algorithm_probe();
  check.Range("plan.algorithm_probe.bytes", probe.bytes(), 0, int64_t{1} << 30);
  for (double seconds : {probe.direct_seconds(), probe.ring_seconds()}) {
    check.That(seconds >= 0 && seconds < 1e6, "plan.algorithm_probe",
               "has a time that is negative, not a number or over 1e6 s");
  }
  Metrics(check, report.test_metrics());
  return check.status();
}

absl::Status CheckResult(const v1::TaskResult& result) {
  Checker check("task result");
  check.Range("generation", result.generation(), 1, kMaxGeneration);
  check.Range("rank", result.rank(), 0, kMaxRank);
  check.Range("steps", result.steps(), 0, kMaxStep);
  check.Range("code", result.code(), 0, 16);
  check.Text("error", result.error());
  check.Text("stop_save_error", result.stop_save_error());
  check.Text("model_digest", result.model_digest());
  check.Range("breakdown.saves", result.breakdown().saves(), 0, kMaxStep);
  Metrics(check, result.test_metrics());
  return check.status();
}

absl::Status CheckPrepared(const v1::CheckpointPrepared& prepared) {
  Checker check("checkpoint prepare");
  check.Range("generation", prepared.generation(), 1, kMaxGeneration);
  check.Range("rank", prepared.rank(), 0, kMaxRank);
  check.Range("step", prepared.step(), 1, kMaxStep);
  check.Text("error", prepared.error());
  if (!check.status().ok() || !prepared.ok()) return check.status();
  // The exact folder this rank prepares this step in: nothing else may be
  // moved into a checkpoint.
  const std::string expected =
      checkpoint::PrepareDir(prepared.rank(), prepared.step());
  check.That(prepared.dir() == expected, "dir",
             absl::StrCat("is not ", expected));
  check.Range("files", prepared.files_size(), 1, kMaxCheckpointFiles);
  for (const v1::CheckpointFile& file : prepared.files()) {
    check.Range("file size", file.size(), 0, kMaxCheckpointFileBytes);
    check.That(!file.name().empty() && file.name().size() <= 255 &&
                   file.name().find('/') == std::string::npos &&
                   file.name() != "." && file.name() != "..",
               "file name", "is not a plain file name");
    check.That(file.sha256().size() == 64 &&
                   file.sha256().find_first_not_of("0123456789abcdef") ==
                       std::string::npos,
               "sha256", "is not 64 lower-case hex digits");
  }
  return check.status();
}

absl::Status CheckCommitted(const v1::CheckpointCommitted& committed) {
  Checker check("checkpoint commit");
  check.Range("generation", committed.generation(), 1, kMaxGeneration);
  check.Range("step", committed.step(), 1, kMaxStep);
  check.Range("epoch", committed.epoch(), 0, kMaxStep);
  check.Range("bytes", committed.bytes(), 0, kMaxCheckpointFileBytes);
  check.Text("error", committed.error());
  if (committed.ok()) {
    check.That(committed.name() == checkpoint::CheckpointName(committed.step()),
               "name", "is not the checkpoint of its step");
  }
  return check.status();
}

absl::Status CheckPreempt(const v1::PreemptRequest& request) {
  Checker check("preemption request");
  check.Text("reason", request.reason());
  check.Text("note", request.note());
  check.Range("live_step", request.live_step(), 0, kMaxStep);
  check.Range("saved_epoch", request.saved_epoch(), 0, kMaxStep);
  check.Range("saved_bytes", request.saved_bytes(), 0, kMaxCheckpointFileBytes);
  if (!request.saved_checkpoint().empty()) {
    check.That(request.live_step() > 0 &&
                   request.saved_checkpoint() ==
                       checkpoint::CheckpointName(request.live_step()),
               "saved_checkpoint", "is not the checkpoint of live_step");
  }
  return check.status();
}

absl::Status CheckSkipped(const v1::RecordsSkipped& skipped) {
  Checker check("skipped records");
  JobId(check, skipped.job_id(), /*may_be_empty=*/false);
  check.Range("generation", skipped.generation(), 0, kMaxGeneration);
  check.Range("records size", skipped.records_size(), 1,
              kMaxSkippedRecordsPerMessage);
  for (const v1::SkippedRecord& record : skipped.records()) {
    check.Text("file", record.file());
    check.That(!record.file().empty(), "file", "is empty");
    check.Range("record", record.record(), 0, kMaxStep);
    // -1: a record of a GZIP stream, named by its number.
    check.Range("offset", record.offset(), -1, int64_t{1} << 62);
    check.Range("bytes", record.bytes(), 0, int64_t{1} << 62);
    check.Text("reason", record.reason());
    check.That(record.split() == "train" || record.split() == "test", "split",
               "is neither \"train\" nor \"test\"");
  }
  return check.status();
}

}  // namespace

absl::Status CheckRegistration(const v1::RegisterWorkerRequest& request) {
  Checker check("registration");
  check.Printable("host", request.host(), 253, /*spaces=*/false);
  check.Printable("task type", request.task().type(), 64, false);
  check.Range("task index", request.task().index(), 0, kMaxRank);
  check.Printable("device name", request.device().name(), 64, false);
  check.Printable("GPU name", request.device().gpu_name(), 256, true);
  check.Printable("GPU UUID", request.device().gpu_uuid(), 128, false);
  check.Printable("BLAS kernel", request.device().blas_kernel(), 64, false);
  check.Printable("BLAS kernel source", request.device().blas_kernel_source(),
                  32, false);
  if (!check.status().ok()) return check.status();
  return CheckLabels("registration", request.labels());
}

absl::Status CheckKvSet(const v1::KvSetRequest& request) {
  Checker check("KvSet");
  Rendezvous(check, request.job_id(), request.generation(), "key",
             request.key());
  check.Range("value size", static_cast<int64_t>(request.value().size()), 0,
              kMaxKvValueBytes);
  return check.status();
}

absl::Status CheckKvGet(const v1::KvGetRequest& request) {
  Checker check("KvGet");
  Rendezvous(check, request.job_id(), request.generation(), "key",
             request.key());
  check.Range("rank", request.rank(), 0, kMaxRank);
  check.Range("timeout_ms", request.timeout_ms(), 0, kMaxWaitMs);
  return check.status();
}

absl::Status CheckArtifactHeader(const v1::ArtifactUpload::Header& header) {
  Checker check("UploadArtifact");
  JobId(check, header.job_id(), /*may_be_empty=*/false);
  check.Range("generation", header.generation(), 0, kMaxGeneration);
  check.Range("rank", header.rank(), 0, kMaxRank);
  check.Range("rank_token size",
              static_cast<int64_t>(header.rank_token().size()), 0, 64);
  const v1::ArtifactInfo& info = header.info();
  check.Printable("info.name", info.name(), 32, false);
  check.Printable("info.file_name", info.file_name(), 255, false);
  check.Printable("info.format", info.format(), 32, false);
  check.Printable("info.sha256", info.sha256(), 64, false);
  check.Range("info.bytes", info.bytes(), 0, kMaxCheckpointFileBytes);
  check.Range("info.step", info.step(), 0, kMaxStep);
  return check.status();
}

absl::Status CheckArtifactRequest(absl::string_view call,
                                  const std::string& job_id,
                                  const std::string& name) {
  Checker check(call, kClientHint);
  JobId(check, job_id, /*may_be_empty=*/false);
  check.Printable("name", name, 32, false);
  return check.status();
}

absl::Status CheckJobId(absl::string_view call, const std::string& job_id,
                        bool may_be_empty) {
  Checker check(call, kClientHint);
  JobId(check, job_id, may_be_empty);
  return check.status();
}

absl::Status CheckSubmission(const v1::JobSpec& spec) {
  Checker check("SubmitJob", kClientHint);
  check.Range("spec size", static_cast<int64_t>(spec.ByteSizeLong()), 0,
              kMaxSpecBytes);
  return check.status();
}

absl::Status CheckStatusRequest(const v1::GetJobStatusRequest& request) {
  Checker check("GetJobStatus", kClientHint);
  JobId(check, request.job_id(), /*may_be_empty=*/true);
  check.Range("page_size", request.page_size(), 0, kMaxStatusPage);
  check.Printable("page_token", request.page_token(), 32, /*spaces=*/false);
  check.Range("history_offset", request.history_offset(), 0, kMaxStep);
  check.Range("history_limit", request.history_limit(), 0, kMaxHistoryPage);
  return check.status();
}

absl::Status CheckListWorkers(const v1::ListWorkersRequest& request) {
  Checker check("ListWorkers", kClientHint);
  check.Range("page_size", request.page_size(), 0, kMaxWorkerPage);
  check.Printable("page_token", request.page_token(), 512, /*spaces=*/false);
  return check.status();
}

absl::Status CheckWorkerMessage(const v1::WorkerMessage& message) {
  switch (message.kind_case()) {
    case v1::WorkerMessage::kHeartbeat: {
      Checker check("heartbeat");
      check.Range("generation", message.heartbeat().generation(), 0,
                  kMaxGeneration);
      check.Range("collective_seq", message.heartbeat().collective_seq(), 0,
                  int64_t{1} << 62);
      check.Range("link_mbps size", message.heartbeat().link_mbps_size(), 0,
                  kMaxRank + 1);
      for (double rate : message.heartbeat().link_mbps()) {
        check.That(rate >= 0 && rate < 1e9, "link_mbps",
                   "holds a rate that is negative, not a number or over "
                   "1e9 MB/s");
      }
      return check.status();
    }
    case v1::WorkerMessage::kProgress:
      return CheckProgress(message.progress());
    case v1::WorkerMessage::kResult:
      return CheckResult(message.result());
    case v1::WorkerMessage::kPrepared:
      return CheckPrepared(message.prepared());
    case v1::WorkerMessage::kCommitted:
      return CheckCommitted(message.committed());
    case v1::WorkerMessage::kPreempt:
      return CheckPreempt(message.preempt());
    case v1::WorkerMessage::kSkipped:
      return CheckSkipped(message.skipped());
    default:
      return absl::OkStatus();
  }
}

absl::Status Refused(absl::Status refusal) {
  LogWarning("refusing a request: ", refusal.message());
  return refusal;
}

}  // namespace lockstep::coordinator
