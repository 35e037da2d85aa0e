// The fused causal attention against a plain reference in double (every
// instruction set this CPU may run, forward and backward, on odd sizes:
// T not a multiple of the row block or the tile, one head, head sizes 8 to
// 128), against LibTorch's unfused ops through autograd, in bf16, and its
// determinism: bit for bit on a repeat, with other thread counts, and for
// a sample alone or in a batch.
#include "worker/train/attention.h"

#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "worker/train/attention_kernels.h"

namespace lockstep::worker {
namespace {

// y and dqkv by the textbook formulas, in double.
struct Reference {
  std::vector<double> y, dqkv;
};

Reference Attend(const std::vector<float>& qkv, const std::vector<float>& dy,
                 const AttentionShape& s) {
  const int64_t c = s.heads * s.head_size, d_size = s.head_size;
  const double scale = 1.0 / std::sqrt(double(d_size));
  Reference out;
  out.y.assign(s.batch * s.tokens * c, 0);
  out.dqkv.assign(qkv.size(), 0);
  auto at = [&](int64_t b, int64_t t, int64_t part, int64_t h) {
    return (b * s.tokens + t) * 3 * c + part * c + h * d_size;
  };
  auto y_at = [&](int64_t b, int64_t t, int64_t h) {
    return (b * s.tokens + t) * c + h * d_size;
  };
  for (int64_t b = 0; b < s.batch; ++b) {
    for (int64_t h = 0; h < s.heads; ++h) {
      for (int64_t i = 0; i < s.tokens; ++i) {
        std::vector<double> p(i + 1), dp(i + 1);
        double max = -std::numeric_limits<double>::infinity(), sum = 0;
        for (int64_t j = 0; j <= i; ++j) {
          double dot = 0;
          for (int64_t d = 0; d < d_size; ++d) {
            dot += double(qkv[at(b, i, 0, h) + d]) * qkv[at(b, j, 1, h) + d];
          }
          p[j] = dot * scale;
          max = std::max(max, p[j]);
        }
        for (double& v : p) sum += v = std::exp(v - max);
        for (double& v : p) v /= sum;
        double delta = 0;
        for (int64_t j = 0; j <= i; ++j) {
          dp[j] = 0;
          for (int64_t d = 0; d < d_size; ++d) {
            out.y[y_at(b, i, h) + d] += p[j] * qkv[at(b, j, 2, h) + d];
            dp[j] += double(dy[y_at(b, i, h) + d]) * qkv[at(b, j, 2, h) + d];
          }
          delta += p[j] * dp[j];
        }
        for (int64_t j = 0; j <= i; ++j) {
          const double ds = p[j] * (dp[j] - delta);
          for (int64_t d = 0; d < d_size; ++d) {
            out.dqkv[at(b, i, 0, h) + d] +=
                scale * ds * qkv[at(b, j, 1, h) + d];
            out.dqkv[at(b, j, 1, h) + d] +=
                scale * ds * qkv[at(b, i, 0, h) + d];
            out.dqkv[at(b, j, 2, h) + d] += p[j] * dy[y_at(b, i, h) + d];
          }
        }
      }
    }
  }
  return out;
}

std::vector<float> Random(int64_t n, unsigned seed) {
  torch::manual_seed(seed);
  torch::Tensor t = torch::randn({n});
  return std::vector<float>(t.data_ptr<float>(), t.data_ptr<float>() + n);
}

// The largest |a - b| over the largest |b|.
template <typename A>
double RelativeError(const std::vector<A>& a, const std::vector<double>& b) {
  double error = 0, scale = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    error = std::max(error, std::abs(double(a[i]) - b[i]));
    scale = std::max(scale, std::abs(b[i]));
  }
  return error / scale;
}

std::vector<VectorIsa> Isas() {
  std::vector<VectorIsa> isas = {VectorIsa::kNone};
  if (AllowedVectorIsa() >= VectorIsa::kAvx2) isas.push_back(VectorIsa::kAvx2);
  if (AllowedVectorIsa() >= VectorIsa::kAvx512) {
    isas.push_back(VectorIsa::kAvx512);
  }
  return isas;
}

std::string Name(const AttentionShape& s, VectorIsa isa) {
  return absl::StrCat("B", s.batch, " T", s.tokens, " H", s.heads, " D",
                      s.head_size, " isa ", static_cast<int>(isa));
}

struct Outputs {
  std::vector<float> y, lse, dqkv;
};

Outputs Kernels(const std::vector<float>& qkv, const std::vector<float>& dy,
                const AttentionShape& s, VectorIsa isa) {
  Outputs run;
  run.y.resize(dy.size());
  run.lse.resize(s.batch * s.heads * s.tokens);
  run.dqkv.assign(qkv.size(), std::numeric_limits<float>::quiet_NaN());
  const float scale = 1.0f / std::sqrt(float(s.head_size));
  CausalAttentionForward(qkv.data(), run.y.data(), run.lse.data(), s, scale,
                         false, isa);
  CausalAttentionBackward(qkv.data(), run.y.data(), run.lse.data(), dy.data(),
                          run.dqkv.data(), s, scale, false, isa);
  return run;
}

const AttentionShape kShapes[] = {
    {2, 1, 1, 8},    // one token
    {2, 37, 1, 8},   // one head, T not a multiple of 4 or of a vector
    {1, 70, 2, 24},  // past one 64-row tile, D not a multiple of 16
    {1, 13, 3, 128}, {3, 9, 4, 13},  // D odd
};

TEST(AttentionTest, EveryInstructionSetMatchesTheReferenceBothWays) {
  for (const AttentionShape& s : kShapes) {
    const int64_t c = s.heads * s.head_size;
    const std::vector<float> qkv = Random(s.batch * s.tokens * 3 * c, 1);
    const std::vector<float> dy = Random(s.batch * s.tokens * c, 2);
    const Reference want = Attend(qkv, dy, s);
    for (VectorIsa isa : Isas()) {
      const Outputs got = Kernels(qkv, dy, s, isa);
      EXPECT_LT(RelativeError(got.y, want.y), 1e-6) << Name(s, isa);
      EXPECT_LT(RelativeError(got.dqkv, want.dqkv), 2e-6) << Name(s, isa);
    }
  }
}

TEST(AttentionTest, RepeatsBitForBitWithAnyThreadsAndAnyBatch) {
  const AttentionShape s = {3, 70, 2, 16};
  const int64_t c = s.heads * s.head_size;
  const std::vector<float> qkv = Random(s.batch * s.tokens * 3 * c, 3);
  const std::vector<float> dy = Random(s.batch * s.tokens * c, 4);
  const int threads = at::get_num_threads();
  for (VectorIsa isa : Isas()) {
    at::set_num_threads(1);
    const Outputs one = Kernels(qkv, dy, s, isa);
    at::set_num_threads(2);
    const Outputs two = Kernels(qkv, dy, s, isa);
    EXPECT_EQ(one.y, two.y);
    EXPECT_EQ(one.dqkv, two.dqkv);
    // The last sample alone gives the bits it gets in the batch.
    AttentionShape alone = s;
    alone.batch = 1;
    const Outputs last = Kernels(
        std::vector<float>(qkv.end() - s.tokens * 3 * c, qkv.end()),
        std::vector<float>(dy.end() - s.tokens * c, dy.end()), alone, isa);
    EXPECT_EQ(last.y,
              std::vector<float>(one.y.end() - s.tokens * c, one.y.end()));
    EXPECT_EQ(last.dqkv, std::vector<float>(one.dqkv.end() - s.tokens * 3 * c,
                                            one.dqkv.end()));
  }
  at::set_num_threads(threads);
}

TEST(AttentionTest, TheAutogradFunctionMatchesLibTorchsUnfusedOps) {
  torch::manual_seed(5);
  for (const auto& [tokens, heads, head_size] :
       std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {1, 1, 8}, {67, 1, 32}, {130, 4, 32}, {19, 2, 128}}) {
    const torch::Tensor base = torch::randn({2, tokens, 3 * heads * head_size});
    const torch::Tensor up = torch::randn({2, tokens, heads * head_size});
    torch::Tensor fused_in = base.clone().requires_grad_(true);
    torch::Tensor unfused_in = base.clone().requires_grad_(true);
    ASSERT_TRUE(FusedCausalAttentionTakes(fused_in, heads));
    torch::Tensor fused = FusedCausalAttention(fused_in, heads);
    torch::Tensor unfused =
        UnfusedCausalAttention(unfused_in, heads, CausalMask(tokens));
    (fused * up).sum().backward();
    (unfused * up).sum().backward();
    const std::string at =
        absl::StrCat("T", tokens, " H", heads, " D", head_size);
    EXPECT_TRUE(torch::allclose(fused, unfused, 1e-5, 1e-6)) << at;
    EXPECT_TRUE(torch::allclose(fused_in.grad(), unfused_in.grad(), 1e-4, 1e-5))
        << at << ": max difference "
        << (fused_in.grad() - unfused_in.grad()).abs().max().item<float>();
  }
}

TEST(AttentionTest, Bf16InputsAccumulateInFp32) {
  torch::manual_seed(6);
  const torch::Tensor base = torch::randn({2, 45, 3 * 64});
  const torch::Tensor up = torch::randn({2, 45, 64});
  torch::Tensor in16 = base.to(torch::kBFloat16).requires_grad_(true);
  torch::Tensor in32 = in16.detach().to(torch::kFloat32).requires_grad_(true);
  torch::Tensor y16 = FusedCausalAttention(in16, 2);
  torch::Tensor y32 = FusedCausalAttention(in32, 2);
  EXPECT_EQ(y16.scalar_type(), torch::kBFloat16);
  (y16 * up.to(torch::kBFloat16)).sum().backward();
  (y32 * up.to(torch::kBFloat16).to(torch::kFloat32)).sum().backward();
  EXPECT_EQ(in16.grad().scalar_type(), torch::kBFloat16);
  // One bf16 rounding of fp32 results (8 bits of mantissa).
  EXPECT_TRUE(torch::allclose(y16.to(torch::kFloat32), y32, 1e-2, 1e-2));
  EXPECT_TRUE(torch::allclose(in16.grad().to(torch::kFloat32), in32.grad(),
                              2e-2, 2e-2));
  EXPECT_FALSE(FusedCausalAttentionTakes(base.to(torch::kFloat64), 2));
  EXPECT_FALSE(FusedCausalAttentionTakes(base, 5));  // 64 / 5 heads
}

}  // namespace
}  // namespace lockstep::worker
