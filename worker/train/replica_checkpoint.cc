// Snapshots, checkpoint restores and the model export (replica_checkpoint.h).
#include "worker/train/replica_checkpoint.h"

#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/export_file.h"
#include "common/files.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "worker/data/sampler.h"
#include "worker/train/model_export.h"
#include "worker/train/torch_error.h"

namespace lockstep::worker {
namespace {

std::string SaveToBytes(torch::serialize::OutputArchive& archive) {
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

std::string SerializeOptimizer(const torch::optim::Optimizer& optimizer) {
  torch::serialize::OutputArchive archive;
  optimizer.save(archive);
  return SaveToBytes(archive);
}

void SaveOnHost(const torch::nn::Module& module,
                torch::serialize::OutputArchive& archive) {
  for (const auto& param : module.named_parameters(/*recurse=*/false)) {
    archive.write(param.key(), param.value().to(torch::kCPU));
  }
  for (const auto& buffer : module.named_buffers(/*recurse=*/false)) {
    archive.write(buffer.key(), buffer.value().to(torch::kCPU),
                  /*is_buffer=*/true);
  }
  for (const auto& child : module.named_children()) {
    if (!child.value()->is_serializable()) continue;
    torch::serialize::OutputArchive child_archive(archive.compilation_unit());
    SaveOnHost(*child.value(), child_archive);
    archive.write(child.key(), child_archive);
  }
}

}  // namespace

std::string SerializeOptimizerThroughHost(const v1::JobSpec& spec,
                                          const Replica& replica) {
  std::vector<torch::Tensor> params;
  for (const torch::Tensor& p : replica.model->parameters()) {
    params.push_back(p.detach().to(torch::kCPU).requires_grad_(true));
  }
  auto twin =
      MakeOptimizer(spec.optimizer(), params, replica.model->WeightDecayMask());
  std::istringstream in(SerializeOptimizer(*replica.optimizer));
  torch::serialize::InputArchive archive;
  archive.load_from(in, torch::Device(torch::kCPU));
  twin->load(archive);
  return SerializeOptimizer(*twin);
}

namespace {

v1::TrainerState TrainerStateOf(const v1::JobSpec& spec, const Replica& replica,
                                const ReplicaPosition& position,
                                int32_t epoch) {
  v1::TrainerState state;
  state.set_step(replica.step);
  state.set_epoch(epoch);
  state.set_global_batch_size(position.plan.global);
  state.set_samples_seen(replica.step * position.plan.global);
  state.set_next_lr(position.next_lr);
  state.set_loss_scale(replica.scaler.scale());
  state.set_loss_scale_good_steps(replica.scaler.good_steps());
  state.set_skipped_steps(replica.scaler.skipped_steps());
  state.set_model(position.model_label);
  state.set_seed(spec.seed());
  return state;
}

void FillManifest(const v1::JobSpec& spec, const Replica& replica,
                  const ReplicaPosition& position, int32_t epoch,
                  v1::Manifest* manifest) {
  manifest->set_job_id(position.job_id);
  manifest->set_job_name(spec.name());
  manifest->set_step(replica.step);
  manifest->set_epoch(epoch);
  manifest->set_generation(position.generation);
  manifest->set_world_size(position.world_size);
  manifest->set_global_batch_size(position.plan.global);
  manifest->set_model(position.model_label);
  manifest->set_seed(spec.seed());
}

}  // namespace

std::string SerializeModelThroughHost(const torch::nn::Module& model) {
  torch::serialize::OutputArchive archive;
  SaveOnHost(model, archive);
  return SaveToBytes(archive);
}

std::string SerializeModelOnHost(const Replica& replica) {
  return replica.device.is_cpu() ? SerializeModel(*replica.model)
                                 : SerializeModelThroughHost(*replica.model);
}

Snapshot MakeSnapshot(const v1::JobSpec& spec, const Replica& replica,
                      const ReplicaPosition& position) {
  Snapshot snapshot;
  const int64_t step = replica.step;
  const BatchPlan& plan = position.plan;
  snapshot.step = step;
  snapshot.epoch = static_cast<int32_t>(step / position.steps_per_epoch);
  v1::RankState rank;
  rank.set_rank(position.rank);
  rank.set_world_size(position.world_size);
  rank.set_step(step);
  rank.set_epoch(snapshot.epoch);
  rank.set_epoch_position((step % position.steps_per_epoch) * plan.global +
                          int64_t{position.rank} * plan.per_replica);
  rank.set_per_replica_batch_size(plan.per_replica);
  rank.set_generator_seed(StepSeed(spec.seed(), position.rank, step));
  if (position.rank == 0) {
    snapshot.files.emplace_back("model.pt", SerializeModelOnHost(replica));
    snapshot.files.emplace_back(
        "optimizer.pt", replica.device.is_cpu()
                            ? SerializeOptimizer(*replica.optimizer)
                            : SerializeOptimizerThroughHost(spec, replica));
    snapshot.files.emplace_back("trainer.state",
                                checkpoint::ToJson(TrainerStateOf(
                                    spec, replica, position, snapshot.epoch)));
    FillManifest(spec, replica, position, snapshot.epoch, &snapshot.manifest);
  }
  snapshot.files.emplace_back(checkpoint::RankStateName(position.rank),
                              checkpoint::ToJson(rank));
  return snapshot;
}

absl::Status LoadCheckpoint(const checkpoint::Found& found,
                            const v1::JobSpec& spec,
                            const std::string& model_label, Replica& replica) {
  const v1::Manifest& manifest = found.manifest;
  // Only files the manifest lists, bounded by and checked against it: a
  // manifest that omits model.pt must not let a link to /dev/zero be read.
  auto read = [&](const std::string& file) {
    return checkpoint::ReadCheckpointFile(found, file);
  };
  ASSIGN_OR_RETURN(std::string trainer_json, read("trainer.state"));
  v1::TrainerState state;
  RETURN_IF_ERROR(checkpoint::FromJson(
      trainer_json, absl::StrCat(found.dir, "/trainer.state"), &state));
  if (state.model() != model_label || state.seed() != spec.seed()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint ", found.dir, " holds model \"", state.model(),
        "\" trained with seed ", state.seed(), ", but the job trains \"",
        model_label, "\" with seed ", spec.seed(),
        "; give the job its own checkpoint.backup_dir, or resume it with "
        "the same model and seed"));
  }
  ASSIGN_OR_RETURN(std::string model_bytes, read("model.pt"));
  ASSIGN_OR_RETURN(std::string optimizer_bytes, read("optimizer.pt"));
  try {
    torch::serialize::InputArchive model;
    std::istringstream model_in(model_bytes);
    model.load_from(model_in, replica.device);
    replica.model->load(model);
    torch::serialize::InputArchive optimizer;
    std::istringstream optimizer_in(optimizer_bytes);
    optimizer.load_from(optimizer_in, replica.device);
    replica.optimizer->load(optimizer);
  } catch (const std::exception& e) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint ", found.dir, " verifies but does not load into model \"",
        model_label, "\" with optimizer \"", spec.optimizer().type(),
        "\": ", TorchErrorSentence(e.what())));
  }
  replica.step = manifest.step();
  replica.global_batch = state.global_batch_size();
  replica.scaler.Restore(state.loss_scale(), state.loss_scale_good_steps(),
                         state.skipped_steps());
  LogInfo("restored ", checkpoint::CheckpointName(manifest.step()), " (step ",
          manifest.step(), ", generation ", manifest.generation(), ", ",
          manifest.world_size(), " workers, global batch ",
          state.global_batch_size(), ")");
  return absl::OkStatus();
}

absl::StatusOr<int64_t> RestoreNewestCheckpoint(const std::string& backup_dir,
                                                int64_t newer_than,
                                                const v1::JobSpec& spec,
                                                const std::string& model_label,
                                                Replica& replica) {
  auto found = checkpoint::FindNewest(
      backup_dir,
      [](const std::string& name, const absl::Status& why) {
        LogWarning("skipping checkpoint ", name, ": ", why.message());
      },
      newer_than);
  if (!found.ok()) {
    if (!absl::IsNotFound(found.status())) {
      LogWarning("cannot restore a checkpoint: ", found.status().message());
    }
    return 0;
  }
  RETURN_IF_ERROR(LoadCheckpoint(*found, spec, model_label, replica));
  return found->manifest.step();
}

absl::Status ExportModel(const ExportOwner& owner, const v1::JobSpec& spec,
                         const Replica& replica) {
  const std::string& path = spec.export_path();
  if (path.empty()) return absl::OkStatus();
  size_t slash = path.find_last_of('/');
  if (slash != std::string::npos && slash > 0) {
    RETURN_IF_ERROR(MakeDirectories(path.substr(0, slash)));
  }
  const std::string& format = spec.export_format();
  absl::StatusOr<std::string> bytes =
      format == "torchscript"  ? ExportTorchScript(*replica.model)
      : format == "state_dict" ? ExportStateDict(*replica.model)
      : replica.device.is_cpu() || replica.model->is_torchscript()
          ? replica.model->Export()
          : absl::StatusOr<std::string>(SerializeModelOnHost(replica));
  absl::Status exported =
      bytes.ok() ? WriteExport(path, *bytes, owner) : bytes.status();
  if (!exported.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the job trained to the end but the final model could not be "
        "exported: ",
        exported.message(),
        spec.checkpoint().backup_dir().empty()
            ? ""
            : "; the checkpoints in checkpoint.backup_dir are kept"));
  }
  LogInfo("exported the final model to ", path, " (",
          format.empty() ? "archive" : format, ")");
  return absl::OkStatus();
}

}  // namespace lockstep::worker
