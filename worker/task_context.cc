// TaskContext: the abort, done and checkpoint-commit signals between the
// agent and a running task.
#include "worker/task_context.h"

#include "absl/strings/str_cat.h"

namespace lockstep::worker {

void TaskContext::Abort() {
  absl::MutexLock lock(&mu_);
  aborted_ = true;
  // Both blocking points of a rendezvous: the key-value store and the
  // communicator's connection (registered before it connects).
  if (kv != nullptr) kv->Cancel();
  if (comm_ != nullptr) comm_->Abort();
}

bool TaskContext::aborted() const {
  absl::MutexLock lock(&mu_);
  return aborted_;
}

void TaskContext::SetCommunicator(Communicator* comm) {
  absl::MutexLock lock(&mu_);
  comm_ = comm;
  if (aborted_ && comm_ != nullptr) comm_->Abort();
}

void TaskContext::DeliverCommit(const v1::CommitCheckpoint& commit) {
  absl::MutexLock lock(&mu_);
  commits_.push_back(commit);
}

absl::StatusOr<v1::CommitCheckpoint> TaskContext::WaitForCommit(
    int64_t step, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto arrived = [&] {
    mu_.AssertHeld();
    if (aborted_ || commits_cancelled_) return true;
    for (const auto& commit : commits_) {
      if (commit.step() == step) return true;
    }
    return false;
  };
  if (!mu_.AwaitWithTimeout(absl::Condition(&arrived), timeout)) {
    return absl::DeadlineExceededError(absl::StrCat(
        "the coordinator did not confirm that every rank prepared step ", step,
        " within ", absl::FormatDuration(timeout)));
  }
  for (const auto& commit : commits_) {
    if (commit.step() == step) return commit;
  }
  if (commits_cancelled_) {
    return absl::CancelledError(
        absl::StrCat("this rank's part of the job ended before step ", step,
                     " was committed"));
  }
  return absl::AbortedError(absl::StrCat(
      "the generation ended before every rank prepared step ", step));
}

void TaskContext::CancelCommitWaits() {
  absl::MutexLock lock(&mu_);
  commits_cancelled_ = true;
}

void TaskContext::MarkDone() {
  absl::MutexLock lock(&mu_);
  done_ = true;
}

bool TaskContext::WaitUntilDone(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout(absl::Condition(&done_), timeout);
}

}  // namespace lockstep::worker
