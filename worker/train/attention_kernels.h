// Causal multi-head self-attention fused into one pass each way on the
// CPU, for the gpt (worker/train/attention.h has its differentiable form).
//
// The unfused attention writes the [T, T] scores of every head, masks them
// with -inf above the diagonal, takes their softmax into another [T, T]
// matrix and keeps it for the backward pass: at block 1024 that is 4 MiB
// per head and sample, and four passes over it each way. These kernels
// follow FlashAttention-2's plan on the CPU instead: each task takes a
// block of 4 query rows at a time against the keys that row block may see
// (the causal mask skips the rest; nothing above the diagonal is computed),
// keeps only those rows' scores (4 x T floats, in cache), and saves one
// log-sum-exp per row. The backward pass recomputes the probabilities from
// it. No T x T matrix exists at any time. (A row block's scores are kept
// whole, so the softmax needs no online rescaling: that is for a GPU's
// tiles that must fit its shared memory.)
//
// Inputs are the model's qkv projection as it comes, [B, T, 3C] with the
// heads side by side (q in columns [0, C), k in [C, 2C), v in [2C, 3C),
// head h in columns h*D to h*D+D of each), fp32 or bf16; the output is
// [B, T, C] in the input's type, heads side by side: what the output
// projection takes, with no transposes or copies around the kernel. All
// arithmetic is fp32. Products run 16 lanes wide where the CPU has
// AVX-512, 8 with AVX2, one at a time otherwise, the widest that
// AllowedVectorIsa() allows, chosen at run time as the BLAS kernel is.
// Threads (at::parallel_for): forward over (sample, head, 64 query rows),
// backward over (sample, head). The result for a sample never depends on
// the others in the batch, nor on the number of threads.
#ifndef LOCKSTEP_WORKER_TRAIN_ATTENTION_KERNELS_H_
#define LOCKSTEP_WORKER_TRAIN_ATTENTION_KERNELS_H_

#include <cstdint>

#include "worker/train/vector_isa.h"

namespace lockstep::worker {

struct AttentionShape {
  int64_t batch = 0;
  int64_t tokens = 0;     // T
  int64_t heads = 0;      // H
  int64_t head_size = 0;  // D; C = H * D
};

// y = softmax(mask(q k^T * scale)) v for every sample and head, and the
// log-sum-exp of each row's scaled scores into lse [B, H, T]. `bf16`: qkv
// and y hold bfloat16 bits (uint16_t) instead of floats. `isa`: the widest
// vector code to run (capped by AllowedVectorIsa()).
void CausalAttentionForward(const void* qkv, void* y, float* lse,
                            const AttentionShape& shape, float scale, bool bf16,
                            VectorIsa isa);

// The gradient of the loss with respect to qkv ([B, T, 3C], written whole)
// from its gradient with respect to y (dy, [B, T, C]), given the forward
// pass's qkv, y and lse. Types as in the forward pass.
void CausalAttentionBackward(const void* qkv, const void* y, const float* lse,
                             const void* dy, void* dqkv,
                             const AttentionShape& shape, float scale,
                             bool bf16, VectorIsa isa);

}  // namespace lockstep::worker

#endif  // LOCKSTEP_WORKER_TRAIN_ATTENTION_KERNELS_H_
