// The handover of a replica's training state from one rank to the others
// (docs/DESIGN.md §3) as raw tensors: a small, bounded header (the
// replica's scalar state and the layout of every parameter, buffer and
// optimizer-state tensor: kind, name, dtype, shape), then each tensor's
// bytes. Small tensors travel packed into buffers of a few MiB, so the
// number of collectives stays small; a large tensor in host memory is
// broadcast straight into the receivers' own tensor. A replica on a GPU
// stages through pinned host memory, which every communicator takes.
//
// Receivers check the header against their own replica before any tensor
// moves, and create the optimizer state a fresh replica has not made yet
// (SGD's momentum buffers, Adam's moments and step), so after the handover
// every rank holds exactly the sender's bytes.
//
// HandOverState is collective: each rank of the communicator calls it, in
// the same order. Thread-compatible.
#ifndef LOCKSTEP_WORKER_TRAIN_STATE_HANDOVER_H_
#define LOCKSTEP_WORKER_TRAIN_STATE_HANDOVER_H_

#include <torch/torch.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "worker/collective/communicator.h"
#include "worker/train/replica.h"
#include "worker/train/state_layout.h"

namespace lockstep::worker {

struct HandoverOptions {
  // Read by the sender only: it packs tensors into buffers of at most this
  // many bytes; a larger one travels alone. 0: every tensor alone.
  size_t pack_bytes = size_t{4} << 20;
};

struct HandoverStats {
  int64_t header_bytes = 0;  // the fixed header and the layout
  int64_t tensor_bytes = 0;  // the tensors' bytes, with packing padding
  int tensors = 0;
  int collectives = 0;  // broadcasts and the verdict all-gather
};

// Overwrites every rank's model, optimizer state, global batch and loss
// scaler state with `source`'s.
// Possible errors:
//   - FailedPrecondition: a rank's replica does not match the sender's
//       layout (another model, optimizer or build); the rank that refused
//       names the first tensor that differs, the others name that rank.
//   - DataLoss: the header is malformed or claims more than the limits.
//   - Unimplemented: an optimizer other than SGD and Adam.
//   - those of the collectives.
absl::StatusOr<HandoverStats> HandOverState(
    Communicator& comm, int source, Replica& replica,
    const HandoverOptions& options = HandoverOptions());

}  // namespace lockstep::worker

#endif  // LOCKSTEP_WORKER_TRAIN_STATE_HANDOVER_H_
