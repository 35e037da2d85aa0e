// The worker's training runner: keeps the replica of the job this worker
// trains and runs each of its generations (docs/DESIGN.md §3, §5).
//
// Live recovery: the replica (model, optimizer, step) outlives a
// generation. When a generation starts, the ranks agree on the most
// advanced step any of them applied and adopt that rank's state, so a
// replacement worker or a rank that fell behind continues exactly where the
// group was (worker/train/generation.h, state_agreement.h).
#ifndef LOCKSTEP_WORKER_TRAIN_TRAINER_H_
#define LOCKSTEP_WORKER_TRAIN_TRAINER_H_

#include <memory>
#include <string>

#include "lockstep/v1/coordinator.pb.h"
#include "worker/task_context.h"

namespace lockstep::worker {

struct Replica;

// Thread-compatible: the agent runs one task at a time.
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

 private:
  const std::string device_;
  std::unique_ptr<Replica> replica_;
};

}  // namespace lockstep::worker

#endif  // LOCKSTEP_WORKER_TRAIN_TRAINER_H_
