// The worker agent: registers with the coordinator, keeps the worker session
// (heartbeats up, commands down) and runs each assignment on a task thread.
//
// Lifecycle: Run() registers (retrying while the coordinator is unreachable,
// as it is while a Kubernetes Service comes up or the coordinator restarts),
// opens the session and dispatches commands until the session ends, then
// aborts the running generation and reconnects with the same incarnation:
// the process, and the training state it holds, survive. Assignment starts a
// task; Stop asks it to stop at a step all ranks agree on; Abort tears down
// its communicator so it returns promptly.
//
// Thread-safety: Run() is called once, from one thread. TaskContext is shared
// by the agent and the task thread and is thread-safe.
#ifndef LOCKSTEP_WORKER_AGENT_H_
#define LOCKSTEP_WORKER_AGENT_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "lockstep/v1/coordinator.pb.h"
#include "worker/collective/communicator.h"
#include "worker/control_plane.h"

namespace lockstep::worker {

// What a task sees of its surroundings.
class TaskContext {
 public:
  v1::Assignment assignment;
  std::unique_ptr<KeyValueClient> kv;  // scoped to (job, generation)
  std::string host;                    // data-plane address of this worker
  std::atomic<bool> stop_requested{false};
  // Collectives entered in this generation; sent with each heartbeat.
  std::atomic<int64_t> collective_seq{0};
  // Sends a progress report up the session. Thread-safe.
  std::function<void(const v1::ProgressReport&)> report;

  // Ends the generation: a collective pending on the task thread fails.
  void Abort();
  bool aborted() const;
  // The task's communicator, so Abort can close it; nullptr to forget it.
  // Registering after Abort aborts it at once.
  void SetCommunicator(Communicator* comm);

 private:
  mutable absl::Mutex mu_;
  bool aborted_ ABSL_GUARDED_BY(mu_) = false;
  Communicator* comm_ ABSL_GUARDED_BY(mu_) = nullptr;
};

// Runs one assignment to its end and says how it went.
using TaskRunner = std::function<v1::TaskResult(TaskContext&)>;

class Agent {
 public:
  struct Options {
    v1::RegisterWorkerRequest registration;
    // How long to keep trying to reach the coordinator, at start and after
    // losing it.
    absl::Duration connect_timeout = absl::Seconds(60);
  };

  Agent(ControlPlane* control, TaskRunner runner, Options options)
      : control_(control),
        runner_(std::move(runner)),
        options_(std::move(options)) {}

  // Returns only when the coordinator cannot be reached for connect_timeout
  // (Unavailable) or refuses the registration (InvalidArgument, with the
  // coordinator's reason).
  absl::Status Run();

 private:
  absl::StatusOr<v1::RegisterWorkerResponse> RegisterWithRetry();
  // Serves one session until it ends.
  void Serve(std::shared_ptr<Session> session,
             absl::Duration heartbeat_interval);
  void StartTask(const v1::Assignment& assignment,
                 const std::shared_ptr<Session>& session);
  void AbortTask(const std::string& why);

  ControlPlane* const control_;
  const TaskRunner runner_;
  const Options options_;

  absl::Mutex mu_;
  std::shared_ptr<TaskContext> task_ ABSL_GUARDED_BY(mu_);
  std::thread task_thread_;  // touched by the Run() thread only
};

}  // namespace lockstep::worker

#endif  // LOCKSTEP_WORKER_AGENT_H_
