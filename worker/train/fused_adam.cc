// Adam in one pass per parameter (fused_adam.h). Built with OpenMP (for
// at::parallel_for) and -ffp-contract=off: every rounding here is written
// out, FMAs included, and the compiler may not add or remove one.
#include "worker/train/fused_adam.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <cmath>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "worker/train/vector_isa.h"

namespace lockstep::worker {
namespace {

using torch::optim::AdamOptions;
using torch::optim::AdamParamState;

// Element i of LibTorch's Adam: exp_avg.mul_(beta1).add_(grad, 1 - beta1);
// exp_avg_sq.mul_(beta2).addcmul_(grad, grad, 1 - beta2); denom =
// exp_avg_sq.sqrt() / sqrt(correction2) + eps; param.addcdiv_(exp_avg,
// denom, -step_size). LibTorch's add_ with alpha and its addcmul_ round
// once for the last multiply and the add (FMAs); the rest rounds each step.
void UpdateElements(float* param, const float* grad, float* exp_avg,
                    float* exp_avg_sq, int64_t begin, int64_t end,
                    const AdamScalars& s) {
  for (int64_t i = begin; i < end; ++i) {
    float g = grad[i];
    // grad.add(param, weight_decay), only when there is weight decay.
    if (s.weight_decay != 0) g = std::fma(param[i], s.weight_decay, g);
    // AdamW: param.mul_(1 - lr * weight_decay), before the update.
    const float p = s.decoupled ? param[i] * s.param_scale : param[i];
    const float m = std::fma(g, s.one_minus_beta1, exp_avg[i] * s.beta1);
    const float v = std::fma(s.one_minus_beta2 * g, g, exp_avg_sq[i] * s.beta2);
    const float denom = std::sqrt(v) / s.sqrt_correction2 + s.eps;
    param[i] = p + s.neg_step_size * m / denom;
    exp_avg[i] = m;
    exp_avg_sq[i] = v;
  }
}

// UpdateElements 8 at a time.
__attribute__((target("avx2,fma"))) void UpdateElementsAvx2(
    float* param, const float* grad, float* exp_avg, float* exp_avg_sq,
    int64_t begin, int64_t end, const AdamScalars& s) {
  const __m256 beta1 = _mm256_set1_ps(s.beta1);
  const __m256 one_minus_beta1 = _mm256_set1_ps(s.one_minus_beta1);
  const __m256 beta2 = _mm256_set1_ps(s.beta2);
  const __m256 one_minus_beta2 = _mm256_set1_ps(s.one_minus_beta2);
  const __m256 sqrt_correction2 = _mm256_set1_ps(s.sqrt_correction2);
  const __m256 eps = _mm256_set1_ps(s.eps);
  const __m256 neg_step_size = _mm256_set1_ps(s.neg_step_size);
  const __m256 weight_decay = _mm256_set1_ps(s.weight_decay);
  const __m256 param_scale = _mm256_set1_ps(s.param_scale);
  const bool decay = s.weight_decay != 0;
  int64_t i = begin;
  for (; i + 8 <= end; i += 8) {
    __m256 p = _mm256_loadu_ps(param + i);
    __m256 g = _mm256_loadu_ps(grad + i);
    if (decay) g = _mm256_fmadd_ps(p, weight_decay, g);
    if (s.decoupled) p = _mm256_mul_ps(p, param_scale);
    const __m256 m = _mm256_fmadd_ps(
        g, one_minus_beta1, _mm256_mul_ps(_mm256_loadu_ps(exp_avg + i), beta1));
    const __m256 v =
        _mm256_fmadd_ps(_mm256_mul_ps(one_minus_beta2, g), g,
                        _mm256_mul_ps(_mm256_loadu_ps(exp_avg_sq + i), beta2));
    const __m256 denom =
        _mm256_add_ps(_mm256_div_ps(_mm256_sqrt_ps(v), sqrt_correction2), eps);
    _mm256_storeu_ps(
        param + i,
        _mm256_add_ps(p,
                      _mm256_div_ps(_mm256_mul_ps(neg_step_size, m), denom)));
    _mm256_storeu_ps(exp_avg + i, m);
    _mm256_storeu_ps(exp_avg_sq + i, v);
  }
  UpdateElements(param, grad, exp_avg, exp_avg_sq, i, end, s);
}

bool HaveAvx2() { return AllowedVectorIsa() != VectorIsa::kNone; }

std::string StateKey(const torch::Tensor& param) {
  return c10::guts::to_string(param.unsafeGetTensorImpl());
}

bool ContiguousCpuFloat(const torch::Tensor& t) {
  return t.defined() && t.device().is_cpu() && !t.is_sparse() &&
         t.scalar_type() == torch::kFloat32 && t.is_contiguous();
}

// The update by LibTorch's optimizer and by FusedAdamUpdate on the same
// random parameters and gradients for a few steps: two groups (one with
// weight decay), sizes with a remainder past any vector width.
template <typename Optimizer, typename Options, typename State>
bool ProbeMatches() {
  torch::NoGradGuard no_grad;
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(20261206);
  const std::vector<int64_t> sizes = {16384 + 13, 1003};
  std::vector<torch::Tensor> params, copies, exp_avgs, exp_avg_sqs;
  for (int64_t n : sizes) {
    params.push_back(torch::randn({n}, gen));
    copies.push_back(params.back().clone());
    exp_avgs.push_back(torch::zeros({n}));
    exp_avg_sqs.push_back(torch::zeros({n}));
  }
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<torch::Tensor>{params[0]},
                      std::make_unique<Options>(Options(1e-3)));
  groups.emplace_back(
      std::vector<torch::Tensor>{params[1]},
      std::make_unique<Options>(Options(3e-2).weight_decay(0.01)));
  Optimizer reference(std::move(groups));
  for (int64_t step = 1; step <= 3; ++step) {
    for (size_t k = 0; k < sizes.size(); ++k) {
      // Gradients over several magnitudes.
      torch::Tensor grad = torch::randn({sizes[k]}, gen) *
                           torch::exp(torch::randn({sizes[k]}, gen) * 3);
      params[k].mutable_grad() = grad;
      const auto& options =
          static_cast<const Options&>(reference.param_groups()[k].options());
      FusedAdamUpdate(copies[k].data_ptr<float>(), grad.data_ptr<float>(),
                      exp_avgs[k].data_ptr<float>(),
                      exp_avg_sqs[k].data_ptr<float>(), sizes[k],
                      AdamScalars::Of(options, step));
    }
    reference.step();
  }
  auto same = [](const torch::Tensor& a, const torch::Tensor& b) {
    return torch::equal(a.view(torch::kInt32), b.view(torch::kInt32));
  };
  for (size_t k = 0; k < sizes.size(); ++k) {
    const auto& state =
        static_cast<const State&>(*reference.state().at(StateKey(params[k])));
    if (!same(params[k], copies[k]) || !same(state.exp_avg(), exp_avgs[k]) ||
        !same(state.exp_avg_sq(), exp_avg_sqs[k])) {
      return false;
    }
  }
  return true;
}

// Whether every parameter with a gradient can take the fused update.
template <typename Options, typename State, typename Groups, typename StateMap>
bool Fusable(const Groups& groups, const StateMap& states) {
  for (const auto& group : groups) {
    if (static_cast<const Options&>(group.options()).amsgrad()) return false;
    for (const torch::Tensor& p : group.params()) {
      if (!p.grad().defined()) continue;
      if (!ContiguousCpuFloat(p) || !ContiguousCpuFloat(p.grad()) ||
          p.grad().numel() != p.numel()) {
        return false;
      }
      auto found = states.find(StateKey(p));
      if (found == states.end()) continue;
      const auto& state = static_cast<const State&>(*found->second);
      if (!ContiguousCpuFloat(state.exp_avg()) ||
          !ContiguousCpuFloat(state.exp_avg_sq()) ||
          state.exp_avg().numel() != p.numel() ||
          state.exp_avg_sq().numel() != p.numel()) {
        return false;
      }
    }
  }
  return true;
}

// One fused step of every parameter with a gradient, each parameter's state
// started as LibTorch starts it.
template <typename Options, typename State, typename Groups, typename StateMap>
void FusedStep(Groups& groups, StateMap& states) {
  torch::NoGradGuard no_grad;
  for (auto& group : groups) {
    const auto& options = static_cast<const Options&>(group.options());
    for (torch::Tensor& p : group.params()) {
      if (!p.grad().defined()) continue;
      std::unique_ptr<torch::optim::OptimizerParamState>& slot =
          states[StateKey(p)];
      if (slot == nullptr) {
        auto state = std::make_unique<State>();
        state->step(0);
        state->exp_avg(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        state->exp_avg_sq(torch::zeros_like(p, torch::MemoryFormat::Preserve));
        slot = std::move(state);
      }
      auto& state = static_cast<State&>(*slot);
      state.step(state.step() + 1);
      FusedAdamUpdate(p.data_ptr<float>(), p.grad().data_ptr<float>(),
                      state.exp_avg().template data_ptr<float>(),
                      state.exp_avg_sq().template data_ptr<float>(), p.numel(),
                      AdamScalars::Of(options, state.step()));
    }
  }
}

}  // namespace

AdamScalars AdamScalars::Of(const AdamOptions& options, int64_t step) {
  // LibTorch computes these in double and rounds each to fp32 when its
  // kernels take it.
  const double beta1 = std::get<0>(options.betas());
  const double beta2 = std::get<1>(options.betas());
  const double correction1 = 1 - std::pow(beta1, step);
  const double correction2 = 1 - std::pow(beta2, step);
  AdamScalars s;
  s.beta1 = static_cast<float>(beta1);
  s.one_minus_beta1 = static_cast<float>(1 - beta1);
  s.beta2 = static_cast<float>(beta2);
  s.one_minus_beta2 = static_cast<float>(1 - beta2);
  s.sqrt_correction2 = static_cast<float>(std::sqrt(correction2));
  s.eps = static_cast<float>(options.eps());
  s.neg_step_size = static_cast<float>(-(options.lr() / correction1));
  s.weight_decay = static_cast<float>(options.weight_decay());
  return s;
}

AdamScalars AdamScalars::Of(const torch::optim::AdamWOptions& options,
                            int64_t step) {
  AdamScalars s = Of(torch::optim::AdamOptions(options.lr())
                         .betas(options.betas())
                         .eps(options.eps()),
                     step);
  // param.mul_(1 - lr * weight_decay): the factor in double, rounded to
  // fp32 by the multiply.
  s.decoupled = options.weight_decay() != 0;
  s.param_scale = static_cast<float>(1 - options.lr() * options.weight_decay());
  return s;
}

void FusedAdamUpdate(float* param, const float* grad, float* exp_avg,
                     float* exp_avg_sq, int64_t n, const AdamScalars& scalars,
                     bool vector) {
  const bool avx2 = vector && HaveAvx2();
  at::parallel_for(0, n, 16384, [&](int64_t begin, int64_t end) {
    if (avx2) {
      UpdateElementsAvx2(param, grad, exp_avg, exp_avg_sq, begin, end, scalars);
    } else {
      UpdateElements(param, grad, exp_avg, exp_avg_sq, begin, end, scalars);
    }
  });
}

bool FusedAdamMatchesLibTorch() {
  static const bool matches =
      ProbeMatches<torch::optim::Adam, AdamOptions, AdamParamState>();
  return matches;
}

bool FusedAdamWMatchesLibTorch() {
  static const bool matches =
      ProbeMatches<torch::optim::AdamW, torch::optim::AdamWOptions,
                   torch::optim::AdamWParamState>();
  return matches;
}

torch::Tensor FusedAdam::step(LossClosure closure) {
  last_step_fused_ =
      closure == nullptr &&
      Fusable<AdamOptions, AdamParamState>(param_groups(), state_) &&
      FusedAdamMatchesLibTorch();
  if (!last_step_fused_) return Adam::step(std::move(closure));
  FusedStep<AdamOptions, AdamParamState>(param_groups(), state_);
  return {};
}

torch::Tensor FusedAdamW::step(LossClosure closure) {
  using torch::optim::AdamWOptions;
  using torch::optim::AdamWParamState;
  last_step_fused_ =
      closure == nullptr &&
      Fusable<AdamWOptions, AdamWParamState>(param_groups(), state_) &&
      FusedAdamWMatchesLibTorch();
  if (!last_step_fused_) return AdamW::step(std::move(closure));
  FusedStep<AdamWOptions, AdamWParamState>(param_groups(), state_);
  return {};
}

}  // namespace lockstep::worker
