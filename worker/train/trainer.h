// Synchronous data-parallel training of one replica (DESIGN §4): the seeded
// global sampler feeds this rank its slice of every global batch, gradients
// are averaged across ranks with one all-reduce per step, the learning rate
// follows LrSchedule, the test set is evaluated after each epoch, and the
// chief reports progress to the coordinator.
#ifndef LOCKSTEP_WORKER_TRAIN_TRAINER_H_
#define LOCKSTEP_WORKER_TRAIN_TRAINER_H_

#include "lockstep/v1/coordinator.pb.h"
#include "worker/agent.h"

namespace lockstep::worker {

// Runs `task` to its end: success, an agreed stop, an abort or an error.
// Never throws: LibTorch and Gloo exceptions become an error result.
v1::TaskResult RunTrainingTask(TaskContext& task);

}  // namespace lockstep::worker

#endif  // LOCKSTEP_WORKER_TRAIN_TRAINER_H_
