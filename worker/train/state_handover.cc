// The raw-tensor handover of a replica's state (state_handover.h): the
// receivers' checks of the sender's layout against their own replica, the
// optimizer state a receiver creates, and the packed broadcasts of the
// tensors' bytes.
#include "worker/train/state_handover.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "worker/train/torch_error.h"

namespace lockstep::worker {
namespace {

// Offsets of packed tensors are aligned so that any dtype can be viewed in
// place.
constexpr int64_t kPackAlignment = 64;

int64_t AlignUp(int64_t n) {
  return (n + kPackAlignment - 1) / kPackAlignment * kPackAlignment;
}

// ---- the receiver's side ---------------------------------------------------

absl::Status Mismatch(int rank, int source, size_t index,
                      const std::string& sent, const std::string& mine) {
  return absl::FailedPreconditionError(absl::StrCat(
      "rank ", rank, " cannot adopt rank ", source, "'s state: tensor ", index,
      " differs (rank ", source, " sends ", sent, ", rank ", rank, " holds ",
      mine,
      "); every worker must run the same lockstep-worker build and job spec"));
}

// Where the received bytes go, once the layout was accepted.
struct Targets {
  std::vector<torch::Tensor> tensors;  // in the layout's order
  // Adam's steps arrive in these 0-dim tensors, then move into the state.
  std::vector<std::pair<torch::optim::OptimizerParamState*, torch::Tensor>>
      steps;
};

// The receiver's check of the sender's optimizer entries against its own
// parameters and optimizer: which slots each parameter will hold.
using SlotsByParam = std::map<size_t, std::set<std::string>>;

absl::StatusOr<SlotsByParam> CheckOptimizerEntries(
    const std::vector<TensorLayout>& sent, size_t first,
    const std::vector<StateTensor>& params, OptimizerType type, int rank,
    int source) {
  std::map<std::string, size_t> param_index;
  for (size_t i = 0; i < params.size(); ++i) {
    param_index[params[i].layout.name] = i;
  }
  SlotsByParam slots;
  for (size_t i = first; i < sent.size(); ++i) {
    const TensorLayout& entry = sent[i];
    const size_t slash = entry.name.rfind('/');
    auto param = slash == std::string::npos
                     ? param_index.end()
                     : param_index.find(entry.name.substr(0, slash));
    const std::string slot =
        slash == std::string::npos ? "" : entry.name.substr(slash + 1);
    const auto& known = SlotsOf(type);
    const bool slot_known =
        std::any_of(known.begin(), known.end(),
                    [&](const Slot& s) { return slot == s.name; });
    if (entry.kind != StateKind::kOptimizer) {
      return Mismatch(rank, source, i, entry.ToString(), "nothing");
    }
    if (param == param_index.end() || !slot_known) {
      return Mismatch(rank, source, i, entry.ToString(),
                      absl::StrCat("no such state for its ",
                                   OptimizerName(type), " optimizer"));
    }
    TensorLayout expected = params[param->second].layout;
    expected.kind = StateKind::kOptimizer;
    expected.name = entry.name;
    if (slot == "step") {
      expected.dtype = torch::kInt64;
      expected.shape.clear();
    }
    if (!(entry == expected)) {
      return Mismatch(rank, source, i, entry.ToString(), expected.ToString());
    }
    if (!slots[param->second].insert(slot).second) {
      return MalformedLayout(i, absl::StrCat(entry.name, " is sent twice"));
    }
  }
  for (const auto& [index, held] : slots) {
    for (const Slot& s : SlotsOf(type)) {
      if (s.required && held.count(s.name) == 0) {
        return MalformedLayout(
            sent.size(),
            absl::StrCat(params[index].layout.name,
                         " has optimizer state without its ", s.name));
      }
    }
  }
  return slots;
}

// Accepts or refuses the sender's layout; changes nothing.
struct Accepted {
  std::vector<StateTensor> own;  // parameters and buffers
  size_t params = 0;
  OptimizerType type = OptimizerType::kSgd;
  SlotsByParam slots;
};

absl::StatusOr<Accepted> CheckLayout(const std::vector<TensorLayout>& sent,
                                     const Replica& replica, int rank,
                                     int source) {
  Accepted accepted;
  ASSIGN_OR_RETURN(accepted.type, TypeOf(*replica.optimizer));
  accepted.own = ModelTensors(*replica.model, &accepted.params);
  const std::vector<StateTensor>& own = accepted.own;
  for (size_t i = 0; i < own.size(); ++i) {
    if (i >= sent.size()) {
      return Mismatch(rank, source, i, "nothing", own[i].layout.ToString());
    }
    if (!(sent[i] == own[i].layout)) {
      return Mismatch(rank, source, i, sent[i].ToString(),
                      own[i].layout.ToString());
    }
  }
  std::vector<StateTensor> params(own.begin(), own.begin() + accepted.params);
  ASSIGN_OR_RETURN(accepted.slots,
                   CheckOptimizerEntries(sent, own.size(), params,
                                         accepted.type, rank, source));
  return accepted;
}

// Whether a receiver's existing optimizer state can take the bytes in
// place.
bool Reusable(const torch::Tensor& state, const torch::Tensor& param) {
  return state.defined() && state.is_contiguous() &&
         state.sizes() == param.sizes() &&
         state.scalar_type() == param.scalar_type() &&
         state.device() == param.device();
}

// Makes the optimizer's state hold exactly the slots the sender sends (a
// fresh replica creates them; state the sender lacks is dropped) and
// returns the tensors the bytes land in.
Targets PrepareTargets(const std::vector<TensorLayout>& sent,
                       Accepted& accepted, Replica& replica) {
  Targets targets;
  for (const StateTensor& t : accepted.own) targets.tensors.push_back(t.tensor);
  auto& state = replica.optimizer->state();
  std::map<std::string, torch::Tensor> by_name;
  for (size_t i = 0; i < accepted.params; ++i) {
    const StateTensor& param = accepted.own[i];
    const OptimizerStateKey key = StateKey(param.tensor);
    auto held = accepted.slots.find(i);
    if (held == accepted.slots.end()) {
      state.erase(key);
      continue;
    }
    auto& slot_state = state[key];
    if (slot_state == nullptr) slot_state = NewState(accepted.type);
    for (const Slot& s : SlotsOf(accepted.type)) {
      const bool step = std::string(s.name) == "step";
      torch::Tensor value;
      if (held->second.count(s.name) == 1) {
        value = step ? torch::zeros({}, torch::kInt64)
                     : GetSlot(accepted.type, *slot_state, s.name);
        if (!step && !Reusable(value, param.tensor)) {
          value =
              torch::empty_like(param.tensor, torch::MemoryFormat::Contiguous);
        }
        if (step) targets.steps.emplace_back(slot_state.get(), value);
        by_name[absl::StrCat(param.layout.name, "/", s.name)] = value;
      }
      SetSlot(accepted.type, *slot_state, s.name,
              step ? torch::Tensor() : value);
    }
  }
  for (size_t i = accepted.own.size(); i < sent.size(); ++i) {
    targets.tensors.push_back(by_name.at(sent[i].name));
  }
  return targets;
}

// ---- moving the bytes ------------------------------------------------------

// A run of consecutive tensors that travels in one broadcast.
struct Group {
  size_t first = 0;
  size_t end = 0;
  int64_t bytes = 0;  // with alignment padding between the tensors
};

// Receivers plan with the sender's `pack_bytes`: a group holds at most the
// state's bytes, which the layout check bounded by the receiver's own.
std::vector<Group> PlanGroups(const std::vector<TensorLayout>& layout,
                              uint64_t pack_bytes) {
  std::vector<Group> groups;
  Group current;
  for (size_t i = 0; i < layout.size(); ++i) {
    const int64_t bytes = layout[i].bytes();
    if (bytes == 0) continue;
    const int64_t start = AlignUp(current.bytes);
    if (current.end > current.first &&
        static_cast<uint64_t>(start + bytes) > pack_bytes) {
      groups.push_back(current);
      current = Group();
    }
    if (current.end == current.first) current.first = i;
    current.bytes = AlignUp(current.bytes) + bytes;
    current.end = i + 1;
  }
  if (current.end > current.first) groups.push_back(current);
  return groups;
}

// The staging buffer of packed groups: pinned host memory for a replica on
// a GPU, so every communicator can read it and the copies are fast.
class Staging {
 public:
  explicit Staging(torch::Device device) : pinned_(device.is_cuda()) {}
  char* Reserve(int64_t bytes) {
    if (!buffer_.defined() || buffer_.numel() < bytes) {
      buffer_ = torch::empty(
          {bytes},
          torch::TensorOptions().dtype(torch::kUInt8).pinned_memory(pinned_));
    }
    return static_cast<char*>(buffer_.data_ptr());
  }

 private:
  bool pinned_;
  torch::Tensor buffer_;
};

// The bytes at `offset` of a pack, seen as the tensor `layout` describes.
torch::Tensor ViewAt(char* base, int64_t offset, const TensorLayout& layout) {
  return torch::from_blob(base + offset, layout.shape,
                          torch::TensorOptions().dtype(layout.dtype));
}

// The tensors of `group` travel from `source` to every other rank. The
// layout, which the receivers checked their tensors against, says where
// each one lies in the pack.
absl::Status MoveGroup(Communicator& comm, int source, const Group& group,
                       const std::vector<TensorLayout>& layout,
                       const std::vector<torch::Tensor>& tensors,
                       Staging& staging) {
  const bool sending = comm.rank() == source;
  const torch::Tensor& only = tensors[group.first];
  if (group.end - group.first == 1 && only.is_cpu() && only.is_contiguous() &&
      only.nbytes() == static_cast<size_t>(group.bytes)) {
    // Straight into the receivers' own tensor.
    return comm.Broadcast(only.data_ptr(), static_cast<size_t>(group.bytes),
                          source);
  }
  char* buffer = staging.Reserve(group.bytes);
  std::vector<int64_t> offsets;
  int64_t offset = 0;
  for (size_t i = group.first; i < group.end; ++i) {
    offset = AlignUp(offset);
    offsets.push_back(offset);
    offset += layout[i].bytes();
  }
  for (size_t i = group.first; i < group.end && sending; ++i) {
    if (layout[i].bytes() == 0) continue;
    ViewAt(buffer, offsets[i - group.first], layout[i]).copy_(tensors[i]);
  }
  RETURN_IF_ERROR(
      comm.Broadcast(buffer, static_cast<size_t>(group.bytes), source));
  for (size_t i = group.first; i < group.end && !sending; ++i) {
    if (layout[i].bytes() == 0) continue;
    tensors[i].copy_(ViewAt(buffer, offsets[i - group.first], layout[i]));
  }
  return absl::OkStatus();
}

absl::Status MoveTensors(Communicator& comm, int source,
                         const std::vector<TensorLayout>& layout,
                         const std::vector<torch::Tensor>& tensors,
                         uint64_t pack_bytes, Replica& replica,
                         HandoverStats& stats) {
  Staging staging(replica.device);
  for (const Group& group : PlanGroups(layout, pack_bytes)) {
    RETURN_IF_ERROR(MoveGroup(comm, source, group, layout, tensors, staging));
    stats.tensor_bytes += group.bytes;
    ++stats.collectives;
  }
  return absl::OkStatus();
}

// A receiver whose tensors were partly overwritten holds no usable state:
// it becomes a fresh replica, which the next generation rebuilds from the
// seed and hands the agreed state to.
void Discard(Replica& replica) {
  Replica fresh;
  fresh.job_id = replica.job_id;
  fresh.device = replica.device;
  replica = std::move(fresh);
}

absl::Status CheckStateHeader(const StateHeader& header, int rank, int source) {
  const auto refuse = [&](absl::string_view what) {
    return absl::DataLossError(absl::StrCat(
        "rank ", rank, " refuses rank ", source, "'s state header: ", what,
        "; the sender runs another lockstep-worker build or the bytes were "
        "corrupted"));
  };
  if (header.magic != StateHeader::kMagic ||
      header.version != StateHeader::kVersion) {
    return refuse(absl::StrCat("format ", header.magic, " version ",
                               header.version, " is not this build's"));
  }
  if (header.tensors > kMaxStateTensors) {
    return refuse(absl::StrCat(header.tensors, " tensors exceed the limit of ",
                               kMaxStateTensors));
  }
  if (header.layout_bytes > kMaxLayoutBytes) {
    return refuse(absl::StrCat("a layout of ", header.layout_bytes,
                               " bytes exceeds the limit of ",
                               kMaxLayoutBytes));
  }
  return absl::OkStatus();
}

// The first message: the header, then as much of the layout as fits (all
// of it for the models lockstep trains), so that the header costs one
// collective; the rest of a longer layout follows in a second. Returns the
// number of collectives. Errors: DataLoss, on receivers, for a header that
// claims more than the limits, before anything is allocated for it.
constexpr int64_t kInlineLayoutBytes =
    kFirstMessageBytes - static_cast<int64_t>(sizeof(StateHeader));

absl::StatusOr<int> BroadcastHeader(Communicator& comm, int source,
                                    StateHeader& header,
                                    std::string& layout_bytes) {
  const bool sending = comm.rank() == source;
  std::string first(kFirstMessageBytes, '\0');
  if (sending) {
    std::memcpy(first.data(), &header, sizeof(header));
    layout_bytes.copy(first.data() + sizeof(header), kInlineLayoutBytes);
  }
  RETURN_IF_ERROR(comm.Broadcast(first.data(), first.size(), source));
  if (!sending) {
    std::memcpy(&header, first.data(), sizeof(header));
    RETURN_IF_ERROR(CheckStateHeader(header, comm.rank(), source));
    layout_bytes.assign(
        first, sizeof(header),
        std::min<uint64_t>(header.layout_bytes, kInlineLayoutBytes));
    layout_bytes.resize(header.layout_bytes);
  }
  if (layout_bytes.size() <= kInlineLayoutBytes) return 1;
  RETURN_IF_ERROR(comm.Broadcast(layout_bytes.data() + kInlineLayoutBytes,
                                 layout_bytes.size() - kInlineLayoutBytes,
                                 source));
  return 2;
}

// Every rank says whether it accepted the layout, so that all of them fail
// together, before any tensor moves, when one refuses.
absl::Status AgreeToReceive(Communicator& comm, const absl::Status& mine,
                            int source) {
  const int32_t refused = mine.ok() ? 0 : 1;
  std::vector<int32_t> all(static_cast<size_t>(comm.size()));
  RETURN_IF_ERROR(comm.AllGather(&refused, sizeof(refused), all.data()));
  if (!mine.ok()) return mine;
  std::vector<int> refusing;
  for (int r = 0; r < comm.size(); ++r) {
    if (all[r] != 0) refusing.push_back(r);
  }
  if (refusing.empty()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      "rank ", absl::StrJoin(refusing, ", rank "), " refused rank ", source,
      "'s state (another model, optimizer or build; see that rank's log); "
      "every worker must run the same lockstep-worker build and job spec"));
}

absl::StatusOr<HandoverStats> HandOver(Communicator& comm, int source,
                                       Replica& replica,
                                       const HandoverOptions& options) {
  if (replica.model == nullptr || replica.optimizer == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", comm.rank(),
                     " has no replica to hand the state to or from; "
                     "initialize it first"));
  }
  torch::NoGradGuard no_grad;
  const bool sending = comm.rank() == source;
  HandoverStats stats;
  StateHeader header;
  std::vector<TensorLayout> layout;
  std::vector<torch::Tensor> tensors;
  std::string layout_bytes;
  if (sending) {
    ASSIGN_OR_RETURN(std::vector<StateTensor> state, CollectState(replica));
    for (StateTensor& t : state) {
      layout.push_back(std::move(t.layout));
      tensors.push_back(std::move(t.tensor));
    }
    layout_bytes = EncodeLayout(layout);
    header.magic = StateHeader::kMagic;
    header.version = StateHeader::kVersion;
    header.global_batch = replica.global_batch;
    header.loss_scale = replica.scaler.scale();
    header.good_steps = replica.scaler.good_steps();
    header.skipped_steps = replica.scaler.skipped_steps();
    header.tensors = layout.size();
    header.layout_bytes = layout_bytes.size();
    header.pack_bytes = options.pack_bytes;
  }
  ASSIGN_OR_RETURN(stats.collectives,
                   BroadcastHeader(comm, source, header, layout_bytes));
  stats.header_bytes =
      kFirstMessageBytes +
      std::max<int64_t>(
          0, static_cast<int64_t>(layout_bytes.size()) - kInlineLayoutBytes);
  ++stats.collectives;  // the verdict
  absl::StatusOr<Accepted> accepted = Accepted();
  if (!sending) {
    auto decoded = DecodeLayout(layout_bytes, header.tensors);
    accepted = decoded.ok()
                   ? CheckLayout(*decoded, replica, comm.rank(), source)
                   : absl::StatusOr<Accepted>(decoded.status());
    if (decoded.ok()) layout = *std::move(decoded);
  }
  RETURN_IF_ERROR(AgreeToReceive(comm, accepted.status(), source));
  Targets targets;
  if (!sending) {
    targets = PrepareTargets(layout, *accepted, replica);
    tensors = targets.tensors;
  }
  stats.tensors = static_cast<int>(layout.size());
  absl::Status moved = MoveTensors(comm, source, layout, tensors,
                                   header.pack_bytes, replica, stats);
  if (!moved.ok()) {
    if (!sending) Discard(replica);
    return moved;
  }
  if (sending) return stats;
  if (!targets.steps.empty()) {
    ASSIGN_OR_RETURN(const OptimizerType type, TypeOf(*replica.optimizer));
    for (auto& [state, step] : targets.steps) {
      SetSlot(type, *state, "step", step);
    }
  }
  replica.global_batch = static_cast<int>(header.global_batch);
  replica.scaler.Restore(header.loss_scale, static_cast<int>(header.good_steps),
                         header.skipped_steps);
  return stats;
}

}  // namespace

absl::StatusOr<HandoverStats> HandOverState(Communicator& comm, int source,
                                            Replica& replica,
                                            const HandoverOptions& options) {
  try {
    return HandOver(comm, source, replica, options);
  } catch (const std::exception& e) {
    // LibTorch's (an allocation, a copy): this rank's tensors may be torn.
    if (comm.rank() != source) Discard(replica);
    return absl::InternalError(absl::StrCat(
        "rank ", comm.rank(), " failed to hand over the state from rank ",
        source, ": ", TorchErrorSentence(e.what())));
  }
}

}  // namespace lockstep::worker
