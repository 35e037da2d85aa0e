// Building a replica and the pieces of a step that act on it (replica.h).
#include "worker/train/replica.h"

#include "absl/strings/match.h"
#include "common/failpoint.h"
#include "common/status_macros.h"

namespace lockstep::worker {
namespace {

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

}  // namespace

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

absl::Status InitializeReplica(const v1::JobSpec& spec, int64_t rows,
                               int64_t cols, Replica* replica) {
  torch::manual_seed(spec.seed());
  ASSIGN_OR_RETURN(replica->model,
                   BuildModel(ModelOptionsOf(spec, rows, cols)));
  LossScaler::Options scaling;
  scaling.initial_scale = spec.loss_scale();
  scaling.growth_interval = spec.loss_scale_growth_interval();
  replica->scaler = LossScaler(spec.precision() == "fp16", scaling);
  if (FailPointHit("perturb_initial_parameters")) {
    // Tests: a rank that built its model differently.
    torch::NoGradGuard no_grad;
    replica->model->parameters()[0].add_(1e-3);
  }
  replica->optimizer =
      MakeOptimizer(spec.optimizer(), replica->model->parameters());
  return absl::OkStatus();
}

void SetLearningRate(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
}

Autocast::Autocast(bool bf16) : enabled_(bf16) {
  if (!enabled_) return;
  previous_ = at::autocast::is_cpu_enabled();
  previous_dtype_ = at::autocast::get_autocast_cpu_dtype();
  at::autocast::set_cpu_enabled(true);
  at::autocast::set_autocast_cpu_dtype(at::kBFloat16);
  at::autocast::increment_nesting();
}

Autocast::~Autocast() {
  if (!enabled_) return;
  // The cast weights are cached for one forward pass only.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_autocast_cpu_dtype(previous_dtype_);
  at::autocast::set_cpu_enabled(previous_);
}

RunningStatistics::RunningStatistics(const torch::nn::Module& model) {
  for (const auto& buffer : model.named_buffers()) {
    const std::string& name = buffer.key();
    if (buffer.value().scalar_type() == torch::kFloat32 &&
        (absl::EndsWith(name, "running_mean") ||
         absl::EndsWith(name, "running_var"))) {
      statistics_.push_back(buffer.value());
      remembered_.push_back(torch::empty_like(buffer.value()));
    }
  }
}

void RunningStatistics::Remember() {
  for (size_t i = 0; i < statistics_.size(); ++i) {
    remembered_[i].copy_(statistics_[i]);
  }
}

void RunningStatistics::PutBack() {
  torch::NoGradGuard no_grad;
  for (size_t i = 0; i < statistics_.size(); ++i) {
    statistics_[i].copy_(remembered_[i]);
  }
}

}  // namespace lockstep::worker
