// What the ranks of a generation agree on before and between steps
// (docs/DESIGN.md §3, §4): at the start, the most advanced state any rank
// holds (or a newer checkpoint), which every rank then adopts; for a job
// that has not trained yet, that every rank built the same initial
// parameters; before evaluating and saving, the average of batch norm's
// running statistics. Integers travel as integers (all-gather, byte
// broadcast), the model and optimizer as raw tensors (state_handover.h).
//
// Every function is collective: each rank of the communicator calls it, in
// the same order. Thread-compatible.
#ifndef LOCKSTEP_WORKER_TRAIN_STATE_AGREEMENT_H_
#define LOCKSTEP_WORKER_TRAIN_STATE_AGREEMENT_H_

#include <torch/torch.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/collective/communicator.h"
#include "worker/train/replica.h"

namespace lockstep::worker {

// How the ranks' states were reconciled.
struct AgreedState {
  // The rank whose live state every rank adopted; -1 when none was (nobody
  // had trained, or a checkpoint was restored).
  int source_rank = -1;
  // The checkpoint restored (e.g. "ckpt-000001200"); empty when none was.
  std::string restored_from;
};

// Rank 0's restore: loads the newest checkpoint that verifies and is newer
// than step `newer_than` into the replica and returns its step, or 0 when
// there is none to restore.
using RestoreNewest =
    std::function<absl::StatusOr<int64_t>(int64_t newer_than)>;

// Every rank says which step it applied last. A step some rank applied had
// a complete all-reduce, so the most advanced state is legitimate; every
// rank adopts it (the lowest rank among equals is the source). When rank 0's
// `newest_checkpoint` (the step of the newest checkpoint folder, not yet
// verified; 0 for none and on other ranks) is ahead of every rank, rank 0
// calls `restore` and broadcasts what it restored: every worker was lost, or
// the job was submitted again. A job that has not trained checks that every
// rank holds the same initial parameters.
// Errors: those of the collectives; FailedPrecondition when initial
// parameters differ.
absl::StatusOr<AgreedState> AgreeOnState(Communicator& comm, Replica& replica,
                                         int64_t newest_checkpoint,
                                         const RestoreNewest& restore);

// Overwrites every rank's model, optimizer, global batch and loss scaler
// state with `source`'s (HandOverState, whose errors it returns).
absl::Status BroadcastState(Communicator& comm, int source, Replica& replica);

// Rank 0's parameters are broadcast and compared bit for bit: a mismatch
// means the ranks run different code or seeds (DDP checks this too), and
// training would silently diverge. Errors: FailedPrecondition naming the
// rank.
absl::Status CheckIdenticalInit(Communicator& comm,
                                const std::vector<torch::Tensor>& params);

// Averages batch norm's running statistics over the ranks: each rank's
// follow its own batches.
absl::Status AverageRunningStatistics(Communicator& comm,
                                      RunningStatistics& statistics);

}  // namespace lockstep::worker

#endif  // LOCKSTEP_WORKER_TRAIN_STATE_AGREEMENT_H_
