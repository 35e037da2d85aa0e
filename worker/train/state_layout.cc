// The state's tensors (state_layout.h): which they are in a replica, the
// optimizer slots SGD and Adam keep, and the layout's encoding and its
// checks of untrusted bytes.
#include "worker/train/state_layout.h"

#include <cstring>
#include <sstream>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace lockstep::worker {
namespace {

// The header travels as its bytes.
static_assert(std::is_trivially_copyable_v<StateHeader>);

const char* KindName(StateKind kind) {
  switch (kind) {
    case StateKind::kParameter:
      return "parameter";
    case StateKind::kBuffer:
      return "buffer";
    case StateKind::kOptimizer:
      return "optimizer state";
  }
  return "?";
}

// The dtypes a header may name: those a model's state holds.
bool KnownDtype(int8_t code) {
  switch (static_cast<torch::ScalarType>(code)) {
    case torch::kFloat32:
    case torch::kFloat64:
    case torch::kFloat16:
    case torch::kBFloat16:
    case torch::kInt64:
    case torch::kInt32:
    case torch::kInt16:
    case torch::kInt8:
    case torch::kUInt8:
    case torch::kBool:
      return true;
    default:
      return false;
  }
}

TensorLayout LayoutOf(StateKind kind, std::string name,
                      const torch::Tensor& tensor) {
  TensorLayout layout;
  layout.kind = kind;
  layout.name = std::move(name);
  layout.dtype = tensor.scalar_type();
  layout.shape = tensor.sizes().vec();
  return layout;
}

// ---- the header's encoding -------------------------------------------------

// Per tensor: kind (u8), dtype (i8), dims (u8), name length (u16), the
// name, then each dimension (i64). Host byte order: the ranks of a job run
// the same build.
template <typename T>
void Put(std::string& out, T value) {
  out.append(reinterpret_cast<const char*>(&value), sizeof(value));
}

// Reads untrusted bytes: every read checks what is left.
class Reader {
 public:
  explicit Reader(absl::string_view bytes) : rest_(bytes) {}
  template <typename T>
  bool Get(T* value) {
    if (rest_.size() < sizeof(T)) return false;
    std::memcpy(value, rest_.data(), sizeof(T));
    rest_.remove_prefix(sizeof(T));
    return true;
  }
  bool GetString(size_t length, std::string* out) {
    if (rest_.size() < length) return false;
    out->assign(rest_.data(), length);
    rest_.remove_prefix(length);
    return true;
  }
  bool done() const { return rest_.empty(); }

 private:
  absl::string_view rest_;
};

absl::StatusOr<TensorLayout> DecodeEntry(Reader& in, uint64_t index) {
  uint8_t kind = 0, dims = 0;
  int8_t dtype = 0;
  uint16_t name_length = 0;
  if (!in.Get(&kind) || !in.Get(&dtype) || !in.Get(&dims) ||
      !in.Get(&name_length)) {
    return MalformedLayout(index, "the layout ends early");
  }
  if (kind < 1 || kind > 3)
    return MalformedLayout(index, "unknown tensor kind");
  if (!KnownDtype(dtype)) return MalformedLayout(index, "unknown dtype");
  if (dims > kMaxTensorDims)
    return MalformedLayout(index, "too many dimensions");
  if (name_length > kMaxTensorNameBytes)
    return MalformedLayout(index, "name too long");
  TensorLayout layout;
  layout.kind = static_cast<StateKind>(kind);
  layout.dtype = static_cast<torch::ScalarType>(dtype);
  if (!in.GetString(name_length, &layout.name)) {
    return MalformedLayout(index, "the layout ends early");
  }
  int64_t elements = 1;
  for (uint8_t d = 0; d < dims; ++d) {
    int64_t size = 0;
    if (!in.Get(&size)) return MalformedLayout(index, "the layout ends early");
    if (size < 0 || size > kMaxTensorBytes) {
      return MalformedLayout(index, "a dimension out of range");
    }
    if (size > 0 && elements > kMaxTensorBytes / size) {
      return MalformedLayout(index, "more bytes than a tensor may hold");
    }
    elements = size == 0 ? 0 : elements * size;
    layout.shape.push_back(size);
  }
  if (elements > kMaxTensorBytes / 8) {
    return MalformedLayout(index, "more bytes than a tensor may hold");
  }
  return layout;
}

}  // namespace

absl::StatusOr<OptimizerType> TypeOf(const torch::optim::Optimizer& optimizer) {
  if (dynamic_cast<const torch::optim::SGD*>(&optimizer) != nullptr) {
    return OptimizerType::kSgd;
  }
  if (dynamic_cast<const torch::optim::Adam*>(&optimizer) != nullptr) {
    return OptimizerType::kAdam;
  }
  if (dynamic_cast<const torch::optim::AdamW*>(&optimizer) != nullptr) {
    return OptimizerType::kAdamW;
  }
  return absl::UnimplementedError(
      "the state handover knows SGD, Adam and AdamW; this optimizer is none "
      "of them");
}

const char* OptimizerName(OptimizerType type) {
  switch (type) {
    case OptimizerType::kSgd:
      return "SGD";
    case OptimizerType::kAdam:
      return "Adam";
    case OptimizerType::kAdamW:
      return "AdamW";
  }
  return "";
}

const std::vector<Slot>& SlotsOf(OptimizerType type) {
  static const std::vector<Slot> sgd = {{"momentum_buffer", true}};
  static const std::vector<Slot> adam = {{"step", true},
                                         {"exp_avg", true},
                                         {"exp_avg_sq", true},
                                         {"max_exp_avg_sq", false}};
  return type == OptimizerType::kSgd ? sgd : adam;
}

namespace {
template <typename Key>
Key KeyOfImpl(void* impl) {
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream out;
    out << impl;
    return out.str();
  } else {
    return impl;
  }
}
}  // namespace

OptimizerStateKey StateKey(const torch::Tensor& param) {
  return KeyOfImpl<OptimizerStateKey>(param.unsafeGetTensorImpl());
}

namespace {

// Adam's and AdamW's states have the same slots under different types.
template <typename State>
torch::Tensor GetAdamSlot(torch::optim::OptimizerParamState& s,
                          const std::string& slot) {
  auto& adam = static_cast<State&>(s);
  if (slot == "step") return torch::tensor(adam.step(), torch::kInt64);
  if (slot == "exp_avg") return adam.exp_avg();
  if (slot == "exp_avg_sq") return adam.exp_avg_sq();
  return adam.max_exp_avg_sq();
}

template <typename State>
void SetAdamSlot(torch::optim::OptimizerParamState& s, const std::string& slot,
                 const torch::Tensor& value) {
  auto& adam = static_cast<State&>(s);
  if (slot == "step") {
    adam.step(value.defined() ? value.item<int64_t>() : 0);
  } else if (slot == "exp_avg") {
    adam.exp_avg(value);
  } else if (slot == "exp_avg_sq") {
    adam.exp_avg_sq(value);
  } else {
    adam.max_exp_avg_sq(value);
  }
}

}  // namespace

torch::Tensor GetSlot(OptimizerType type, torch::optim::OptimizerParamState& s,
                      const std::string& slot) {
  switch (type) {
    case OptimizerType::kSgd:
      return static_cast<torch::optim::SGDParamState&>(s).momentum_buffer();
    case OptimizerType::kAdam:
      return GetAdamSlot<torch::optim::AdamParamState>(s, slot);
    case OptimizerType::kAdamW:
      return GetAdamSlot<torch::optim::AdamWParamState>(s, slot);
  }
  return {};
}

void SetSlot(OptimizerType type, torch::optim::OptimizerParamState& s,
             const std::string& slot, const torch::Tensor& value) {
  switch (type) {
    case OptimizerType::kSgd:
      static_cast<torch::optim::SGDParamState&>(s).momentum_buffer(value);
      return;
    case OptimizerType::kAdam:
      return SetAdamSlot<torch::optim::AdamParamState>(s, slot, value);
    case OptimizerType::kAdamW:
      return SetAdamSlot<torch::optim::AdamWParamState>(s, slot, value);
  }
}

std::unique_ptr<torch::optim::OptimizerParamState> NewState(
    OptimizerType type) {
  switch (type) {
    case OptimizerType::kSgd:
      return std::make_unique<torch::optim::SGDParamState>();
    case OptimizerType::kAdam:
      return std::make_unique<torch::optim::AdamParamState>();
    case OptimizerType::kAdamW:
      return std::make_unique<torch::optim::AdamWParamState>();
  }
  return nullptr;
}

absl::Status MalformedLayout(uint64_t index, absl::string_view what) {
  return absl::DataLossError(absl::StrCat(
      "the state header is malformed at tensor ", index, ": ", what,
      "; the sender runs another lockstep-worker build or the bytes were "
      "corrupted"));
}

std::vector<StateTensor> ModelTensors(const torch::nn::Module& model,
                                      size_t* params) {
  std::vector<StateTensor> tensors;
  for (const auto& p : model.named_parameters()) {
    tensors.push_back(
        {LayoutOf(StateKind::kParameter, p.key(), p.value()), p.value()});
  }
  *params = tensors.size();
  for (const auto& b : model.named_buffers()) {
    tensors.push_back(
        {LayoutOf(StateKind::kBuffer, b.key(), b.value()), b.value()});
  }
  return tensors;
}
int64_t TensorLayout::bytes() const {
  int64_t elements = 1;
  for (int64_t size : shape) elements *= size;
  return elements * static_cast<int64_t>(c10::elementSize(dtype));
}

std::string TensorLayout::ToString() const {
  return absl::StrCat(KindName(kind), " ", name, " ", c10::toString(dtype),
                      " [", absl::StrJoin(shape, ", "), "]");
}

bool TensorLayout::operator==(const TensorLayout& other) const {
  return kind == other.kind && name == other.name && dtype == other.dtype &&
         shape == other.shape;
}

std::string EncodeLayout(const std::vector<TensorLayout>& layout) {
  std::string out;
  for (const TensorLayout& t : layout) {
    Put(out, static_cast<uint8_t>(t.kind));
    Put(out, static_cast<int8_t>(t.dtype));
    Put(out, static_cast<uint8_t>(t.shape.size()));
    Put(out, static_cast<uint16_t>(t.name.size()));
    out.append(t.name);
    for (int64_t size : t.shape) Put(out, size);
  }
  return out;
}

absl::StatusOr<std::vector<TensorLayout>> DecodeLayout(absl::string_view bytes,
                                                       uint64_t count) {
  // Each entry takes at least 5 bytes: a count the bytes cannot hold is
  // refused before reserving anything.
  if (count > kMaxStateTensors || count > bytes.size() / 5) {
    return MalformedLayout(0, absl::StrCat(count, " tensors cannot fit in ",
                                           bytes.size(), " bytes"));
  }
  std::vector<TensorLayout> layout;
  layout.reserve(count);
  Reader in(bytes);
  for (uint64_t i = 0; i < count; ++i) {
    ASSIGN_OR_RETURN(TensorLayout entry, DecodeEntry(in, i));
    layout.push_back(std::move(entry));
  }
  if (!in.done()) return MalformedLayout(count, "bytes follow the last tensor");
  return layout;
}

absl::StatusOr<std::vector<StateTensor>> CollectState(const Replica& replica) {
  ASSIGN_OR_RETURN(OptimizerType type, TypeOf(*replica.optimizer));
  size_t params = 0;
  std::vector<StateTensor> state = ModelTensors(*replica.model, &params);
  const auto& optimizer_state = replica.optimizer->state();
  for (size_t i = 0; i < params; ++i) {
    const StateTensor param = state[i];  // a copy: `state` grows below
    auto held = optimizer_state.find(StateKey(param.tensor));
    if (held == optimizer_state.end()) continue;
    for (const Slot& slot : SlotsOf(type)) {
      torch::Tensor value = GetSlot(type, *held->second, slot.name);
      if (!value.defined()) continue;
      state.push_back(
          {LayoutOf(StateKind::kOptimizer,
                    absl::StrCat(param.layout.name, "/", slot.name), value),
           value});
    }
  }
  return state;
}

}  // namespace lockstep::worker
