// The worker agent: registers with the coordinator, keeps the worker session
// (heartbeats up, commands down) and runs each assignment on a task thread.
//
// Lifecycle: Run() registers (retrying while the coordinator is unreachable,
// as it is while a Kubernetes Service comes up or the coordinator restarts,
// or while the session of this task's previous process is still live),
// opens the session and dispatches commands until the session ends, then
// aborts the running generation and reconnects with the same incarnation:
// the process, and the training state it holds, survive. Assignment starts a
// task; Stop asks it to stop at a step all ranks agree on; Abort tears down
// its communicator so it returns promptly; Standby (to an idle worker) lets
// it prepare for the job whose failed rank it may take.
//
// Thread-safety: Run() is called once, from one thread. TaskContext is shared
// by the agent and the task thread and is thread-safe.
#ifndef LOCKSTEP_WORKER_AGENT_H_
#define LOCKSTEP_WORKER_AGENT_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/export_file.h"
#include "lockstep/v1/coordinator.pb.h"
#include "worker/control_plane.h"
#include "worker/task_context.h"

namespace lockstep::worker {

// Runs one assignment to its end and says how it went.
using TaskRunner = std::function<v1::TaskResult(TaskContext&)>;

// What became of the live training state a worker held when it was told to
// leave while no generation ran on it (docs/DESIGN.md §3).
struct LiveStateOutcome {
  int64_t step = 0;      // the step it held; 0 for none
  std::string saved_as;  // the checkpoint it saved, if it did
  int32_t saved_epoch = 0;
  int64_t saved_bytes = 0;
  std::string note;  // otherwise, why not
};
// Saves the runner's live state where the restore path finds it, if it is
// newer than the newest checkpoint. Called only while no task runs.
using LiveStateSaver = std::function<LiveStateOutcome()>;

class Agent {
 public:
  struct Options {
    v1::RegisterWorkerRequest registration;
    // How long to keep trying to reach the coordinator, at start and after
    // losing it. Also how long a restarted worker waits for its old
    // process's session to end (the coordinator refuses it with Unavailable
    // until then): keep it above the coordinator's heartbeat timeout.
    absl::Duration connect_timeout = absl::Seconds(60);
    // Called on the session's thread when the coordinator says which job
    // this idle worker stands by for (docs/DESIGN.md §3); it must return
    // promptly. May be empty.
    std::function<void(const v1::Standby&)> standby;
    // Checks the paths an assignment's job names against the folders this
    // worker lets jobs use (common/path_policy.h). A refusal ends the task
    // before it runs, with the refusal as the rank's result (not retried:
    // another generation would be refused alike). May be empty.
    std::function<absl::Status(const ExportOwner& owner, const v1::JobSpec&)>
        check_paths;
    // The worker's metrics, handed to each task; may be null.
    WorkerMetrics* metrics = nullptr;
    // How its tasks' CPU collectives travel (TaskContext).
    bool data_plane_encryption = true;
    bool data_plane_gloo = false;
  };

  Agent(ControlPlane* control, TaskRunner runner, Options options,
        LiveStateSaver save_live_state = nullptr)
      : control_(control),
        runner_(std::move(runner)),
        save_live_state_(std::move(save_live_state)),
        options_(std::move(options)) {}
  // Aborts a task still running and waits for its thread, so a runner must
  // return promptly once its TaskContext is aborted. (The worker process
  // exits without destroying its agent; tests destroy theirs.)
  ~Agent();

  // Returns only when the coordinator cannot be reached for connect_timeout
  // (Unavailable) or refuses the registration (InvalidArgument,
  // PermissionDenied, Unauthenticated, with the coordinator's reason).
  absl::Status Run();

  // SIGTERM: asks the coordinator to stop the running job at a step all
  // ranks agree on (saving it when checkpoints are configured), waits up to
  // `grace` for this worker's part to end, and closes the session cleanly.
  // When no generation runs here (the job is recovering), it starts no new
  // task, lets an aborted one unwind, and saves the live state it holds
  // (LiveStateSaver) within `grace`, telling the coordinator what became of
  // it. Called from any thread, once.
  void Preempt(absl::Duration grace);

 private:
  absl::StatusOr<v1::RegisterWorkerResponse> RegisterWithRetry();
  // Serves one session until it ends.
  void Serve(std::shared_ptr<Session> session,
             absl::Duration heartbeat_interval);
  // The runner's result, or the path check's refusal without running it.
  v1::TaskResult RunIfPathsAllowed(TaskContext& task);
  // The chief of a job that succeeded hands its export to the coordinator
  // when the assignment asks (Assignment.upload_export), before it reports
  // its result, while the generation is live. A failed upload is logged
  // (the coordinator records why on the job); the result stands.
  void UploadExport(const TaskContext& task, const v1::TaskResult& result);
  // The chief of a job that succeeded or stopped hands its newest committed
  // checkpoint to the coordinator as a tar when the assignment asks
  // (Assignment.upload_checkpoint), then removes the checkpoints of a job
  // that succeeded unless it keeps them (checkpoint.keep_backups). Failures
  // are logged as UploadExport's.
  void UploadCheckpoint(const TaskContext& task, const v1::TaskResult& result);
  void StartTask(const v1::Assignment& assignment,
                 const std::shared_ptr<Session>& session);
  void AbortTask(const std::string& why);
  // Preempt's path when no generation runs on this worker.
  void LeaveWhileIdle(const std::shared_ptr<TaskContext>& task,
                      const std::shared_ptr<Session>& session,
                      absl::Time deadline);

  ControlPlane* const control_;
  const TaskRunner runner_;
  const LiveStateSaver save_live_state_;
  const Options options_;

  absl::Mutex mu_;
  std::shared_ptr<TaskContext> task_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<Session> session_ ABSL_GUARDED_BY(mu_);
  bool preempted_ ABSL_GUARDED_BY(mu_) = false;
  std::thread task_thread_;  // touched by the Run() thread only
};

}  // namespace lockstep::worker

#endif  // LOCKSTEP_WORKER_AGENT_H_
