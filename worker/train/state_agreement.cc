// The collectives that reconcile the ranks' replicas (state_agreement.h).
#include "worker/train/state_agreement.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "checkpoint/store.h"
#include "common/status_macros.h"
#include "worker/train/state_handover.h"

namespace lockstep::worker {
namespace {

// What each rank contributes to the agreement.
struct Position {
  int64_t step = 0;               // the last step this rank applied
  int64_t newest_checkpoint = 0;  // rank 0 only
};

}  // namespace

absl::StatusOr<AgreedState> AgreeOnState(Communicator& comm, Replica& replica,
                                         int64_t newest_checkpoint,
                                         const RestoreNewest& restore) {
  const int world = comm.size();
  Position mine;
  mine.step = replica.step;
  if (comm.rank() == 0) mine.newest_checkpoint = newest_checkpoint;
  std::vector<Position> all(static_cast<size_t>(world));
  RETURN_IF_ERROR(comm.AllGather(&mine, sizeof(Position), all.data()));
  int source = 0;
  int64_t best = -1;
  for (int r = 0; r < world; ++r) {
    if (all[r].step > best) {
      best = all[r].step;
      source = r;
    }
  }
  AgreedState agreed;
  if (all[0].newest_checkpoint > best) {
    // Maybe no rank holds state as recent as the newest checkpoint. Rank 0
    // verifies the newer checkpoints, newest first, and says which one it
    // restored.
    int64_t restored = 0;
    if (comm.rank() == 0) {
      ASSIGN_OR_RETURN(restored, restore(best));
    }
    RETURN_IF_ERROR(comm.Broadcast(&restored, sizeof(restored), 0));
    if (restored > 0) {
      RETURN_IF_ERROR(BroadcastState(comm, 0, replica));
      replica.step = restored;
      agreed.restored_from = checkpoint::CheckpointName(restored);
      return agreed;
    }
  }
  if (best == 0) {
    // Nobody trained yet: every rank holds the seeded initial state.
    RETURN_IF_ERROR(CheckIdenticalInit(comm, replica.model->parameters()));
    return agreed;
  }
  RETURN_IF_ERROR(BroadcastState(comm, source, replica));
  replica.step = best;
  agreed.source_rank = source;
  return agreed;
}

absl::Status BroadcastState(Communicator& comm, int source, Replica& replica) {
  return HandOverState(comm, source, replica).status();
}

absl::Status CheckIdenticalInit(Communicator& comm,
                                const std::vector<torch::Tensor>& params) {
  size_t elements = 0;
  for (const torch::Tensor& p : params) elements += p.numel();
  std::vector<float> local(elements);
  size_t offset = 0;
  for (const torch::Tensor& p : params) {
    const torch::Tensor host = p.detach().to(torch::kCPU).contiguous();
    std::memcpy(local.data() + offset, host.data_ptr<float>(),
                host.numel() * sizeof(float));
    offset += host.numel();
  }
  std::vector<float> root = local;
  RETURN_IF_ERROR(comm.Broadcast(root.data(), root.size(), 0));
  if (std::memcmp(root.data(), local.data(), local.size() * sizeof(float)) !=
      0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", comm.rank(),
        " initial parameters differ from rank 0's; every worker must run the "
        "same lockstep-worker build and job spec"));
  }
  return absl::OkStatus();
}

absl::Status AverageRunningStatistics(Communicator& comm,
                                      RunningStatistics& statistics) {
  if (comm.size() == 1 || statistics.empty()) return absl::OkStatus();
  std::vector<torch::Tensor> flat;
  for (const torch::Tensor& buffer : statistics.tensors()) {
    flat.push_back(buffer.reshape({-1}));
  }
  torch::NoGradGuard no_grad;
  // Summed in host memory, which every communicator takes (a no-op move
  // on the CPU).
  torch::Tensor all = torch::cat(flat).to(torch::kCPU);
  RETURN_IF_ERROR(comm.AllReduceSum(all.data_ptr<float>(), all.numel()));
  all.div_(comm.size());
  int64_t offset = 0;
  for (torch::Tensor& buffer : statistics.tensors()) {
    buffer.copy_(all.narrow(0, offset, buffer.numel()).view_as(buffer));
    offset += buffer.numel();
  }
  return absl::OkStatus();
}

}  // namespace lockstep::worker
