#include "worker/train/trainer.h"

#include <torch/torch.h>

#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/job_spec.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "worker/collective/gloo_communicator.h"
#include "worker/data/idx.h"
#include "worker/data/sampler.h"
#include "worker/train/lr_schedule.h"
#include "worker/train/model.h"

namespace lockstep::worker {
namespace {

// Fashion-MNIST's pixel mean and standard deviation over the training set.
constexpr float kPixelMean = 0.2860f;
constexpr float kPixelStd = 0.3530f;
constexpr int64_t kEvalBatch = 1000;

// A split as tensors: normalized images [N, 1, H, W] and int64 labels [N].
struct TensorDataset {
  torch::Tensor images;
  torch::Tensor labels;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t size() const { return labels.size(0); }
};

absl::StatusOr<TensorDataset> LoadSplit(const std::string& dir, bool train) {
  // Decoding is a second or two; a worker that runs several jobs keeps it.
  static absl::Mutex mu(absl::kConstInit);
  static auto* cache =
      new std::map<std::pair<std::string, bool>, TensorDataset>;
  absl::MutexLock lock(&mu);
  auto it = cache->find({dir, train});
  if (it != cache->end()) return it->second;
  ASSIGN_OR_RETURN(ImageDataset raw, LoadFashionMnist(dir, train));
  TensorDataset data;
  data.rows = raw.rows;
  data.cols = raw.cols;
  data.images =
      torch::from_blob(raw.pixels.data(), {raw.count, 1, raw.rows, raw.cols},
                       torch::kUInt8)
          .to(torch::kFloat32)
          .div_(255.0f)
          .sub_(kPixelMean)
          .div_(kPixelStd);
  data.labels = torch::from_blob(raw.labels.data(), {raw.count}, torch::kUInt8)
                    .to(torch::kInt64);
  (*cache)[{dir, train}] = data;
  return data;
}

std::unique_ptr<torch::optim::Optimizer> MakeOptimizer(
    const v1::OptimizerSpec& spec, std::vector<torch::Tensor> params,
    double lr) {
  if (spec.type() == "adam") {
    return std::make_unique<torch::optim::Adam>(
        params,
        torch::optim::AdamOptions(lr).weight_decay(spec.weight_decay()));
  }
  return std::make_unique<torch::optim::SGD>(
      params, torch::optim::SGDOptions(lr)
                  .momentum(spec.momentum())
                  .weight_decay(spec.weight_decay()));
}

void SetLearningRate(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
}

class Trainer {
 public:
  explicit Trainer(TaskContext& task)
      : task_(task),
        spec_(task.assignment.spec()),
        rank_(task.assignment.rank()),
        world_(task.assignment.world_size()) {}

  absl::StatusOr<v1::TaskResult> Run();

 private:
  absl::Status Setup();
  absl::Status CheckIdenticalInit();
  // One optimizer step; sets *stop when any rank asked to stop.
  absl::Status Step(int64_t step, bool* stop);
  absl::StatusOr<double> Evaluate(double* loss);
  void MaybeReport(int64_t step, bool force, std::optional<double> accuracy,
                   std::optional<double> test_loss);

  TaskContext& task_;
  const v1::JobSpec& spec_;
  const int rank_;
  const int world_;

  BatchPlan plan_;
  TensorDataset train_;
  TensorDataset test_;
  std::unique_ptr<Communicator> comm_;
  torch::nn::Sequential model_{nullptr};
  std::vector<torch::Tensor> params_;
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::unique_ptr<LrSchedule> lr_;
  std::unique_ptr<GlobalSampler> sampler_;
  int64_t total_steps_ = 0;
  // Gradients of every parameter, then this rank's loss and stop vote.
  std::vector<float> flat_;
  int64_t grad_elements_ = 0;

  // Progress reporting (chief).
  std::vector<float> pending_losses_;
  int64_t pending_first_step_ = 0;
  absl::Time last_report_ = absl::InfinitePast();
  absl::Time train_start_;
  absl::Duration eval_time_;
  double last_loss_ = 0;
};

absl::Status Trainer::Setup() {
  ASSIGN_OR_RETURN(plan_, ResolveBatch(spec_, world_));
  ASSIGN_OR_RETURN(train_, LoadSplit(spec_.data().dir(), /*train=*/true));
  ASSIGN_OR_RETURN(test_, LoadSplit(spec_.data().dir(), /*train=*/false));
  if (train_.size() < plan_.global) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the training set has ", train_.size(),
        " samples, fewer than one global batch of ", plan_.global));
  }
  if (world_ == 1) {
    comm_ = std::make_unique<SingleRankCommunicator>();
  } else {
    GlooCommunicator::Options options;
    options.rank = rank_;
    options.size = world_;
    options.host = task_.host;
    ASSIGN_OR_RETURN(comm_, GlooCommunicator::Connect(task_.kv.get(), options));
  }

  torch::manual_seed(spec_.seed());
  ASSIGN_OR_RETURN(model_, BuildModel(spec_.model(), train_.rows, train_.cols));
  params_ = model_->parameters();
  for (const torch::Tensor& p : params_) grad_elements_ += p.numel();
  flat_.resize(static_cast<size_t>(grad_elements_) + 2);
  RETURN_IF_ERROR(CheckIdenticalInit());

  lr_ = std::make_unique<LrSchedule>(spec_, plan_.global);
  optimizer_ = MakeOptimizer(spec_.optimizer(), params_, lr_->At(0));
  sampler_ = std::make_unique<GlobalSampler>(spec_.seed(), train_.size(), plan_,
                                             rank_);
  total_steps_ = sampler_->steps_per_epoch() * spec_.epochs();
  if (spec_.max_steps() > 0) {
    total_steps_ = std::min(total_steps_, spec_.max_steps());
  }
  if (rank_ == 0) {
    LogInfo("job ", task_.assignment.job_id(), ": ", world_,
            " replicas x per-replica batch ", plan_.per_replica,
            " = global batch ", plan_.global, "; ", sampler_->steps_per_epoch(),
            " steps/epoch, ", total_steps_, " steps; lr ", lr_->base_lr(),
            " scaled (", spec_.lr_scaling(), ") to ", lr_->scaled_lr(),
            " over ", spec_.warmup_steps(), " warmup steps");
  }
  return absl::OkStatus();
}

absl::Status Trainer::CheckIdenticalInit() {
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
  RETURN_IF_ERROR(comm_->Broadcast(root.data(), root.size(), 0));
  if (std::memcmp(root.data(), local.data(), local.size() * sizeof(float)) !=
      0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", rank_,
        " initial parameters differ from rank 0's; every "
        "worker must run the same lockstep-worker build and job spec"));
  }
  return absl::OkStatus();
}

absl::Status Trainer::Step(int64_t step, bool* stop) {
  const std::vector<int64_t>& batch = sampler_->RankBatch(step);
  torch::Tensor index =
      torch::from_blob(const_cast<int64_t*>(batch.data()),
                       {static_cast<int64_t>(batch.size())}, torch::kInt64);
  torch::Tensor x = train_.images.index_select(0, index);
  torch::Tensor y = train_.labels.index_select(0, index);

  optimizer_->zero_grad();
  torch::Tensor loss =
      torch::nn::functional::cross_entropy(model_->forward(x), y);
  loss.backward();

  float* out = flat_.data();
  for (const torch::Tensor& p : params_) {
    torch::Tensor g = p.grad();
    std::memcpy(out, g.data_ptr<float>(), g.numel() * sizeof(float));
    out += g.numel();
  }
  out[0] = loss.item<float>();
  out[1] = task_.stop_requested ? 1.0f : 0.0f;
  RETURN_IF_ERROR(comm_->AllReduceSum(flat_.data(), flat_.size()));

  const float inv_world = 1.0f / static_cast<float>(world_);
  const float* in = flat_.data();
  for (const torch::Tensor& p : params_) {
    torch::Tensor g = p.grad();
    float* dst = g.data_ptr<float>();
    for (int64_t i = 0; i < g.numel(); ++i) dst[i] = in[i] * inv_world;
    in += g.numel();
  }
  last_loss_ = in[0] * inv_world;
  *stop = in[1] > 0;
  SetLearningRate(*optimizer_, lr_->At(step));
  optimizer_->step();
  return absl::OkStatus();
}

absl::StatusOr<double> Trainer::Evaluate(double* loss) {
  torch::NoGradGuard no_grad;
  int64_t n = test_.size();
  int64_t begin = n * rank_ / world_;
  int64_t end = n * (rank_ + 1) / world_;
  double correct = 0;
  double loss_sum = 0;
  for (int64_t i = begin; i < end; i += kEvalBatch) {
    int64_t stop = std::min(end, i + kEvalBatch);
    torch::Tensor logits = model_->forward(test_.images.slice(0, i, stop));
    torch::Tensor labels = test_.labels.slice(0, i, stop);
    correct += logits.argmax(1).eq(labels).sum().item<double>();
    loss_sum += torch::nn::functional::cross_entropy(
                    logits, labels,
                    torch::nn::functional::CrossEntropyFuncOptions().reduction(
                        torch::kSum))
                    .item<double>();
  }
  float totals[2] = {static_cast<float>(correct), static_cast<float>(loss_sum)};
  RETURN_IF_ERROR(comm_->AllReduceSum(totals, 2));
  *loss = totals[1] / n;
  return totals[0] / n;
}

void Trainer::MaybeReport(int64_t step, bool force,
                          std::optional<double> accuracy,
                          std::optional<double> test_loss) {
  if (rank_ != 0) return;
  pending_losses_.push_back(static_cast<float>(last_loss_));
  absl::Time now = absl::Now();
  bool due = spec_.log_every_steps() > 0
                 ? (step + 1) % spec_.log_every_steps() == 0
                 : now - last_report_ >= absl::Seconds(1);
  if (!due && !force) return;
  v1::ProgressReport report;
  report.set_job_id(task_.assignment.job_id());
  report.set_generation(task_.assignment.generation());
  report.set_step(step + 1);
  report.set_epoch(static_cast<int>(step / sampler_->steps_per_epoch()));
  report.set_total_steps(total_steps_);
  report.set_first_step(pending_first_step_);
  for (float loss : pending_losses_) report.add_step_losses(loss);
  double seconds = absl::ToDoubleSeconds(now - train_start_ - eval_time_);
  if (seconds > 0) {
    report.set_samples_per_second(static_cast<double>(step + 1) * plan_.global /
                                  seconds);
  }
  if (accuracy) report.set_test_accuracy(*accuracy);
  if (test_loss) report.set_test_loss(*test_loss);
  task_.report(report);
  pending_losses_.clear();
  pending_first_step_ = step + 1;
  last_report_ = now;
}

absl::StatusOr<v1::TaskResult> Trainer::Run() {
  RETURN_IF_ERROR(Setup());
  v1::TaskResult result;
  train_start_ = absl::Now();
  int64_t step = 0;
  bool stop = false;
  double accuracy = 0;
  while (step < total_steps_ && !stop) {
    if (task_.aborted) {
      return absl::AbortedError(
          "the generation was aborted by the coordinator");
    }
    RETURN_IF_ERROR(Step(step, &stop));
    bool epoch_end = (step + 1) % sampler_->steps_per_epoch() == 0;
    bool last = step + 1 == total_steps_ || stop;
    std::optional<double> eval_accuracy, eval_loss;
    if (epoch_end || last) {
      absl::Time eval_start = absl::Now();
      double loss = 0;
      ASSIGN_OR_RETURN(accuracy, Evaluate(&loss));
      eval_time_ += absl::Now() - eval_start;
      eval_accuracy = accuracy;
      eval_loss = loss;
      if (rank_ == 0) {
        LogInfo("epoch ", step / sampler_->steps_per_epoch() + 1, " step ",
                step + 1, "/", total_steps_, ": loss ", last_loss_,
                ", test accuracy ", accuracy, ", test loss ", loss);
      }
    }
    MaybeReport(step, epoch_end || last, eval_accuracy, eval_loss);
    ++step;
  }
  double seconds =
      absl::ToDoubleSeconds(absl::Now() - train_start_ - eval_time_);
  result.set_ok(true);
  result.set_stopped(stop);
  result.set_steps(step);
  result.set_final_loss(last_loss_);
  result.set_test_accuracy(accuracy);
  result.set_samples_per_second(seconds > 0 ? step * plan_.global / seconds
                                            : 0);
  result.set_model_digest(ModelDigest(*model_));
  return result;
}

}  // namespace

v1::TaskResult RunTrainingTask(TaskContext& task) {
  absl::StatusOr<v1::TaskResult> result;
  try {
    Trainer trainer(task);
    result = trainer.Run();
  } catch (const std::exception& e) {
    result = absl::InternalError(absl::StrCat("LibTorch error: ", e.what()));
  }
  v1::TaskResult out;
  if (result.ok()) {
    out = *std::move(result);
  } else {
    out.set_ok(false);
    out.set_error(std::string(result.status().message()));
    LogError("job ", task.assignment.job_id(), " failed on rank ",
             task.assignment.rank(), ": ", result.status().message());
  }
  out.set_job_id(task.assignment.job_id());
  out.set_generation(task.assignment.generation());
  out.set_rank(task.assignment.rank());
  return out;
}

}  // namespace lockstep::worker
