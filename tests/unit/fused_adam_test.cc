// FusedAdam against torch::optim::Adam (FusedAdamW against AdamW), bit for bit:
// parameters and state after several steps, with weight decay, parameters
// without gradients, sizes past any vector width, one and two threads; and the
// cases it hands to LibTorch (amsgrad, bf16 parameters).
#include "worker/train/fused_adam.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/ascii.h"

namespace lockstep::worker {
namespace {

using torch::optim::AdamOptions;
using torch::optim::AdamParamState;

bool SameBits(const torch::Tensor& a, const torch::Tensor& b) {
  const torch::Dtype bits =
      a.element_size() == 2 ? torch::kInt16 : torch::kInt32;
  return a.sizes() == b.sizes() && a.scalar_type() == b.scalar_type() &&
         torch::equal(a.contiguous().view(bits), b.contiguous().view(bits));
}

// Two groups: the second with weight decay and its own betas and eps.
template <typename Optimizer, typename Options = AdamOptions>
std::unique_ptr<Optimizer> Make(const std::vector<torch::Tensor>& params,
                                bool amsgrad = false) {
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(
      std::vector<torch::Tensor>(params.begin(), params.begin() + 2),
      std::make_unique<Options>(Options(1e-3).amsgrad(amsgrad)));
  groups.emplace_back(
      std::vector<torch::Tensor>(params.begin() + 2, params.end()),
      std::make_unique<Options>(Options(2e-2)
                                    .betas({0.8, 0.99})
                                    .eps(1e-6)
                                    .weight_decay(0.05)
                                    .amsgrad(amsgrad)));
  return std::make_unique<Optimizer>(std::move(groups));
}

std::vector<torch::Tensor> Params(torch::Dtype dtype = torch::kFloat32) {
  torch::manual_seed(7);
  std::vector<torch::Tensor> params;
  for (int64_t n : {1, 17, 40000 + 3, 1031}) {
    params.push_back(torch::randn({n}).to(dtype));
  }
  return params;
}

std::vector<torch::Tensor> Clone(const std::vector<torch::Tensor>& params) {
  std::vector<torch::Tensor> copies;
  for (const torch::Tensor& p : params) copies.push_back(p.clone());
  return copies;
}

// Steps both with the same gradients (none for parameter 1 on odd steps)
// and expects the same bits after each.
template <typename Reference = torch::optim::Adam, typename Fused = FusedAdam,
          typename Options = AdamOptions, typename State = AdamParamState>
void ExpectSameTraining(std::vector<torch::Tensor> params, bool amsgrad,
                        bool expect_fused) {
  std::vector<torch::Tensor> copies = Clone(params);
  auto reference = Make<Reference, Options>(params, amsgrad);
  auto fused = Make<Fused, Options>(copies, amsgrad);
  for (int step = 1; step <= 6; ++step) {
    for (size_t k = 0; k < params.size(); ++k) {
      torch::Tensor grad;
      if (!(k == 1 && step % 2 == 1)) {
        grad = (torch::randn(params[k].sizes()) *
                torch::exp(torch::randn(params[k].sizes()) * 3))
                   .to(params[k].scalar_type());
      }
      params[k].mutable_grad() = grad;
      copies[k].mutable_grad() = grad.defined() ? grad.clone() : grad;
    }
    reference->step();
    fused->step();
    EXPECT_EQ(fused->last_step_fused(), expect_fused);
    for (size_t k = 0; k < params.size(); ++k) {
      ASSERT_TRUE(SameBits(params[k], copies[k]))
          << "parameter " << k << " after step " << step;
    }
  }
  for (size_t k = 0; k < params.size(); ++k) {
    const auto key = c10::guts::to_string(params[k].unsafeGetTensorImpl());
    const auto fused_key =
        c10::guts::to_string(copies[k].unsafeGetTensorImpl());
    const auto& want = static_cast<const State&>(*reference->state().at(key));
    const auto& got = static_cast<const State&>(*fused->state().at(fused_key));
    EXPECT_EQ(got.step(), want.step()) << k;
    EXPECT_TRUE(SameBits(got.exp_avg(), want.exp_avg())) << k;
    EXPECT_TRUE(SameBits(got.exp_avg_sq(), want.exp_avg_sq())) << k;
  }
}

TEST(FusedAdamTest, ThisLibTorchComputesAdamAsFusedAdamDoes) {
  // ATen's unvectorized kernels round Adam's step otherwise: FusedAdam
  // runs LibTorch's step there (the other tests check that), as it must.
  const char* capability = std::getenv("ATEN_CPU_CAPABILITY");
  if (capability != nullptr && absl::AsciiStrToLower(capability) == "default") {
    GTEST_SKIP() << "ATEN_CPU_CAPABILITY=default: FusedAdam "
                 << (FusedAdamMatchesLibTorch() ? "runs" : "falls back");
  }
  // Debian 12's LibTorch 1.13 (AVX2 kernels) does; another build may not,
  // and then FusedAdam runs LibTorch's step (the tests below still pass),
  // but the speed is gone: this says so.
  EXPECT_TRUE(FusedAdamMatchesLibTorch())
      << "FusedAdam falls back to torch::optim::Adam with this LibTorch";
}

TEST(FusedAdamTest, SameBitsAsLibTorchOnOneAndTwoThreads) {
  const int threads = at::get_num_threads();
  for (int n : {1, 2}) {
    at::set_num_threads(n);
    ExpectSameTraining(Params(), /*amsgrad=*/false,
                       /*expect_fused=*/FusedAdamMatchesLibTorch());
  }
  at::set_num_threads(threads);
}

// AdamW: decoupled weight decay (the second group's), the same bits.
TEST(FusedAdamTest, AdamWGivesLibTorchsBitsOrRunsItsStep) {
  using torch::optim::AdamW;
  using torch::optim::AdamWOptions;
  using torch::optim::AdamWParamState;
  const char* capability = std::getenv("ATEN_CPU_CAPABILITY");
  const bool portable =
      capability != nullptr && absl::AsciiStrToLower(capability) == "default";
  if (!portable) EXPECT_TRUE(FusedAdamWMatchesLibTorch());
  const int threads = at::get_num_threads();
  for (int n : {1, 2}) {
    at::set_num_threads(n);
    ExpectSameTraining<AdamW, FusedAdamW, AdamWOptions, AdamWParamState>(
        Params(), /*amsgrad=*/false,
        /*expect_fused=*/FusedAdamWMatchesLibTorch());
  }
  at::set_num_threads(threads);
  ExpectSameTraining<AdamW, FusedAdamW, AdamWOptions, AdamWParamState>(
      Params(), /*amsgrad=*/true, /*expect_fused=*/false);
}

TEST(FusedAdamTest, AmsgradAndBf16RunLibTorchsStep) {
  ExpectSameTraining(Params(), /*amsgrad=*/true, /*expect_fused=*/false);
  ExpectSameTraining(Params(torch::kBFloat16), /*amsgrad=*/false,
                     /*expect_fused=*/false);
}

TEST(FusedAdamTest, PortableAndVectorCodeAgree) {
  torch::manual_seed(3);
  const int64_t n = 1000 + 5;
  torch::Tensor param = torch::randn({n}), grad = torch::randn({n});
  torch::Tensor m = torch::randn({n}), v = torch::rand({n});
  AdamScalars scalars = AdamScalars::Of(AdamOptions(1e-2).weight_decay(0.1), 3);
  std::vector<torch::Tensor> out[2];
  for (bool vector : {true, false}) {
    torch::Tensor p = param.clone(), a = m.clone(), b = v.clone();
    FusedAdamUpdate(p.data_ptr<float>(), grad.data_ptr<float>(),
                    a.data_ptr<float>(), b.data_ptr<float>(), n, scalars,
                    vector);
    out[vector] = {p, a, b};
  }
  for (int k = 0; k < 3; ++k) EXPECT_TRUE(SameBits(out[0][k], out[1][k]));
}

TEST(FusedAdamTest, StateSavesAndLoadsAsAdams) {
  std::vector<torch::Tensor> params = Params();
  auto fused = Make<FusedAdam>(params);
  for (torch::Tensor& p : params) p.mutable_grad() = torch::randn(p.sizes());
  fused->step();
  fused->step();
  torch::serialize::OutputArchive out;
  fused->save(out);
  std::ostringstream bytes;
  out.save_to(bytes);

  std::vector<torch::Tensor> copies = Clone(params);
  auto reference = Make<torch::optim::Adam>(copies);
  torch::serialize::InputArchive in;
  std::istringstream read(bytes.str());
  in.load_from(read);
  reference->load(in);
  for (size_t k = 0; k < params.size(); ++k) {
    copies[k].mutable_grad() = params[k].grad().clone();
  }
  fused->step();
  reference->step();
  for (size_t k = 0; k < params.size(); ++k) {
    EXPECT_TRUE(SameBits(params[k], copies[k])) << k;
  }
}

}  // namespace
}  // namespace lockstep::worker
