// Runs each generation of the worker's job on its replica, turns how it
// ended (including a LibTorch exception) into the rank's result, and loads
// a job's data while this worker stands by for it (trainer.h).
#include "worker/train/trainer.h"

#include <exception>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "checkpoint/store.h"
#include "common/log.h"
#include "worker/train/data_cache.h"
#include "worker/train/replica.h"
#include "worker/train/torch_error.h"
#include "worker/train/training_generation.h"

namespace lockstep::worker {

TrainingRunner::TrainingRunner(std::string device)
    : device_(std::move(device)) {}
TrainingRunner::~TrainingRunner() = default;

void TrainingRunner::Standby(const v1::Standby& standby) {
  absl::MutexLock lock(&standby_mu_);
  if (standby_.valid() &&
      standby_.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
    return;  // one load at a time; the task loads what this one did not
  }
  LogInfo("standing by for job ", standby.job_id(), ": loading its data");
  standby_ =
      std::async(std::launch::async, [standby] {
        const absl::Time start = absl::Now();
        for (bool train : {true, false}) {
          auto data = LoadSplit(standby.spec().data(), train);
          if (!data.ok()) {
            LogWarning("standing by for job ", standby.job_id(),
                       ": cannot load its data: ", data.status().message());
            return;
          }
        }
        LogInfo("standing by for job ", standby.job_id(), ": data loaded in ",
                absl::FormatDuration(
                    absl::Trunc(absl::Now() - start, absl::Milliseconds(1))));
      }).share();
}

void TrainingRunner::WaitForStandby() {
  std::shared_future<void> standby;
  {
    absl::MutexLock lock(&standby_mu_);
    standby = standby_;
  }
  if (standby.valid()) standby.wait();
}

v1::TaskResult TrainingRunner::Run(TaskContext& task) {
  // A load the standby started is what this generation would load.
  WaitForStandby();
  const v1::Assignment& assignment = task.assignment;
  if (replica_ == nullptr || replica_->job_id != assignment.job_id()) {
    // A new job: the previous job's replica is no longer needed.
    replica_ = std::make_unique<Replica>();
    replica_->job_id = assignment.job_id();
  }
  if (spec_.name() != assignment.spec().name() ||
      replica_->job_id != assignment.job_id()) {
    position_.reset();
  }
  spec_ = assignment.spec();
  job_ended_ = false;
  absl::StatusOr<v1::TaskResult> result;
  try {
    TrainingGeneration generation(task, *replica_, torch::Device(device_));
    result = generation.Run();
    if (auto position = generation.LastPosition()) {
      position_ = std::make_unique<ReplicaPosition>(*std::move(position));
    }
  } catch (const std::exception& e) {
    result = absl::InternalError(
        absl::StrCat("LibTorch error: ", TorchErrorSentence(e.what())));
  }
  // A job trained to its last step is done (the chief exported it and
  // removed its checkpoints); a stop saved its step as a checkpoint.
  job_ended_ = result.ok() && !result->stopped();
  // Its data need not stay. Not after a stop: a preempted group's stop
  // waits for the group to re-form and train on (a job stopped for good
  // gives its data up when the next data set is loaded).
  if (job_ended_) ForgetCachedData();
  v1::TaskResult out;
  if (result.ok()) {
    out = *std::move(result);
  } else {
    out.set_ok(false);
    out.set_code(static_cast<int>(result.status().code()));
    out.set_error(std::string(result.status().message()));
    // Where this rank stopped: the steps it applied, which a later resume
    // from an older checkpoint repeats.
    out.set_steps(replica_->step);
    LogError("job ", assignment.job_id(), " generation ",
             assignment.generation(), " ended on rank ", assignment.rank(),
             " after step ", replica_->step, ": ", result.status().message());
  }
  out.set_job_id(assignment.job_id());
  out.set_generation(assignment.generation());
  out.set_rank(assignment.rank());
  return out;
}

LiveStateOutcome TrainingRunner::SaveLiveState() {
  LiveStateOutcome out;
  if (replica_ == nullptr || replica_->model == nullptr ||
      position_ == nullptr || replica_->step == 0) {
    out.note = "it held no trained state";
    return out;
  }
  out.step = replica_->step;
  if (job_ended_) {
    out.note = absl::StrCat("its part of job ", replica_->job_id,
                            " had ended; nothing to save");
    return out;
  }
  const std::string& backup_dir = spec_.checkpoint().backup_dir();
  if (backup_dir.empty()) {
    out.note = absl::StrCat(
        "the job saves no checkpoints (no checkpoint.backup_dir), so the live "
        "state at step ",
        out.step, " left with the worker");
    return out;
  }
  const int64_t newest = checkpoint::NewestStep(backup_dir);
  if (out.step <= newest) {
    out.note = absl::StrCat(
        "its live state (step ", out.step, ") is not newer than checkpoint ",
        checkpoint::CheckpointName(newest), "; nothing to save");
    return out;
  }
  absl::Status saved;
  try {
    // The whole replicated state, as the chief writes it; the rank record
    // is rank 0's, a pure function of the seed, the plan and the step.
    ReplicaPosition position = *position_;
    const int prepared_by = position.rank;
    position.rank = 0;
    Snapshot snapshot = MakeSnapshot(spec_, *replica_, position);
    auto files = checkpoint::Prepare(backup_dir, prepared_by, snapshot.step,
                                     snapshot.files);
    if (files.ok()) {
      checkpoint::PreparedPart part;
      part.dir = checkpoint::PrepareDir(prepared_by, snapshot.step);
      part.files = *std::move(files);
      auto bytes = checkpoint::Commit(backup_dir, snapshot.manifest, {part});
      if (bytes.ok()) {
        out.saved_as = checkpoint::CheckpointName(snapshot.step);
        out.saved_epoch = snapshot.epoch;
        out.saved_bytes = *bytes;
        return out;
      }
      saved = bytes.status();
    } else {
      saved = files.status();
    }
  } catch (const std::exception& e) {
    saved = absl::InternalError(
        absl::StrCat("LibTorch error: ", TorchErrorSentence(e.what())));
  }
  out.note = absl::StrCat("saving its live state at step ", out.step, " in ",
                          backup_dir, " failed: ", saved.message());
  LogError(out.note);
  return out;
}

}  // namespace lockstep::worker
