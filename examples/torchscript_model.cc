// Writes a small convolutional TorchScript module for Fashion-MNIST-shaped
// images, as a user's PyTorch code would with torch.jit.save (see
// docs/MODELS.md for the Python version). lockstep trains it with
//   "model": {"torchscript": "PATH"}
// With --step, a training-step module instead (task.type "custom").
//
//   lockstep-example-torchscript [--step] PATH [SEED]
#include <torch/script.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

namespace {

// He-normal weights for `fan_in` inputs. Trainable, as nn.Parameter's are
// by default (lockstep refuses frozen parameters).
torch::Tensor Weights(std::vector<int64_t> shape, int64_t fan_in) {
  return (torch::randn(shape) * std::sqrt(2.0 / static_cast<double>(fan_in)))
      .requires_grad_(true);
}

torch::Tensor Zeros(int64_t size) {
  return torch::zeros({size}).requires_grad_(true);
}

torch::jit::Module LinearLayer(int64_t in, int64_t out) {
  torch::jit::Module layer("Linear");
  layer.register_parameter("weight", Weights({out, in}, in), false);
  layer.register_parameter("bias", Zeros(out), false);
  layer.define(R"(
def forward(self, x):
    return torch.matmul(x, self.weight.t()) + self.bias
)");
  return layer;
}

torch::jit::Module ExampleNet() {
  torch::jit::Module net("ExampleNet");
  // 16 5x5 filters, 2x2 max-pool: [N, 16, 14, 14] for 28x28 images.
  net.register_parameter("conv_weight", Weights({16, 1, 5, 5}, 25), false);
  net.register_parameter("conv_bias", Zeros(16), false);
  net.register_module("hidden", LinearLayer(16 * 14 * 14, 64));
  net.register_module("out", LinearLayer(64, 10));
  net.define(R"(
def forward(self, x):
    x = torch.conv2d(x, self.conv_weight, self.conv_bias, [1, 1], [2, 2])
    x = torch.max_pool2d(torch.relu(x), [2, 2])
    x = torch.relu(self.hidden.forward(x.flatten(1)))
    return self.out.forward(x)
)");
  return net;
}

// A training-step module (task.type "custom") for the 100-class data of
// `lockstep-example-data classes`: forward takes the batch's columns x
// (float32 [N, 32]) and label (int64 [N]) and returns its loss, here
// cross-entropy with a margin of 1 on the true class's logit (what no
// built-in task computes); eval_step adds the correct answers and the
// samples, which lockstep reports as test_accuracy.
torch::jit::Module StepNet() {
  torch::jit::Module net("StepNet");
  net.register_module("hidden", LinearLayer(32, 64));
  net.register_module("out", LinearLayer(64, 100));
  net.define(R"(
def logits(self, x):
    return self.out.forward(torch.relu(self.hidden.forward(x)))

def margin_loss(self, logits, label):
    margin = torch.zeros_like(logits).scatter_(1, label.unsqueeze(1), 1.0)
    log_p = torch.log_softmax(logits - margin, 1)
    return -log_p.gather(1, label.unsqueeze(1)).mean()

def forward(self, batch: Dict[str, Tensor]) -> Dict[str, Tensor]:
    logits = self.logits(batch["x"])
    return {"loss": self.margin_loss(logits, batch["label"])}

def eval_step(self, batch: Dict[str, Tensor]) -> Dict[str, Tensor]:
    logits = self.logits(batch["x"])
    label = batch["label"]
    correct = (logits.argmax(1) == label).sum().float()
    count = torch.full([1], 1.0 * label.size(0))
    return {"loss": self.margin_loss(logits, label), "accuracy": correct,
            "count": count}
)");
  return net;
}

}  // namespace

int main(int argc, char** argv) {
  const bool step = argc > 1 && std::string(argv[1]) == "--step";
  if (step) {
    --argc;
    ++argv;
  }
  if (argc < 2 || argc > 3) {
    std::fprintf(stderr, "usage: %s [--step] PATH [SEED]\n", argv[0]);
    return 2;
  }
  try {
    torch::manual_seed(argc == 3 ? std::strtoull(argv[2], nullptr, 10) : 1);
    (step ? StepNet() : ExampleNet()).save(argv[1]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cannot write %s: %s\n", argv[1], e.what());
    return 1;
  }
  std::printf("wrote %s\n", argv[1]);
  return 0;
}
