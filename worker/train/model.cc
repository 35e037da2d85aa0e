// The built-in networks (mlp, cnn, resnet), TorchScript models, and model
// digests and serialization (model.h).
#include "worker/train/model.h"

#include <torch/script.h>

#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "common/sha256.h"
#include "common/status_macros.h"
#include "worker/train/gpt.h"
#include "worker/train/max_pool.h"
#include "worker/train/model_export.h"
#include "worker/train/torch_error.h"

namespace lockstep::worker {
namespace {

namespace nn = torch::nn;

// A 2x2 max pooling with stride 2, no padding, dilation or ceiling.
bool IsPlain2x2(const torch::nn::Module& layer) {
  const auto* pool = layer.as<nn::MaxPool2d>();
  if (pool == nullptr) return false;
  const auto& o = pool->options;
  auto pair = [](const torch::ExpandingArray<2>& a, int64_t v) {
    return (*a)[0] == v && (*a)[1] == v;
  };
  return pair(o.kernel_size(), 2) && pair(o.stride(), 2) &&
         pair(o.padding(), 0) && pair(o.dilation(), 1) && !o.ceil_mode();
}

// A stack of layers and a linear output layer.
class SequentialNetwork : public Network {
 public:
  SequentialNetwork(nn::Sequential body, nn::Linear head)
      : body_(register_module("body", std::move(body))),
        head_(register_module("head", std::move(head))) {}

  torch::Tensor Features(const torch::Tensor& inputs) override {
    torch::Tensor x = inputs;
    for (size_t i = 0; i < body_->size(); ++i) {
      torch::nn::Module& layer = *body_->ptr(i);
      // A plain 2x2 max pooling on fp32 NCHW runs lockstep's kernel
      // (LibTorch's bits, without its branches), with a ReLU before it in
      // the same pass.
      const auto* relu = layer.as<nn::ReLU>();
      const bool relu_then_pool = relu != nullptr && !relu->options.inplace() &&
                                  i + 1 < body_->size() &&
                                  IsPlain2x2(*body_->ptr(i + 1));
      if ((relu_then_pool || IsPlain2x2(layer)) && MaxPool2x2Takes(x)) {
        x = MaxPool2x2(x, relu_then_pool);
        if (relu_then_pool) ++i;
        continue;
      }
      x = body_->begin()[i].forward(x);
      if (layer.as<nn::Conv2d>() != nullptr) x = ConvLayout(x);
    }
    return x;
  }
  torch::Tensor Logits(const torch::Tensor& features) override {
    return head_->forward(features.to(torch::kFloat32));
  }

  // The body's layers one by one (dropout is off in evaluation).
  absl::StatusOr<std::string> TorchScriptSource() const override {
    std::string code = "def forward(self, x):\n";
    for (const auto& child : body_->named_children()) {
      const std::string prefix = absl::StrCat("body_", child.key(), "_");
      nn::Module& layer = *child.value();
      std::string call;
      if (const auto* linear = layer.as<nn::Linear>()) {
        call = torchscript::Linear("x", prefix, *linear);
      } else if (const auto* conv = layer.as<nn::Conv2d>()) {
        ASSIGN_OR_RETURN(call, torchscript::Conv2d("x", prefix, *conv));
      } else if (layer.as<nn::ReLU>() != nullptr) {
        call = "torch.relu(x)";
      } else if (const auto* pool = layer.as<nn::MaxPool2d>()) {
        const auto& o = pool->options;
        call = absl::StrCat("torch.max_pool2d(x, [", (*o.kernel_size())[0],
                            ", ", (*o.kernel_size())[1], "], [",
                            (*o.stride())[0], ", ", (*o.stride())[1], "])");
      } else if (const auto* flatten = layer.as<nn::Flatten>()) {
        call = absl::StrCat("torch.flatten(x, ", flatten->options.start_dim(),
                            ", ", flatten->options.end_dim(), ")");
      } else if (layer.as<nn::Dropout>() != nullptr) {
        continue;
      } else {
        return absl::UnimplementedError(
            absl::StrCat("layer ", child.key(), " (", layer.name(),
                         ") has no TorchScript export"));
      }
      absl::StrAppend(&code, "    x = ", call, "\n");
    }
    absl::StrAppend(&code, "    return ",
                    torchscript::Linear("x", "head_", *head_), "\n");
    return code;
  }

 private:
  nn::Sequential body_;
  nn::Linear head_;
};

// Two 3x3 convolutions with batch norm, added to the input (through a 1x1
// convolution where the shape changes).
class ResidualBlockImpl : public nn::Module {
 public:
  ResidualBlockImpl(int64_t in, int64_t out, int64_t stride)
      : conv1_(register_module("conv1", nn::Conv2d(nn::Conv2dOptions(in, out, 3)
                                                       .stride(stride)
                                                       .padding(1)
                                                       .bias(false)))),
        bn1_(register_module("bn1", nn::BatchNorm2d(out))),
        conv2_(register_module(
            "conv2",
            nn::Conv2d(nn::Conv2dOptions(out, out, 3).padding(1).bias(false)))),
        bn2_(register_module("bn2", nn::BatchNorm2d(out))) {
    if (stride != 1 || in != out) {
      shortcut_ = register_module(
          "shortcut",
          nn::Sequential(
              nn::Conv2d(
                  nn::Conv2dOptions(in, out, 1).stride(stride).bias(false)),
              nn::BatchNorm2d(out)));
    }
  }

  torch::Tensor forward(const torch::Tensor& x) {
    torch::Tensor y = torch::relu(bn1_->forward(conv1_->forward(x)));
    y = bn2_->forward(conv2_->forward(y));
    return torch::relu(y + (shortcut_ ? shortcut_->forward(x) : x));
  }

 private:
  nn::Conv2d conv1_;
  nn::BatchNorm2d bn1_;
  nn::Conv2d conv2_;
  nn::BatchNorm2d bn2_;
  nn::Sequential shortcut_{nullptr};
};
TORCH_MODULE(ResidualBlock);

class ResNet : public Network {
 public:
  ResNet(int64_t channels, int64_t classes, double dropout)
      : stem_(register_module(
            "stem",
            nn::Sequential(
                nn::Conv2d(
                    nn::Conv2dOptions(channels, 16, 3).padding(1).bias(false)),
                nn::BatchNorm2d(16), nn::ReLU()))),
        blocks_(register_module(
            "blocks",
            nn::Sequential(ResidualBlock(16, 16, 1), ResidualBlock(16, 32, 2),
                           ResidualBlock(32, 64, 2)))),
        dropout_(register_module("dropout", nn::Dropout(dropout))),
        head_(register_module("head", nn::Linear(64, classes))) {}

  torch::Tensor Features(const torch::Tensor& images) override {
    torch::Tensor x = blocks_->forward(ConvLayout(stem_->forward(images)));
    return dropout_->forward(x.mean({2, 3}));
  }
  torch::Tensor Logits(const torch::Tensor& features) override {
    return head_->forward(features.to(torch::kFloat32));
  }
  bool has_batch_norm() const override { return true; }

  absl::StatusOr<std::string> TorchScriptSource() const override {
    // A convolution then its batch norm: stem.0 and stem.1, conv1 and bn1,
    // shortcut.0 and shortcut.1.
    using Layer = std::shared_ptr<nn::Module>;
    auto conv_bn = [](const std::string& x, const std::string& conv_prefix,
                      const Layer& conv, const std::string& bn_prefix,
                      const Layer& bn) -> absl::StatusOr<std::string> {
      ASSIGN_OR_RETURN(
          std::string call,
          torchscript::Conv2d(x, conv_prefix, *conv->as<nn::Conv2d>()));
      return torchscript::BatchNorm2d(call, bn_prefix,
                                      *bn->as<nn::BatchNorm2d>());
    };
    ASSIGN_OR_RETURN(std::string stem, conv_bn("x", "stem_0_", stem_->ptr(0),
                                               "stem_1_", stem_->ptr(1)));
    std::string code =
        absl::StrCat("def forward(self, x):\n    x = torch.relu(", stem, ")\n");
    for (size_t i = 0; i < blocks_->size(); ++i) {
      const std::string p = absl::StrCat("blocks_", i, "_");
      std::map<std::string, Layer> layers;
      for (const auto& child : blocks_->ptr(i)->named_children()) {
        layers[child.key()] = child.value();
      }
      ASSIGN_OR_RETURN(std::string first,
                       conv_bn("x", p + "conv1_", layers["conv1"], p + "bn1_",
                               layers["bn1"]));
      ASSIGN_OR_RETURN(std::string second,
                       conv_bn("y", p + "conv2_", layers["conv2"], p + "bn2_",
                               layers["bn2"]));
      std::string shortcut = "x";
      if (layers.count("shortcut") > 0) {
        const auto& path = *layers["shortcut"]->as<nn::Sequential>();
        ASSIGN_OR_RETURN(shortcut, conv_bn("x", p + "shortcut_0_", path.ptr(0),
                                           p + "shortcut_1_", path.ptr(1)));
      }
      absl::StrAppend(&code, "    y = torch.relu(", first, ")\n",
                      "    y = ", second, "\n", "    x = torch.relu(y + ",
                      shortcut, ")\n");
    }
    absl::StrAppend(&code, "    x = torch.mean(x, [2, 3])\n    return ",
                    torchscript::Linear("x", "head_", *head_), "\n");
    return code;
  }

 private:
  nn::Sequential stem_;
  nn::Sequential blocks_;
  nn::Dropout dropout_;
  nn::Linear head_;
};

// A TorchScript module trained as is. Its parameters and buffers are
// registered here under flattened names ("layer.weight" -> "layer_weight"):
// the same tensors, so the optimizer, the gradient hooks, checkpoints and
// the digest see the scripted module's own storage.
class ScriptedNetwork : public Network {
 public:
  static absl::StatusOr<std::shared_ptr<ScriptedNetwork>> Load(
      const std::string& path) {
    torch::jit::Module module;
    try {
      module = torch::jit::load(path);
    } catch (const std::exception& e) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model.torchscript ", path,
          " is not a TorchScript module LibTorch can load (save it with "
          "torch.jit.save(torch.jit.script(model), path); see "
          "docs/MODELS.md): ",
          TorchErrorSentence(e.what())));
    }
    auto network = std::shared_ptr<ScriptedNetwork>(new ScriptedNetwork(path));
    network->module_ = std::move(module);
    std::set<std::string> names;
    auto flat = [&](const std::string& name) -> absl::StatusOr<std::string> {
      std::string out = absl::StrReplaceAll(name, {{".", "_"}});
      if (!names.insert(out).second) {
        return absl::InvalidArgumentError(absl::StrCat(
            "model.torchscript ", path, ": two tensors flatten to the name ",
            out, "; rename one of them"));
      }
      return out;
    };
    // A tensor shared by two submodules (tied weights) is registered once:
    // twice would reduce and update it twice per step.
    std::set<const void*> seen;
    std::vector<std::string> frozen;
    for (const auto& param : network->module_.named_parameters(true)) {
      if (!seen.insert(param.value.unsafeGetTensorImpl()).second) continue;
      if (!param.value.requires_grad()) {
        frozen.push_back(param.name);
        continue;
      }
      auto name = flat(param.name);
      if (!name.ok()) return name.status();
      network->register_parameter(*name, param.value, true);
    }
    if (network->parameters().empty() && frozen.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model.torchscript ", path,
          " has no parameters to train (torch.jit.freeze turns them into "
          "constants); save the scripted module without freezing it"));
    }
    if (!frozen.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model.torchscript ", path, " has frozen parameters (",
          absl::StrJoin(frozen, ", "),
          "); lockstep trains every parameter of the module: unfreeze them, "
          "or make them buffers (register_buffer) before exporting"));
    }
    for (const auto& buffer : network->module_.named_buffers(true)) {
      if (!seen.insert(buffer.value.unsafeGetTensorImpl()).second) continue;
      auto name = flat(buffer.name);
      if (!name.ok()) return name.status();
      network->register_buffer(*name, buffer.value);
    }
    for (const auto& param : network->module_.parameters(true)) {
      if (param.scalar_type() != torch::kFloat32) {
        return absl::InvalidArgumentError(absl::StrCat(
            "model.torchscript ", path, " has ", param.scalar_type(),
            " parameters; export it in float32 (model.float()) and choose "
            "the training precision with the job's \"precision\""));
      }
    }
    // A training-step module's forward takes the batch's columns.
    const auto& arguments = network->module_.get_method("forward")
                                .function()
                                .getSchema()
                                .arguments();
    network->step_module_ =
        arguments.size() == 2 &&
        arguments[1].type()->kind() == c10::TypeKind::DictType;
    for (const auto& module : network->module_.modules()) {
      if (module.type()->name() && module.type()->name()->name().find(
                                       "BatchNorm") != std::string::npos) {
        network->batch_norm_ = true;
      }
    }
    return network;
  }

  torch::Tensor Features(const torch::Tensor& images) override {
    return module_.forward({images}).toTensor();
  }
  torch::Tensor Logits(const torch::Tensor& features) override {
    return features.to(torch::kFloat32);
  }
  void train(bool on) override {
    Network::train(on);
    module_.train(on);
  }
  bool has_batch_norm() const override { return batch_norm_; }
  bool is_torchscript() const override { return true; }
  bool is_step_module() const override { return step_module_; }
  torch::Tensor StepLoss(const NamedBatch& batch) override {
    c10::impl::GenericDict out =
        module_.forward({ToDict(batch)}).toGenericDict();
    return out.at("loss").toTensor();
  }
  std::map<std::string, torch::Tensor> EvalStep(
      const NamedBatch& batch) override {
    const bool has_eval = module_.find_method("eval_step").has_value();
    c10::IValue out = has_eval ? module_.run_method("eval_step", ToDict(batch))
                               : module_.forward({ToDict(batch)});
    std::map<std::string, torch::Tensor> sums;
    for (const auto& entry : out.toGenericDict()) {
      sums[entry.key().toStringRef()] = entry.value().toTensor();
    }
    return sums;
  }
  std::vector<std::string> EvalSums() const override { return eval_sums_; }
  void set_eval_sums(std::vector<std::string> sums) {
    eval_sums_ = std::move(sums);
  }
  // The registered tensors are the scripted module's own; its other
  // attributes (constants) move with it.
  using Network::to;
  void to(torch::Device device, bool non_blocking = false) override {
    Network::to(device, non_blocking);
    module_.to(device, non_blocking);
  }
  // The scripted module's own (dotted) names, as its state_dict has them.
  std::vector<StateEntry> StateDict() const override {
    std::vector<StateEntry> entries;
    for (const auto& param : module_.named_parameters(true)) {
      entries.push_back({param.name, param.value, false});
    }
    for (const auto& buffer : module_.named_buffers(true)) {
      entries.push_back({buffer.name, buffer.value, true});
    }
    return entries;
  }
  // On the CPU, so that a machine without the GPU it trained on loads it.
  absl::StatusOr<std::string> Export() const override {
    std::ostringstream out;
    try {
      bool on_host = true;
      for (const auto& param : module_.parameters(true)) {
        on_host &= param.is_cpu();
      }
      if (on_host) {
        module_.save(out);
      } else {
        torch::jit::Module host = module_.deepcopy();
        host.to(torch::kCPU);
        host.save(out);
      }
    } catch (const std::exception& e) {
      return absl::InternalError(
          absl::StrCat("cannot serialize TorchScript module: ",
                       TorchErrorSentence(e.what())));
    }
    return out.str();
  }
  const std::string& path() const { return path_; }

 private:
  explicit ScriptedNetwork(std::string path) : path_(std::move(path)) {}

  static c10::Dict<std::string, torch::Tensor> ToDict(const NamedBatch& batch) {
    c10::Dict<std::string, torch::Tensor> dict;
    for (const auto& [name, tensor] : batch) dict.insert(name, tensor);
    return dict;
  }

  std::string path_;
  torch::jit::Module module_;
  bool batch_norm_ = false;
  bool step_module_ = false;
  std::vector<std::string> eval_sums_;
};

// What a training-step module's outputs may be called: a metric's name
// once "test_" is put before it.
bool IsSumName(const std::string& name) {
  return !name.empty() && name.size() <= 27 &&
         name.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_") ==
             std::string::npos;
}

// Runs a training-step module on a batch of two zero samples of every
// column: forward must return a scalar "loss", and the evaluation (its
// eval_step, or forward) scalars with names that can be metrics. Notes the
// evaluation's names. Errors name the file.
absl::Status CheckStepModule(ScriptedNetwork& network,
                             const ModelOptions& options) {
  NamedBatch batch;
  std::vector<std::string> columns;
  for (const ColumnInfo& column : options.step_columns) {
    std::vector<int64_t> shape = {2};
    shape.insert(shape.end(), column.shape.begin(), column.shape.end());
    batch.emplace_back(column.name, torch::zeros(shape, IsFloat(column.dtype)
                                                            ? torch::kFloat32
                                                            : torch::kInt64));
    columns.push_back(absl::StrCat(column.name, " [2, ",
                                   absl::StrJoin(column.shape, ", "), "]"));
  }
  const std::string named = absl::StrCat("model.torchscript ", network.path(),
                                         " (a training-step module)");
  std::map<std::string, torch::Tensor> sums;
  try {
    torch::NoGradGuard no_grad;
    network.train(false);
    torch::Tensor loss = network.StepLoss(batch);
    sums = network.EvalStep(batch);
    network.train(true);
    if (loss.numel() != 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          named, " returns a \"loss\" of shape [",
          absl::StrJoin(loss.sizes(), ", "), "]; it must be a scalar"));
    }
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(
        named, " fails on a batch of the job's columns (",
        absl::StrJoin(columns, ", "),
        "); forward(batch: Dict[str, Tensor]) must return a Dict[str, "
        "Tensor] holding \"loss\": ",
        TorchErrorSentence(e.what())));
  }
  std::vector<std::string> names;
  for (const auto& [name, value] : sums) {
    if (value.numel() != 1 || !IsSumName(name)) {
      return absl::InvalidArgumentError(absl::StrCat(
          named, "'s evaluation returns \"", name.substr(0, 64),
          "\" of shape [", absl::StrJoin(value.sizes(), ", "),
          "]; every output must be a scalar named by 1 to 27 lower-case "
          "letters, digits or '_'"));
    }
    if (name != "loss") names.push_back(name);
  }
  if (sums.count("loss") == 0 || names.size() > 15) {
    return absl::InvalidArgumentError(absl::StrCat(
        named, "'s evaluation must return \"loss\" and at most 15 sums"));
  }
  network.set_eval_sums(std::move(names));
  return absl::OkStatus();
}

// Runs one small batch through `network` to check it returns what the
// task needs; errors name the file and both shapes.
absl::Status CheckScriptedOutput(ScriptedNetwork& network,
                                 const ModelOptions& options) {
  std::vector<int64_t> shape = {2};
  shape.insert(shape.end(), options.input.begin(), options.input.end());
  std::vector<int64_t> expected = {2};
  if (options.token_input) expected.push_back(options.input[0]);
  expected.push_back(options.outputs);
  torch::Tensor outputs;
  const char* what = options.token_input ? "token ids" : "inputs";
  try {
    torch::NoGradGuard no_grad;
    network.train(false);  // batch norm statistics stay untouched
    outputs = network.forward(torch::zeros(
        shape, options.token_input ? torch::kInt64 : torch::kFloat32));
    network.train(true);
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.torchscript ", network.path(), " fails on ", what, " of shape [",
        absl::StrJoin(shape, ", "), "]: ", TorchErrorSentence(e.what())));
  }
  if (outputs.sizes().vec() != expected) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model.torchscript ", network.path(), " returns shape [",
        absl::StrJoin(outputs.sizes(), ", "), "] for ", what, " of shape [",
        absl::StrJoin(shape, ", "), "]; the task needs [",
        absl::StrJoin(expected, ", "), "] (N = 2)"));
  }
  return absl::OkStatus();
}

// The input as [C, H, W] for the convolutional models.
absl::StatusOr<std::vector<int64_t>> ImageInput(const ModelOptions& options) {
  const std::vector<int64_t>& in = options.input;
  if (options.token_input || in.size() != 3 || in[1] < 4 || in[2] < 4) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model \"", options.name, "\" takes images [C, H, W] of at least 4x4",
        options.token_input ? " (not token ids)" : "",
        ", but the task's input is [", absl::StrJoin(in, ", "),
        "]; use model \"mlp\" or reshape the data"));
  }
  return in;
}

}  // namespace

absl::StatusOr<std::string> Network::Export() const {
  return SerializeModel(*this);
}

std::vector<StateEntry> Network::StateDict() const {
  std::vector<StateEntry> entries;
  for (const auto& param : named_parameters()) {
    entries.push_back({param.key(), param.value(), false});
  }
  for (const auto& buffer : named_buffers()) {
    entries.push_back({buffer.key(), buffer.value(), true});
  }
  return entries;
}

absl::StatusOr<std::string> Network::TorchScriptSource() const {
  return absl::UnimplementedError("this model has no TorchScript export");
}

torch::Tensor Network::StepLoss(const NamedBatch&) {
  throw std::logic_error("not a training-step module");
}

std::map<std::string, torch::Tensor> Network::EvalStep(const NamedBatch&) {
  throw std::logic_error("not a training-step module");
}

std::vector<bool> Network::WeightDecayMask() const {
  std::vector<bool> mask;
  for (const torch::Tensor& p : parameters()) mask.push_back(p.dim() >= 2);
  return mask;
}

absl::StatusOr<std::shared_ptr<Network>> BuildModel(
    const ModelOptions& options) {
  if (!options.torchscript.empty()) {
    auto network = ScriptedNetwork::Load(options.torchscript);
    if (!network.ok()) return network.status();
    const bool step = !options.step_columns.empty();
    if ((*network)->is_step_module() != step) {
      return absl::InvalidArgumentError(absl::StrCat(
          "model.torchscript ", options.torchscript,
          step ? " takes one tensor, but task.type \"custom\" trains a "
                 "training-step module, whose forward takes the batch's "
                 "columns (Dict[str, Tensor]); see docs/MODELS.md"
               : " is a training-step module (its forward takes a Dict of "
                 "columns): set task.type \"custom\""));
    }
    absl::Status checked = step ? CheckStepModule(**network, options)
                                : CheckScriptedOutput(**network, options);
    if (!checked.ok()) return checked;
    return std::shared_ptr<Network>(*std::move(network));
  }
  const double p = options.dropout;
  if (options.name == "gpt") {
    if (!options.token_input || options.input.size() != 1) {
      return absl::InvalidArgumentError(
          "model \"gpt\" is a language model: it takes windows of token ids "
          "(task.type \"language_model\")");
    }
    GptOptions gpt;
    gpt.vocab = options.outputs;
    gpt.block = options.input[0];
    gpt.n_layer = options.n_layer;
    gpt.n_head = options.n_head;
    gpt.n_embd = options.n_embd;
    gpt.fused = options.fused;
    gpt.dropout = p;
    return MakeGpt(gpt);
  }
  if (options.token_input) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model \"", options.name,
        "\" does not take token ids; a language model trains model \"gpt\" "
        "or a TorchScript module"));
  }
  // Dropout after each hidden layer, when asked for.
  auto hidden = [p](nn::Sequential& body, int64_t in, int64_t out) {
    body->push_back(nn::Linear(in, out));
    body->push_back(nn::ReLU());
    if (p > 0) body->push_back(nn::Dropout(p));
  };
  if (options.name == "mlp") {
    int64_t inputs = 1;
    for (int64_t dim : options.input) inputs *= dim;
    nn::Sequential body{nn::Flatten()};
    hidden(body, inputs, 256);
    hidden(body, 256, 128);
    return std::make_shared<SequentialNetwork>(
        body, nn::Linear(128, options.outputs));
  }
  if (options.name == "cnn") {
    ASSIGN_OR_RETURN(std::vector<int64_t> in, ImageInput(options));
    nn::Sequential body(nn::Conv2d(nn::Conv2dOptions(in[0], 32, 3).padding(1)),
                        nn::ReLU(), nn::MaxPool2d(2),
                        nn::Conv2d(nn::Conv2dOptions(32, 64, 3).padding(1)),
                        nn::ReLU(), nn::MaxPool2d(2), nn::Flatten());
    hidden(body, 64 * (in[1] / 4) * (in[2] / 4), 128);
    return std::make_shared<SequentialNetwork>(
        body, nn::Linear(128, options.outputs));
  }
  if (options.name == "resnet") {
    ASSIGN_OR_RETURN(std::vector<int64_t> in, ImageInput(options));
    return std::make_shared<ResNet>(in[0], options.outputs, p);
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown model \"", options.name, "\"; choose mlp, cnn, resnet or gpt"));
}

std::string ModelLabel(const ModelOptions& options) {
  if (!options.torchscript.empty()) {
    return absl::StrCat("torchscript:", options.torchscript);
  }
  const ModelOptions fashion_mnist;
  if (options.input == fashion_mnist.input && !options.token_input &&
      options.outputs == fashion_mnist.outputs) {
    return options.name;
  }
  std::string label =
      absl::StrCat(options.name, ":in=[", absl::StrJoin(options.input, ", "),
                   "]:out=", options.outputs);
  if (options.name == "gpt") {
    absl::StrAppend(&label, ":layers=", options.n_layer,
                    ":heads=", options.n_head, ":embd=", options.n_embd);
  }
  return label;
}

absl::StatusOr<std::string> ModelDigest(const torch::nn::Module& model) {
  Sha256 hash;
  for (const torch::Tensor& param : model.parameters()) {
    torch::Tensor data = param.detach().to(torch::kFloat32).contiguous().cpu();
    hash.Update(data.data_ptr(), data.numel() * sizeof(float));
  }
  return hash.HexDigest();
}

std::string SerializeModel(const torch::nn::Module& model) {
  torch::serialize::OutputArchive archive;
  model.save(archive);
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

}  // namespace lockstep::worker
