// The collectives that reconcile the ranks' replicas (state_agreement.h).
#include "worker/train/state_agreement.h"

#include <cstring>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"
#include "worker/checkpoint/store.h"

namespace lockstep::worker {
namespace {

// What each rank contributes to the agreement.
struct Position {
  int64_t step = 0;               // the last step this rank applied
  int64_t newest_checkpoint = 0;  // rank 0 only
};

// What travels ahead of the state archive.
struct StateHeader {
  uint64_t archive_bytes = 0;
  int64_t global_batch = 0;
  double loss_scale = 1;
  int64_t good_steps = 0;
  int64_t skipped_steps = 0;
};

std::string SerializeState(const Replica& replica) {
  torch::serialize::OutputArchive archive;
  replica.model->save(archive);
  torch::serialize::OutputArchive optimizer;
  replica.optimizer->save(optimizer);
  archive.write("optimizer", optimizer);
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

void LoadState(const std::string& bytes, Replica& replica) {
  std::istringstream in(bytes);
  torch::serialize::InputArchive archive;
  archive.load_from(in, replica.device);  // the sender's device may differ
  replica.model->load(archive);
  torch::serialize::InputArchive optimizer;
  archive.read("optimizer", optimizer);
  replica.optimizer->load(optimizer);
}

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
  const bool sending = comm.rank() == source;
  std::string archive;
  if (sending) archive = SerializeState(replica);
  StateHeader header;
  header.archive_bytes = archive.size();
  header.global_batch = replica.global_batch;
  header.loss_scale = replica.scaler.scale();
  header.good_steps = replica.scaler.good_steps();
  header.skipped_steps = replica.scaler.skipped_steps();
  RETURN_IF_ERROR(comm.Broadcast(&header, sizeof(header), source));
  replica.global_batch = static_cast<int>(header.global_batch);
  replica.scaler.Restore(header.loss_scale, static_cast<int>(header.good_steps),
                         header.skipped_steps);
  if (!sending) archive.resize(header.archive_bytes);
  RETURN_IF_ERROR(comm.Broadcast(archive.data(), archive.size(), source));
  if (!sending) LoadState(archive, replica);
  return absl::OkStatus();
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
