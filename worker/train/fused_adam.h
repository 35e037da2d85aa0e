// Adam and AdamW with LibTorch's arithmetic in one pass over each parameter.
//
// torch::optim::Adam updates a parameter with seven tensor operations (two
// multiplies, two fused adds, a square root, a division and the update),
// each a pass over memory: a third of an MLP step on the CPU. FusedAdam
// does the same operations on each element in one pass, rounding where
// LibTorch rounds, so the parameters come out with LibTorch's bits and the
// reference digests stay; its state is Adam's (the same class, checkpoints
// and state handover unchanged).
//
// Which operations LibTorch's kernels fuse into one rounding (an FMA)
// depends on how its CPU kernels were compiled, so FusedAdam checks once per
// process, on a probe, that its update gives the bits torch::optim::Adam
// gives; where it does not (another LibTorch build, ATEN_CPU_CAPABILITY
// set), and for anything but contiguous fp32 CPU tensors or with amsgrad,
// it runs torch::optim::Adam's own step.
#ifndef LOCKSTEP_WORKER_TRAIN_FUSED_ADAM_H_
#define LOCKSTEP_WORKER_TRAIN_FUSED_ADAM_H_

#include <torch/torch.h>

#include <cstdint>

namespace lockstep::worker {

class FusedAdam : public torch::optim::Adam {
 public:
  using torch::optim::Adam::Adam;

  torch::Tensor step(LossClosure closure = nullptr) override;

  // Whether the last step ran fused (for the test).
  bool last_step_fused() const { return last_step_fused_; }

 private:
  bool last_step_fused_ = false;
};

// AdamW (decoupled weight decay: each parameter first scaled by
// 1 - lr * weight_decay) the same way: torch::optim::AdamW's bits, its
// state and checkpoints, one pass per parameter, with the same probe and
// the same fallback to LibTorch's own step.
class FusedAdamW : public torch::optim::AdamW {
 public:
  using torch::optim::AdamW::AdamW;

  torch::Tensor step(LossClosure closure = nullptr) override;

  bool last_step_fused() const { return last_step_fused_; }

 private:
  bool last_step_fused_ = false;
};

// The scalars of one Adam update, as LibTorch rounds them to fp32.
struct AdamScalars {
  float beta1 = 0;            // exp_avg *= beta1
  float one_minus_beta1 = 0;  // exp_avg += (1 - beta1) * grad
  float beta2 = 0;
  float one_minus_beta2 = 0;
  float sqrt_correction2 = 0;  // sqrt(1 - beta2^step)
  float eps = 0;
  float neg_step_size = 0;  // -lr / (1 - beta1^step)
  float weight_decay = 0;   // Adam's: added to the gradient (L2)
  // AdamW's: the parameter is first multiplied by param_scale.
  bool decoupled = false;
  float param_scale = 1;  // 1 - lr * weight_decay

  static AdamScalars Of(const torch::optim::AdamOptions& options, int64_t step);
  static AdamScalars Of(const torch::optim::AdamWOptions& options,
                        int64_t step);
};

// One Adam update of `n` elements, in place. `vector` false runs the
// portable code where the AVX2 code would run.
void FusedAdamUpdate(float* param, const float* grad, float* exp_avg,
                     float* exp_avg_sq, int64_t n, const AdamScalars& scalars,
                     bool vector = true);

// Whether FusedAdamUpdate gives torch::optim::Adam's (AdamW's) bits in this
// process (probed once, on tensors of its own, without touching the global
// RNG).
bool FusedAdamMatchesLibTorch();
bool FusedAdamWMatchesLibTorch();

}  // namespace lockstep::worker

#endif  // LOCKSTEP_WORKER_TRAIN_FUSED_ADAM_H_
