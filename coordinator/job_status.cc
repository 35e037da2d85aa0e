// Updates to a job's reported status from its workers' reports.
#include "coordinator/job_status.h"

#include <algorithm>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace lockstep::coordinator {
namespace {

// Checkpoints kept in a job's status, newest last.
constexpr int kCheckpointsInStatus = 100;

// The "resumed" event of a generation's first report, if it resumed: a first
// generation that starts from scratch did not resume anything.
void AddResumedEvent(v1::JobStatus& status, const v1::ProgressReport& report,
                     double now) {
  if (!report.has_resumed_at_step() ||
      (report.resumed_at_step() <= 0 && status.generation() <= 1)) {
    return;
  }
  const int64_t recorded =
      status.step_losses_size() == 0
          ? 0
          : (status.step_losses_size() - 1) * LossStride(status) + 1;
  // The history's last loss may lie up to loss_stride - 1 steps before the
  // last one reported.
  const int64_t known =
      std::max({recorded, status.applied_step(), status.step()});
  int64_t repeated = std::max<int64_t>(0, known - report.resumed_at_step());
  std::string source =
      report.state_source_rank() >= 0
          ? absl::StrCat(" with rank ", report.state_source_rank(),
                         "'s live state")
      : !report.restored_checkpoint().empty()
          ? absl::StrCat(" from checkpoint ", report.restored_checkpoint())
          : " from the initial state";
  AddEvent(status, now, "resumed", nullptr,
           absl::StrCat("generation ", status.generation(),
                        " trains again after step ", report.resumed_at_step(),
                        source, "; ", repeated, " steps repeated"));
}

void AddEval(v1::JobStatus& status, const v1::ProgressReport& report,
             double now) {
  if (report.has_test_accuracy()) {
    status.set_test_accuracy(report.test_accuracy());
  }
  *status.mutable_test_metrics() = report.test_metrics();
  if (status.evals_size() >= kMaxEvals) {
    // Every second one goes, the first and the newest stay: the list keeps
    // spanning the whole job at half the resolution.
    auto* evals = status.mutable_evals();
    const int size = evals->size();
    int kept = 0;
    for (int i = 0; i < size; ++i) {
      if (i % 2 == 0 || i == size - 1) evals->SwapElements(kept++, i);
    }
    evals->DeleteSubrange(kept, size - kept);
    status.set_dropped_evals(status.dropped_evals() + size - kept);
  }
  v1::EvalPoint* eval = status.add_evals();
  eval->set_step(report.step());
  eval->set_epoch(report.epoch());
  eval->set_test_accuracy(report.test_accuracy());
  eval->set_test_loss(report.test_loss());
  *eval->mutable_metrics() = report.test_metrics();
  eval->set_samples(report.eval_samples());
  eval->set_time(now);
}

// Keeps every second value of a history.
void Halve(google::protobuf::RepeatedField<float>& history) {
  const int kept = (history.size() + 1) / 2;
  for (int i = 1; i < kept; ++i) history.Set(i, history.Get(2 * i));
  history.Truncate(kept);
}

// Keeps every second loss (and learning rate) of the history and doubles
// its stride.
void HalveLossHistory(v1::JobStatus& status) {
  Halve(*status.mutable_step_losses());
  Halve(*status.mutable_step_lrs());
  status.set_loss_stride(LossStride(status) * 2);
}

// Writes the report's losses (and learning rates) into the history from
// its first_step, which may repeat steps (a resume) or skip some (a job
// resumed from another's backup starts past step 1): skipped steps are
// recorded as loss 0 and learning rate NaN. The learning rates are kept
// beside the losses once a report carries them; NaN where one did not.
void RecordLosses(v1::JobStatus& status, const v1::ProgressReport& report) {
  constexpr float kUnknown = std::numeric_limits<float>::quiet_NaN();
  auto* losses = status.mutable_step_losses();
  auto* lrs = status.mutable_step_lrs();
  if (report.step_lrs_size() > 0 && lrs->empty()) {
    lrs->Resize(losses->size(), kUnknown);
  }
  // The history's index of the first loss at or after first_step. A job
  // that starts far along (resumed from another job's backup) thins the
  // history until that index fits: at most 20 halvings, steps being below
  // 2^40.
  while ((report.first_step() + LossStride(status) - 1) / LossStride(status) >
         kMaxLossHistory) {
    HalveLossHistory(status);
  }
  int64_t stride = LossStride(status);
  const int64_t from = (report.first_step() + stride - 1) / stride;
  losses->Resize(static_cast<int>(from), 0.0f);
  const bool keep_lrs = report.step_lrs_size() > 0 || !lrs->empty();
  if (keep_lrs) lrs->Resize(static_cast<int>(from), kUnknown);
  const bool reported_lrs = report.step_lrs_size() == report.step_losses_size();
  int64_t step = report.first_step();
  for (int i = 0; i < report.step_losses_size(); ++i, ++step) {
    if (step % stride != 0) continue;
    if (losses->size() == kMaxLossHistory) {
      HalveLossHistory(status);
      stride = LossStride(status);
      if (step % stride != 0) continue;
    }
    losses->Add(report.step_losses(i));
    if (keep_lrs) lrs->Add(reported_lrs ? report.step_lrs(i) : kUnknown);
  }
}

}  // namespace

int RestartsUsed(const v1::JobStatus& status) {
  return std::max(0, status.generations() - 1 - status.preemptions() -
                         status.coordinator_restarts());
}

void AddEvent(v1::JobStatus& status, double now, const std::string& kind,
              const Worker* worker, const std::string& message) {
  if (status.events_size() >= kMaxEvents) {
    const int drop = status.events_size() - kMaxEvents + 1;
    status.mutable_events()->DeleteSubrange(0, drop);
    status.set_dropped_events(status.dropped_events() + drop);
  }
  v1::JobEvent* event = status.add_events();
  event->set_time(now);
  event->set_generation(status.generation());
  event->set_kind(kind);
  if (message.size() <= kMaxEventMessageBytes) {
    event->set_message(message);
  } else {
    // Cut on a character boundary: never inside a UTF-8 sequence.
    size_t cut = kMaxEventMessageBytes;
    while (cut > 0 &&
           (static_cast<unsigned char>(message[cut]) & 0xC0) == 0x80) {
      --cut;
    }
    event->set_message(absl::StrCat(message.substr(0, cut), " [",
                                    message.size() - cut, " more bytes]"));
  }
  event->set_rank(-1);
  if (worker != nullptr) {
    event->set_worker_id(worker->id);
    event->set_host(worker->host);
    event->set_rank(worker->rank);
  }
}

namespace {

// A skipped record's key (JobStatus.skipped_record_keys): FNV-1a of its
// split, file, number and offset, stable across processes and builds.
uint64_t SkippedRecordKey(const v1::SkippedRecord& record) {
  uint64_t hash = 0xcbf29ce484222325ull;
  auto mix = [&hash](absl::string_view bytes) {
    for (char c : bytes) {
      hash ^= static_cast<uint8_t>(c);
      hash *= 0x100000001b3ull;
    }
    hash ^= 0xff;  // ends the field: "ab","c" and "a","bc" differ
    hash *= 0x100000001b3ull;
  };
  mix(record.split());
  mix(record.file());
  mix(absl::StrCat(record.record()));
  mix(absl::StrCat(record.offset()));
  return hash;
}

}  // namespace

std::string DescribeSkippedRecord(const v1::SkippedRecord& record) {
  std::string where = absl::StrCat(record.split(), " data ", record.file(),
                                   " record ", record.record());
  if (record.offset() >= 0)
    absl::StrAppend(&where, " at byte ", record.offset());
  if (record.bytes() > 0)
    absl::StrAppend(&where, " (", record.bytes(), " bytes)");
  return absl::StrCat(where, ": ", record.reason());
}

int NoteSkippedRecords(v1::JobStatus& status, const v1::RecordsSkipped& skipped,
                       const Worker& worker, double now) {
  const int64_t limit = status.spec().data().skip_corrupt();
  int fresh = 0;
  for (const v1::SkippedRecord& record : skipped.records()) {
    // Past the limit the job is failing: nothing more is kept.
    if (status.records_skipped() > limit) break;
    const uint64_t key = SkippedRecordKey(record);
    const auto& keys = status.skipped_record_keys();
    if (std::find(keys.begin(), keys.end(), key) != keys.end()) continue;
    status.add_skipped_record_keys(key);
    status.set_records_skipped(status.records_skipped() + 1);
    ++fresh;
    AddEvent(
        status, now, "record_skipped", &worker,
        absl::StrCat(
            "rank ", worker.rank, " (", worker.id, " on ", worker.host,
            ") could not read ", DescribeSkippedRecord(record),
            status.records_skipped() > limit
                ? absl::StrCat("; one more than the ", limit,
                               " data.skip_corrupt allows")
                : absl::StrCat("; skipped (", status.records_skipped(), " of ",
                               limit, " allowed by data.skip_corrupt)")));
  }
  return fresh;
}

int64_t LossStride(const v1::JobStatus& status) {
  return std::max<int64_t>(1, status.loss_stride());
}

// The all-reduce algorithm communication.algorithm "auto" chose for this
// generation, and the times it chose by.
void AddAlgorithmEvent(v1::JobStatus& status, const v1::TrainingPlan& plan,
                       double now) {
  if (!plan.has_algorithm_probe()) return;
  const v1::AllReduceProbe& probe = plan.algorithm_probe();
  AddEvent(
      status, now, "all_reduce_algorithm", nullptr,
      absl::StrFormat(
          "generation %d all-reduces %s: %.1f MiB took %.3f s direct, "
          "%.3f s by the ring (each rank's fastest try, summed over %d "
          "ranks)",
          status.generation(),
          plan.all_reduce_algorithm() == "ring" ? "by the ring" : "directly",
          static_cast<double>(probe.bytes()) / (1 << 20),
          probe.direct_seconds(), probe.ring_seconds(), plan.replicas()));
}

void ApplyProgress(v1::JobStatus& status, const v1::ProgressReport& report,
                   double now) {
  AddResumedEvent(status, report, now);
  AddAlgorithmEvent(status, report.plan(), now);
  for (const std::string& warning : report.warnings()) {
    AddEvent(status, now, "warning", nullptr, warning);
  }
  status.set_step(report.step());
  NoteAppliedStep(status, report.step());
  status.set_epoch(report.epoch());
  status.set_total_steps(report.total_steps());
  status.set_samples_per_second(report.samples_per_second());
  if (report.first_step() >= 0 && report.step_losses_size() > 0) {
    RecordLosses(status, report);
    status.set_loss(report.step_losses(report.step_losses_size() - 1));
  }
  status.set_tokens_per_second(report.tokens_per_second());
  if (report.has_test_loss()) status.set_test_loss(report.test_loss());
  if (report.has_plan()) *status.mutable_plan() = report.plan();
  // Every task reports a test loss; only classifiers an accuracy.
  if (report.has_test_loss()) AddEval(status, report, now);
}

void NoteAppliedStep(v1::JobStatus& status, int64_t step) {
  if (step <= status.applied_step()) return;
  // A step past the plan's end, or past the spec's max_steps (before any
  // plan was reported), is no step this job trained.
  if (status.total_steps() > 0 && step > status.total_steps()) return;
  if (status.spec().max_steps() > 0 && step > status.spec().max_steps()) {
    return;
  }
  status.set_applied_step(step);
}

void ApplyResult(v1::JobStatus& status, int rank,
                 const v1::TaskResult& result) {
  v1::RankResult* ranked = status.mutable_ranks(rank);
  ranked->set_model_digest(result.model_digest());
  ranked->set_steps(result.steps());
  if (rank != 0) return;
  status.set_step(result.steps());
  status.set_loss(result.final_loss());
  // A task without accuracy (regression, language models) leaves it unset.
  if (result.test_metrics().contains("test_accuracy") ||
      result.test_metrics().empty()) {
    status.set_test_accuracy(result.test_accuracy());
  }
  if (!result.test_metrics().empty()) {
    status.set_test_loss(result.test_loss());
    *status.mutable_test_metrics() = result.test_metrics();
  }
  status.set_samples_per_second(result.samples_per_second());
  status.set_tokens_per_second(result.tokens_per_second());
  *status.mutable_breakdown() = result.breakdown();
}

void AddCheckpoint(v1::JobStatus& status, const v1::CheckpointCommitted& c,
                   const Worker& worker, double now) {
  v1::CheckpointInfo* info = status.add_checkpoints();
  info->set_name(c.name());
  info->set_step(c.step());
  info->set_epoch(c.epoch());
  info->set_generation(c.generation());
  info->set_time(now);
  info->set_bytes(c.bytes());
  if (status.checkpoints_size() > kCheckpointsInStatus) {
    status.mutable_checkpoints()->DeleteSubrange(
        0, status.checkpoints_size() - kCheckpointsInStatus);
  }
  AddEvent(status, now, "checkpoint_committed", &worker,
           absl::StrCat(c.name(), ": step ", c.step(), ", epoch ",
                        c.epoch() + 1, ", ", c.bytes(), " bytes"));
}

namespace {

// The committed checkpoint of `step`, and the newest one (null: none).
const v1::CheckpointInfo* CheckpointAt(const v1::JobStatus& status,
                                       int64_t step) {
  for (const v1::CheckpointInfo& info : status.checkpoints()) {
    if (info.step() == step) return &info;
  }
  return nullptr;
}
const v1::CheckpointInfo* NewestCheckpoint(const v1::JobStatus& status) {
  const v1::CheckpointInfo* newest = nullptr;
  for (const v1::CheckpointInfo& info : status.checkpoints()) {
    if (newest == nullptr || info.step() > newest->step()) newest = &info;
  }
  return newest;
}

}  // namespace

std::string FinalSave(const v1::JobStatus& status, int64_t step,
                      const std::string& failure) {
  if (status.spec().checkpoint().backup_dir().empty()) return "";
  if (const v1::CheckpointInfo* saved = CheckpointAt(status, step)) {
    return absl::StrCat("saved as ", saved->name());
  }
  const v1::CheckpointInfo* newest = NewestCheckpoint(status);
  if (failure.empty() && status.total_steps() > 0 &&
      step >= status.total_steps()) {
    return absl::StrCat("step ", step, " is the last one and is not saved");
  }
  std::string text = absl::StrCat(
      "its final save at step ", step, " failed",
      failure.empty() ? " (no checkpoint of that step was committed)"
                      : absl::StrCat(" (", failure, ")"));
  if (newest == nullptr) {
    return absl::StrCat(text, "; no checkpoint of this job was committed");
  }
  return absl::StrCat(text, "; the newest checkpoint is ", newest->name(),
                      " (step ", newest->step(), ")");
}

std::string ResumePoint(const v1::JobStatus& status) {
  if (status.spec().checkpoint().backup_dir().empty()) return "";
  const v1::CheckpointInfo* newest = NewestCheckpoint(status);
  if (newest == nullptr) {
    return "it resumes from step 0 (no checkpoint of this job was committed)";
  }
  return absl::StrCat("it resumes from ", newest->name(), " (step ",
                      newest->step(), "), its newest checkpoint");
}

std::string ContinuesAfterPreemption(const v1::JobStatus& status) {
  const int64_t stopped = status.applied_step();
  if (const v1::CheckpointInfo* saved = CheckpointAt(status, stopped)) {
    return absl::StrCat("it continues from step ", stopped, " (", saved->name(),
                        ")");
  }
  if (stopped == 0) return "it starts from step 0";
  const std::string resumes = ResumePoint(status);
  if (resumes.empty()) return absl::StrCat("it stopped at step ", stopped);
  return absl::StrCat("it stopped at step ", stopped,
                      ", which was not saved: ", resumes,
                      ", unless its workers still hold the newer "
                      "state");
}

v1::JobStatus Summary(v1::JobStatus status, size_t max_bytes,
                      size_t max_error_bytes) {
  status.clear_events();
  status.clear_checkpoints();
  status.clear_evals();
  status.clear_skipped_record_keys();
  if (status.ByteSizeLong() > max_bytes) {
    // A record stored before the bounds (a job named with megabytes of
    // text): listed without its spec and with its error cut; `lockstep
    // status JOB` has the whole record, `lockstep delete JOB` removes it.
    status.clear_spec();
    if (status.error().size() > max_error_bytes) {
      status.mutable_error()->resize(max_error_bytes);
    }
  }
  return status;
}

}  // namespace lockstep::coordinator
