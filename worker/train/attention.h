// The gpt's causal self-attention, fused (attention_kernels.h) and
// differentiable: a torch::autograd::Function whose backward pass runs the
// fused backward kernel, so the model reads as one call; and the unfused
// ops it replaces, for model.fused false, the tests and the bench.
#ifndef LOCKSTEP_WORKER_TRAIN_ATTENTION_H_
#define LOCKSTEP_WORKER_TRAIN_ATTENTION_H_

#include <torch/torch.h>

#include <cstdint>

#include "worker/train/vector_isa.h"

namespace lockstep::worker {

// Whether FusedCausalAttention takes `qkv`: a CPU [B, T, 3C] tensor of
// fp32 or bf16 with C a multiple of n_head.
bool FusedCausalAttentionTakes(const torch::Tensor& qkv, int64_t n_head);

// softmax(mask(q k^T / sqrt(D))) v for each head of qkv = [q | k | v]
// ([B, T, 3C], heads side by side in each), as [B, T, C] in qkv's type:
// what the unfused attention gives, within rounding. `isa` caps the
// vector code (for tests and benches; the widest allowed by default).
torch::Tensor FusedCausalAttention(const torch::Tensor& qkv, int64_t n_head,
                                   VectorIsa isa = VectorIsa::kAvx512);

// LibTorch's unfused attention, op for op as the gpt computes it with
// model.fused false: the [B, H, T, T] scores q k^T scaled and added to
// `mask` (CausalMask) in one pass, their softmax (then `dropout`, when
// given), times v, as [B, T, C].
torch::Tensor UnfusedCausalAttention(const torch::Tensor& qkv, int64_t n_head,
                                     const torch::Tensor& mask,
                                     torch::nn::Dropout* dropout = nullptr);

// [t, t] fp32: 0 where a position may attend (on and below the diagonal),
// -inf above.
torch::Tensor CausalMask(int64_t t);

}  // namespace lockstep::worker

#endif  // LOCKSTEP_WORKER_TRAIN_ATTENTION_H_
