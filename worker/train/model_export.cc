// TorchScript and state_dict exports of a trained model (model_export.h).
#include "worker/train/model_export.h"

#include <torch/script.h>
#include <torch/serialize.h>

#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "worker/train/torch_error.h"

namespace lockstep::worker {
namespace {

torch::Tensor HostCopy(const torch::Tensor& tensor) {
  return tensor.detach().to(torch::kCPU).clone();
}

}  // namespace

namespace torchscript {

std::string Number(double value) { return absl::StrFormat("%.17g", value); }

std::string Linear(const std::string& x, const std::string& prefix,
                   const torch::nn::LinearImpl& linear) {
  return absl::StrCat(
      "torch.linear(", x, ", self.", prefix, "weight, ",
      linear.options.bias() ? "self." + prefix + "bias" : "None", ")");
}

absl::StatusOr<std::string> Conv2d(const std::string& x,
                                   const std::string& prefix,
                                   const torch::nn::Conv2dImpl& conv) {
  const auto& o = conv.options;
  const auto* padding = c10::get_if<torch::ExpandingArray<2>>(&o.padding());
  if (padding == nullptr ||
      !c10::holds_alternative<torch::enumtype::kZeros>(o.padding_mode())) {
    return absl::UnimplementedError(
        "a convolution with a padding mode of its own has no TorchScript "
        "export");
  }
  auto pair = [](const torch::ExpandingArray<2>& a) {
    return absl::StrCat("[", (*a)[0], ", ", (*a)[1], "]");
  };
  return absl::StrCat("torch.conv2d(", x, ", self.", prefix, "weight, ",
                      o.bias() ? "self." + prefix + "bias" : "None", ", ",
                      pair(o.stride()), ", ", pair(*padding), ", ",
                      pair(o.dilation()), ", ", o.groups(), ")");
}

std::string BatchNorm2d(const std::string& x, const std::string& prefix,
                        const torch::nn::BatchNorm2dImpl& norm) {
  const std::string p = "self." + prefix;
  return absl::StrCat("torch.batch_norm(", x, ", ", p, "weight, ", p, "bias, ",
                      p, "running_mean, ", p, "running_var, False, ",
                      Number(norm.options.momentum().value_or(0.1)), ", ",
                      Number(norm.options.eps()), ", False)");
}

std::string LayerNorm(const std::string& x, const std::string& prefix,
                      const torch::nn::LayerNormImpl& norm) {
  const std::string p = "self." + prefix;
  return absl::StrCat("torch.layer_norm(", x, ", [",
                      absl::StrJoin(norm.options.normalized_shape(), ", "),
                      "], ", p, "weight, ", p, "bias, ",
                      Number(norm.options.eps()), ")");
}

}  // namespace torchscript

absl::StatusOr<std::string> ExportTorchScript(const Network& network) {
  if (network.is_torchscript()) return network.Export();
  absl::StatusOr<std::string> source = network.TorchScriptSource();
  if (!source.ok()) return source.status();
  std::ostringstream out;
  try {
    torch::jit::Module module("lockstep_model");
    for (const StateEntry& entry : network.StateDict()) {
      module.register_parameter(absl::StrReplaceAll(entry.name, {{".", "_"}}),
                                HostCopy(entry.tensor), entry.buffer);
    }
    module.define(*source);
    module.eval();
    module.save(out);
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("cannot script the trained model: ",
                                            TorchErrorSentence(e.what())));
  }
  return out.str();
}

absl::StatusOr<std::string> ExportStateDict(const Network& network) {
  c10::Dict<std::string, torch::Tensor> dict;
  for (const StateEntry& entry : network.StateDict()) {
    dict.insert(entry.name, HostCopy(entry.tensor));
  }
  try {
    std::vector<char> bytes = torch::pickle_save(dict);
    return std::string(bytes.begin(), bytes.end());
  } catch (const std::exception& e) {
    return absl::InternalError(
        absl::StrCat("cannot write the trained model's state_dict: ",
                     TorchErrorSentence(e.what())));
  }
}

}  // namespace lockstep::worker
