// One rank's background save: prepare and report, and on the chief wait for
// the go, commit, prune and report the commit (checkpointer.h).
#include "worker/checkpoint/checkpointer.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/log.h"
#include "common/status_macros.h"

namespace lockstep::worker {
namespace {

// How long the chief waits for every rank to prepare a step. A generation
// that ends releases it earlier (abort).
constexpr absl::Duration kCommitTimeout = absl::Minutes(10);

}  // namespace

Checkpointer::Checkpointer(TaskContext& task, std::string backup_dir, int keep)
    : task_(task),
      backup_dir_(std::move(backup_dir)),
      keep_(keep),
      rank_(task.assignment.rank()) {}

Checkpointer::~Checkpointer() {
  if (thread_.joinable()) task_.CancelCommitWaits();
  (void)Wait();
}

void Checkpointer::SaveAsync(Snapshot snapshot) {
  (void)Wait();
  thread_ = std::thread([this, snapshot = std::move(snapshot)] {
    const absl::Time start = absl::Now();
    last_ = Save(snapshot);
    if (last_.ok()) {
      LogInfo("checkpoint of step ", snapshot.step,
              rank_ == 0 ? " committed" : " prepared", " in ",
              absl::FormatDuration(
                  absl::Trunc(absl::Now() - start, absl::Milliseconds(1))));
    } else {
      LogWarning("checkpoint of step ", snapshot.step, " failed on rank ",
                 rank_, ": ", last_.message(),
                 "; training goes on, the previous checkpoint stays valid");
    }
  });
}

absl::Status Checkpointer::Wait() {
  if (thread_.joinable()) thread_.join();
  return last_;
}

void Checkpointer::Send(const v1::WorkerMessage& message) {
  if (task_.send) task_.send(message);
}

absl::Status Checkpointer::Save(const Snapshot& snapshot) {
  const v1::Assignment& assignment = task_.assignment;
  const absl::Time write_start = absl::Now();
  auto files =
      checkpoint::Prepare(backup_dir_, rank_, snapshot.step, snapshot.files);
  if (files.ok() && task_.metrics != nullptr) {
    task_.metrics->CheckpointWritten(absl::Now() - write_start);
  }
  v1::WorkerMessage message;
  v1::CheckpointPrepared* prepared = message.mutable_prepared();
  prepared->set_job_id(assignment.job_id());
  prepared->set_generation(assignment.generation());
  prepared->set_rank(rank_);
  prepared->set_step(snapshot.step);
  prepared->set_ok(files.ok());
  prepared->set_dir(checkpoint::PrepareDir(rank_, snapshot.step));
  if (files.ok()) {
    for (const v1::CheckpointFile& file : *files) *prepared->add_files() = file;
  } else {
    prepared->set_error(
        absl::StrCat("rank ", rank_, " on ", task_.host,
                     " could not write its part: ", files.status().message()));
  }
  Send(message);
  RETURN_IF_ERROR(files.status());
  if (rank_ != 0) return absl::OkStatus();
  return CommitOnChief(snapshot);
}

absl::Status Checkpointer::CommitOnChief(const Snapshot& snapshot) {
  const v1::Assignment& assignment = task_.assignment;
  absl::StatusOr<int64_t> bytes;
  auto go = task_.WaitForCommit(snapshot.step, kCommitTimeout);
  if (!go.ok()) {
    bytes = go.status();
  } else if (!go->abandoned().empty()) {
    bytes = absl::AbortedError(go->abandoned());
  } else {
    std::vector<checkpoint::PreparedPart> parts;
    for (const v1::CheckpointPrepared& rank : go->ranks()) {
      checkpoint::PreparedPart& part = parts.emplace_back();
      part.dir = rank.dir();
      part.files.assign(rank.files().begin(), rank.files().end());
    }
    v1::Manifest manifest = snapshot.manifest;
    manifest.set_time(absl::ToDoubleSeconds(absl::Now() - absl::UnixEpoch()));
    bytes = checkpoint::Commit(backup_dir_, manifest, parts);
    if (bytes.ok()) {
      absl::Status pruned =
          checkpoint::Prune(backup_dir_, keep_, snapshot.step);
      if (!pruned.ok()) {
        LogWarning("after committing step ", snapshot.step,
                   ", could not remove old checkpoints: ", pruned.message());
      }
    }
  }
  // A generation that ended has no one to report to, and an abandoned step
  // was reported by the rank that could not prepare it.
  if ((!go.ok() && !absl::IsDeadlineExceeded(go.status())) ||
      (go.ok() && !go->abandoned().empty())) {
    return bytes.status();
  }
  v1::WorkerMessage message;
  v1::CheckpointCommitted* committed = message.mutable_committed();
  committed->set_job_id(assignment.job_id());
  committed->set_generation(assignment.generation());
  committed->set_step(snapshot.step);
  committed->set_epoch(snapshot.epoch);
  committed->set_name(checkpoint::CheckpointName(snapshot.step));
  committed->set_ok(bytes.ok());
  if (bytes.ok()) {
    committed->set_bytes(*bytes);
  } else {
    committed->set_error(std::string(bytes.status().message()));
  }
  Send(message);
  return bytes.status();
}

}  // namespace lockstep::worker
