// The built-in models, user TorchScript models and the export formats.
#include "worker/train/model.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <torch/script.h>

#include "common/files.h"

namespace lockstep::worker {
namespace {

std::string TempDir() {
  std::string tmpl = ::testing::TempDir() + "model_XXXXXX";
  return mkdtemp(tmpl.data());
}

ModelOptions Named(const std::string& name, double dropout = 0) {
  ModelOptions options;
  options.name = name;
  options.dropout = dropout;
  return options;
}

TEST(ModelTest, UnknownModelIsNamed) {
  auto model = BuildModel(Named("resnet9000"));
  ASSERT_FALSE(model.ok());
  EXPECT_NE(model.status().message().find("resnet9000"), std::string::npos);
}

TEST(ModelTest, EveryBuiltInGivesLogitsAndOnlyResnetHasBatchNorm) {
  for (const char* name : {"mlp", "cnn", "resnet"}) {
    auto model = BuildModel(Named(name, 0.1));
    ASSERT_TRUE(model.ok()) << name;
    torch::Tensor logits = (*model)->forward(torch::randn({3, 1, 28, 28}));
    EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{3, 10})) << name;
    EXPECT_EQ(logits.scalar_type(), torch::kFloat32);
    EXPECT_EQ((*model)->has_batch_norm(), std::string(name) == "resnet");
  }
}

// Dropout draws from LibTorch's generator: the same seed gives the same
// masks (what the trainer's per-step seeding relies on), and evaluation
// mode turns it off.
TEST(ModelTest, DropoutFollowsTheSeedAndStopsInEvalMode) {
  auto model = BuildModel(Named("mlp", 0.5));
  ASSERT_TRUE(model.ok());
  torch::Tensor x = torch::randn({4, 1, 28, 28});
  torch::manual_seed(11);
  torch::Tensor a = (*model)->forward(x);
  torch::manual_seed(11);
  torch::Tensor b = (*model)->forward(x);
  torch::manual_seed(12);
  torch::Tensor c = (*model)->forward(x);
  EXPECT_TRUE(torch::equal(a, b));
  EXPECT_FALSE(torch::equal(a, c));
  (*model)->eval();
  EXPECT_TRUE(torch::equal((*model)->forward(x), (*model)->forward(x)));
}

// The exported file is what torch::load reads: a user loads the final model
// into the same architecture with plain LibTorch.
TEST(ModelTest, ExportedModelLoadsWithTorchLoad) {
  for (const char* name : {"mlp", "cnn", "resnet"}) {
    torch::manual_seed(3);
    auto trained = BuildModel(Named(name));
    ASSERT_TRUE(trained.ok());
    std::string path = TempDir() + "/final.pt";
    auto bytes = (*trained)->Export();
    ASSERT_TRUE(bytes.ok());
    ASSERT_TRUE(WriteFileAtomically(path, *bytes).ok());

    torch::manual_seed(4);  // different initial weights
    auto loaded = BuildModel(Named(name));
    ASSERT_TRUE(loaded.ok());
    ASSERT_NE(ModelDigest(**loaded).value(), ModelDigest(**trained).value())
        << name;
    torch::load(*loaded, path);
    EXPECT_EQ(ModelDigest(**loaded).value(), ModelDigest(**trained).value())
        << name;
    (*loaded)->eval();
    (*trained)->eval();
    torch::Tensor x = torch::randn({2, 1, 28, 28});
    EXPECT_TRUE(torch::equal((*loaded)->forward(x), (*trained)->forward(x)))
        << name;
  }
}

// A scripted module with a nested submodule, as torch.jit.script writes.
void WriteScripted(const std::string& path, int64_t outputs) {
  torch::jit::Module fc("Linear");
  fc.register_parameter(
      "weight", (torch::randn({outputs, 784}) * 0.01).requires_grad_(), false);
  fc.register_parameter("bias", torch::zeros({outputs}).requires_grad_(),
                        false);
  fc.define(R"(
def forward(self, x):
    return torch.matmul(x, self.weight.t()) + self.bias
)");
  torch::jit::Module net("Net");
  net.register_module("fc", fc);
  net.define(R"(
def forward(self, x):
    return self.fc.forward(x.flatten(1))
)");
  net.save(path);
}

TEST(ModelTest, TorchScriptModuleTrainsThroughItsOwnParameters) {
  const std::string path = TempDir() + "/net.pt";
  WriteScripted(path, 10);
  ModelOptions options;
  options.torchscript = path;
  auto model = BuildModel(options);
  ASSERT_TRUE(model.ok()) << model.status();
  auto named = (*model)->named_parameters();
  ASSERT_EQ(named.size(), 2u);
  EXPECT_TRUE(named.contains("fc_weight"));
  EXPECT_EQ(ModelLabel(options), "torchscript:" + path);

  // A few SGD steps on a fixed batch: the loss falls, so gradients reach the
  // scripted module's tensors through the registered parameters.
  torch::manual_seed(5);
  torch::Tensor x = torch::randn({32, 1, 28, 28});
  torch::Tensor y = torch::randint(0, 10, {32});
  torch::optim::SGD sgd((*model)->parameters(), 0.5);
  double first = 0, last = 0;
  for (int i = 0; i < 20; ++i) {
    sgd.zero_grad();
    torch::Tensor loss =
        torch::nn::functional::cross_entropy((*model)->forward(x), y);
    loss.backward();
    sgd.step();
    (i == 0 ? first : last) = loss.item<double>();
  }
  EXPECT_LT(last, first / 2);

  // Exported as TorchScript: torch::jit::load gives the trained module.
  auto bytes = (*model)->Export();
  ASSERT_TRUE(bytes.ok());
  const std::string out = TempDir() + "/trained.pt";
  ASSERT_TRUE(WriteFileAtomically(out, *bytes).ok());
  torch::jit::Module reloaded = torch::jit::load(out);
  torch::NoGradGuard no_grad;
  EXPECT_TRUE(
      torch::allclose(reloaded.forward({x}).toTensor(), (*model)->forward(x)));
}

// Two submodules sharing one tensor (tied weights): registered once, so it
// is reduced and updated once per step.
TEST(ModelTest, TiedTorchScriptWeightsAreOneParameter) {
  torch::Tensor shared = (torch::randn({784, 784}) * 0.01).requires_grad_();
  torch::jit::Module net("Net");
  for (const char* name : {"a", "b"}) {
    torch::jit::Module layer("Layer");
    layer.register_parameter("weight", shared, false);
    layer.define(R"(
def forward(self, x):
    return torch.matmul(x, self.weight)
)");
    net.register_module(name, layer);
  }
  net.register_parameter(
      "out", (torch::randn({784, 10}) * 0.01).requires_grad_(), false);
  net.define(R"(
def forward(self, x):
    return torch.matmul(self.b.forward(self.a.forward(x.flatten(1))), self.out)
)");
  const std::string path = TempDir() + "/tied.pt";
  net.save(path);
  ModelOptions options;
  options.torchscript = path;
  auto model = BuildModel(options);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ((*model)->parameters().size(), 2u);
}

TEST(ModelTest, FrozenTorchScriptParametersAreRefusedByName) {
  torch::jit::Module net("Net");
  net.register_parameter("weight", torch::randn({784, 10}).requires_grad_(),
                         false);
  net.register_parameter("frozen_bias", torch::zeros({10}), false);
  net.define(R"(
def forward(self, x):
    return torch.matmul(x.flatten(1), self.weight) + self.frozen_bias
)");
  const std::string path = TempDir() + "/frozen.pt";
  net.save(path);
  ModelOptions options;
  options.torchscript = path;
  auto model = BuildModel(options);
  ASSERT_FALSE(model.ok());
  EXPECT_NE(model.status().message().find("frozen parameters (frozen_bias)"),
            std::string::npos)
      << model.status();
}

TEST(ModelTest, BadTorchScriptFilesAreNamed) {
  const std::string dir = TempDir();
  ASSERT_TRUE(WriteFileAtomically(dir + "/garbage.pt", "not a model").ok());
  WriteScripted(dir + "/seven.pt", 7);
  ModelOptions options;
  for (const auto& [file, message] :
       std::vector<std::pair<std::string, std::string>>{
           {"/garbage.pt", "is not a TorchScript module"},
           {"/missing.pt", "is not a TorchScript module"},
           {"/seven.pt", "returns shape [2, 7]"}}) {
    options.torchscript = dir + file;
    auto model = BuildModel(options);
    ASSERT_FALSE(model.ok()) << file;
    EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(model.status().message().find(dir + file), std::string::npos)
        << model.status();
    EXPECT_NE(model.status().message().find(message), std::string::npos)
        << model.status();
  }
}

}  // namespace
}  // namespace lockstep::worker
