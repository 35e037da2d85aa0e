// 2x2 max pooling with stride 2 for fp32 NCHW activations on the CPU, with
// LibTorch's results to the bit: the same outputs (the first maximum of a
// window in row-major order wins a tie; a NaN wins over any number, the last
// NaN over an earlier one) and the same input gradients (0 + the output's
// gradient at the winner, 0 elsewhere).
//
// LibTorch 1.13's own NCHW kernel branches on every comparison and spends a
// third of an fp32 CNN step mispredicting them (docs/BENCHMARKS.md, "The
// roofline"); this one selects without branches, 16 outputs at a time where
// the CPU has AVX-512, and keeps a one-byte winner per output for the
// backward pass instead of an int64 index. A ReLU before the pooling (the
// CNN's convolution, ReLU, pooling) runs in the same pass, which spares its
// own forward and backward passes over the largest activations.
#ifndef LOCKSTEP_WORKER_TRAIN_MAX_POOL_H_
#define LOCKSTEP_WORKER_TRAIN_MAX_POOL_H_

#include <torch/torch.h>

#include <cstdint>

namespace lockstep::worker {

// Whether MaxPool2x2 takes `x`: a CPU fp32 [N, C, H, W] tensor, contiguous
// in NCHW, with H and W at least 2.
bool MaxPool2x2Takes(const torch::Tensor& x);

// torch::max_pool2d(x, 2) for an `x` MaxPool2x2Takes, differentiable; with
// `relu`, torch::max_pool2d(torch::relu(x), 2) in one pass (the ReLU's
// output is never stored), its gradient LibTorch's through both.
torch::Tensor MaxPool2x2(const torch::Tensor& x, bool relu = false);

// The kernels on raw planes, for the test: `planes` planes of h x w inputs
// in, (h / 2) x (w / 2) outputs and winners out (bits 0-1: top left, top
// right, bottom left, bottom right; bit 2: the ReLU passes no gradient
// there). `vector` false runs the portable forward code where the AVX-512
// code would run. The backward pass writes every input gradient.
void MaxPool2x2Forward(const float* in, float* out, uint8_t* winner,
                       int64_t planes, int64_t h, int64_t w, bool relu,
                       bool vector);
void MaxPool2x2Backward(const float* grad_out, const uint8_t* winner,
                        float* grad_in, int64_t planes, int64_t h, int64_t w);

}  // namespace lockstep::worker

#endif  // LOCKSTEP_WORKER_TRAIN_MAX_POOL_H_
