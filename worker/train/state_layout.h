// The training state of a replica as tensors (docs/DESIGN.md §3): its
// parameters, buffers and the optimizer's per-parameter state (the slots
// SGD and Adam keep), each described by a layout entry (kind, name, dtype,
// shape), and the compact encoding the handover's header carries. Decoding
// treats its bytes as untrusted and bounds every count before allocating.
//
// Thread-compatible.
#ifndef LOCKSTEP_WORKER_TRAIN_STATE_LAYOUT_H_
#define LOCKSTEP_WORKER_TRAIN_STATE_LAYOUT_H_

#include <torch/torch.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
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

// The model's parameters (their number in `params`), then its buffers.
std::vector<StateTensor> ModelTensors(const torch::nn::Module& model,
                                      size_t* params);

// DataLoss: the header's layout is malformed at entry `index`.
absl::Status MalformedLayout(uint64_t index, absl::string_view what);

// ---- optimizer state ----

// The optimizers MakeOptimizer builds, and the per-parameter state each
// keeps (LibTorch creates it at a parameter's first step).
enum class OptimizerType { kSgd, kAdam, kAdamW };
// Unimplemented for any other optimizer.
absl::StatusOr<OptimizerType> TypeOf(const torch::optim::Optimizer& optimizer);
// "SGD", "Adam", "AdamW".
const char* OptimizerName(OptimizerType type);

// Every slot in travel order; `required` ones exist whenever the parameter
// has state at all.
struct Slot {
  const char* name;
  bool required;
};
const std::vector<Slot>& SlotsOf(OptimizerType type);

// The key of a parameter's state in Optimizer::state(): its TensorImpl's
// address, printed as a string in LibTorch 1.x and the pointer itself in 2.x.
using OptimizerStateKey = std::decay_t<
    decltype(std::declval<torch::optim::Optimizer&>().state())>::key_type;
OptimizerStateKey StateKey(const torch::Tensor& param);
// The slot's tensor; Adam's (and AdamW's) step as a 0-dim int64 host tensor.
// Undefined when the parameter's state does not hold the slot.
torch::Tensor GetSlot(OptimizerType type, torch::optim::OptimizerParamState& s,
                      const std::string& slot);
void SetSlot(OptimizerType type, torch::optim::OptimizerParamState& s,
             const std::string& slot, const torch::Tensor& value);
// An empty per-parameter state of the optimizer's kind.
std::unique_ptr<torch::optim::OptimizerParamState> NewState(OptimizerType type);

}  // namespace lockstep::worker

#endif  // LOCKSTEP_WORKER_TRAIN_STATE_LAYOUT_H_
