// Setup, the step, evaluation and the loop of one generation
// (generation.h).
#include "worker/train/training_generation.h"

#include <malloc.h>
#include <torch/version.h>

#include <algorithm>
#include <fstream>
#include <future>
#include <string>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "checkpoint/store.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "worker/collective/gloo_communicator.h"
#include "worker/collective/membership.h"
#include "worker/collective/mesh_communicator.h"
#ifdef LOCKSTEP_HAVE_NCCL
#include "worker/collective/nccl_communicator.h"
#endif
#include "worker/train/data_cache.h"
#include "worker/train/device_batches.h"
#include "worker/train/model.h"
#include "worker/train/prefetcher.h"
#include "worker/train/replica_checkpoint.h"
#include "worker/train/vector_isa.h"

namespace lockstep::worker {
namespace {

// This process's anonymous resident memory (RssAnon), in MiB; -1 where
// /proc does not say.
// Freed heap is returned to the system first, so this is what the worker
// holds, not what the allocator kept from an evaluation's activations.
int64_t AnonymousMemoryMib() {
  malloc_trim(0);
  std::ifstream status("/proc/self/status");
  std::string text;
  while (std::getline(status, text)) {
    absl::string_view line = text;
    int64_t kib = 0;
    if (absl::ConsumePrefix(&line, "RssAnon:") &&
        absl::SimpleAtoi(
            absl::StripSuffix(absl::StripAsciiWhitespace(line), " kB"), &kib)) {
      return kib / 1024;
    }
  }
  return -1;
}

// A preempting rank's stop vote: any sum this large means "save, then stop".
constexpr float kPreemptVote = 1000.0f;
// Below this per-replica batch, batch norm's statistics are noisy.
constexpr int kSmallBatchNormBatch = 32;
// fp16: this many overflows in a row at the smallest loss scale: diverged.
constexpr int kMaxConsecutiveSkips = 100;

// The largest buffer communication.algorithm "auto" times each algorithm on
// (a 25 MiB bucket would take seconds per try on a slow link).
constexpr size_t kMaxProbeBytes = size_t{8} << 20;

// Zeroes the gradients in place, as LibTorch 1.13 does; 2.x would drop
// them (set_to_none), and the reducer would allocate them again each step.
void ZeroGradients(torch::optim::Optimizer& optimizer) {
#if TORCH_VERSION_MAJOR >= 2
  optimizer.zero_grad(/*set_to_none=*/false);
#else
  optimizer.zero_grad();
#endif
}

absl::Duration Millis(absl::Duration d) {
  return absl::Trunc(d, absl::Milliseconds(1));
}

}  // namespace

TrainingGeneration::TrainingGeneration(TaskContext& task, Replica& replica,
                                       torch::Device device)
    : task_(task),
      replica_(replica),
      spec_(task.assignment.spec()),
      rank_(task.assignment.rank()),
      world_(task.assignment.world_size()),
      device_(device),
      skips_(task.assignment, task.send) {
  metrics_.set_sink(task.metrics);
}

TrainingGeneration::~TrainingGeneration() { task_.SetCommunicator(nullptr); }

std::string TrainingGeneration::Backend() const {
  // The coordinator resolves "auto" for the whole generation; without its
  // word (an older coordinator) only an explicit "nccl" means NCCL.
  const std::string& backend = task_.assignment.backend().empty()
                                   ? spec_.communication().backend()
                                   : task_.assignment.backend();
  return backend == "nccl" ? "nccl" : "gloo";
}

absl::Status TrainingGeneration::CheckSupported() const {
  if (Backend() == "nccl" && !device_.is_cuda()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the job asks for communication.backend \"nccl\", but worker rank ",
        rank_, " on ", task_.host,
        " trains on the CPU; use \"gloo\" or \"auto\", or run the worker "
        "with --device cuda"));
  }
  if (Backend() == "nccl" && CompressesGradients(spec_.communication())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the job asks for communication.compression \"",
        spec_.communication().compression(),
        "\", which only the Gloo all-reduce has, but generation ",
        task_.assignment.generation(), " runs NCCL (worker rank ", rank_,
        " on ", task_.host,
        "); set communication.backend \"gloo\" or compression \"none\""));
  }
  if (spec_.precision() == "fp16" && !device_.is_cuda()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the job asks for precision \"fp16\", which needs a GPU, but worker "
        "rank ",
        rank_, " on ", task_.host,
        " trains on the CPU; use \"bf16\" (autocast on the CPU) or \"fp32\""));
  }
  return absl::OkStatus();
}

absl::Status TrainingGeneration::ConnectAndLoad(absl::Time* connected_at) {
  auto load = [data = spec_.data()](bool train) {
    return LoadSplit(data, train);
  };
  auto loading_train = std::async(std::launch::async, load, true);
  auto loading_test = std::async(std::launch::async, load, false);
  auto comm = Connect();
  absl::Status connected = comm.status();
  if (comm.ok()) comm_ = *std::move(comm);
  *connected_at = absl::Now();
  auto train = loading_train.get();
  auto test = loading_test.get();
  RETURN_IF_ERROR(train.status());
  RETURN_IF_ERROR(test.status());
  RETURN_IF_ERROR(connected);
  train_ = *std::move(train);
  test_ = *std::move(test);
  skips_.Watch(train_.get());
  skips_.Watch(test_.get());
  skips_.SendNew();  // what opening the files left out
  ASSIGN_OR_RETURN(learning_, ResolveTask(spec_, *train_, test_.get()));
  ASSIGN_OR_RETURN(const Task test_task, TaskForTest(learning_, *test_));
  train_assembler_ = std::make_unique<BatchAssembler>(train_, learning_);
  test_assembler_ = std::make_unique<BatchAssembler>(test_, test_task);
  column_names_ = train_assembler_->names();
  counted_ = std::make_unique<CountingCommunicator>(
      comm_.get(), &task_.collective_seq, task_.metrics);
  if (task_.metrics != nullptr) {
    task_.metrics->SetAssignment(task_.assignment.job_id(), rank_, Backend());
  }
  task_.SetCommunicator(comm_.get());
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<Communicator>> TrainingGeneration::Connect() {
  if (world_ == 1) return std::make_unique<SingleRankCommunicator>();
  ASSIGN_OR_RETURN(Membership membership,
                   MembershipOf(task_.assignment, Backend() == "nccl"));
  // Registered with the task before it connects: an abort reaches it there.
  auto connect =
      [this](auto created) -> absl::StatusOr<std::unique_ptr<Communicator>> {
    if (!created.ok()) return created.status();
    auto comm = *std::move(created);
    task_.SetCommunicator(comm.get());
    absl::Status connected = comm->Connect(task_.kv.get());
    task_.SetCommunicator(nullptr);
    if (!connected.ok()) return connected;
    return std::unique_ptr<Communicator>(std::move(comm));
  };
  if (Backend() == "nccl") {
#ifdef LOCKSTEP_HAVE_NCCL
    NcclCommunicator::Options options;
    options.rank = rank_;
    options.size = world_;
    options.device = device_.has_index() ? device_.index() : 0;
    options.membership = std::move(membership);
    return connect(NcclCommunicator::Create(options));
#else
    return absl::FailedPreconditionError(absl::StrCat(
        "worker rank ", rank_, " on ", task_.host,
        " was built without NCCL (no CUDA at build time); use "
        "communication.backend \"gloo\" or a lockstep-worker built with "
        "LOCKSTEP_CUDA=ON"));
#endif
  }
  const AllReduceAlgorithm algorithm =
      spec_.communication().algorithm() == "ring" ? AllReduceAlgorithm::kRing
                                                  : AllReduceAlgorithm::kDirect;
  if (task_.data_plane_gloo) {
    GlooCommunicator::Options options;
    options.rank = rank_;
    options.size = world_;
    options.host = task_.host;
    options.algorithm = algorithm;
    options.membership = std::move(membership);
    return connect(GlooCommunicator::Create(options));
  }
  MeshCommunicator::Options options;
  options.rank = rank_;
  options.size = world_;
  options.host = task_.host;
  options.algorithm = algorithm;
  options.membership = std::move(membership);
  options.encrypted = task_.data_plane_encryption;
  options.links = &task_.links;
  return connect(MeshCommunicator::Create(options));
}

absl::Status TrainingGeneration::PlanBatches() {
  if (replica_.global_batch > 0) {
    // A resumed job keeps its global batch on any world size.
    ASSIGN_OR_RETURN(
        plan_,
        ResumeBatch(replica_.global_batch, world_, spec_.accumulation_steps(),
                    agreed_.restored_from.empty()
                        ? std::string("the job")
                        : absl::StrCat("checkpoint ", agreed_.restored_from)));
  } else {
    ASSIGN_OR_RETURN(plan_, ResolveBatch(spec_, world_));
  }
  replica_.global_batch = plan_.global;
  if (train_->size() < plan_.global) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the training data (", train_->description(), ") has ", train_->size(),
        " samples, fewer than one global batch of ", plan_.global));
  }
  return absl::OkStatus();
}

absl::Status TrainingGeneration::Setup() {
  const absl::Time start = absl::Now();
  RETURN_IF_ERROR(CheckSupported());
  // A worker whose oneDNN is capped below its bf16 kernels (an AVX-512 CPU
  // with ONEDNN_MAX_CPU_ISA=AVX2, as a pool mixing CPUs sets it) computes a
  // bf16 generation as an AVX2-only CPU does, in ATen's own kernels, where
  // LibTorch would send its convolutions to oneDNN and fail (issue 51).
  // Per generation: the process trains one at a time.
  const bool without_onednn = spec_.precision() == "bf16" && device_.is_cpu() &&
                              OneDnnLacksBf16Kernels();
  at::globalContext().setUserEnabledMkldnn(!without_onednn);
  if (without_onednn) {
    LogInfo("bf16 in ATen's kernels: oneDNN runs ", OneDnnCpuIsa(),
            " here, below its bf16 kernels (AVX512_CORE)");
  }
  absl::Time connected;
  RETURN_IF_ERROR(ConnectAndLoad(&connected));
  const absl::Time loaded = absl::Now();
  if (replica_.model == nullptr) {
    RETURN_IF_ERROR(InitializeReplica(spec_, Model(), device_, &replica_));
  }
  replica_.model->train();
  const std::string& backup_dir = spec_.checkpoint().backup_dir();
  if (!backup_dir.empty()) {
    checkpointer_ = std::make_unique<Checkpointer>(task_, backup_dir,
                                                   spec_.checkpoint().keep());
  }
  const std::string label = ModelLabel(Model());
  const int64_t newest_checkpoint = rank_ == 0 && checkpointer_ != nullptr
                                        ? checkpoint::NewestStep(backup_dir)
                                        : 0;
  ASSIGN_OR_RETURN(agreed_, AgreeOnState(*counted_, replica_, newest_checkpoint,
                                         [&](int64_t newer_than) {
                                           return RestoreNewestCheckpoint(
                                               backup_dir, newer_than, spec_,
                                               label, replica_);
                                         }));
  params_ = replica_.model->parameters();
  statistics_ = std::make_unique<RunningStatistics>(*replica_.model);
  RETURN_IF_ERROR(PlanBatches());
  GradientReducer::Options reducer;
  reducer.bucket_bytes =
      static_cast<size_t>(spec_.communication().bucket_mb() * (1 << 20));
  reducer.first_bucket_bytes =
      std::min(reducer.first_bucket_bytes, reducer.bucket_bytes);
  reducer.overlap = spec_.communication().overlap();
  reducer.accumulate = plan_.accumulation > 1;
  RETURN_IF_ERROR(ChooseAlgorithm(reducer.bucket_bytes));
  reducer.device = device_;
  reducer.stage_through_host = device_.is_cuda() && Backend() != "nccl";
  reducer.bf16_wire = spec_.communication().compression() == "bf16";
  // The hand-off talks to the NCCL communicator itself, not its counter.
  handoff_ =
      MakeBucketHandoff(device_, comm_.get(), reducer.stage_through_host);
  reducer.handoff = handoff_.get();
  reducer_ =
      std::make_unique<GradientReducer>(params_, counted_.get(), reducer);
  RETURN_IF_ERROR(StartPipeline());
  LogPlan(absl::Now() - start, connected - start, loaded - start);
  return absl::OkStatus();
}

absl::Status TrainingGeneration::ChooseAlgorithm(size_t bucket_bytes) {
  if (spec_.communication().algorithm() != "auto" || Backend() == "nccl" ||
      world_ < 3) {
    return absl::OkStatus();
  }
  // Most of the gradient moves in full buckets; a small model in one.
  size_t gradient_bytes = 0;
  for (const torch::Tensor& param : params_) {
    gradient_bytes += static_cast<size_t>(param.numel()) * sizeof(float);
  }
  const size_t bytes = std::min({bucket_bytes, gradient_bytes, kMaxProbeBytes});
  absl::StatusOr<AlgorithmProbe> probe =
      ChooseAllReduceAlgorithm(*counted_, bytes);
  if (!probe.ok()) {
    return absl::Status(probe.status().code(),
                        absl::StrCat("timing the all-reduce algorithms for "
                                     "communication.algorithm \"auto\": ",
                                     probe.status().message()));
  }
  probe_ = *probe;
  LogInfo("all-reduce algorithm for generation ", task_.assignment.generation(),
          ": ", AlgorithmName(), " (", probe_->bytes, " bytes took ",
          probe_->direct_seconds, " s direct, ", probe_->ring_seconds,
          " s by the ring, summed over ", world_, " ranks)");
  return absl::OkStatus();
}

std::string TrainingGeneration::AlgorithmName() const {
  if (Backend() == "nccl" || world_ < 2) return "";
  const bool ring = probe_.has_value()
                        ? probe_->algorithm == AllReduceAlgorithm::kRing
                        : spec_.communication().algorithm() == "ring";
  return ring ? "ring" : "direct";
}

ModelOptions TrainingGeneration::Model() const {
  ModelOptions options = ModelOptionsOf(
      spec_, learning_.model_input, learning_.token_input, learning_.outputs);
  if (learning_.type == TaskType::kCustom) options.step_columns = learning_.all;
  return options;
}

GlobalSampler TrainingGeneration::MakeSampler() const {
  const bool blocks = spec_.data().shuffle() == "blocks";
  return GlobalSampler(spec_.seed(), train_->size(), plan_, rank_,
                       blocks ? spec_.data().shuffle_block() : 0);
}

absl::Status TrainingGeneration::StartPipeline() {
  sampler_ = std::make_unique<GlobalSampler>(MakeSampler());
  total_steps_ = sampler_->steps_per_epoch() * spec_.epochs();
  if (spec_.max_steps() > 0) {
    total_steps_ = std::min(total_steps_, spec_.max_steps());
  }
  lr_ = std::make_unique<LrSchedule>(spec_, plan_.global, total_steps_);
  // On a GPU a split small enough is assembled once and lives there.
  ASSIGN_OR_RETURN(std::optional<DeviceSplit> on_device,
                   AssembleOnDevice(*train_assembler_, device_));
  if (on_device.has_value()) {
    batches_ =
        std::make_unique<DeviceBatches>(*std::move(on_device), MakeSampler());
  } else {
    batches_ = std::make_unique<Prefetcher>(*train_assembler_, MakeSampler(),
                                            plan_, replica_.step, total_steps_,
                                            /*pinned=*/device_.is_cuda());
  }
  if (rank_ != 0) return absl::OkStatus();
  reporter_ = std::make_unique<ProgressReporter>(
      task_.assignment, TrainingPlanOf(), replica_.step, agreed_, task_.report,
      learning_.token_input ? learning_.block : 0);
  if (replica_.model->has_batch_norm() &&
      plan_.per_replica < kSmallBatchNormBatch) {
    std::string warning = absl::StrCat(
        "the model has batch norm and each replica normalizes over its own ",
        plan_.per_replica, " samples per forward pass (per-replica batch",
        plan_.accumulation > 1 ? " of one micro-batch" : "", "); below ",
        kSmallBatchNormBatch,
        " the batch statistics are noisy and the results differ from a run "
        "with fewer, larger replicas at the same global batch; raise "
        "per_replica_batch_size, use fewer workers, or a model without "
        "batch norm");
    LogWarning(warning);
    reporter_->Warn(std::move(warning));
  }
  return absl::OkStatus();
}

v1::TrainingPlan TrainingGeneration::TrainingPlanOf() const {
  v1::TrainingPlan plan;
  plan.set_replicas(world_);
  plan.set_per_replica_batch_size(plan_.per_replica);
  plan.set_global_batch_size(plan_.global);
  plan.set_steps_per_epoch(static_cast<int32_t>(sampler_->steps_per_epoch()));
  plan.set_total_steps(total_steps_);
  plan.set_base_lr(lr_->base_lr());
  plan.set_scaled_lr(lr_->scaled_lr());
  plan.set_lr_scaling(spec_.lr_scaling());
  plan.set_warmup_steps(spec_.warmup_steps());
  plan.set_all_reduce_algorithm(AlgorithmName());
  for (const std::string& name : learning_.target.classes) {
    plan.add_classes(name);
  }
  if (probe_.has_value()) {
    v1::AllReduceProbe* probe = plan.mutable_algorithm_probe();
    probe->set_bytes(static_cast<int64_t>(probe_->bytes));
    probe->set_direct_seconds(probe_->direct_seconds);
    probe->set_ring_seconds(probe_->ring_seconds);
  }
  return plan;
}

void TrainingGeneration::LogPlan(absl::Duration setup,
                                 absl::Duration rendezvous,
                                 absl::Duration loaded) const {
  LogInfo("generation ", task_.assignment.generation(), " set up in ",
          absl::FormatDuration(Millis(setup)), " (rendezvous ",
          absl::FormatDuration(Millis(rendezvous)), ", data ready after ",
          absl::FormatDuration(Millis(loaded)), ")");
  if (rank_ != 0) return;
  LogInfo("job ", task_.assignment.job_id(), " generation ",
          task_.assignment.generation(), ": ", world_,
          " replicas x per-replica batch ", plan_.per_replica,
          plan_.accumulation > 1
              ? absl::StrCat(" x ", plan_.accumulation, " accumulation steps")
              : "",
          " = global batch ", plan_.global, "; ", sampler_->steps_per_epoch(),
          " steps/epoch, ", total_steps_, " steps; lr ", lr_->base_lr(),
          " scaled (", spec_.lr_scaling(), ") to ", lr_->scaled_lr(), " over ",
          spec_.warmup_steps(), " warmup steps, then ", spec_.lr_decay(),
          "; precision ", spec_.precision(), "; starting after step ",
          replica_.step,
          agreed_.source_rank >= 0
              ? absl::StrCat(" with rank ", agreed_.source_rank, "'s state")
              : "",
          agreed_.restored_from.empty()
              ? ""
              : absl::StrCat(" from ", agreed_.restored_from));
}

std::optional<ReplicaPosition> TrainingGeneration::LastPosition() const {
  if (sampler_ == nullptr || lr_ == nullptr) return std::nullopt;
  return Position();
}

ReplicaPosition TrainingGeneration::Position() const {
  ReplicaPosition position;
  position.job_id = task_.assignment.job_id();
  position.generation = task_.assignment.generation();
  position.rank = rank_;
  position.world_size = world_;
  position.plan = plan_;
  position.steps_per_epoch = sampler_->steps_per_epoch();
  position.next_lr = lr_->At(replica_.applied_steps());
  position.model_label = ModelLabel(Model());
  return position;
}

absl::Status TrainingGeneration::Step(bool* stop) {
  StepMetrics::Timer timer(&metrics_);
  const int64_t step = replica_.step;
  ASSIGN_OR_RETURN(Batch batch, batches_->Take(step));
  for (torch::Tensor& tensor : batch) {
    if (tensor.device() == device_) continue;
    // Pinned host batches for a GPU (a data set too large to keep there),
    // copied asynchronously; the slot goes back to the prefetcher only
    // after the step's one synchronisation (Finish), when the copy is done.
    tensor = tensor.to(device_, /*non_blocking=*/true);
  }
  timer.Lap(StepMetrics::kData);
  const int accumulation = plan_.accumulation;
  ZeroGradients(*replica_.optimizer);
  Network& model = *replica_.model;
  const LossScaler& scaler = replica_.scaler;
  // Dropout masks: a function of (seed, rank, step), whoever runs the step.
  torch::manual_seed(StepSeed(spec_.seed(), rank_, step));
  // A failed step leaves the replica as it was: batch norm's running
  // statistics, which the forward pass updates, are put back too.
  statistics_->Remember();
  // Micro-batches: their gradients add up in .grad (each loss divided by
  // their number, so the sum is the mean over this rank's samples), and only
  // the last one's backward communicates.
  // On the CPU the loss is read as it comes; on a GPU it stays there, and
  // rides to the other ranks without a synchronisation.
  float local_loss = 0;
  torch::Tensor device_loss;
  for (int micro = 0; micro < accumulation; ++micro) {
    const int64_t begin = int64_t{micro} * plan_.per_replica;
    torch::Tensor loss = MicroBatchLoss(batch, begin, plan_.per_replica);
    if (accumulation > 1) loss = loss / accumulation;
    if (device_.is_cpu()) {
      local_loss += loss.item<float>();
    } else {
      device_loss =
          device_loss.defined() ? device_loss + loss.detach() : loss.detach();
    }
    if (scaler.enabled()) loss = loss * scaler.scale();
    timer.Lap(StepMetrics::kForward);
    if (micro == accumulation - 1) {
      // Gradients are reduced bucket by bucket while backward runs. Nothing
      // of this step is applied unless every bucket's all-reduce completes,
      // so a failed step leaves the replica at the previous one.
      const float vote = task_.preempt_requested ? kPreemptVote
                         : task_.stop_requested  ? 1.0f
                                                 : 0.0f;
      if (device_.is_cpu()) {
        reducer_->Prepare(local_loss, vote);
      } else {
        reducer_->Prepare(device_loss, vote);
      }
    }
    loss.backward();
    timer.Lap(StepMetrics::kBackward);
  }
  float loss_sum = 0, stop_votes = 0;
  absl::Status reduced = reducer_->Finish(&loss_sum, &stop_votes);
  batches_->Release(step);
  if (!reduced.ok()) {
    statistics_->PutBack();
    return reduced;
  }
  timer.Lap(StepMetrics::kExposedComm);
  replica_.last_loss = loss_sum / world_;
  *stop = stop_votes > 0;
  preempted_ = stop_votes >= kPreemptVote;
  RETURN_IF_ERROR(ApplyGradients(step));
  timer.Lap(StepMetrics::kOptimizer);
  ++replica_.step;
  metrics_.StepDone();
  return absl::OkStatus();
}

torch::Tensor TrainingGeneration::MicroBatchLoss(const Batch& batch,
                                                 int64_t begin, int64_t count) {
  Network& model = *replica_.model;
  if (learning_.type == TaskType::kCustom) {
    // The module computes its own loss, under the job's precision.
    NamedBatch named;
    for (size_t c = 0; c < batch.size(); ++c) {
      named.emplace_back(column_names_[c], batch[c].narrow(0, begin, count));
    }
    Autocast autocast(spec_.precision(), device_);
    return model.StepLoss(named).to(torch::kFloat32).reshape({});
  }
  // The loss in fp32.
  return TaskLoss(learning_,
                  PrecisionLogits(model, batch[0].narrow(0, begin, count),
                                  spec_.precision(), device_),
                  batch[1].narrow(0, begin, count));
}

absl::Status TrainingGeneration::ApplyGradients(int64_t step) {
  replica_.last_lr = lr_->At(replica_.applied_steps());
  LossScaler& scaler = replica_.scaler;
  if (scaler.enabled()) {
    // Every rank holds the same averaged gradients: an overflow on any rank
    // is an inf/nan here on all of them, and they all decide alike.
    // One check (and one synchronisation) for every gradient.
    std::vector<torch::Tensor> checks;
    for (const torch::Tensor& p : params_) {
      if (p.grad().defined()) checks.push_back(torch::isfinite(p.grad()).all());
    }
    const bool finite =
        checks.empty() || torch::stack(checks).all().item<bool>();
    if (finite) {
      for (const torch::Tensor& p : params_) {
        if (p.grad().defined()) p.mutable_grad().mul_(1.0 / scaler.scale());
      }
    }
    if (!scaler.Update(finite)) {
      if (rank_ == 0) {
        LogWarning("step ", step + 1, ": fp16 gradients overflowed; skipped ",
                   "the step, loss scale now ", scaler.scale());
      }
      if (scaler.consecutive_skips() >= kMaxConsecutiveSkips) {
        return absl::FailedPreconditionError(absl::StrCat(
            "the gradients were not finite for ", kMaxConsecutiveSkips,
            " steps in a row (loss scale ", scaler.scale(),
            "): training diverged; lower base_lr or use precision bf16"));
      }
      return absl::OkStatus();
    }
  }
  if (spec_.clip_grad_norm() > 0) {
    // The averaged gradients are the same on every rank, so is the clip.
    torch::nn::utils::clip_grad_norm_(params_, spec_.clip_grad_norm());
  }
  SetLearningRate(*replica_.optimizer, replica_.last_lr);
  replica_.optimizer->step();
  return absl::OkStatus();
}

absl::Status TrainingGeneration::MaybeSave(int64_t step, bool epoch_end,
                                           bool stop) {
  // The last step is exported, not saved, unless the job asks for its
  // final state as a checkpoint (checkpoint.upload_last): every rank
  // decides by the spec alone, so all of them save the same steps.
  const bool save_last = spec_.checkpoint().upload_last();
  if (checkpointer_ == nullptr || (step == total_steps_ && !save_last)) {
    return absl::OkStatus();
  }
  const v1::CheckpointSpec& ckpt = spec_.checkpoint();
  // Stopped or preempted: save this step before leaving, so the job
  // resumes exactly here.
  const bool save =
      stop || step == total_steps_ ||
      (ckpt.save_every_steps() > 0 && step % ckpt.save_every_steps() == 0) ||
      (ckpt.save_every_epoch() && epoch_end);
  if (!save) return absl::OkStatus();
  const absl::Time save_start = absl::Now();
  RETURN_IF_ERROR(AverageRunningStatistics(*counted_, *statistics_));
  checkpointer_->SaveAsync(MakeSnapshot(spec_, replica_, Position()));
  if (stop) {
    stop_save_ = checkpointer_->Wait();
  } else if (!ckpt.async()) {
    (void)checkpointer_->Wait();  // a failure is reported and logged
  }
  metrics_.SaveDone(absl::Now() - save_start);
  return absl::OkStatus();
}

absl::Status TrainingGeneration::Finalize() {
  if (checkpointer_ != nullptr) (void)checkpointer_->Wait();
  if (rank_ != 0) return absl::OkStatus();
  RETURN_IF_ERROR(
      ExportModel({task_.assignment.job_id(), task_.assignment.submitted_by()},
                  spec_, replica_));
  // A checkpoint to upload stays until the agent has uploaded it
  // (Agent::UploadCheckpoint removes it then).
  if (checkpointer_ != nullptr && !spec_.checkpoint().keep_backups() &&
      !task_.assignment.upload_checkpoint()) {
    absl::Status removed = checkpoint::RemoveAll(checkpointer_->backup_dir());
    if (!removed.ok()) {
      LogWarning("could not remove the checkpoints after success: ",
                 removed.message());
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::TaskResult> TrainingGeneration::Run() {
  absl::StatusOr<v1::TaskResult> result = Train();
  // Also after an error (the limit of skipped records, say): before the
  // result, on the same session.
  skips_.SendNew();
  return result;
}

absl::StatusOr<v1::TaskResult> TrainingGeneration::Train() {
  RETURN_IF_ERROR(Setup());
  // What the worker holds itself (not the mapped data, which is the page
  // cache's): it must not grow with the data set (docs/BENCHMARKS.md).
  LogInfo("rank ", rank_, ": anonymous memory ", AnonymousMemoryMib(),
          " MiB before the first step");
  train_start_ = absl::Now();
  const int64_t first_step = replica_.step;
  const int64_t steps_per_epoch = sampler_->steps_per_epoch();
  bool stop = false;
  while (replica_.step < total_steps_ && !stop) {
    if (task_.aborted()) {
      return absl::AbortedError("the generation was aborted");
    }
    RETURN_IF_ERROR(Step(&stop));
    skips_.SendNew();
    const int64_t step = replica_.step;
    const bool epoch_end = step % steps_per_epoch == 0;
    const bool last = step == total_steps_ || stop;
    // A scheduled evaluation on a step where the whole split is read anyway
    // is that one.
    const bool whole = epoch_end || last;
    const bool scheduled = !whole && spec_.eval_every_steps() > 0 &&
                           step % spec_.eval_every_steps() == 0;
    const bool evaluated = whole || scheduled;
    int64_t eval_samples = 0;
    if (evaluated) {
      const absl::Time eval_start = absl::Now();
      ASSIGN_OR_RETURN(eval_samples, Evaluate(/*subset=*/scheduled));
      eval_time_ += absl::Now() - eval_start;
      if (rank_ == 0) {
        std::string metrics;
        for (const auto& [name, value] : replica_.last_metrics) {
          absl::StrAppend(&metrics, ", ", name, " ", value);
        }
        LogInfo("epoch ", (step - 1) / steps_per_epoch + 1, " step ", step, "/",
                total_steps_, ": loss ", replica_.last_loss, ", test loss ",
                replica_.last_test_loss, metrics, " (", eval_samples,
                " test samples)");
      }
    }
    if (reporter_ != nullptr) {
      std::optional<Evaluation> evaluation;
      if (evaluated) {
        evaluation = Evaluation{replica_.last_test_loss, replica_.last_metrics,
                                eval_samples};
      }
      reporter_->StepDone(step, replica_.last_loss, replica_.last_lr, evaluated,
                          evaluation, absl::Now() - train_start_ - eval_time_);
    }
    RETURN_IF_ERROR(MaybeSave(step, epoch_end, stop));
  }
  if (!stop) RETURN_IF_ERROR(Finalize());
  LogInfo("rank ", rank_, ": anonymous memory ", AnonymousMemoryMib(),
          " MiB at the end (step ", replica_.step, ")");
  return Result(first_step, stop);
}

absl::StatusOr<v1::TaskResult> TrainingGeneration::Result(int64_t first_step,
                                                          bool stop) const {
  const double seconds =
      absl::ToDoubleSeconds(absl::Now() - train_start_ - eval_time_);
  v1::TaskResult result;
  result.set_ok(true);
  result.set_stopped(stop);
  result.set_total_steps(total_steps_);
  result.set_preempted(preempted_);
  if (stop_save_.has_value() && !stop_save_->ok()) {
    result.set_stop_save_error(std::string(stop_save_->message()));
  }
  result.set_steps(replica_.step);
  result.set_final_loss(replica_.last_loss);
  result.set_test_accuracy(replica_.last_accuracy);
  result.set_test_loss(replica_.last_test_loss);
  for (const auto& [name, value] : replica_.last_metrics) {
    (*result.mutable_test_metrics())[name] = value;
  }
  const int64_t trained = replica_.step - first_step;
  const double samples_per_second =
      seconds > 0 ? trained * plan_.global / seconds : 0;
  result.set_samples_per_second(samples_per_second);
  if (learning_.token_input) {
    result.set_tokens_per_second(samples_per_second * learning_.block);
  }
  ASSIGN_OR_RETURN(*result.mutable_model_digest(),
                   ModelDigest(*replica_.model));
  if (!metrics_.empty()) metrics_.Fill(result.mutable_breakdown());
  return result;
}

}  // namespace lockstep::worker
