// The in-memory coordinator of fake_control_plane.h: scripted registrations,
// sessions as command queues and message logs, a map as key-value store.
#include "tests/fakes/fake_control_plane.h"

#include "absl/strings/str_cat.h"

namespace lockstep::fakes {
namespace {

// The Session the worker holds: forwards to the FakeSession the test holds,
// which outlives it.
class SessionEnd : public worker::Session {
 public:
  explicit SessionEnd(std::shared_ptr<FakeSession> session)
      : session_(std::move(session)) {}
  bool Send(const v1::WorkerMessage& message) override {
    return session_->Send(message);
  }
  bool Receive(v1::CoordinatorCommand* command) override {
    return session_->Receive(command);
  }
  absl::Status Finish() override { return session_->Finish(); }
  void CloseWrites() override { session_->CloseWrites(); }

 private:
  const std::shared_ptr<FakeSession> session_;
};

class ScopedKeyValue : public worker::KeyValueClient {
 public:
  ScopedKeyValue(FakeControlPlane* plane, std::string job_id,
                 int64_t generation)
      : plane_(plane), job_id_(std::move(job_id)), generation_(generation) {}
  ~ScopedKeyValue() override { plane_->ForgetClient(this); }
  absl::Status Set(const std::string& key, const std::string& value) override {
    return plane_->Set(job_id_, generation_, key, value, this);
  }
  absl::StatusOr<std::string> Get(const std::string& key,
                                  absl::Duration timeout) override {
    return plane_->Get(job_id_, generation_, key, timeout, this);
  }
  void Cancel() override { plane_->CancelClient(this); }

 private:
  FakeControlPlane* const plane_;
  const std::string job_id_;
  const int64_t generation_;
};

}  // namespace

// ---- FakeSession ----------------------------------------------------------

void FakeSession::Push(v1::CoordinatorCommand command) {
  absl::MutexLock lock(&mu_);
  commands_.push_back(std::move(command));
}

void FakeSession::End(absl::Status why) {
  absl::MutexLock lock(&mu_);
  if (ended_) return;
  ended_ = true;
  why_ended_ = std::move(why);
}

bool FakeSession::WaitUntilHandled(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto handled = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return (commands_.empty() && receiving_) || over_;
  };
  return mu_.AwaitWithTimeout(absl::Condition(&handled), timeout);
}

std::optional<v1::WorkerMessage> FakeSession::WaitForMessage(
    const std::function<bool(const v1::WorkerMessage&)>& match,
    absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  std::optional<v1::WorkerMessage> found;
  auto arrived = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    for (const v1::WorkerMessage& message : messages_) {
      if (match(message)) {
        found = message;
        return true;
      }
    }
    return false;
  };
  mu_.AwaitWithTimeout(absl::Condition(&arrived), timeout);
  return found;
}

bool FakeSession::WaitUntilOver(absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  return mu_.AwaitWithTimeout(absl::Condition(&over_), timeout);
}

std::vector<v1::WorkerMessage> FakeSession::messages() const {
  absl::MutexLock lock(&mu_);
  return messages_;
}

int FakeSession::refused_sends() const {
  absl::MutexLock lock(&mu_);
  return refused_sends_;
}

bool FakeSession::writes_closed() const {
  absl::MutexLock lock(&mu_);
  return writes_closed_;
}

bool FakeSession::Send(const v1::WorkerMessage& message) {
  absl::MutexLock lock(&mu_);
  if (ended_ || writes_closed_) {
    ++refused_sends_;
    return false;
  }
  messages_.push_back(message);
  return true;
}

bool FakeSession::Receive(v1::CoordinatorCommand* command) {
  absl::MutexLock lock(&mu_);
  receiving_ = true;
  auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return !commands_.empty() || ended_;
  };
  mu_.Await(absl::Condition(&ready));
  receiving_ = false;
  if (commands_.empty()) {
    over_ = true;
    return false;
  }
  *command = std::move(commands_.front());
  commands_.pop_front();
  return true;
}

absl::Status FakeSession::Finish() {
  absl::MutexLock lock(&mu_);
  return why_ended_;
}

void FakeSession::CloseWrites() {
  absl::MutexLock lock(&mu_);
  writes_closed_ = true;
  if (!ended_) {
    ended_ = true;
    why_ended_ = absl::OkStatus();
  }
}

// ---- FakeControlPlane -----------------------------------------------------

void FakeControlPlane::ScriptRegister(
    absl::StatusOr<v1::RegisterWorkerResponse> response) {
  absl::MutexLock lock(&mu_);
  scripted_.push_back(std::move(response));
}

void FakeControlPlane::ScriptUnavailable(int count) {
  for (int i = 0; i < count; ++i) {
    ScriptRegister(absl::UnavailableError(
        absl::StrCat("the coordinator is not up yet (attempt ", i + 1, ")")));
  }
}

void FakeControlPlane::RefuseRegistrations(absl::Status why) {
  absl::MutexLock lock(&mu_);
  refusal_ = std::move(why);
}

void FakeControlPlane::SetHeartbeatInterval(absl::Duration interval) {
  absl::MutexLock lock(&mu_);
  heartbeat_interval_ = interval;
}

void FakeControlPlane::FailNextOpenSession(absl::Status why) {
  absl::MutexLock lock(&mu_);
  open_failure_ = std::move(why);
}

void FakeControlPlane::EndAllSessions(absl::Status why) {
  std::vector<std::shared_ptr<FakeSession>> sessions;
  {
    absl::MutexLock lock(&mu_);
    sessions = sessions_;
  }
  for (const auto& session : sessions) session->End(why);
}

std::vector<v1::RegisterWorkerRequest> FakeControlPlane::registrations() const {
  absl::MutexLock lock(&mu_);
  return registrations_;
}

std::shared_ptr<FakeSession> FakeControlPlane::WaitForSession(
    int index, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  std::shared_ptr<FakeSession> session;
  {
    absl::MutexLock lock(&mu_);
    auto opened = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return static_cast<int>(sessions_.size()) > index;
    };
    if (!mu_.AwaitWithDeadline(absl::Condition(&opened), deadline)) {
      return nullptr;
    }
    session = sessions_[index];
  }
  // The first heartbeat is sent once the agent serves the session.
  auto beat = session->WaitForMessage(
      [](const v1::WorkerMessage& m) { return m.has_heartbeat(); },
      deadline - absl::Now());
  return beat.has_value() ? session : nullptr;
}

int FakeControlPlane::sessions_opened() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(sessions_.size());
}

std::vector<std::pair<std::string, int64_t>> FakeControlPlane::kv_scopes()
    const {
  absl::MutexLock lock(&mu_);
  return kv_scopes_;
}

void FakeControlPlane::EndGeneration(const std::string& job_id,
                                     int64_t generation) {
  absl::MutexLock lock(&mu_);
  ended_generations_.insert({job_id, generation});
}

absl::StatusOr<v1::RegisterWorkerResponse> FakeControlPlane::Register(
    const v1::RegisterWorkerRequest& request) {
  absl::MutexLock lock(&mu_);
  registrations_.push_back(request);
  if (!scripted_.empty()) {
    auto response = std::move(scripted_.front());
    scripted_.pop_front();
    return response;
  }
  if (!refusal_.ok()) return refusal_;
  v1::RegisterWorkerResponse granted;
  granted.set_worker_id(kWorkerId);
  granted.set_heartbeat_interval_ms(
      absl::ToInt64Milliseconds(heartbeat_interval_));
  return granted;
}

absl::StatusOr<std::unique_ptr<worker::Session>> FakeControlPlane::OpenSession(
    const std::string& worker_id, uint64_t incarnation) {
  absl::MutexLock lock(&mu_);
  if (!open_failure_.ok()) {
    absl::Status why = std::move(open_failure_);
    open_failure_ = absl::OkStatus();
    return why;
  }
  auto session = std::make_shared<FakeSession>(worker_id, incarnation);
  sessions_.push_back(session);
  return std::make_unique<SessionEnd>(session);
}

std::unique_ptr<worker::KeyValueClient> FakeControlPlane::KeyValue(
    const std::string& job_id, int64_t generation, int /*rank*/,
    const std::string& /*rank_token*/) {
  {
    absl::MutexLock lock(&mu_);
    kv_scopes_.emplace_back(job_id, generation);
  }
  return std::make_unique<ScopedKeyValue>(this, job_id, generation);
}

absl::Status FakeControlPlane::Set(const std::string& job_id,
                                   int64_t generation, const std::string& key,
                                   const std::string& value,
                                   const void* client) {
  absl::MutexLock lock(&mu_);
  if (cancelled_clients_.count(client)) {
    return absl::AbortedError(absl::StrCat("key '", key, "': cancelled"));
  }
  if (ended_generations_.count({job_id, generation})) {
    return absl::AbortedError(
        absl::StrCat("generation ", generation, " of ", job_id, " is over"));
  }
  values_[{job_id, generation, key}] = value;
  return absl::OkStatus();
}

absl::StatusOr<std::string> FakeControlPlane::Get(const std::string& job_id,
                                                  int64_t generation,
                                                  const std::string& key,
                                                  absl::Duration timeout,
                                                  const void* client) {
  absl::MutexLock lock(&mu_);
  const auto entry = std::make_tuple(job_id, generation, key);
  auto settled = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
    return values_.count(entry) > 0 ||
           ended_generations_.count({job_id, generation}) > 0 ||
           cancelled_clients_.count(client) > 0;
  };
  if (!mu_.AwaitWithTimeout(absl::Condition(&settled), timeout)) {
    return absl::DeadlineExceededError(absl::StrCat(
        "key '", key, "' was not set within ", absl::FormatDuration(timeout)));
  }
  if (cancelled_clients_.count(client)) {
    return absl::AbortedError(absl::StrCat("key '", key, "': cancelled"));
  }
  if (ended_generations_.count({job_id, generation})) {
    return absl::AbortedError(
        absl::StrCat("generation ", generation, " of ", job_id, " is over"));
  }
  return values_[entry];
}

void FakeControlPlane::CancelClient(const void* client) {
  absl::MutexLock lock(&mu_);
  cancelled_clients_.insert(client);
}

void FakeControlPlane::ForgetClient(const void* client) {
  absl::MutexLock lock(&mu_);
  cancelled_clients_.erase(client);
}

}  // namespace lockstep::fakes
