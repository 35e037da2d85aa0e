// A data set split as tensors: the images and labels a worker trains or
// evaluates on, decoded once per process (Fashion-MNIST IDX files or NumPy
// arrays) and kept across generations, with the pixel statistics its inputs
// are normalized with.
#ifndef LOCKSTEP_WORKER_TRAIN_TENSOR_DATASET_H_
#define LOCKSTEP_WORKER_TRAIN_TENSOR_DATASET_H_

#include <torch/torch.h>

#include <cstdint>

#include "absl/status/statusor.h"
#include "lockstep/v1/job.pb.h"

namespace lockstep::worker {

// Fashion-MNIST's pixel mean and standard deviation over the training set.
// Other data sets (npy) are normalized by their own training set's.
inline constexpr float kFashionMnistMean = 0.2860f;
inline constexpr float kFashionMnistStd = 0.3530f;

// Raw uint8 images [N, 1, H, W] (normalized per batch, which is cheaper than
// converting the whole set up front) and int64 labels [N]. Copies share the
// tensors.
struct TensorDataset {
  torch::Tensor images;
  torch::Tensor labels;
  int64_t rows = 0;
  int64_t cols = 0;
  // Pixel statistics (of [0, 1] values) the inputs are normalized with.
  float mean = kFashionMnistMean;
  float std = kFashionMnistStd;
  int64_t size() const { return labels.size(0); }
};

// The training or test split of `spec`. Decoding takes a second or two, so
// each split is decoded once per process and cached (keyed by format, folder
// and split), so that the next generation of the job, or a spare given a
// rank, does not decode it again. The cache holds one data set at a time:
// loading another (format, folder) drops the other's splits, so a worker
// that trains job after job holds at most one data set besides the one a
// running generation uses. Thread-safe. Errors name the file that is
// missing or malformed.
absl::StatusOr<TensorDataset> LoadSplit(const v1::DataSpec& spec, bool train);

// Drops the cached splits (a job ended here; its next job may bring other
// data). Tensors a running generation holds stay valid. Thread-safe.
void ForgetCachedData();

// The test split is evaluated with the training split's statistics, and
// must have the same image size. Errors: InvalidArgument naming both sizes.
absl::Status MatchTestToTrain(const v1::DataSpec& spec,
                              const TensorDataset& train, TensorDataset* test);

// uint8 pixels to the normalized float inputs the models take.
torch::Tensor Normalize(const torch::Tensor& pixels, float mean, float std);

}  // namespace lockstep::worker

#endif  // LOCKSTEP_WORKER_TRAIN_TENSOR_DATASET_H_
