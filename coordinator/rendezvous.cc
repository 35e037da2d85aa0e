// The Coordinator's rendezvous entry points: the key-value store and the
// barriers of a job's live generation, and the fence that refuses every
// other generation.
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "coordinator/coordinator.h"
#include "coordinator/message_checks.h"

namespace lockstep::coordinator {
namespace {

// Logs a refused rendezvous request once and passes the refusal on.
absl::Status Refused(absl::Status refusal) {
  LogWarning("refusing a rendezvous request: ", refusal.message());
  return refusal;
}

}  // namespace

absl::StatusOr<Generation*> Coordinator::CurrentGenerationLocked(
    const std::string& job_id, int64_t number) {
  if (shutdown_) return absl::CancelledError("the coordinator is stopping");
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("no job ", job_id));
  }
  Generation* current = it->second.generation.get();
  if (running_job_ != job_id || current == nullptr ||
      !current->Admits(number)) {
    const v1::JobStatus& status = it->second.status;
    return absl::AbortedError(absl::StrCat(
        "job ", job_id, " generation ", number, " is over (the job is ",
        v1::JobState_Name(status.state()), " in generation ",
        status.generation(), "): ", status.error()));
  }
  return current;
}

absl::Status Coordinator::KvSet(const v1::KvSetRequest& request) {
  if (absl::Status bad = CheckKvSet(request); !bad.ok()) return Refused(bad);
  absl::MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(
      Generation * generation,
      CurrentGenerationLocked(request.job_id(), request.generation()));
  if (absl::Status full = generation->Set(request.key(), request.value());
      !full.ok()) {
    return Refused(full);
  }
  changed_.SignalAll();
  return absl::OkStatus();
}

absl::StatusOr<std::string> Coordinator::KvGet(
    const v1::KvGetRequest& request) {
  if (absl::Status bad = CheckKvGet(request); !bad.ok()) return Refused(bad);
  absl::Time deadline = absl::Now() + absl::Milliseconds(request.timeout_ms());
  absl::MutexLock lock(&mu_);
  while (true) {
    // Looked up again after every wait: the generation may have been
    // replaced meanwhile, and then this call is fenced.
    ASSIGN_OR_RETURN(
        Generation * generation,
        CurrentGenerationLocked(request.job_id(), request.generation()));
    if (const std::string* value = generation->Get(request.key())) {
      return *value;
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "key '", request.key(), "' of job ", request.job_id(), " generation ",
          request.generation(), " was not set within ", request.timeout_ms(),
          " ms; a peer did not reach rendezvous"));
    }
    changed_.WaitWithDeadline(&mu_, deadline);
  }
}

absl::Status Coordinator::Barrier(const v1::BarrierRequest& request) {
  if (absl::Status bad = CheckBarrier(request); !bad.ok()) return Refused(bad);
  absl::Time deadline = absl::Now() + absl::Milliseconds(request.timeout_ms());
  absl::MutexLock lock(&mu_);
  {
    ASSIGN_OR_RETURN(
        Generation * generation,
        CurrentGenerationLocked(request.job_id(), request.generation()));
    if (request.rank() < 0 || request.rank() >= generation->world_size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "barrier '", request.name(), "' of job ", request.job_id(),
          " generation ", request.generation(), ": rank ", request.rank(),
          " is not one of its ", generation->world_size(), " ranks"));
    }
    if (absl::Status full = generation->Arrive(request.name(), request.rank());
        !full.ok()) {
      return Refused(full);
    }
    changed_.SignalAll();
  }
  while (true) {
    ASSIGN_OR_RETURN(
        Generation * generation,
        CurrentGenerationLocked(request.job_id(), request.generation()));
    if (generation->AllArrived(request.name())) return absl::OkStatus();
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat(
          "barrier '", request.name(), "' timed out after ",
          request.timeout_ms(), " ms; missing: ",
          absl::StrJoin(generation->Missing(request.name()), ", ")));
    }
    changed_.WaitWithDeadline(&mu_, deadline);
  }
}

}  // namespace lockstep::coordinator
