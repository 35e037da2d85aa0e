// The fp32 NCHW 2x2 max pooling against LibTorch's, bit for bit: outputs
// and input gradients, AVX-512 and portable code, with ties, NaNs, signed
// zeros and infinities, odd sizes and rows longer than one vector.
#include "worker/train/max_pool.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

namespace lockstep::worker {
namespace {

// The same bits (NaN payloads and zero signs included).
bool SameBits(const torch::Tensor& a, const torch::Tensor& b) {
  return a.sizes() == b.sizes() &&
         torch::equal(a.contiguous().view(torch::kInt32),
                      b.contiguous().view(torch::kInt32));
}

// Values drawn from a few, so windows tie, with special values sprinkled.
torch::Tensor Awkward(const std::vector<int64_t>& shape, int seed) {
  torch::manual_seed(seed);
  torch::Tensor x = torch::randint(-2, 3, shape).to(torch::kFloat32);
  torch::Tensor flat = x.view(-1);
  const float specials[] = {std::numeric_limits<float>::quiet_NaN(),
                            -std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            -0.0f,
                            0.0f};
  torch::Tensor where = torch::randint(flat.numel(), {flat.numel() / 5});
  for (int64_t i = 0; i < where.numel(); ++i) {
    flat[where[i].item<int64_t>()] = specials[i % 6];
  }
  return x;
}

struct Reference {
  torch::Tensor out;
  torch::Tensor grad_in;
};

// max_pool2d(x, 2), or max_pool2d(relu(x), 2), and its input gradient.
Reference LibTorch(const torch::Tensor& x, const torch::Tensor& grad_out,
                   bool relu) {
  torch::Tensor input = x.detach().clone().requires_grad_(true);
  torch::Tensor out = torch::max_pool2d(relu ? torch::relu(input) : input, 2);
  out.backward(grad_out);
  return {out.detach(), input.grad()};
}

TEST(MaxPoolTest, KernelsMatchLibTorchBitForBit) {
  const std::vector<std::vector<int64_t>> shapes = {
      {1, 1, 2, 2},   {2, 3, 28, 28}, {3, 2, 14, 14}, {1, 2, 7, 9},
      {2, 1, 5, 67},  {1, 1, 3, 2},   {1, 3, 4, 33},  {2, 2, 64, 64},
      {1, 1, 2, 130}, {1, 2, 9, 3}};
  int seed = 0;
  for (const auto& shape : shapes) {
    for (bool relu : {false, true}) {
      for (bool vector : {true, false}) {
        const torch::Tensor x = Awkward(shape, ++seed);
        const int64_t planes = shape[0] * shape[1], h = shape[2], w = shape[3];
        torch::Tensor grad_out =
            Awkward({shape[0], shape[1], h / 2, w / 2}, ++seed);
        const Reference want = LibTorch(x, grad_out, relu);

        torch::Tensor out = torch::full_like(want.out, 7.0f);
        torch::Tensor winner =
            torch::empty(want.out.sizes(), torch::kUInt8).fill_(9);
        MaxPool2x2Forward(x.data_ptr<float>(), out.data_ptr<float>(),
                          winner.data_ptr<uint8_t>(), planes, h, w, relu,
                          vector);
        EXPECT_TRUE(SameBits(out, want.out))
            << "shape " << x.sizes() << " relu " << relu << " vector "
            << vector;

        // Every input gradient is written: start from garbage.
        torch::Tensor grad_in = torch::full_like(x, 5.0f);
        MaxPool2x2Backward(grad_out.data_ptr<float>(),
                           winner.data_ptr<uint8_t>(),
                           grad_in.data_ptr<float>(), planes, h, w);
        EXPECT_TRUE(SameBits(grad_in, want.grad_in))
            << "shape " << x.sizes() << " relu " << relu << " vector "
            << vector;
      }
    }
  }
}

TEST(MaxPoolTest, TiesGoToTheFirstAndNaNsToTheLast) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // Windows with a tie, a later equal value, two NaNs, and only -inf.
  const float inf = std::numeric_limits<float>::infinity();
  torch::Tensor x =
      torch::tensor({3.0f, 1.0f, 0.0f, 1.0f, 3.0f, 2.0f, 1.0f, -0.0f, nan, 2.0f,
                     -inf, -inf, 1.0f, nan, -inf, -inf})
          .view({1, 1, 4, 4});
  // The four windows are x[0:2, 0:2], x[0:2, 2:4], x[2:4, 0:2], x[2:4, 2:4].
  torch::Tensor out = torch::empty({1, 1, 2, 2});
  torch::Tensor winner = torch::empty({1, 1, 2, 2}, torch::kUInt8);
  for (bool vector : {true, false}) {
    MaxPool2x2Forward(x.data_ptr<float>(), out.data_ptr<float>(),
                      winner.data_ptr<uint8_t>(), 1, 4, 4, /*relu=*/false,
                      vector);
    // {3, 1 / 3, 2}: the first 3 wins; {0, 1 / 1, -0}: 1, top right;
    // {nan, 2 / 1, nan}: the last NaN; {-inf, -inf / -inf, -inf}: the first.
    EXPECT_EQ(winner.view(-1)[0].item<int>(), 0);
    EXPECT_EQ(winner.view(-1)[1].item<int>(), 1);
    EXPECT_EQ(winner.view(-1)[2].item<int>(), 3);
    EXPECT_EQ(winner.view(-1)[3].item<int>(), 0);
    EXPECT_TRUE(std::isnan(out.view(-1)[2].item<float>()));
  }
}

TEST(MaxPoolTest, AutogradMatchesLibTorch) {
  for (bool relu : {false, true}) {
    for (bool training : {true, false}) {
      torch::Tensor x = Awkward({4, 3, 10, 12}, 42).requires_grad_(training);
      torch::Tensor mine = x.detach().clone().requires_grad_(training);
      ASSERT_TRUE(MaxPool2x2Takes(mine));
      torch::Tensor want = torch::max_pool2d(relu ? torch::relu(x) : x, 2);
      torch::Tensor got = MaxPool2x2(mine, relu);
      EXPECT_TRUE(SameBits(got, want)) << relu;
      if (!training) continue;
      torch::Tensor grad = torch::randn(want.sizes());
      want.backward(grad);
      got.backward(grad);
      EXPECT_TRUE(SameBits(mine.grad(), x.grad())) << relu;
    }
  }
}

TEST(MaxPoolTest, TakesOnlyContiguousFp32NchwOnTheCpu) {
  EXPECT_TRUE(MaxPool2x2Takes(torch::zeros({2, 3, 4, 4})));
  EXPECT_FALSE(MaxPool2x2Takes(torch::zeros({2, 3, 4, 4}, torch::kBFloat16)));
  EXPECT_FALSE(
      MaxPool2x2Takes(torch::zeros({2, 3, 4, 4})
                          .contiguous(torch::MemoryFormat::ChannelsLast)));
  EXPECT_FALSE(MaxPool2x2Takes(torch::zeros({3, 4, 4})));
  EXPECT_FALSE(MaxPool2x2Takes(torch::zeros({2, 3, 1, 4})));
  EXPECT_FALSE(MaxPool2x2Takes(torch::zeros({2, 3, 8, 8}).slice(3, 0, 4)));
}

}  // namespace
}  // namespace lockstep::worker
