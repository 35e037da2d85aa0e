// An in-memory coordinator for tests of the worker side: a ControlPlane
// whose registrations are scripted, whose sessions take commands the test
// pushes down and record the messages the worker sends up, and whose
// key-value store is a map. No process, no network; every wait is on an
// event with a deadline.
//
// Thread-safety: every class here is thread-safe. The agent's threads call
// the ControlPlane and Session side, the test thread the rest.
#ifndef LOCKSTEP_TESTS_FAKES_FAKE_CONTROL_PLANE_H_
#define LOCKSTEP_TESTS_FAKES_FAKE_CONTROL_PLANE_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "lockstep/v1/coordinator.pb.h"
#include "worker/control_plane.h"

namespace lockstep::fakes {

// How long a test waits for an event before it fails instead of hanging.
inline constexpr absl::Duration kEventTimeout = absl::Seconds(10);

// The coordinator's end of one worker session.
//
//   open --End()-----------> ended: Receive returns false once the queued
//     |                      commands are taken; Send fails
//     +--CloseWrites()-----> ended, as a coordinator ends the session of a
//                            worker that leaves cleanly
class FakeSession {
 public:
  FakeSession(std::string worker_id, uint64_t incarnation)
      : worker_id_(std::move(worker_id)), incarnation_(incarnation) {}

  const std::string& worker_id() const { return worker_id_; }
  uint64_t incarnation() const { return incarnation_; }

  // ---- the test (the coordinator) ----
  // Queues a command down the session.
  void Push(v1::CoordinatorCommand command);
  // Ends the session, as a coordinator that went away or declared the worker
  // failed; `why` is what Finish returns.
  void End(absl::Status why = absl::UnavailableError("session ended"));
  // Waits until the worker took every queued command and finished handling
  // it (it is blocked in Receive again), or the session is over. False on
  // timeout.
  bool WaitUntilHandled(absl::Duration timeout = kEventTimeout);
  // Waits for a message sent up the session (since it opened) for which
  // `match` holds; nullopt on timeout.
  std::optional<v1::WorkerMessage> WaitForMessage(
      const std::function<bool(const v1::WorkerMessage&)>& match,
      absl::Duration timeout = kEventTimeout);
  // Waits until the worker's Receive returned false (it saw the end).
  bool WaitUntilOver(absl::Duration timeout = kEventTimeout);
  // The messages sent up while the session was open, in order.
  std::vector<v1::WorkerMessage> messages() const;
  // Sends refused because the session had ended or its writes were closed.
  int refused_sends() const;
  bool writes_closed() const;

  // ---- the worker (through the Session the ControlPlane returned) ----
  bool Send(const v1::WorkerMessage& message);
  bool Receive(v1::CoordinatorCommand* command);
  absl::Status Finish();
  void CloseWrites();

 private:
  const std::string worker_id_;
  const uint64_t incarnation_;

  mutable absl::Mutex mu_;
  std::deque<v1::CoordinatorCommand> commands_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::WorkerMessage> messages_ ABSL_GUARDED_BY(mu_);
  int refused_sends_ ABSL_GUARDED_BY(mu_) = 0;
  bool receiving_ ABSL_GUARDED_BY(mu_) = false;  // blocked in Receive
  bool ended_ ABSL_GUARDED_BY(mu_) = false;
  bool over_ ABSL_GUARDED_BY(mu_) = false;  // Receive returned false
  bool writes_closed_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status why_ended_ ABSL_GUARDED_BY(mu_);
};

class FakeControlPlane : public worker::ControlPlane {
 public:
  // The worker id granted when no response is scripted.
  static constexpr char kWorkerId[] = "worker:0";

  // ---- the test ----
  // The next Register calls answer these, in order; after them every
  // registration is granted (kWorkerId).
  void ScriptRegister(absl::StatusOr<v1::RegisterWorkerResponse> response);
  // Shorthand: the next `count` registrations fail with Unavailable.
  void ScriptUnavailable(int count);
  // From now on, every registration is refused with `why` (after the
  // scripted ones): a non-transient code ends Agent::Run.
  void RefuseRegistrations(absl::Status why);
  // The heartbeat interval granted registrations tell the worker to keep.
  void SetHeartbeatInterval(absl::Duration interval);
  // The next OpenSession fails with `why`.
  void FailNextOpenSession(absl::Status why);
  // Ends every session opened so far (FakeSession::End).
  void EndAllSessions(absl::Status why);

  // Every registration request received, in order.
  std::vector<v1::RegisterWorkerRequest> registrations() const;
  // Waits until the worker opened its `index`-th session (from 0) and is
  // serving it (its first heartbeat arrived); nullptr on timeout.
  std::shared_ptr<FakeSession> WaitForSession(
      int index, absl::Duration timeout = kEventTimeout);
  int sessions_opened() const;
  // The key-value scopes (job, generation) the worker asked for, in order.
  std::vector<std::pair<std::string, int64_t>> kv_scopes() const;
  // Ends a generation: Gets in its scope fail with Aborted from now on.
  void EndGeneration(const std::string& job_id, int64_t generation);

  // ---- the worker ----
  absl::StatusOr<v1::RegisterWorkerResponse> Register(
      const v1::RegisterWorkerRequest& request) override;
  absl::StatusOr<std::unique_ptr<worker::Session>> OpenSession(
      const std::string& worker_id, uint64_t incarnation) override;
  std::unique_ptr<worker::KeyValueClient> KeyValue(
      const std::string& job_id, int64_t generation, int rank,
      const std::string& rank_token) override;

  // The store behind KeyValue clients; `client` is the one calling, and
  // fails with Aborted once it was cancelled.
  absl::Status Set(const std::string& job_id, int64_t generation,
                   const std::string& key, const std::string& value,
                   const void* client);
  absl::StatusOr<std::string> Get(const std::string& job_id, int64_t generation,
                                  const std::string& key,
                                  absl::Duration timeout, const void* client);
  void CancelClient(const void* client);
  void ForgetClient(const void* client);

 private:
  using Scope = std::pair<std::string, int64_t>;

  mutable absl::Mutex mu_;
  std::deque<absl::StatusOr<v1::RegisterWorkerResponse>> scripted_
      ABSL_GUARDED_BY(mu_);
  absl::Status refusal_ ABSL_GUARDED_BY(mu_);
  absl::Duration heartbeat_interval_ ABSL_GUARDED_BY(mu_) = absl::Hours(1);
  absl::Status open_failure_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::RegisterWorkerRequest> registrations_ ABSL_GUARDED_BY(mu_);
  std::vector<std::shared_ptr<FakeSession>> sessions_ ABSL_GUARDED_BY(mu_);
  std::vector<Scope> kv_scopes_ ABSL_GUARDED_BY(mu_);
  std::set<Scope> ended_generations_ ABSL_GUARDED_BY(mu_);
  std::set<const void*> cancelled_clients_ ABSL_GUARDED_BY(mu_);
  std::map<std::tuple<std::string, int64_t, std::string>, std::string> values_
      ABSL_GUARDED_BY(mu_);
};

}  // namespace lockstep::fakes

#endif  // LOCKSTEP_TESTS_FAKES_FAKE_CONTROL_PLANE_H_
