// The models a worker trains: the built-in ones, created under the job's
// seed so every rank starts from the same weights (checked by the trainer at
// start), and user models exported from PyTorch as TorchScript.
#ifndef LOCKSTEP_WORKER_TRAIN_MODEL_H_
#define LOCKSTEP_WORKER_TRAIN_MODEL_H_

#include <torch/torch.h>

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/data/split_source.h"

namespace lockstep::worker {

// A model split where mixed precision needs it: the trainer runs Features
// under autocast and, unless the model says otherwise, Logits in fp32, so
// the output layer and the loss keep full precision.
// A training-step module's batch: every column by name, [N, ...] each.
using NamedBatch = std::vector<std::pair<std::string, torch::Tensor>>;

// One tensor of a model's state_dict: its dotted name as PyTorch gives it
// ("body.1.weight"), and whether it is a buffer (batch norm's statistics).
struct StateEntry {
  std::string name;
  torch::Tensor tensor;
  bool buffer = false;
};

class Network : public torch::nn::Module {
 public:
  // Everything up to the output layer, for a batch of inputs [N, ...]
  // (floats, or int64 token ids).
  virtual torch::Tensor Features(const torch::Tensor& inputs) = 0;
  // The output layer: outputs [N, outputs] ([N, T, vocab] for a language
  // model), fp32 outside autocast.
  virtual torch::Tensor Logits(const torch::Tensor& features) = 0;
  // Whether the output layer runs under the job's precision (autocast) too,
  // rather than in fp32 (PrecisionLogits, replica.h).
  virtual bool output_layer_in_precision() const { return false; }
  torch::Tensor forward(const torch::Tensor& images) {
    return Logits(Features(images));
  }
  // Which of parameters() the optimizer "adamw" decays: the matrices
  // (dim >= 2) by default; not biases or norms.
  virtual std::vector<bool> WeightDecayMask() const;
  // Whether the model normalizes over the batch (batch norm), which makes
  // its statistics depend on the per-replica batch.
  virtual bool has_batch_norm() const { return false; }
  // A user's TorchScript module (exported as TorchScript, not as an archive).
  virtual bool is_torchscript() const { return false; }
  // A training-step module (docs/MODELS.md): forward takes the batch's
  // columns and returns its "loss" and additive sums.
  virtual bool is_step_module() const { return false; }
  // A training-step module's scalar loss for `batch`.
  virtual torch::Tensor StepLoss(const NamedBatch& batch);
  // A training-step module's evaluation of `batch` (its eval_step, else
  // forward; the caller disables gradients): "loss", the batch's mean, and
  // the other outputs, sums to add up over batches and ranks.
  virtual std::map<std::string, torch::Tensor> EvalStep(
      const NamedBatch& batch);
  // The names EvalStep returns besides "loss", sorted (the same on every
  // rank: found when the module is loaded).
  virtual std::vector<std::string> EvalSums() const { return {}; }
  // The trained model as a file users load: a LibTorch archive
  // (torch::load into the same architecture) for the built-in models, a
  // TorchScript module (torch.jit.load) for user models.
  virtual absl::StatusOr<std::string> Export() const;
  // What a PyTorch state_dict of the same architecture holds: the
  // parameters, then the buffers, in registration order (a TorchScript
  // model's own names; model_export.h).
  virtual std::vector<StateEntry> StateDict() const;
  // The forward pass in evaluation mode as TorchScript source (`def
  // forward(self, x)`) over the tensors of StateDict(), named with '.'
  // replaced by '_' (model_export.h). Unimplemented where a model has none.
  virtual absl::StatusOr<std::string> TorchScriptSource() const;

  // Convolutions on channels-last (NHWC) activations, the layout oneDNN's
  // bf16 kernels and LibTorch's CPU max pooling are fastest on. Their sums
  // run in another order than NCHW's, so only a job whose arithmetic may
  // change (bf16) sets it; the parameters keep their layout either way.
  void set_channels_last(bool on) { channels_last_ = on; }

 protected:
  // A convolution's output in the layout set_channels_last chose (the
  // layers after it follow its layout).
  torch::Tensor ConvLayout(const torch::Tensor& x) const {
    return channels_last_ ? x.contiguous(torch::MemoryFormat::ChannelsLast) : x;
  }

 private:
  bool channels_last_ = false;
};

struct ModelOptions {
  // "mlp", "cnn", "resnet" or "gpt"; ignored when `torchscript` is set.
  std::string name = "mlp";
  // Path of a TorchScript module to train instead of a built-in.
  std::string torchscript;
  // Dropout probability after each hidden layer of the built-in models.
  double dropout = 0;
  // One sample's input: floats [C, H, W] (images), [D] or any shape (mlp);
  // or, with `token_input`, [T] int64 token ids.
  std::vector<int64_t> input = {1, 28, 28};
  bool token_input = false;
  // Classes, regression targets, or the vocabulary of a language model.
  int64_t outputs = 10;
  // Set for a training-step module (task.type "custom"): every column of
  // the batch, which it is checked against when loaded.
  std::vector<ColumnInfo> step_columns;
  // gpt's sizes.
  int64_t n_layer = 4;
  int64_t n_head = 4;
  int64_t n_embd = 128;
  // gpt: lockstep's fused attention where it applies (gpt.h).
  bool fused = true;
};

// "mlp": inputs flattened, then 256-128 hidden units with ReLU. "cnn": two
// 3x3 conv + max-pool blocks (32, 64 channels), then 128 hidden units.
// "resnet": a 3x3 stem and three residual blocks (16, 32, 64 channels, the
// last two at stride 2), each conv followed by batch norm, then global
// average pooling. cnn and resnet take [C, H, W] inputs. All return
// [N, outputs]. "gpt": gpt.h, for token inputs. Errors name the TorchScript
// file that cannot be loaded or does not produce the task's shape, or the
// model that cannot take the input.
absl::StatusOr<std::shared_ptr<Network>> BuildModel(
    const ModelOptions& options);

// How checkpoints name the model, to refuse restoring another one: the
// name alone for Fashion-MNIST's shape (what lockstep always wrote), else
// with the shapes and sizes ("cnn:in=[3, 32, 32]:out=100").
std::string ModelLabel(const ModelOptions& options);

// SHA-256 (hex) of the fp32 parameters in registration order.
absl::StatusOr<std::string> ModelDigest(const torch::nn::Module& model);

// A module's parameters and buffers as a LibTorch archive: the bytes
// torch::save(module, path) writes, so torch::load(module, path) reads them
// back into the same architecture.
std::string SerializeModel(const torch::nn::Module& model);

}  // namespace lockstep::worker

#endif  // LOCKSTEP_WORKER_TRAIN_MODEL_H_
