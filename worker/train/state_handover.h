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

namespace lockstep::worker {

enum class StateKind : uint8_t { kParameter = 1, kBuffer = 2, kOptimizer = 3 };

// One tensor of the state as the header describes it.
struct TensorLayout {
  StateKind kind = StateKind::kParameter;
  // The module's name for a parameter or buffer ("head.weight"); for
  // optimizer state "<parameter>/<slot>" ("head.weight/exp_avg").
  std::string name;
  torch::ScalarType dtype = torch::kFloat32;
  std::vector<int64_t> shape;

  int64_t bytes() const;
  std::string ToString() const;  // "parameter head.weight Float [10, 64]"
  bool operator==(const TensorLayout& other) const;
};

// What travels first, at a fixed size: the replica's scalar state (the
// step is agreed before) and the size of the layout that follows.
struct StateHeader {
  static constexpr uint32_t kMagic = 0x4854534c;  // "LSTH"
  static constexpr uint32_t kVersion = 1;
  uint32_t magic = 0;
  uint32_t version = 0;
  int64_t global_batch = 0;
  double loss_scale = 1;
  int64_t good_steps = 0;
  int64_t skipped_steps = 0;
  uint64_t tensors = 0;
  uint64_t layout_bytes = 0;
  // The sender's HandoverOptions::pack_bytes: every rank packs alike.
  uint64_t pack_bytes = 0;
};

// The header and the start of the layout travel in one message of this
// size.
inline constexpr int64_t kFirstMessageBytes = int64_t{16} << 10;

// What a header may claim; anything beyond is refused before allocating.
inline constexpr size_t kMaxLayoutBytes = size_t{16} << 20;
inline constexpr uint64_t kMaxStateTensors = uint64_t{1} << 18;
inline constexpr size_t kMaxTensorNameBytes = 1024;
inline constexpr size_t kMaxTensorDims = 16;
inline constexpr int64_t kMaxTensorBytes = int64_t{1} << 40;

// The layout in the header's encoding, and back. DecodeLayout treats its
// input as untrusted: it checks every count, length, dtype and dimension
// against the limits above. Errors: DataLoss saying what is malformed.
std::string EncodeLayout(const std::vector<TensorLayout>& layout);
absl::StatusOr<std::vector<TensorLayout>> DecodeLayout(absl::string_view bytes,
                                                       uint64_t count);

// A replica's state in the order it travels: parameters, buffers, then the
// optimizer's state parameter by parameter. The tensors are the replica's
// own (Adam's step, an integer, travels as a 0-dim int64 tensor). Errors:
// Unimplemented for an optimizer other than SGD and Adam.
struct StateTensor {
  TensorLayout layout;
  torch::Tensor tensor;
};
absl::StatusOr<std::vector<StateTensor>> CollectState(const Replica& replica);

struct HandoverOptions {
  // The sender's applies. Tensors are packed into buffers of at most this many
  // bytes; one larger travels alone. 0: every tensor alone.
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
