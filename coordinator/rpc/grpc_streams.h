// The long-lived calls of the coordinator's gRPC service as callback
// reactors: a worker session (commands down, heartbeats and reports up) and
// a job watch (each status change down). Neither holds a thread: gRPC calls
// their reactions on its own small pool, and the coordinator pushes to them
// through SessionSink::Send and Coordinator::WatchJob's watcher, which only
// queue and start a write.
#ifndef LOCKSTEP_COORDINATOR_RPC_GRPC_STREAMS_H_
#define LOCKSTEP_COORDINATOR_RPC_GRPC_STREAMS_H_

#include <grpcpp/grpcpp.h>

#include <deque>
#include <memory>
#include <optional>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "common/caller.h"
#include "coordinator/coordinator.h"
#include "lockstep/v1/coordinator.pb.h"

namespace lockstep::coordinator {

// A cap on open streams of one kind, and a smaller one per identity, so
// that one caller (a viewer's script) cannot take every slot from the
// others; the global cap stays as the last line. Thread-safe.
class StreamSlots {
 public:
  // `what` names the streams ("worker sessions"), `flag` and
  // `identity_flag` the daemon flags that set `cap` and `per_identity`; they
  // go into the error a refused stream gets.
  StreamSlots(std::string what, std::string flag, int cap,
              std::string identity_flag, int per_identity);
  // Takes a slot for `identity` (a SPIFFE ID; empty: a caller without one,
  // under --insecure, counted only against the global cap), or says why
  // not: RESOURCE_EXHAUSTED naming the cap. Refusals are logged at most
  // kRefusalsLogged per kRefusalLogWindow.
  grpc::Status Take(const std::string& identity);
  void Release(const std::string& identity);
  int used() const;

 private:
  const std::string what_;
  const std::string flag_;
  const int cap_;
  const std::string identity_flag_;
  const int per_identity_;
  mutable absl::Mutex mu_;
  int used_ ABSL_GUARDED_BY(mu_) = 0;
  absl::flat_hash_map<std::string, int> by_identity_ ABSL_GUARDED_BY(mu_);
};

// One worker session. Life cycle:
//
//   reading the SessionHello ──▶ open (OpenSession) ──▶ ending ──▶ OnDone
//                                  │ reads → HandleWorkerMessage
//                                  │ Send → queue → one write at a time
//
// It ends when the worker closes or cancels the stream, a write fails, or
// the coordinator calls Close (then the queued commands are written first).
// OnDone calls CloseSession, which also waits out any Send the coordinator
// is making (it holds the coordinator's lock), and only then deletes the
// reactor: the coordinator never sees a dangling sink.
//
// Lock order: the coordinator's lock before mu_. The reactor never calls the
// coordinator while holding mu_; gRPC never runs a reaction inside Start*
// or Finish, so those may be called with mu_ held.
class SessionReactor final
    : public grpc::ServerBidiReactor<v1::WorkerMessage, v1::CoordinatorCommand>,
      public SessionSink {
 public:
  // Holds one slot of `slots` (taken by the caller) until done. `caller`
  // made the call: the session opens only for a worker it registered.
  SessionReactor(Coordinator* coordinator, StreamSlots* slots, Caller caller);

  // SessionSink: called by the coordinator with its lock held.
  void Send(const v1::CoordinatorCommand& command) override;
  void Close() override;

  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

 private:
  // Attaches the session from its first message; false if refused (the
  // stream is then ending).
  bool Open();
  // Starts ending the stream with `status` for the worker; `cause` is what
  // the coordinator is told. `drain`: write the queued commands first.
  void EndLocked(grpc::Status status, absl::Status cause, bool drain)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void WriteNextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Coordinator* const coordinator_;
  StreamSlots* const slots_;
  const Caller caller_;

  // Touched only by reactions, which gRPC runs one at a time for the reads.
  v1::WorkerMessage incoming_;
  bool opened_ = false;
  std::string worker_id_;
  uint64_t incarnation_ = 0;

  absl::Mutex mu_;
  std::deque<v1::CoordinatorCommand> queue_ ABSL_GUARDED_BY(mu_);
  // The command being written; valid until OnWriteDone.
  v1::CoordinatorCommand outgoing_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool ending_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status final_status_ ABSL_GUARDED_BY(mu_);
  absl::Status cause_ ABSL_GUARDED_BY(mu_);
};

// One WatchJob stream: writes the job's status after each change, the
// newest only when changes come faster than the client reads, and ends
// after a terminal state. OnDone unregisters the watcher before deleting the
// reactor. Lock order as for SessionReactor.
class WatchReactor final : public grpc::ServerWriteReactor<v1::JobStatus> {
 public:
  // Holds one slot of `slots` (taken by the caller for `identity`) until
  // done.
  WatchReactor(Coordinator* coordinator, StreamSlots* slots,
               std::string identity, const std::string& job_id);

  void OnWriteDone(bool ok) override;
  void OnCancel() override;
  void OnDone() override;

 private:
  // The coordinator's watcher: called with its lock held.
  void OnStatus(absl::StatusOr<std::shared_ptr<const v1::JobStatus>> status);
  void EndLocked(grpc::Status status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void WriteNextLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Coordinator* const coordinator_;
  StreamSlots* const slots_;
  const std::string identity_;

  absl::Mutex mu_;
  std::optional<Coordinator::WaitId> watch_id_ ABSL_GUARDED_BY(mu_);
  // The newest status not yet written, and the one being written.
  std::shared_ptr<const v1::JobStatus> pending_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<const v1::JobStatus> outgoing_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool ending_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  grpc::Status final_status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace lockstep::coordinator

#endif  // LOCKSTEP_COORDINATOR_RPC_GRPC_STREAMS_H_
