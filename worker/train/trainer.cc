#include "worker/train/trainer.h"

#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include <array>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/failpoint.h"
#include "common/files.h"
#include "common/job_spec.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "worker/checkpoint/checkpointer.h"
#include "worker/checkpoint/store.h"
#include "worker/collective/gloo_communicator.h"
#include "worker/data/idx.h"
#include "worker/data/npy.h"
#include "worker/data/sampler.h"
#include "worker/train/gradient_reducer.h"
#include "worker/train/loss_scaler.h"
#include "worker/train/lr_schedule.h"
#include "worker/train/model.h"

namespace lockstep::worker {
namespace {

// Fashion-MNIST's pixel mean and standard deviation over the training set.
// Other data sets (npy) are normalized by their own training set's.
constexpr float kPixelMean = 0.2860f;
constexpr float kPixelStd = 0.3530f;
constexpr int64_t kEvalBatch = 1000;
// Steps travel through float all-reduces as two exact 20-bit halves.
constexpr int64_t kHalf = int64_t{1} << 20;
// A preempting rank's stop vote: any sum this large means "save, then stop".
constexpr float kPreemptVote = 1000.0f;
// Below this per-replica batch, batch norm's statistics are noisy.
constexpr int kSmallBatchNormBatch = 32;
// fp16: this many overflowing steps in a row at the smallest loss scale
// means training diverged.
constexpr int kMaxConsecutiveSkips = 100;

// bf16: the enclosed ops run where LibTorch's CPU autocast policy lowers
// them (convolutions, matrix products) in bfloat16; a no-op otherwise.
class Autocast {
 public:
  explicit Autocast(bool bf16) : enabled_(bf16) {
    if (!enabled_) return;
    previous_ = at::autocast::is_cpu_enabled();
    previous_dtype_ = at::autocast::get_autocast_cpu_dtype();
    at::autocast::set_cpu_enabled(true);
    at::autocast::set_autocast_cpu_dtype(at::kBFloat16);
    at::autocast::increment_nesting();
  }
  ~Autocast() {
    if (!enabled_) return;
    // The cast weights are cached for one forward pass only.
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_cpu_dtype(previous_dtype_);
    at::autocast::set_cpu_enabled(previous_);
  }
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;

 private:
  const bool enabled_;
  bool previous_ = false;
  at::ScalarType previous_dtype_ = at::kBFloat16;
};

// Batch norm's running statistics: what each rank accumulates from its own
// batches (and what SyncBuffers averages). Other buffers (a TorchScript
// module's constants) are the same on every rank and stay untouched.
std::vector<torch::Tensor> RunningStatistics(const torch::nn::Module& model) {
  std::vector<torch::Tensor> out;
  for (const auto& buffer : model.named_buffers()) {
    const std::string& name = buffer.key();
    if (buffer.value().scalar_type() == torch::kFloat32 &&
        (absl::EndsWith(name, "running_mean") ||
         absl::EndsWith(name, "running_var"))) {
      out.push_back(buffer.value());
    }
  }
  return out;
}

ModelOptions ModelOptionsOf(const v1::JobSpec& spec, int64_t rows,
                            int64_t cols) {
  ModelOptions options;
  options.name = spec.model().name();
  options.torchscript = spec.model().torchscript();
  options.dropout = spec.model().dropout();
  options.rows = rows;
  options.cols = cols;
  return options;
}

// A split as tensors: raw uint8 images [N, 1, H, W] (normalized per batch,
// which is cheaper than converting the whole set up front) and int64 labels.
struct TensorDataset {
  torch::Tensor images;
  torch::Tensor labels;
  int64_t rows = 0;
  int64_t cols = 0;
  // Pixel statistics (of [0, 1] values) the inputs are normalized with.
  float mean = kPixelMean;
  float std = kPixelStd;
  int64_t size() const { return labels.size(0); }
};

absl::StatusOr<TensorDataset> LoadSplit(const v1::DataSpec& spec, bool train) {
  // Decoding takes a second or two; a worker keeps it across generations.
  static absl::Mutex mu(absl::kConstInit);
  static auto* cache =
      new std::map<std::tuple<std::string, std::string, bool>, TensorDataset>;
  const auto key = std::make_tuple(spec.format(), spec.dir(), train);
  {
    absl::MutexLock lock(&mu);
    auto it = cache->find(key);
    if (it != cache->end()) return it->second;
  }
  const bool npy = spec.format() == "npy";
  ASSIGN_OR_RETURN(ImageDataset raw, npy ? LoadNpyDataset(spec.dir(), train)
                                         : LoadFashionMnist(spec.dir(), train));
  TensorDataset data;
  data.rows = raw.rows;
  data.cols = raw.cols;
  if (npy && !raw.pixels.empty()) {
    double sum = 0, sum_squares = 0;
    for (uint8_t p : raw.pixels) {
      sum += p;
      sum_squares += static_cast<double>(p) * p;
    }
    const double n = static_cast<double>(raw.pixels.size());
    const double mean = sum / n / 255.0;
    const double var = sum_squares / n / (255.0 * 255.0) - mean * mean;
    data.mean = static_cast<float>(mean);
    data.std = static_cast<float>(std::sqrt(std::max(var, 1e-12)));
  }
  // The tensor takes over the decoded bytes: no copy of the whole set.
  auto* pixels = new std::vector<uint8_t>(std::move(raw.pixels));
  data.images = torch::from_blob(
      pixels->data(), {raw.count, 1, raw.rows, raw.cols},
      [pixels](void*) { delete pixels; }, torch::kUInt8);
  data.labels = torch::from_blob(raw.labels.data(), {raw.count}, torch::kUInt8)
                    .to(torch::kInt64);
  absl::MutexLock lock(&mu);
  (*cache)[key] = data;
  return data;
}

// uint8 pixels to the normalized float inputs the models take.
torch::Tensor Normalize(const torch::Tensor& pixels, float mean, float std) {
  return pixels.to(torch::kFloat32)
      .mul_(1.0f / (255.0f * std))
      .sub_(mean / std);
}

std::unique_ptr<torch::optim::Optimizer> MakeOptimizer(
    const v1::OptimizerSpec& spec, std::vector<torch::Tensor> params) {
  if (spec.type() == "adam") {
    return std::make_unique<torch::optim::Adam>(
        params,
        torch::optim::AdamOptions(1e-3).weight_decay(spec.weight_decay()));
  }
  return std::make_unique<torch::optim::SGD>(
      params, torch::optim::SGDOptions(0.1)
                  .momentum(spec.momentum())
                  .weight_decay(spec.weight_decay()));
}

void SetLearningRate(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
}

}  // namespace

// Prepares the batches of the next steps on a background thread while the
// current step computes (DESIGN §4 order: the sampler's slice of each global
// batch for this rank, gathered and normalized). A bounded ring of `kDepth`
// reused tensors: no allocation per step, and the thread never runs more
// than kDepth steps ahead. Thread-safe between the training thread (Take,
// Release) and its own thread.
class Prefetcher {
 public:
  static constexpr int kDepth = 2;

  Prefetcher(const TensorDataset& data, uint64_t seed, const BatchPlan& plan,
             int rank, int64_t first_step, int64_t end_step)
      : data_(data),
        sampler_(seed, data.size(), plan, rank),
        next_(first_step),
        end_(end_step) {
    for (Slot& slot : slots_) {
      slot.images = torch::empty({plan.rank_batch(), 1, data.rows, data.cols});
      slot.labels = torch::empty({plan.rank_batch()}, torch::kInt64);
    }
    thread_ = std::thread([this] { Loop(); });
  }
  ~Prefetcher() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    changed_.notify_all();
    thread_.join();
  }

  // The batch of `step` (the next one not yet taken), once it is ready.
  // Valid until Release(step).
  std::pair<torch::Tensor, torch::Tensor> Take(int64_t step) {
    std::unique_lock<std::mutex> lock(mu_);
    Slot& slot = slots_[step % kDepth];
    changed_.wait(lock, [&] { return slot.ready && slot.step == step; });
    return {slot.images, slot.labels};
  }
  void Release(int64_t step) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      slots_[step % kDepth].ready = false;
    }
    changed_.notify_all();
  }

 private:
  struct Slot {
    int64_t step = -1;
    bool ready = false;
    torch::Tensor images;  // [rank batch, 1, H, W] float
    torch::Tensor labels;  // [rank batch] int64
  };

  void Loop() {
    while (true) {
      int64_t step;
      Slot* slot;
      {
        std::unique_lock<std::mutex> lock(mu_);
        changed_.wait(lock, [&] {
          return stopping_ || (next_ < end_ && !slots_[next_ % kDepth].ready);
        });
        if (stopping_) return;
        step = next_++;
        slot = &slots_[step % kDepth];
      }
      Fill(sampler_.RankBatch(step), *slot);
      {
        std::lock_guard<std::mutex> lock(mu_);
        slot->step = step;
        slot->ready = true;
      }
      changed_.notify_all();
    }
  }

  // Gathers and normalizes the samples: one pass over the bytes.
  void Fill(const std::vector<int64_t>& indices, Slot& slot) {
    const int64_t pixels = data_.rows * data_.cols;
    const uint8_t* images = data_.images.data_ptr<uint8_t>();
    const int64_t* labels = data_.labels.data_ptr<int64_t>();
    float* x = slot.images.data_ptr<float>();
    int64_t* y = slot.labels.data_ptr<int64_t>();
    const float scale = 1.0f / (255.0f * data_.std);
    const float shift = data_.mean / data_.std;
    for (size_t i = 0; i < indices.size(); ++i) {
      const uint8_t* src = images + indices[i] * pixels;
      float* dst = x + static_cast<int64_t>(i) * pixels;
      for (int64_t j = 0; j < pixels; ++j) dst[j] = src[j] * scale - shift;
      y[i] = labels[indices[i]];
    }
  }

  const TensorDataset& data_;
  GlobalSampler sampler_;  // used by the thread only
  std::mutex mu_;
  std::condition_variable changed_;
  std::array<Slot, kDepth> slots_;
  int64_t next_;
  const int64_t end_;
  bool stopping_ = false;
  std::thread thread_;
};

// The training state that survives generations.
struct TrainingRunner::Replica {
  std::string job_id;
  std::shared_ptr<Network> model;
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  int64_t step = 0;  // optimizer steps applied
  // The global batch the replica trains with, fixed once it has trained:
  // a generation on another world size re-slices it.
  int global_batch = 0;
  double last_loss = 0;
  double last_accuracy = 0;
  LossScaler scaler;  // fp16 only; holds the skipped-step count
};

namespace {

// Where a training step's time goes.
enum Phase { kData, kForward, kBackward, kExposedComm, kOptimizer, kPhases };

// Adds the time since the previous lap to a phase.
class Timer {
 public:
  explicit Timer(std::array<absl::Duration, kPhases>* phases)
      : phases_(phases), last_(absl::Now()) {}
  void Lap(Phase phase) {
    absl::Time now = absl::Now();
    (*phases_)[phase] += now - last_;
    last_ = now;
  }

 private:
  std::array<absl::Duration, kPhases>* phases_;
  absl::Time last_;
};

// One generation of one job on this rank.
class Generation {
 public:
  Generation(TaskContext& task, TrainingRunner::Replica& replica)
      : task_(task),
        replica_(replica),
        spec_(task.assignment.spec()),
        rank_(task.assignment.rank()),
        world_(task.assignment.world_size()) {}
  ~Generation() { task_.SetCommunicator(nullptr); }

  absl::StatusOr<v1::TaskResult> Run();

 private:
  absl::Status Setup();
  // Agrees on the most advanced rank and adopts its state; returns the rank
  // (-1 when nobody had progressed).
  absl::StatusOr<int> AdoptMostAdvancedState();
  absl::Status BroadcastState(int source);
  absl::Status CheckIdenticalInit();
  // Averages batch norm's running statistics over the ranks: each rank's
  // follow its own batches. Before evaluating and saving.
  absl::Status SyncBuffers();
  // Optimizer steps applied: the LR schedule's position.
  int64_t applied_steps() const {
    return replica_.step - replica_.scaler.skipped_steps();
  }
  // Loads a verified checkpoint into the replica (rank 0 only).
  absl::Status LoadCheckpoint(const checkpoint::Found& found);
  // The state at this step boundary, serialized to host memory.
  Snapshot MakeSnapshot() const;
  // The chief's work after the last step: export, then drop the backups.
  absl::Status Finalize();
  // One optimizer step; sets *stop when any rank asked to stop.
  absl::Status Step(bool* stop);
  absl::StatusOr<double> Evaluate(double* loss);
  void Report(bool force, std::optional<double> accuracy,
              std::optional<double> test_loss);

  absl::Status AllReduce(float* data, size_t count) {
    ++task_.collective_seq;
    return comm_->AllReduceSum(data, count);
  }
  absl::Status Broadcast(float* data, size_t count, int root) {
    ++task_.collective_seq;
    return comm_->Broadcast(data, count, root);
  }

  TaskContext& task_;
  TrainingRunner::Replica& replica_;
  const v1::JobSpec& spec_;
  const int rank_;
  const int world_;

  BatchPlan plan_;
  TensorDataset train_;
  TensorDataset test_;
  std::unique_ptr<Communicator> comm_;
  std::unique_ptr<Checkpointer> checkpointer_;  // null without backup_dir
  std::string restored_from_;  // the checkpoint this generation restored
  bool preempted_ = false;
  std::vector<torch::Tensor> params_;
  std::unique_ptr<LrSchedule> lr_;
  std::unique_ptr<GlobalSampler> sampler_;
  int64_t total_steps_ = 0;
  // Gradients of every parameter, then this rank's loss and stop vote.
  std::unique_ptr<GradientReducer> reducer_;
  std::unique_ptr<Prefetcher> prefetcher_;
  int64_t grad_elements_ = 0;
  bool bf16_ = false;
  // Batch norm's running statistics (the model's own buffers), and a copy
  // from before the current step's forward pass (see Step).
  std::vector<torch::Tensor> statistics_;
  std::vector<torch::Tensor> statistics_before_;

  // Progress reporting (chief).
  std::optional<int64_t> resumed_at_;
  int source_rank_ = -1;
  std::vector<std::string> warnings_;  // for the next report
  std::vector<float> pending_losses_;
  int64_t pending_first_step_ = 0;
  int64_t generation_first_step_ = 0;
  absl::Time last_report_ = absl::InfinitePast();
  absl::Time train_start_;
  absl::Duration eval_time_;
  std::array<absl::Duration, kPhases> phases_{};
  int64_t timed_steps_ = 0;
  int saves_ = 0;
  absl::Duration save_stall_;
};

absl::Status Generation::Setup() {
  const absl::Time start = absl::Now();
  if (spec_.communication().backend() == "nccl") {
    return absl::FailedPreconditionError(
        "the job asks for communication.backend \"nccl\", but this worker "
        "trains on the CPU; use \"gloo\" or \"auto\"");
  }
  if (spec_.precision() == "fp16") {
    return absl::FailedPreconditionError(absl::StrCat(
        "the job asks for precision \"fp16\", which needs a GPU, but worker "
        "rank ",
        rank_, " on ", task_.host,
        " trains on the CPU; use \"bf16\" (autocast on the CPU) or \"fp32\""));
  }
  bf16_ = spec_.precision() == "bf16";
  // A replacement worker loads its data while the ranks rendezvous: both
  // are on the critical path back to training.
  auto load = [data = spec_.data()](bool train) {
    return LoadSplit(data, train);
  };
  auto loading_train = std::async(std::launch::async, load, true);
  auto loading_test = std::async(std::launch::async, load, false);
  absl::Status connected = absl::OkStatus();
  if (world_ == 1) {
    comm_ = std::make_unique<SingleRankCommunicator>();
  } else {
    GlooCommunicator::Options options;
    options.rank = rank_;
    options.size = world_;
    options.host = task_.host;
    options.algorithm = spec_.communication().algorithm() == "ring"
                            ? GlooCommunicator::Algorithm::kRing
                            : GlooCommunicator::Algorithm::kDirect;
    auto comm = GlooCommunicator::Connect(task_.kv.get(), options);
    if (comm.ok()) comm_ = *std::move(comm);
    connected = comm.status();
  }
  const absl::Time rendezvous = absl::Now();
  auto train = loading_train.get();
  auto test = loading_test.get();
  RETURN_IF_ERROR(train.status());
  RETURN_IF_ERROR(test.status());
  RETURN_IF_ERROR(connected);
  train_ = *std::move(train);
  test_ = *std::move(test);
  if (test_.rows != train_.rows || test_.cols != train_.cols) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the test images in ", spec_.data().dir(), " are ", test_.rows, "x",
        test_.cols, " but the training images are ", train_.rows, "x",
        train_.cols));
  }
  // The test set is normalized with the training set's statistics.
  test_.mean = train_.mean;
  test_.std = train_.std;
  task_.SetCommunicator(comm_.get());
  const absl::Time loaded = absl::Now();

  if (replica_.model == nullptr) {
    torch::manual_seed(spec_.seed());
    ASSIGN_OR_RETURN(replica_.model, BuildModel(ModelOptionsOf(
                                         spec_, train_.rows, train_.cols)));
    LossScaler::Options scaling;
    scaling.initial_scale = spec_.loss_scale();
    scaling.growth_interval = spec_.loss_scale_growth_interval();
    replica_.scaler = LossScaler(spec_.precision() == "fp16", scaling);
    if (FailPointHit("perturb_initial_parameters")) {
      // Tests: a rank that built its model differently.
      torch::NoGradGuard no_grad;
      replica_.model->parameters()[0].add_(1e-3);
    }
    replica_.optimizer =
        MakeOptimizer(spec_.optimizer(), replica_.model->parameters());
  }
  replica_.model->train();
  params_ = replica_.model->parameters();
  grad_elements_ = 0;
  for (const torch::Tensor& p : params_) grad_elements_ += p.numel();
  const v1::CheckpointSpec& ckpt = spec_.checkpoint();
  if (!ckpt.backup_dir().empty()) {
    checkpointer_ =
        std::make_unique<Checkpointer>(task_, ckpt.backup_dir(), ckpt.keep());
  }
  ASSIGN_OR_RETURN(source_rank_, AdoptMostAdvancedState());
  // Loading state replaces the buffers' contents, not the buffers.
  statistics_ = RunningStatistics(*replica_.model);
  statistics_before_.clear();
  for (const torch::Tensor& t : statistics_) {
    statistics_before_.push_back(torch::empty_like(t));
  }
  if (replica_.global_batch > 0) {
    // A resumed job keeps its global batch on any world size.
    ASSIGN_OR_RETURN(
        plan_,
        ResumeBatch(replica_.global_batch, world_, spec_.accumulation_steps(),
                    restored_from_.empty()
                        ? std::string("the job")
                        : absl::StrCat("checkpoint ", restored_from_)));
  } else {
    ASSIGN_OR_RETURN(plan_, ResolveBatch(spec_, world_));
  }
  replica_.global_batch = plan_.global;
  if (rank_ == 0 && replica_.model->has_batch_norm() &&
      plan_.per_replica < kSmallBatchNormBatch) {
    warnings_.push_back(absl::StrCat(
        "the model has batch norm and each replica normalizes over its own ",
        plan_.per_replica, " samples per forward pass (per-replica batch",
        plan_.accumulation > 1 ? " of one micro-batch" : "", "); below ",
        kSmallBatchNormBatch,
        " the batch statistics are noisy and the results differ from a run "
        "with fewer, larger replicas at the same global batch; raise "
        "per_replica_batch_size, use fewer workers, or a model without "
        "batch norm"));
    LogWarning(warnings_.back());
  }
  if (train_.size() < plan_.global) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the training set has ", train_.size(),
        " samples, fewer than one global batch of ", plan_.global));
  }
  GradientReducer::Options reducer;
  reducer.bucket_bytes =
      static_cast<size_t>(spec_.communication().bucket_mb() * (1 << 20));
  reducer.first_bucket_bytes =
      std::min(reducer.first_bucket_bytes, reducer.bucket_bytes);
  reducer.overlap = spec_.communication().overlap();
  reducer.accumulate = plan_.accumulation > 1;
  reducer_ = std::make_unique<GradientReducer>(params_, comm_.get(), reducer);
  LogInfo(
      "generation ", task_.assignment.generation(), " set up in ",
      absl::FormatDuration(
          absl::Trunc(absl::Now() - start, absl::Milliseconds(1))),
      " (rendezvous ",
      absl::FormatDuration(
          absl::Trunc(rendezvous - start, absl::Milliseconds(1))),
      ", data ready after ",
      absl::FormatDuration(absl::Trunc(loaded - start, absl::Milliseconds(1))),
      ")");

  sampler_ = std::make_unique<GlobalSampler>(spec_.seed(), train_.size(), plan_,
                                             rank_);
  total_steps_ = sampler_->steps_per_epoch() * spec_.epochs();
  if (spec_.max_steps() > 0) {
    total_steps_ = std::min(total_steps_, spec_.max_steps());
  }
  lr_ = std::make_unique<LrSchedule>(spec_, plan_.global, total_steps_);
  prefetcher_ = std::make_unique<Prefetcher>(train_, spec_.seed(), plan_, rank_,
                                             replica_.step, total_steps_);
  resumed_at_ = replica_.step;
  pending_first_step_ = replica_.step;
  generation_first_step_ = replica_.step;
  if (rank_ == 0) {
    LogInfo(
        "job ", task_.assignment.job_id(), " generation ",
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
        source_rank_ >= 0
            ? absl::StrCat(" with rank ", source_rank_, "'s state")
            : "",
        restored_from_.empty() ? "" : absl::StrCat(" from ", restored_from_));
  }
  return absl::OkStatus();
}

absl::StatusOr<int> Generation::AdoptMostAdvancedState() {
  // Every rank says which step it applied last. A step some rank applied had
  // a complete all-reduce, so the most advanced state is legitimate. Rank 0
  // adds the step of the newest checkpoint folder (not yet verified).
  std::vector<float> steps(2 * static_cast<size_t>(world_) + 2, 0.0f);
  steps[2 * rank_] = static_cast<float>(replica_.step / kHalf);
  steps[2 * rank_ + 1] = static_cast<float>(replica_.step % kHalf);
  if (rank_ == 0 && checkpointer_ != nullptr) {
    const int64_t newest = checkpoint::NewestStep(checkpointer_->backup_dir());
    steps[2 * world_] = static_cast<float>(newest / kHalf);
    steps[2 * world_ + 1] = static_cast<float>(newest % kHalf);
  }
  RETURN_IF_ERROR(AllReduce(steps.data(), steps.size()));
  auto step_at = [&](int slot) {
    return static_cast<int64_t>(steps[2 * slot]) * kHalf +
           static_cast<int64_t>(steps[2 * slot + 1]);
  };
  int source = 0;
  int64_t best = -1;
  for (int r = 0; r < world_; ++r) {
    if (step_at(r) > best) {
      best = step_at(r);
      source = r;
    }
  }
  if (step_at(world_) > best) {
    // Maybe no rank holds state as recent as the newest checkpoint (every
    // worker was lost, or the job was submitted again). Rank 0 verifies the
    // newer checkpoints, newest first, and says which one it restored.
    float restored[2] = {0, 0};
    if (rank_ == 0) {
      auto found = checkpoint::FindNewest(
          checkpointer_->backup_dir(),
          [](const std::string& name, const absl::Status& why) {
            LogWarning("skipping checkpoint ", name, ": ", why.message());
          },
          best);
      if (found.ok()) {
        RETURN_IF_ERROR(LoadCheckpoint(*found));
        restored[0] = static_cast<float>(found->manifest.step() / kHalf);
        restored[1] = static_cast<float>(found->manifest.step() % kHalf);
      } else if (!absl::IsNotFound(found.status())) {
        LogWarning("cannot restore a checkpoint: ", found.status().message());
      }
    }
    RETURN_IF_ERROR(Broadcast(restored, 2, 0));
    const int64_t restored_step = static_cast<int64_t>(restored[0]) * kHalf +
                                  static_cast<int64_t>(restored[1]);
    if (restored_step > 0) {
      RETURN_IF_ERROR(BroadcastState(0));
      replica_.step = restored_step;
      restored_from_ = checkpoint::CheckpointName(restored_step);
      return -1;
    }
  }
  if (best == 0) {
    // Nobody trained yet: every rank holds the seeded initial state.
    RETURN_IF_ERROR(CheckIdenticalInit());
    return -1;
  }
  RETURN_IF_ERROR(BroadcastState(source));
  replica_.step = best;
  return source;
}

absl::Status Generation::BroadcastState(int source) {
  std::string bytes;
  if (rank_ == source) {
    torch::serialize::OutputArchive archive;
    replica_.model->save(archive);
    torch::serialize::OutputArchive optimizer;
    replica_.optimizer->save(optimizer);
    archive.write("optimizer", optimizer);
    std::ostringstream out;
    archive.save_to(out);
    bytes = out.str();
  }
  const LossScaler& scaler = replica_.scaler;
  float header[6] = {
      static_cast<float>(bytes.size() / kHalf),
      static_cast<float>(bytes.size() % kHalf),
      static_cast<float>(replica_.global_batch),
      static_cast<float>(scaler.scale()),  // a power of two: exact
      static_cast<float>(scaler.good_steps()),
      static_cast<float>(scaler.skipped_steps())};
  RETURN_IF_ERROR(Broadcast(header, 6, source));
  size_t length =
      static_cast<size_t>(header[0]) * kHalf + static_cast<size_t>(header[1]);
  replica_.global_batch = static_cast<int>(header[2]);
  replica_.scaler.Restore(header[3], static_cast<int>(header[4]),
                          static_cast<int64_t>(header[5]));
  std::vector<float> buffer((length + sizeof(float) - 1) / sizeof(float));
  if (rank_ == source) std::memcpy(buffer.data(), bytes.data(), length);
  RETURN_IF_ERROR(Broadcast(buffer.data(), buffer.size(), source));
  if (rank_ == source) return absl::OkStatus();
  std::istringstream in(
      std::string(reinterpret_cast<const char*>(buffer.data()), length));
  torch::serialize::InputArchive archive;
  archive.load_from(in);
  replica_.model->load(archive);
  torch::serialize::InputArchive optimizer;
  archive.read("optimizer", optimizer);
  replica_.optimizer->load(optimizer);
  params_ = replica_.model->parameters();
  return absl::OkStatus();
}

absl::Status Generation::LoadCheckpoint(const checkpoint::Found& found) {
  const v1::Manifest& manifest = found.manifest;
  const std::string name = checkpoint::CheckpointName(manifest.step());
  auto read = [&](const std::string& file) {
    return ReadFileToString(absl::StrCat(found.dir, "/", file));
  };
  ASSIGN_OR_RETURN(std::string trainer_json, read("trainer.state"));
  v1::TrainerState state;
  RETURN_IF_ERROR(checkpoint::FromJson(
      trainer_json, absl::StrCat(found.dir, "/trainer.state"), &state));
  const std::string label =
      ModelLabel(ModelOptionsOf(spec_, train_.rows, train_.cols));
  if (state.model() != label || state.seed() != spec_.seed()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint ", found.dir, " holds model \"", state.model(),
        "\" trained with seed ", state.seed(), ", but the job trains \"", label,
        "\" with seed ", spec_.seed(),
        "; give the job its own checkpoint.backup_dir, or resume it with "
        "the same model and seed"));
  }
  ASSIGN_OR_RETURN(std::string model_bytes, read("model.pt"));
  ASSIGN_OR_RETURN(std::string optimizer_bytes, read("optimizer.pt"));
  try {
    torch::serialize::InputArchive model;
    std::istringstream model_in(model_bytes);
    model.load_from(model_in);
    replica_.model->load(model);
    torch::serialize::InputArchive optimizer;
    std::istringstream optimizer_in(optimizer_bytes);
    optimizer.load_from(optimizer_in);
    replica_.optimizer->load(optimizer);
  } catch (const std::exception& e) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint ", found.dir, " verifies but does not load into model \"",
        label, "\" with optimizer \"", spec_.optimizer().type(),
        "\": ", e.what()));
  }
  params_ = replica_.model->parameters();
  replica_.step = manifest.step();
  replica_.global_batch = state.global_batch_size();
  replica_.scaler.Restore(state.loss_scale(), state.loss_scale_good_steps(),
                          state.skipped_steps());
  LogInfo("restored ", name, " (step ", manifest.step(), ", generation ",
          manifest.generation(), ", ", manifest.world_size(),
          " workers, global batch ", state.global_batch_size(), ")");
  return absl::OkStatus();
}

Snapshot Generation::MakeSnapshot() const {
  Snapshot snapshot;
  const int64_t step = replica_.step;
  const int64_t per_epoch = sampler_->steps_per_epoch();
  snapshot.step = step;
  snapshot.epoch = static_cast<int32_t>(step / per_epoch);
  v1::RankState rank;
  rank.set_rank(rank_);
  rank.set_world_size(world_);
  rank.set_step(step);
  rank.set_epoch(snapshot.epoch);
  rank.set_epoch_position((step % per_epoch) * plan_.global +
                          int64_t{rank_} * plan_.per_replica);
  rank.set_per_replica_batch_size(plan_.per_replica);
  rank.set_generator_seed(StepSeed(spec_.seed(), rank_, step));
  if (rank_ == 0) {
    v1::TrainerState state;
    state.set_step(step);
    state.set_epoch(snapshot.epoch);
    state.set_global_batch_size(plan_.global);
    state.set_samples_seen(step * plan_.global);
    const std::string label =
        ModelLabel(ModelOptionsOf(spec_, train_.rows, train_.cols));
    state.set_next_lr(lr_->At(applied_steps()));
    state.set_loss_scale(replica_.scaler.scale());
    state.set_loss_scale_good_steps(replica_.scaler.good_steps());
    state.set_skipped_steps(replica_.scaler.skipped_steps());
    state.set_model(label);
    state.set_seed(spec_.seed());
    torch::serialize::OutputArchive optimizer;
    replica_.optimizer->save(optimizer);
    std::ostringstream optimizer_out;
    optimizer.save_to(optimizer_out);
    snapshot.files.emplace_back("model.pt", SerializeModel(*replica_.model));
    snapshot.files.emplace_back("optimizer.pt", optimizer_out.str());
    snapshot.files.emplace_back("trainer.state", checkpoint::ToJson(state));
    v1::Manifest& manifest = snapshot.manifest;
    manifest.set_job_id(task_.assignment.job_id());
    manifest.set_job_name(spec_.name());
    manifest.set_step(step);
    manifest.set_epoch(snapshot.epoch);
    manifest.set_generation(task_.assignment.generation());
    manifest.set_world_size(world_);
    manifest.set_global_batch_size(plan_.global);
    manifest.set_model(label);
    manifest.set_seed(spec_.seed());
  }
  snapshot.files.emplace_back(checkpoint::RankStateName(rank_),
                              checkpoint::ToJson(rank));
  return snapshot;
}

absl::Status Generation::Finalize() {
  if (checkpointer_ != nullptr) (void)checkpointer_->Wait();
  if (rank_ != 0) return absl::OkStatus();
  const std::string& path = spec_.export_path();
  if (!path.empty()) {
    size_t slash = path.find_last_of('/');
    if (slash != std::string::npos && slash > 0) {
      RETURN_IF_ERROR(MakeDirectories(path.substr(0, slash)));
    }
    auto bytes = replica_.model->Export();
    absl::Status exported =
        bytes.ok() ? WriteFileAtomically(path, *bytes) : bytes.status();
    if (!exported.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "the job trained to the end but the final model could not be "
          "exported: ",
          exported.message(),
          checkpointer_ ? "; the checkpoints in checkpoint.backup_dir are kept"
                        : ""));
    }
    LogInfo("exported the final model to ", path);
  }
  if (checkpointer_ != nullptr && !spec_.checkpoint().keep_backups()) {
    absl::Status removed = checkpoint::RemoveAll(checkpointer_->backup_dir());
    if (!removed.ok()) {
      LogWarning("could not remove the checkpoints after success: ",
                 removed.message());
    }
  }
  return absl::OkStatus();
}

absl::Status Generation::CheckIdenticalInit() {
  // Rank 0's initial parameters are broadcast and compared bit for bit: a
  // mismatch means the ranks run different code or seeds (DDP checks this
  // too), and training would silently diverge.
  std::vector<float> local(static_cast<size_t>(grad_elements_));
  size_t offset = 0;
  for (const torch::Tensor& p : params_) {
    std::memcpy(local.data() + offset, p.data_ptr<float>(),
                p.numel() * sizeof(float));
    offset += p.numel();
  }
  std::vector<float> root = local;
  RETURN_IF_ERROR(Broadcast(root.data(), root.size(), 0));
  if (std::memcmp(root.data(), local.data(), local.size() * sizeof(float)) !=
      0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", rank_,
        " initial parameters differ from rank 0's; every worker must run the "
        "same lockstep-worker build and job spec"));
  }
  return absl::OkStatus();
}

absl::Status Generation::Step(bool* stop) {
  Timer timer(&phases_);
  const int64_t step = replica_.step;
  auto [images, labels] = prefetcher_->Take(step);
  timer.Lap(kData);
  const int accumulation = plan_.accumulation;
  torch::optim::Optimizer& optimizer = *replica_.optimizer;
  optimizer.zero_grad();
  Network& model = *replica_.model;
  LossScaler& scaler = replica_.scaler;
  // Dropout masks: a function of (seed, rank, step), whoever runs the step.
  torch::manual_seed(StepSeed(spec_.seed(), rank_, step));
  // A failed step leaves the replica as it was: batch norm's running
  // statistics, which the forward pass updates, are put back too.
  for (size_t i = 0; i < statistics_.size(); ++i) {
    statistics_before_[i].copy_(statistics_[i]);
  }
  // Micro-batches: their gradients add up in .grad (each loss divided by
  // their number, so the sum is the mean over this rank's samples), and only
  // the last one's backward communicates.
  float local_loss = 0;
  for (int micro = 0; micro < accumulation; ++micro) {
    const int64_t begin = int64_t{micro} * plan_.per_replica;
    torch::Tensor features;
    {
      Autocast autocast(bf16_);
      features = model.Features(images.narrow(0, begin, plan_.per_replica));
    }
    // The output layer and the loss in fp32.
    torch::Tensor loss = torch::nn::functional::cross_entropy(
        model.Logits(features), labels.narrow(0, begin, plan_.per_replica));
    if (accumulation > 1) loss = loss / accumulation;
    local_loss += loss.item<float>();
    if (scaler.enabled()) loss = loss * scaler.scale();
    timer.Lap(kForward);
    if (micro == accumulation - 1) {
      // Gradients are reduced bucket by bucket while backward runs. Nothing
      // of this step is applied unless every bucket's all-reduce completes,
      // so a failed step leaves the replica at the previous one.
      ++task_.collective_seq;
      reducer_->Prepare(local_loss, task_.preempt_requested ? kPreemptVote
                                    : task_.stop_requested  ? 1.0f
                                                            : 0.0f);
    }
    loss.backward();
    timer.Lap(kBackward);
  }
  prefetcher_->Release(step);
  float loss_sum = 0, stop_votes = 0;
  absl::Status reduced = reducer_->Finish(&loss_sum, &stop_votes);
  if (!reduced.ok()) {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < statistics_.size(); ++i) {
      statistics_[i].copy_(statistics_before_[i]);
    }
    return reduced;
  }
  timer.Lap(kExposedComm);
  replica_.last_loss = loss_sum / world_;
  *stop = stop_votes > 0;
  preempted_ = stop_votes >= kPreemptVote;
  bool apply = true;
  if (scaler.enabled()) {
    // Every rank holds the same averaged gradients: an overflow on any rank
    // is an inf/nan here on all of them, and they all decide alike.
    bool finite = true;
    for (const torch::Tensor& p : params_) {
      if (p.grad().defined() && !torch::isfinite(p.grad()).all().item<bool>()) {
        finite = false;
        break;
      }
    }
    if (finite) {
      for (const torch::Tensor& p : params_) {
        if (p.grad().defined()) p.mutable_grad().mul_(1.0 / scaler.scale());
      }
    }
    apply = scaler.Update(finite);
    if (!apply) {
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
    }
  }
  if (apply) {
    if (spec_.clip_grad_norm() > 0) {
      // The averaged gradients are the same on every rank, so is the clip.
      torch::nn::utils::clip_grad_norm_(params_, spec_.clip_grad_norm());
    }
    SetLearningRate(optimizer, lr_->At(applied_steps()));
    optimizer.step();
  }
  timer.Lap(kOptimizer);
  ++replica_.step;
  ++timed_steps_;
  return absl::OkStatus();
}

absl::Status Generation::SyncBuffers() {
  if (world_ == 1 || statistics_.empty()) return absl::OkStatus();
  std::vector<torch::Tensor> flat;
  for (const torch::Tensor& buffer : statistics_) {
    flat.push_back(buffer.reshape({-1}));
  }
  torch::NoGradGuard no_grad;
  torch::Tensor all = torch::cat(flat);
  RETURN_IF_ERROR(AllReduce(all.data_ptr<float>(), all.numel()));
  all.div_(world_);
  int64_t offset = 0;
  for (torch::Tensor& buffer : statistics_) {
    buffer.copy_(all.narrow(0, offset, buffer.numel()).view_as(buffer));
    offset += buffer.numel();
  }
  return absl::OkStatus();
}

absl::StatusOr<double> Generation::Evaluate(double* loss) {
  RETURN_IF_ERROR(SyncBuffers());
  torch::NoGradGuard no_grad;
  Network& model = *replica_.model;
  model.eval();
  int64_t n = test_.size();
  int64_t begin = n * rank_ / world_;
  int64_t end = n * (rank_ + 1) / world_;
  double correct = 0;
  double loss_sum = 0;
  for (int64_t i = begin; i < end; i += kEvalBatch) {
    int64_t stop = std::min(end, i + kEvalBatch);
    torch::Tensor features;
    {
      Autocast autocast(bf16_);
      features = model.Features(
          Normalize(test_.images.slice(0, i, stop), test_.mean, test_.std));
    }
    torch::Tensor logits = model.Logits(features);
    torch::Tensor labels = test_.labels.slice(0, i, stop);
    correct += logits.argmax(1).eq(labels).sum().item<double>();
    loss_sum += torch::nn::functional::cross_entropy(
                    logits, labels,
                    torch::nn::functional::CrossEntropyFuncOptions().reduction(
                        torch::kSum))
                    .item<double>();
  }
  model.train();
  float totals[2] = {static_cast<float>(correct), static_cast<float>(loss_sum)};
  RETURN_IF_ERROR(AllReduce(totals, 2));
  *loss = totals[1] / n;
  return totals[0] / n;
}

void Generation::Report(bool force, std::optional<double> accuracy,
                        std::optional<double> test_loss) {
  if (rank_ != 0) return;
  pending_losses_.push_back(static_cast<float>(replica_.last_loss));
  absl::Time now = absl::Now();
  const int64_t step = replica_.step;
  bool due = spec_.log_every_steps() > 0
                 ? step % spec_.log_every_steps() == 0
                 : now - last_report_ >= absl::Seconds(1);
  if (!due && !force && !resumed_at_.has_value()) return;
  v1::ProgressReport report;
  report.set_job_id(task_.assignment.job_id());
  report.set_generation(task_.assignment.generation());
  report.set_step(step);
  report.set_epoch(static_cast<int>((step - 1) / sampler_->steps_per_epoch()));
  report.set_total_steps(total_steps_);
  report.set_first_step(pending_first_step_);
  for (float loss : pending_losses_) report.add_step_losses(loss);
  for (std::string& warning : warnings_) {
    report.add_warnings(std::move(warning));
  }
  warnings_.clear();
  double seconds = absl::ToDoubleSeconds(now - train_start_ - eval_time_);
  int64_t steps_here = step - generation_first_step_;
  if (seconds > 0) {
    report.set_samples_per_second(static_cast<double>(steps_here) *
                                  plan_.global / seconds);
  }
  if (accuracy) report.set_test_accuracy(*accuracy);
  if (test_loss) report.set_test_loss(*test_loss);
  if (resumed_at_.has_value()) {
    report.set_resumed_at_step(*resumed_at_);
    report.set_state_source_rank(source_rank_);
    report.set_restored_checkpoint(restored_from_);
    v1::TrainingPlan* plan = report.mutable_plan();
    plan->set_replicas(world_);
    plan->set_per_replica_batch_size(plan_.per_replica);
    plan->set_global_batch_size(plan_.global);
    plan->set_steps_per_epoch(
        static_cast<int32_t>(sampler_->steps_per_epoch()));
    plan->set_total_steps(total_steps_);
    plan->set_base_lr(lr_->base_lr());
    plan->set_scaled_lr(lr_->scaled_lr());
    plan->set_lr_scaling(spec_.lr_scaling());
    plan->set_warmup_steps(spec_.warmup_steps());
    resumed_at_.reset();
  }
  task_.report(report);
  pending_losses_.clear();
  pending_first_step_ = step;
  last_report_ = now;
}

absl::StatusOr<v1::TaskResult> Generation::Run() {
  RETURN_IF_ERROR(Setup());
  train_start_ = absl::Now();
  const int64_t first_step = replica_.step;
  bool stop = false;
  while (replica_.step < total_steps_ && !stop) {
    if (task_.aborted()) {
      return absl::AbortedError("the generation was aborted");
    }
    RETURN_IF_ERROR(Step(&stop));
    const int64_t step = replica_.step;
    bool epoch_end = step % sampler_->steps_per_epoch() == 0;
    bool last = step == total_steps_ || stop;
    std::optional<double> eval_accuracy, eval_loss;
    if (epoch_end || last) {
      absl::Time eval_start = absl::Now();
      double loss = 0;
      ASSIGN_OR_RETURN(replica_.last_accuracy, Evaluate(&loss));
      eval_time_ += absl::Now() - eval_start;
      eval_accuracy = replica_.last_accuracy;
      eval_loss = loss;
      if (rank_ == 0) {
        LogInfo("epoch ", (step - 1) / sampler_->steps_per_epoch() + 1,
                " step ", step, "/", total_steps_, ": loss ",
                replica_.last_loss, ", test accuracy ", replica_.last_accuracy,
                ", test loss ", loss);
      }
    }
    Report(epoch_end || last, eval_accuracy, eval_loss);
    if (checkpointer_ == nullptr || step == total_steps_) continue;
    const v1::CheckpointSpec& ckpt = spec_.checkpoint();
    // Stopped or preempted: save this step before leaving, so the job
    // resumes exactly here.
    const bool save =
        stop ||
        (ckpt.save_every_steps() > 0 && step % ckpt.save_every_steps() == 0) ||
        (ckpt.save_every_epoch() && epoch_end);
    if (!save) continue;
    const absl::Time save_start = absl::Now();
    RETURN_IF_ERROR(SyncBuffers());
    checkpointer_->SaveAsync(MakeSnapshot());
    if (stop || !ckpt.async()) (void)checkpointer_->Wait();
    save_stall_ += absl::Now() - save_start;
    ++saves_;
  }
  if (!stop) RETURN_IF_ERROR(Finalize());
  double seconds =
      absl::ToDoubleSeconds(absl::Now() - train_start_ - eval_time_);
  v1::TaskResult result;
  result.set_ok(true);
  result.set_stopped(stop);
  result.set_preempted(preempted_);
  result.set_steps(replica_.step);
  result.set_final_loss(replica_.last_loss);
  result.set_test_accuracy(replica_.last_accuracy);
  int64_t trained = replica_.step - first_step;
  result.set_samples_per_second(seconds > 0 ? trained * plan_.global / seconds
                                            : 0);
  result.set_model_digest(ModelDigest(*replica_.model));
  if (timed_steps_ > 0) {
    auto mean_ms = [&](Phase phase) {
      return absl::ToDoubleMilliseconds(phases_[phase]) / timed_steps_;
    };
    v1::StepBreakdown* breakdown = result.mutable_breakdown();
    breakdown->set_data_ms(mean_ms(kData));
    breakdown->set_forward_ms(mean_ms(kForward));
    breakdown->set_backward_ms(mean_ms(kBackward));
    breakdown->set_exposed_comm_ms(mean_ms(kExposedComm));
    breakdown->set_optimizer_ms(mean_ms(kOptimizer));
    breakdown->set_saves(saves_);
    if (saves_ > 0) {
      breakdown->set_save_stall_ms(absl::ToDoubleMilliseconds(save_stall_) /
                                   saves_);
    }
  }
  return result;
}

}  // namespace

TrainingRunner::TrainingRunner() = default;
TrainingRunner::~TrainingRunner() = default;

v1::TaskResult TrainingRunner::Run(TaskContext& task) {
  const v1::Assignment& assignment = task.assignment;
  if (replica_ == nullptr || replica_->job_id != assignment.job_id()) {
    // A new job: the previous job's replica is no longer needed.
    replica_ = std::make_unique<Replica>();
    replica_->job_id = assignment.job_id();
  }
  absl::StatusOr<v1::TaskResult> result;
  try {
    Generation generation(task, *replica_);
    result = generation.Run();
  } catch (const std::exception& e) {
    result = absl::InternalError(absl::StrCat("LibTorch error: ", e.what()));
  }
  v1::TaskResult out;
  if (result.ok()) {
    out = *std::move(result);
  } else {
    out.set_ok(false);
    out.set_code(static_cast<int>(result.status().code()));
    out.set_error(std::string(result.status().message()));
    LogError("job ", assignment.job_id(), " generation ",
             assignment.generation(), " ended on rank ", assignment.rank(),
             " after step ", replica_->step, ": ", result.status().message());
  }
  out.set_job_id(assignment.job_id());
  out.set_generation(assignment.generation());
  out.set_rank(assignment.rank());
  return out;
}

}  // namespace lockstep::worker
