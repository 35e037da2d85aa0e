// Synchronous data-parallel training of one replica (DESIGN §4): the seeded
// global sampler feeds this rank its slice of every global batch, gradients
// are averaged across ranks with one all-reduce per step, the learning rate
// follows LrSchedule, the test set is evaluated after each epoch, and the
// chief reports progress to the coordinator.
//
// Live recovery (DESIGN §3): the replica (model, optimizer, step) outlives a
// generation. When a generation starts, the ranks agree on the most advanced
// step any of them applied and adopt that rank's state, so a replacement
// worker or a rank that fell behind continues exactly where the group was.
#ifndef LOCKSTEP_WORKER_TRAIN_TRAINER_H_
#define LOCKSTEP_WORKER_TRAIN_TRAINER_H_

#include <memory>

#include "lockstep/v1/coordinator.pb.h"
#include "worker/agent.h"

namespace lockstep::worker {

// Keeps the replica of the last job this worker trained and runs each of its
// generations. Thread-compatible: the agent runs one task at a time.
class TrainingRunner {
 public:
  TrainingRunner();
  ~TrainingRunner();

  // Runs one generation to its end: success, an agreed stop, an abort or an
  // error. Never throws: LibTorch and Gloo exceptions become an error result
  // whose code says whether the job can re-form (Unavailable, Aborted).
  v1::TaskResult Run(TaskContext& task);

  struct Replica;

 private:
  std::unique_ptr<Replica> replica_;
};

}  // namespace lockstep::worker

#endif  // LOCKSTEP_WORKER_TRAIN_TRAINER_H_
