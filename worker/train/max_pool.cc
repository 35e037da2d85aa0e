// 2x2 max pooling for fp32 NCHW activations (max_pool.h). Built with
// OpenMP so at::parallel_for shares the rows among LibTorch's threads.
#include "worker/train/max_pool.h"

#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "worker/train/vector_isa.h"

namespace lockstep::worker {
namespace {

uint32_t Bits(float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof(bits));
  return bits;
}

float FromBits(uint32_t bits) {
  float value;
  std::memcpy(&value, &bits, sizeof(value));
  return value;
}

// All ones where `on`, else zero.
uint32_t Mask(bool on) { return 0u - static_cast<uint32_t>(on); }

// One step of LibTorch's scan of a window: `value` (at window position
// `position`) replaces the maximum so far when greater, or when NaN.
void Take(float value, uint32_t position, float& max, uint32_t& winner) {
  const uint32_t take = Mask((value > max) | std::isnan(value));
  max = FromBits((Bits(value) & take) | (Bits(max) & ~take));
  winner = (position & take) | (winner & ~take);
}

// The winner's bit that says ReLU passes no gradient back through it.
constexpr uint32_t kBlocked = 4;

// LibTorch's relu: std::max(value, 0), so -0 and NaN stay as they are.
float Relu(float value) {
  return FromBits(Bits(value) & Mask(!(value < 0.0f)));
}

// One output row from the input rows `top` and `bottom`, without branches;
// with `relu`, of the inputs' ReLU.
void ForwardRow(const float* top, const float* bottom, float* out,
                uint8_t* winners, int64_t columns, bool relu) {
  auto in = [relu](float value) { return relu ? Relu(value) : value; };
  for (int64_t j = 0; j < columns; ++j) {
    float max = in(top[2 * j]);
    uint32_t winner = 0;
    Take(in(top[2 * j + 1]), 1, max, winner);
    Take(in(bottom[2 * j]), 2, max, winner);
    Take(in(bottom[2 * j + 1]), 3, max, winner);
    // ReLU's backward passes nothing where its output is <= 0.
    if (relu) winner |= kBlocked & Mask(max <= 0.0f);
    out[j] = max;
    winners[j] = static_cast<uint8_t>(winner);
  }
}

// The first `n` lanes of 16.
__attribute__((target("avx512f"))) __mmask16 Lanes(int64_t n) {
  return n >= 16 ? __mmask16{0xFFFF}
                 : static_cast<__mmask16>((1u << std::max<int64_t>(n, 0)) - 1);
}

// ForwardRow 16 outputs at a time: each input row's 32 values split into
// the windows' left and right columns.
__attribute__((target("avx512f"))) void ForwardRowAvx512(
    const float* top, const float* bottom, float* out, uint8_t* winners,
    int64_t columns, bool relu) {
  const __m512i left = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20,
                                         22, 24, 26, 28, 30);
  const __m512i right = _mm512_add_epi32(left, _mm512_set1_epi32(1));
  for (int64_t j = 0; j < columns; j += 16) {
    const int64_t n = std::min<int64_t>(16, columns - j);
    const __mmask16 low = Lanes(2 * n), high = Lanes(2 * n - 16);
    const __m512 t0 = _mm512_maskz_loadu_ps(low, top + 2 * j);
    const __m512 t1 = _mm512_maskz_loadu_ps(high, top + 2 * j + 16);
    const __m512 b0 = _mm512_maskz_loadu_ps(low, bottom + 2 * j);
    const __m512 b1 = _mm512_maskz_loadu_ps(high, bottom + 2 * j + 16);
    __m512 values[4] = {_mm512_permutex2var_ps(t0, left, t1),
                        _mm512_permutex2var_ps(t0, right, t1),
                        _mm512_permutex2var_ps(b0, left, b1),
                        _mm512_permutex2var_ps(b0, right, b1)};
    if (relu) {
      // max(0, v) returns v where v is NaN or a zero, as Relu does.
      for (__m512& value : values) {
        value = _mm512_max_ps(_mm512_setzero_ps(), value);
      }
    }
    __m512 max = values[0];
    __m512i winner = _mm512_setzero_si512();
    for (int position = 1; position < 4; ++position) {
      const __m512 value = values[position];
      const __mmask16 take = _mm512_cmp_ps_mask(value, max, _CMP_GT_OQ) |
                             _mm512_cmp_ps_mask(value, value, _CMP_UNORD_Q);
      max = _mm512_mask_mov_ps(max, take, value);
      winner = _mm512_mask_mov_epi32(winner, take, _mm512_set1_epi32(position));
    }
    if (relu) {
      const __mmask16 blocked =
          _mm512_cmp_ps_mask(max, _mm512_setzero_ps(), _CMP_LE_OQ);
      winner = _mm512_mask_or_epi32(winner, blocked, winner,
                                    _mm512_set1_epi32(kBlocked));
    }
    _mm512_mask_storeu_ps(out + j, Lanes(n), max);
    _mm512_mask_cvtepi32_storeu_epi8(winners + j, Lanes(n), winner);
  }
}

bool HaveAvx512() { return AllowedVectorIsa() == VectorIsa::kAvx512; }

// Rows of outputs per task: about 4096 outputs.
int64_t Grain(int64_t columns) {
  return std::max<int64_t>(1, 4096 / std::max<int64_t>(columns, 1));
}

}  // namespace

void MaxPool2x2Forward(const float* in, float* out, uint8_t* winner,
                       int64_t planes, int64_t h, int64_t w, bool relu,
                       bool vector) {
  const int64_t rows = h / 2, columns = w / 2;
  const bool avx512 = vector && HaveAvx512();
  at::parallel_for(
      0, planes * rows, Grain(columns), [&](int64_t begin, int64_t end) {
        for (int64_t row = begin; row < end; ++row) {
          const float* top = in + (row / rows) * h * w + (row % rows) * 2 * w;
          if (avx512) {
            ForwardRowAvx512(top, top + w, out + row * columns,
                             winner + row * columns, columns, relu);
          } else {
            ForwardRow(top, top + w, out + row * columns,
                       winner + row * columns, columns, relu);
          }
        }
      });
}

void MaxPool2x2Backward(const float* grad_out, const uint8_t* winner,
                        float* grad_in, int64_t planes, int64_t h, int64_t w) {
  const int64_t rows = h / 2, columns = w / 2;
  // Where output row `row`'s window rows start.
  auto top = [&](int64_t row) {
    return grad_in + (row / rows) * h * w + (row % rows) * 2 * w;
  };
  at::parallel_for(
      0, planes * rows, Grain(columns), [&](int64_t begin, int64_t end) {
        // LibTorch zeroes the input gradient, then adds each output's gradient
        // at its winner. Zero the rows' windows (and an odd last row of a
        // plane: inputs no window covers) in one sweep, as they are contiguous.
        float* last = top(end - 1) + 2 * w;
        if (h % 2 != 0 && (end - 1) % rows == rows - 1) last += w;
        std::fill(top(begin), last, 0.0f);
        for (int64_t row = begin; row < end; ++row) {
          float* window = top(row);
          const float* grad = grad_out + row * columns;
          const uint8_t* winners = winner + row * columns;
          for (int64_t j = 0; j < columns; ++j) {
            // 0 + -0 is +0, as in LibTorch's sum; a blocked winner gets 0.
            const uint32_t at = winners[j];
            window[((at >> 1) & 1) * w + 2 * j + (at & 1)] =
                FromBits(Bits(0.0f + grad[j]) & Mask((at & kBlocked) == 0));
          }
        }
      });
}

namespace {

// The pooled outputs of `x` (of its ReLU with `relu`), and each one's
// winner in `winner`.
torch::Tensor Pool(const torch::Tensor& x, bool relu, torch::Tensor& winner) {
  const int64_t n = x.size(0), c = x.size(1), h = x.size(2), w = x.size(3);
  torch::Tensor out = torch::empty({n, c, h / 2, w / 2}, x.options());
  winner = torch::empty({n, c, h / 2, w / 2}, x.options().dtype(torch::kUInt8));
  MaxPool2x2Forward(x.data_ptr<float>(), out.data_ptr<float>(),
                    winner.data_ptr<uint8_t>(), n * c, h, w, relu,
                    /*vector=*/true);
  return out;
}

class MaxPool2x2Function
    : public torch::autograd::Function<MaxPool2x2Function> {
 public:
  static torch::Tensor forward(torch::autograd::AutogradContext* ctx,
                               const torch::Tensor& x, bool relu) {
    torch::Tensor winner;
    torch::Tensor out = Pool(x, relu, winner);
    ctx->save_for_backward({winner});
    ctx->saved_data["h"] = x.size(2);
    ctx->saved_data["w"] = x.size(3);
    return out;
  }

  static torch::autograd::tensor_list backward(
      torch::autograd::AutogradContext* ctx,
      torch::autograd::tensor_list grads) {
    const torch::Tensor winner = ctx->get_saved_variables()[0];
    const torch::Tensor grad = grads[0].contiguous();
    const int64_t h = ctx->saved_data["h"].toInt();
    const int64_t w = ctx->saved_data["w"].toInt();
    torch::Tensor grad_in =
        torch::empty({winner.size(0), winner.size(1), h, w}, grad.options());
    MaxPool2x2Backward(grad.data_ptr<float>(), winner.data_ptr<uint8_t>(),
                       grad_in.data_ptr<float>(),
                       winner.size(0) * winner.size(1), h, w);
    return {grad_in, torch::Tensor()};  // nothing for `relu`
  }
};

}  // namespace

bool MaxPool2x2Takes(const torch::Tensor& x) {
  return x.defined() && x.device().is_cpu() &&
         x.scalar_type() == torch::kFloat32 && x.dim() == 4 &&
         x.is_contiguous() && x.size(2) >= 2 && x.size(3) >= 2;
}

torch::Tensor MaxPool2x2(const torch::Tensor& x, bool relu) {
  if (!torch::GradMode::is_enabled() || !x.requires_grad()) {
    torch::Tensor winner;
    return Pool(x, relu, winner);
  }
  return MaxPool2x2Function::apply(x, relu);
}

}  // namespace lockstep::worker
