// The worker session and job watch reactors, and the cap on open streams
// (grpc_streams.h).
#include "coordinator/rpc/grpc_streams.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/grpc_status.h"
#include "common/job_state.h"
#include "coordinator/authorization.h"

namespace lockstep::coordinator {

// ---- StreamSlots
// --------------------------------------------------------------

StreamSlots::StreamSlots(std::string what, std::string flag, int cap,
                         std::string identity_flag, int per_identity)
    : what_(std::move(what)),
      flag_(std::move(flag)),
      cap_(cap),
      identity_flag_(std::move(identity_flag)),
      per_identity_(per_identity) {}

grpc::Status StreamSlots::Take(const std::string& identity) {
  absl::MutexLock lock(&mu_);
  if (!identity.empty()) {
    auto it = by_identity_.find(identity);
    if (it != by_identity_.end() && it->second >= per_identity_) {
      return ToGrpcStatus(LogRefusal(absl::ResourceExhaustedError(absl::StrCat(
          identity, " already holds ", per_identity_, " ", what_,
          ", the most one identity may (", identity_flag_, " ", per_identity_,
          "); close one of its streams, or give each client its own "
          "certificate"))));
    }
  }
  if (used_ >= cap_) {
    return ToGrpcStatus(LogRefusal(absl::ResourceExhaustedError(
        absl::StrCat("the coordinator already serves its cap of ", cap_, " ",
                     what_, " (", flag_, " ", cap_,
                     "); close one or restart the coordinator with a "
                     "larger ",
                     flag_))));
  }
  ++used_;
  if (!identity.empty()) ++by_identity_[identity];
  return grpc::Status::OK;
}

void StreamSlots::Release(const std::string& identity) {
  absl::MutexLock lock(&mu_);
  --used_;
  if (identity.empty()) return;
  auto it = by_identity_.find(identity);
  if (it != by_identity_.end() && --it->second <= 0) by_identity_.erase(it);
}

int StreamSlots::used() const {
  absl::MutexLock lock(&mu_);
  return used_;
}

// ---- SessionReactor
// -------------------------------------------------------------

SessionReactor::SessionReactor(Coordinator* coordinator, StreamSlots* slots,
                               Caller caller)
    : coordinator_(coordinator), slots_(slots), caller_(std::move(caller)) {
  StartRead(&incoming_);
}

void SessionReactor::Send(const v1::CoordinatorCommand& command) {
  absl::MutexLock lock(&mu_);
  if (ending_) return;
  queue_.push_back(command);
  if (!writing_) WriteNextLocked();
}

void SessionReactor::Close() {
  absl::MutexLock lock(&mu_);
  EndLocked(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                         "the coordinator ended this session (the worker was "
                         "declared failed); register again"),
            absl::UnavailableError("the coordinator closed the session"),
            /*drain=*/true);
}

void SessionReactor::OnReadDone(bool ok) {
  if (!ok) {
    absl::MutexLock lock(&mu_);
    EndLocked(grpc::Status::OK,
              absl::UnavailableError("the worker closed its session"),
              /*drain=*/false);
    return;
  }
  if (!opened_) {
    if (!Open()) return;
  } else {
    bool ending;
    {
      absl::MutexLock lock(&mu_);
      ending = ending_;
    }
    // A read that completed after the coordinator closed this session (the
    // worker was declared failed) is not handled. A refused message is
    // logged by the coordinator; the session goes on.
    if (!ending) (void)coordinator_->HandleWorkerMessage(worker_id_, incoming_);
  }
  absl::MutexLock lock(&mu_);
  if (!ending_) StartRead(&incoming_);
}

bool SessionReactor::Open() {
  absl::Status opened;
  if (!incoming_.has_hello()) {
    opened = absl::InvalidArgumentError(
        "a worker session must start with a SessionHello");
  } else {
    worker_id_ = incoming_.hello().worker_id();
    incarnation_ = incoming_.hello().incarnation();
    opened = coordinator_->OpenSession(caller_, worker_id_, incarnation_, this);
  }
  if (opened.ok()) {
    opened_ = true;
    return true;
  }
  absl::MutexLock lock(&mu_);
  EndLocked(ToGrpcStatus(opened), opened, /*drain=*/false);
  return false;
}

void SessionReactor::OnWriteDone(bool ok) {
  absl::MutexLock lock(&mu_);
  writing_ = false;
  if (!ok) {
    EndLocked(grpc::Status::OK,
              absl::UnavailableError("cannot write to the worker"),
              /*drain=*/false);
    queue_.clear();
  }
  if (!queue_.empty()) {
    WriteNextLocked();
  } else if (ending_ && !finished_) {
    finished_ = true;
    Finish(final_status_);
  }
}

void SessionReactor::OnCancel() {
  absl::MutexLock lock(&mu_);
  EndLocked(grpc::Status::CANCELLED,
            absl::CancelledError("the session was cancelled"),
            /*drain=*/false);
}

void SessionReactor::OnDone() {
  absl::Status cause;
  {
    absl::MutexLock lock(&mu_);
    cause = cause_;
  }
  // Also waits for any Send in progress: the coordinator makes it with its
  // lock held, and CloseSession takes that lock.
  if (opened_)
    coordinator_->CloseSession(worker_id_, incarnation_, this, cause);
  slots_->Release(caller_.role == Role::kInsecure ? "" : caller_.id);
  delete this;
}

void SessionReactor::EndLocked(grpc::Status status, absl::Status cause,
                               bool drain) {
  if (ending_) return;
  ending_ = true;
  final_status_ = std::move(status);
  cause_ = std::move(cause);
  if (!drain) queue_.clear();
  if (!writing_ && queue_.empty() && !finished_) {
    finished_ = true;
    Finish(final_status_);
  }
}

void SessionReactor::WriteNextLocked() {
  outgoing_ = std::move(queue_.front());
  queue_.pop_front();
  writing_ = true;
  StartWrite(&outgoing_);
}

// ---- WatchReactor
// ---------------------------------------------------------------

WatchReactor::WatchReactor(Coordinator* coordinator, StreamSlots* slots,
                           std::string identity, const std::string& job_id)
    : coordinator_(coordinator), slots_(slots), identity_(std::move(identity)) {
  // The first status arrives inside WatchJob, before it returns.
  auto id = coordinator_->WatchJob(
      job_id,
      [this](absl::StatusOr<std::shared_ptr<const v1::JobStatus>> status) {
        OnStatus(std::move(status));
      });
  absl::MutexLock lock(&mu_);
  if (id.ok()) {
    watch_id_ = *id;
  } else {
    EndLocked(ToGrpcStatus(id.status()));
  }
}

void WatchReactor::OnStatus(
    absl::StatusOr<std::shared_ptr<const v1::JobStatus>> status) {
  absl::MutexLock lock(&mu_);
  if (ending_) return;
  if (!status.ok()) {
    EndLocked(ToGrpcStatus(status.status()));
    return;
  }
  pending_ = *std::move(status);
  if (!writing_) WriteNextLocked();
}

void WatchReactor::OnWriteDone(bool ok) {
  absl::MutexLock lock(&mu_);
  writing_ = false;
  // The client is gone, or the job ended and so does the watch.
  if (!ok || IsTerminal(outgoing_->state())) EndLocked(grpc::Status::OK);
  if (ending_) {
    if (!finished_) {
      finished_ = true;
      Finish(final_status_);
    }
    return;
  }
  if (pending_ != nullptr) WriteNextLocked();
}

void WatchReactor::OnCancel() {
  absl::MutexLock lock(&mu_);
  EndLocked(grpc::Status::CANCELLED);
}

void WatchReactor::OnDone() {
  std::optional<Coordinator::WaitId> id;
  {
    absl::MutexLock lock(&mu_);
    id = watch_id_;
  }
  // After Unwatch returns the watcher (this) is never called again.
  if (id.has_value()) coordinator_->Unwatch(*id);
  slots_->Release(identity_);
  delete this;
}

void WatchReactor::EndLocked(grpc::Status status) {
  if (ending_) return;
  ending_ = true;
  final_status_ = std::move(status);
  pending_.reset();
  if (!writing_ && !finished_) {
    finished_ = true;
    Finish(final_status_);
  }
}

void WatchReactor::WriteNextLocked() {
  outgoing_ = std::move(pending_);
  pending_.reset();
  writing_ = true;
  StartWrite(outgoing_.get());
}

}  // namespace lockstep::coordinator
