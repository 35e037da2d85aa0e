// The TorchScript and state_dict exports of the built-in models
// (worker/train/model_export.h): what a user loads outside lockstep computes
// what lockstep's own model computes in evaluation mode.
#include "worker/train/model_export.h"

#include <gtest/gtest.h>
#include <torch/script.h>
#include <torch/serialize.h>

#include <sstream>
#include <string>
#include <vector>

#include "worker/train/gpt.h"
#include "worker/train/model.h"

namespace lockstep::worker {
namespace {

struct Case {
  std::string name;
  std::shared_ptr<Network> network;
  torch::Tensor input;
};

std::vector<Case> Cases() {
  std::vector<Case> cases;
  for (const char* name : {"mlp", "cnn", "resnet"}) {
    ModelOptions options;
    options.name = name;
    options.dropout = 0.2;  // dropped from the export: evaluation mode
    torch::manual_seed(5);
    auto network = BuildModel(options);
    EXPECT_TRUE(network.ok()) << name;
    cases.push_back({name, *network, torch::randn({4, 1, 28, 28})});
  }
  GptOptions gpt;
  gpt.vocab = 37;
  gpt.block = 16;
  gpt.n_layer = 2;
  gpt.n_head = 2;
  gpt.n_embd = 32;
  gpt.dropout = 0.1;
  torch::manual_seed(6);
  cases.push_back({"gpt", MakeGpt(gpt), torch::randint(0, 37, {3, 16})});
  return cases;
}

// Batch norm's running statistics away from their initial values, as after
// training: a few forward passes in training mode.
void Warm(Network& network, const torch::Tensor& input) {
  torch::NoGradGuard no_grad;
  network.train(true);
  for (int i = 0; i < 3; ++i) {
    network.forward(input.is_floating_point() ? input * (1 + i) : input);
  }
  network.eval();
}

TEST(ModelExportTest, TorchScriptComputesWhatTheModelComputes) {
  for (Case& c : Cases()) {
    Warm(*c.network, c.input);
    absl::StatusOr<std::string> bytes = ExportTorchScript(*c.network);
    ASSERT_TRUE(bytes.ok()) << c.name << ": " << bytes.status();
    std::istringstream in(*bytes);
    torch::jit::Module loaded = torch::jit::load(in);
    torch::NoGradGuard no_grad;
    torch::Tensor want = c.network->forward(c.input);
    torch::Tensor got = loaded.forward({c.input}).toTensor();
    ASSERT_EQ(got.sizes(), want.sizes()) << c.name;
    EXPECT_LE((got - want).abs().max().item<double>(), 1e-6) << c.name;
    // Every tensor of the model, by its flattened name.
    size_t tensors = 0;
    for (const auto& param : loaded.named_parameters(false)) {
      (void)param;
      ++tensors;
    }
    for (const auto& buffer : loaded.named_buffers(false)) {
      (void)buffer;
      ++tensors;
    }
    EXPECT_EQ(tensors, c.network->StateDict().size()) << c.name;
  }
}

TEST(ModelExportTest, StateDictHoldsEveryTensorByItsPyTorchName) {
  for (Case& c : Cases()) {
    Warm(*c.network, c.input);
    absl::StatusOr<std::string> bytes = ExportStateDict(*c.network);
    ASSERT_TRUE(bytes.ok()) << c.name << ": " << bytes.status();
    c10::IValue value =
        torch::pickle_load(std::vector<char>(bytes->begin(), bytes->end()));
    ASSERT_TRUE(value.isGenericDict()) << c.name;
    c10::impl::GenericDict dict = value.toGenericDict();
    std::vector<StateEntry> state = c.network->StateDict();
    ASSERT_EQ(dict.size(), state.size()) << c.name;
    size_t i = 0;
    for (const auto& entry : dict) {  // in insertion order
      EXPECT_EQ(entry.key().toStringRef(), state[i].name) << c.name;
      EXPECT_TRUE(torch::equal(entry.value().toTensor(), state[i].tensor))
          << c.name << " " << state[i].name;
      ++i;
    }
  }
  // PyTorch's names: nested modules joined by dots, buffers after the
  // parameters.
  ModelOptions resnet;
  resnet.name = "resnet";
  std::vector<StateEntry> state = (*BuildModel(resnet))->StateDict();
  EXPECT_EQ(state.front().name, "stem.0.weight");
  EXPECT_EQ(state.back().name, "blocks.2.shortcut.1.num_batches_tracked");
  EXPECT_TRUE(state.back().buffer);
}

}  // namespace
}  // namespace lockstep::worker
