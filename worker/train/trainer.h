// The worker's training runner: keeps the replica of the job this worker
// trains and runs each of its generations (docs/DESIGN.md §3, §5).
//
// Live recovery: the replica (model, optimizer, step) outlives a
// generation. When a generation starts, the ranks agree on the most
// advanced step any of them applied and adopt that rank's state, so a
// replacement worker or a rank that fell behind continues exactly where the
// group was (worker/train/training_generation.h, state_agreement.h).
#ifndef LOCKSTEP_WORKER_TRAIN_TRAINER_H_
#define LOCKSTEP_WORKER_TRAIN_TRAINER_H_

#include <future>
#include <memory>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "lockstep/v1/coordinator.pb.h"
#include "worker/agent.h"
#include "worker/task_context.h"

namespace lockstep::worker {

struct Replica;
struct ReplicaPosition;

// Hot spares: Standby() loads the data set of the job this worker stands by
// for, in the background, into the process's data set cache (LoadSplit), so
// that a spare given a failed rank, like a survivor starting its next
// generation, does not load it again. It builds no replica: the state
// comes from a survivor through state agreement.
//
// Thread-safety: the agent runs one task at a time; Standby() may be called
// from the agent's thread while a task runs.
class TrainingRunner {
 public:
  // Trains on `device`: "cpu" or "cuda:N" (lockstep-worker --device, as
  // resolved at start).
  explicit TrainingRunner(std::string device = "cpu");
  ~TrainingRunner();

  // Runs one generation to its end: success, an agreed stop, an abort or an
  // error. Never throws: LibTorch and Gloo exceptions become an error result
  // whose code says whether the job can re-form (Unavailable, Aborted).
  v1::TaskResult Run(TaskContext& task);

  // The worker is leaving while no generation runs (SIGTERM during
  // recovery): if the replica holds a step newer than the job's newest
  // checkpoint, saves it as a checkpoint of its own (prepare and commit,
  // as the chief would) so the next generation restores it instead of an
  // older one. Call only while Run is not running.
  LiveStateOutcome SaveLiveState();

  // Starts loading the data of the job `standby` names and returns; Run()
  // waits for a load under way before it starts. A failed load is only
  // logged: the rank that would need it reports the error itself.
  void Standby(const v1::Standby& standby);

 private:
  // Waits for the standby's load, if one is under way.
  void WaitForStandby();

  const std::string device_;
  absl::Mutex standby_mu_;
  std::shared_future<void> standby_ ABSL_GUARDED_BY(standby_mu_);
  std::unique_ptr<Replica> replica_;
  // Of the last generation run: the job's spec, where the replica stood,
  // and whether the job ended there (its checkpoints are then gone).
  v1::JobSpec spec_;
  std::unique_ptr<ReplicaPosition> position_;  // null until planned
  bool job_ended_ = false;
};

}  // namespace lockstep::worker

#endif  // LOCKSTEP_WORKER_TRAIN_TRAINER_H_
