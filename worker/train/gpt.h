// A decoder-only transformer with nanoGPT's architecture: token and learned
// position embeddings, n_layer pre-LayerNorm blocks of causal multi-head
// self-attention and a 4x GELU MLP, a final LayerNorm, and an output layer
// tied to the token embedding. Initialized as nanoGPT does (normal, std
// 0.02; the residual projections scaled by 1/sqrt(2 n_layer)).
#ifndef LOCKSTEP_WORKER_TRAIN_GPT_H_
#define LOCKSTEP_WORKER_TRAIN_GPT_H_

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "worker/train/model.h"

namespace lockstep::worker {

struct GptOptions {
  int64_t vocab = 0;
  int64_t block = 0;  // the longest sequence (positions)
  int64_t n_layer = 4;
  int64_t n_head = 4;
  int64_t n_embd = 128;
  double dropout = 0;
  // The attention by lockstep's fused kernel (attention.h) where it takes
  // the tensors (CPU, fp32 or bf16) and no attention dropout applies; on a
  // GPU with LibTorch 2 or later, at::scaled_dot_product_attention.
  // Otherwise, and when false, LibTorch's unfused ops.
  bool fused = true;
};

// Takes int64 token ids [N, T] (T <= block); Features returns the final
// LayerNorm's output [N, T, n_embd], Logits [N, T, vocab] in fp32.
std::shared_ptr<Network> MakeGpt(const GptOptions& options);

}  // namespace lockstep::worker

#endif  // LOCKSTEP_WORKER_TRAIN_GPT_H_
