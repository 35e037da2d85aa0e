// The built-in models. Parameters are created under the job's seed so every
// rank starts from the same weights (checked by the trainer at start).
#ifndef LOCKSTEP_WORKER_TRAIN_MODEL_H_
#define LOCKSTEP_WORKER_TRAIN_MODEL_H_

#include <torch/torch.h>

#include <string>

#include "absl/status/statusor.h"

namespace lockstep::worker {

// "mlp": 784-256-128-10 with ReLU. "cnn": two 3x3 conv + max-pool blocks
// (32, 64 channels), then 128 hidden units. Both take [N, 1, 28, 28] images
// and return [N, 10] logits.
absl::StatusOr<torch::nn::Sequential> BuildModel(const std::string& name,
                                                 int64_t rows, int64_t cols);

// SHA-256 (hex) of the fp32 parameters in registration order.
std::string ModelDigest(const torch::nn::Module& model);

// A module's parameters and buffers as a LibTorch archive: the bytes
// torch::save(module, path) writes, so torch::load(module, path) reads them
// back into the same architecture.
std::string SerializeModel(const torch::nn::Module& model);

}  // namespace lockstep::worker

#endif  // LOCKSTEP_WORKER_TRAIN_MODEL_H_
