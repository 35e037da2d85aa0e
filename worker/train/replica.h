// The model replica a worker trains for one job: the model, its optimizer,
// the loss scaler and the position in training. It outlives generations
// (docs/DESIGN.md §3): a rank that keeps its process keeps its replica, and
// the ranks of a new generation adopt the most advanced one. Also what the
// step does to it: the optimizer's learning rate, bf16 autocast, and batch
// norm's running statistics.
//
// Thread-compatible: the training thread owns the replica.
#ifndef LOCKSTEP_WORKER_TRAIN_REPLICA_H_
#define LOCKSTEP_WORKER_TRAIN_REPLICA_H_

#include <ATen/autocast_mode.h>
#include <torch/torch.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "lockstep/v1/job.pb.h"
#include "worker/train/loss_scaler.h"
#include "worker/train/model.h"

namespace lockstep::worker {

struct Replica {
  std::string job_id;
  std::shared_ptr<Network> model;  // null until the first generation
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  int64_t step = 0;  // steps taken (applied or skipped by the loss scaler)
  // The global batch the replica trains with, fixed once it has trained:
  // a generation on another world size re-slices it.
  int global_batch = 0;
  double last_loss = 0;
  // The learning rate of the last step: its schedule's value (also for a
  // step the loss scaler skipped, which applied nothing).
  double last_lr = 0;
  // The last evaluation: classification's accuracy, the test loss and the
  // task's metrics by name.
  double last_accuracy = 0;
  double last_test_loss = 0;
  std::map<std::string, double> last_metrics;
  LossScaler scaler;  // fp16 only; holds the skipped-step count
  // Where the model and the optimizer's state live (this worker's device).
  torch::Device device = torch::kCPU;

  // Optimizer steps applied: the learning-rate schedule's position.
  int64_t applied_steps() const { return step - scaler.skipped_steps(); }
};

// The options of the job's model for one sample's `input` shape (int64
// token ids when `token_input`) and `outputs` (classes, targets or the
// vocabulary). The defaults are Fashion-MNIST's.
ModelOptions ModelOptionsOf(const v1::JobSpec& spec,
                            std::vector<int64_t> input = {1, 28, 28},
                            bool token_input = false, int64_t outputs = 10);

// Builds the job's model, optimizer and loss scaler into `replica` under the
// job's seed, so every rank starts from the same parameters, and puts the
// model on `device` (the optimizer's state follows it). Errors name the
// TorchScript file that cannot be used, or the model that cannot take the
// task's input.
absl::Status InitializeReplica(const v1::JobSpec& spec,
                               const ModelOptions& options,
                               torch::Device device, Replica* replica);

// The job's optimizer over `params`; `decay[i]` says whether params[i] is
// decayed by "adamw" (Network::WeightDecayMask; sgd and adam decay all).
std::unique_ptr<torch::optim::Optimizer> MakeOptimizer(
    const v1::OptimizerSpec& spec, std::vector<torch::Tensor> params,
    const std::vector<bool>& decay);

void SetLearningRate(torch::optim::Optimizer& optimizer, double lr);

// The job's precision: "bf16" and "fp16" compute the enclosed ops where
// LibTorch's autocast policy for the device lowers them (convolutions,
// matrix products) in that type; "fp32" (and fp16 on the CPU, which the
// trainer refuses) enclose nothing.
class Autocast {
 public:
  Autocast(const std::string& precision, torch::Device device);
  ~Autocast();
  Autocast(const Autocast&) = delete;
  Autocast& operator=(const Autocast&) = delete;

 private:
  bool enabled_ = false;
  at::DeviceType device_type_ = at::kCPU;
  bool previous_ = false;
  at::ScalarType previous_dtype_ = at::kBFloat16;
};

// `model`'s fp32 outputs for `inputs` in the job's precision: Features
// under Autocast, the output layer too where the model asks for it
// (Network::output_layer_in_precision), else in fp32.
torch::Tensor PrecisionLogits(Network& model, const torch::Tensor& inputs,
                              const std::string& precision,
                              torch::Device device);

// Batch norm's running statistics: what each rank accumulates from its own
// batches (and what the ranks average before evaluating and saving). Other
// buffers (a TorchScript module's constants) are the same on every rank and
// are not included. The tensors are the model's own buffers: loading state
// replaces their contents, not the buffers.
class RunningStatistics {
 public:
  explicit RunningStatistics(const torch::nn::Module& model);

  std::vector<torch::Tensor>& tensors() { return statistics_; }
  bool empty() const { return statistics_.empty(); }
  // Before a forward pass: a failed step puts these values back.
  void Remember();
  void PutBack();

 private:
  std::vector<torch::Tensor> statistics_;
  std::vector<torch::Tensor> remembered_;
};

}  // namespace lockstep::worker

#endif  // LOCKSTEP_WORKER_TRAIN_REPLICA_H_
