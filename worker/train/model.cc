#include "worker/train/model.h"

#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/sha256.h"

namespace lockstep::worker {

absl::StatusOr<torch::nn::Sequential> BuildModel(const std::string& name,
                                                 int64_t rows, int64_t cols) {
  namespace nn = torch::nn;
  if (name == "mlp") {
    return nn::Sequential(nn::Flatten(), nn::Linear(rows * cols, 256),
                          nn::ReLU(), nn::Linear(256, 128), nn::ReLU(),
                          nn::Linear(128, 10));
  }
  if (name == "cnn") {
    return nn::Sequential(nn::Conv2d(nn::Conv2dOptions(1, 32, 3).padding(1)),
                          nn::ReLU(), nn::MaxPool2d(2),
                          nn::Conv2d(nn::Conv2dOptions(32, 64, 3).padding(1)),
                          nn::ReLU(), nn::MaxPool2d(2), nn::Flatten(),
                          nn::Linear(64 * (rows / 4) * (cols / 4), 128),
                          nn::ReLU(), nn::Linear(128, 10));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown model \"", name, "\"; choose mlp or cnn"));
}

std::string ModelDigest(const torch::nn::Module& model) {
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
