// The trained model in the forms users load outside lockstep (the job's
// export_format, docs/MODELS.md "Exports"): a TorchScript module that
// Python's torch.jit.load opens and runs, and a state_dict (.pt) that
// torch.load reads and load_state_dict puts into the same architecture
// written in PyTorch (lockstep.models). The LibTorch archive is
// Network::Export().
#ifndef LOCKSTEP_WORKER_TRAIN_MODEL_EXPORT_H_
#define LOCKSTEP_WORKER_TRAIN_MODEL_EXPORT_H_

#include <torch/torch.h>

#include <string>

#include "absl/status/statusor.h"
#include "worker/train/model.h"

namespace lockstep::worker {

// A scripted module holding a copy of every tensor of
// network.StateDict() (on the CPU, names with '.' replaced by '_') and its
// TorchScriptSource() as `forward`, in the bytes torch.jit.save writes. A
// TorchScript model's export is its own module. Errors: Unimplemented for a
// model without a source, Internal when the source does not compile.
absl::StatusOr<std::string> ExportTorchScript(const Network& network);

// network.StateDict() (on the CPU) as a Dict[str, Tensor] in the bytes
// torch.save writes.
absl::StatusOr<std::string> ExportStateDict(const Network& network);

// The pieces of TorchScript source the built-in models' forward passes are
// written with: calls on `x` with the tensors of the module at `prefix`
// ("body_0_": its weight is self.body_0_weight), in evaluation mode.
namespace torchscript {
std::string Linear(const std::string& x, const std::string& prefix,
                   const torch::nn::LinearImpl& linear);
// Errors: Unimplemented for a padding mode other than explicit sizes.
absl::StatusOr<std::string> Conv2d(const std::string& x,
                                   const std::string& prefix,
                                   const torch::nn::Conv2dImpl& conv);
std::string BatchNorm2d(const std::string& x, const std::string& prefix,
                        const torch::nn::BatchNorm2dImpl& norm);
std::string LayerNorm(const std::string& x, const std::string& prefix,
                      const torch::nn::LayerNormImpl& norm);
// A double as TorchScript reads it back exactly.
std::string Number(double value);
}  // namespace torchscript

}  // namespace lockstep::worker

#endif  // LOCKSTEP_WORKER_TRAIN_MODEL_EXPORT_H_
