// The worker agent: registers with the coordinator, keeps the worker session
// (heartbeats up, commands down) and runs each assignment on a task thread.
//
// Lifecycle: Run() registers (retrying while the coordinator is unreachable,
// as it is while a Kubernetes Service comes up), opens the session and
// dispatches commands until the session ends. Assignment starts a task;
// Stop asks it to stop at a step boundary agreed by all ranks; Abort tells it
// to give up its generation. The process stays alive between tasks.
//
// Thread-safety: Run() is called once, from one thread.
#ifndef LOCKSTEP_WORKER_AGENT_H_
#define LOCKSTEP_WORKER_AGENT_H_

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "lockstep/v1/coordinator.pb.h"
#include "worker/control_plane.h"

namespace lockstep::worker {

// What a task sees of its surroundings.
struct TaskContext {
  v1::Assignment assignment;
  std::unique_ptr<KeyValueClient> kv;  // scoped to (job, generation)
  std::string host;                    // data-plane address of this worker
  std::atomic<bool> stop_requested{false};
  std::atomic<bool> aborted{false};
  // Sends a progress report up the session. Thread-safe.
  std::function<void(const v1::ProgressReport&)> report;
};

// Runs one assignment to its end and says how it went.
using TaskRunner = std::function<v1::TaskResult(TaskContext&)>;

class Agent {
 public:
  struct Options {
    v1::RegisterWorkerRequest registration;
    absl::Duration heartbeat_interval = absl::Seconds(2);
    // How long to keep trying to reach the coordinator at start.
    absl::Duration connect_timeout = absl::Seconds(60);
  };

  Agent(ControlPlane* control, TaskRunner runner, Options options)
      : control_(control),
        runner_(std::move(runner)),
        options_(std::move(options)) {}

  // Returns when the session ends. Errors: the registration was refused
  // (InvalidArgument, with the coordinator's reason), or the coordinator
  // could not be reached or went away (Unavailable).
  absl::Status Run();

 private:
  absl::StatusOr<v1::RegisterWorkerResponse> RegisterWithRetry();

  ControlPlane* const control_;
  const TaskRunner runner_;
  const Options options_;
};

}  // namespace lockstep::worker

#endif  // LOCKSTEP_WORKER_AGENT_H_
