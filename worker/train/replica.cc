// Building a replica and the pieces of a step that act on it (replica.h).
#include "worker/train/replica.h"

#include <torch/version.h>

#include "absl/strings/match.h"
#include "common/failpoint.h"
#include "common/status_macros.h"
#include "worker/train/fused_adam.h"

namespace lockstep::worker {
namespace {

// LibTorch 2.4 replaced the per-backend autocast setters with ones that
// take the device type; 1.13 (Debian's) has only the old ones.
#if TORCH_VERSION_MAJOR > 2 || \
    (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4)
bool AutocastEnabled(at::DeviceType type) {
  return at::autocast::is_autocast_enabled(type);
}
void SetAutocastEnabled(at::DeviceType type, bool on) {
  at::autocast::set_autocast_enabled(type, on);
}
at::ScalarType AutocastDtype(at::DeviceType type) {
  return at::autocast::get_autocast_dtype(type);
}
void SetAutocastDtype(at::DeviceType type, at::ScalarType dtype) {
  at::autocast::set_autocast_dtype(type, dtype);
}
#else
bool AutocastEnabled(at::DeviceType type) {
  return type == at::kCUDA ? at::autocast::is_enabled()
                           : at::autocast::is_cpu_enabled();
}
void SetAutocastEnabled(at::DeviceType type, bool on) {
  if (type == at::kCUDA) {
    at::autocast::set_enabled(on);
  } else {
    at::autocast::set_cpu_enabled(on);
  }
}
at::ScalarType AutocastDtype(at::DeviceType type) {
  return type == at::kCUDA ? at::autocast::get_autocast_gpu_dtype()
                           : at::autocast::get_autocast_cpu_dtype();
}
void SetAutocastDtype(at::DeviceType type, at::ScalarType dtype) {
  if (type == at::kCUDA) {
    at::autocast::set_autocast_gpu_dtype(dtype);
  } else {
    at::autocast::set_autocast_cpu_dtype(dtype);
  }
}
#endif

}  // namespace

std::unique_ptr<torch::optim::Optimizer> MakeOptimizer(
    const v1::OptimizerSpec& spec, std::vector<torch::Tensor> params,
    const std::vector<bool>& decay) {
  // Unset (a spec without defaults applied): Adam's usual 0.9 and 0.999.
  const std::tuple<double, double> betas = {
      spec.has_beta1() ? spec.beta1() : 0.9,
      spec.has_beta2() ? spec.beta2() : 0.999};
  if (spec.type() == "adam") {
    // LibTorch's Adam, to the bit, in one pass per parameter.
    return std::make_unique<FusedAdam>(
        params, torch::optim::AdamOptions(1e-3).betas(betas).weight_decay(
                    spec.weight_decay()));
  }
  if (spec.type() == "adamw") {
    // Two groups, in the parameters' order: decayed, then not.
    std::vector<torch::Tensor> decayed, kept;
    for (size_t i = 0; i < params.size(); ++i) {
      (i < decay.size() && decay[i] ? decayed : kept).push_back(params[i]);
    }
    auto options = [&](double weight_decay) {
      return std::make_unique<torch::optim::AdamWOptions>(
          torch::optim::AdamWOptions(1e-3).betas(betas).weight_decay(
              weight_decay));
    };
    std::vector<torch::optim::OptimizerParamGroup> groups;
    groups.emplace_back(decayed, options(spec.weight_decay()));
    groups.emplace_back(kept, options(0));
    // LibTorch's AdamW, to the bit, in one pass per parameter.
    return std::make_unique<FusedAdamW>(
        groups, torch::optim::AdamWOptions(1e-3).betas(betas));
  }
  return std::make_unique<torch::optim::SGD>(
      params, torch::optim::SGDOptions(0.1)
                  .momentum(spec.momentum())
                  .weight_decay(spec.weight_decay()));
}

ModelOptions ModelOptionsOf(const v1::JobSpec& spec, std::vector<int64_t> input,
                            bool token_input, int64_t outputs) {
  ModelOptions options;
  options.name = spec.model().name();
  options.torchscript = spec.model().torchscript();
  options.dropout = spec.model().dropout();
  options.input = std::move(input);
  options.token_input = token_input;
  options.outputs = outputs;
  options.n_layer = spec.model().n_layer();
  options.n_head = spec.model().n_head();
  options.n_embd = spec.model().n_embd();
  options.fused = !spec.model().has_fused() || spec.model().fused();
  return options;
}

absl::Status InitializeReplica(const v1::JobSpec& spec,
                               const ModelOptions& options,
                               torch::Device device, Replica* replica) {
  torch::manual_seed(spec.seed());
  ASSIGN_OR_RETURN(replica->model, BuildModel(options));
  // bf16 convolutional models on the CPU train channels-last: the CNN
  // 1.37-1.40x faster, the ResNet 1.06x (docs/BENCHMARKS.md, "The
  // roofline"). Untried on GPUs.
  replica->model->set_channels_last(spec.precision() == "bf16" &&
                                    device.is_cpu());
  LossScaler::Options scaling;
  scaling.initial_scale = spec.loss_scale();
  scaling.growth_interval = spec.loss_scale_growth_interval();
  replica->scaler = LossScaler(spec.precision() == "fp16", scaling);
  if (FailPointHit("perturb_initial_parameters")) {
    // Tests: a rank that built its model differently.
    torch::NoGradGuard no_grad;
    replica->model->parameters()[0].add_(1e-3);
  }
  // Before the optimizer exists: its state is created on the parameters'
  // device.
  replica->device = device;
  if (!device.is_cpu()) replica->model->to(device);
  replica->optimizer =
      MakeOptimizer(spec.optimizer(), replica->model->parameters(),
                    replica->model->WeightDecayMask());
  return absl::OkStatus();
}

void SetLearningRate(torch::optim::Optimizer& optimizer, double lr) {
  for (auto& group : optimizer.param_groups()) group.options().set_lr(lr);
}

Autocast::Autocast(const std::string& precision, torch::Device device)
    : device_type_(device.type()) {
  at::ScalarType dtype;
  if (precision == "bf16") {
    dtype = at::kBFloat16;
  } else if (precision == "fp16" && device.is_cuda()) {
    dtype = at::kHalf;
  } else {
    return;
  }
  enabled_ = true;
  previous_ = AutocastEnabled(device_type_);
  previous_dtype_ = AutocastDtype(device_type_);
  SetAutocastEnabled(device_type_, true);
  SetAutocastDtype(device_type_, dtype);
  at::autocast::increment_nesting();
}

Autocast::~Autocast() {
  if (!enabled_) return;
  // The cast weights are cached for one forward pass only.
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  SetAutocastDtype(device_type_, previous_dtype_);
  SetAutocastEnabled(device_type_, previous_);
}

torch::Tensor PrecisionLogits(Network& model, const torch::Tensor& inputs,
                              const std::string& precision,
                              torch::Device device) {
  torch::Tensor features;
  {
    Autocast autocast(precision, device);
    features = model.Features(inputs);
    if (model.output_layer_in_precision()) {
      return model.Logits(features).to(torch::kFloat32);
    }
  }
  return model.Logits(features);
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
