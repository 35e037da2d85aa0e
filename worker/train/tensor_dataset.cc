// Decoding, caching and normalizing the data set splits (tensor_dataset.h).
#include "worker/train/tensor_dataset.h"

#include <algorithm>
#include <cmath>
#include <iterator>
#include <map>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"
#include "worker/data/idx.h"
#include "worker/data/npy.h"

namespace lockstep::worker {
namespace {

using CacheKey = std::tuple<std::string, std::string, bool>;

absl::Mutex cache_mu(absl::kConstInit);
std::map<CacheKey, TensorDataset>* cache ABSL_GUARDED_BY(cache_mu) = nullptr;

// The mean and standard deviation of the pixels as [0, 1] values.
void SetPixelStatistics(const std::vector<uint8_t>& pixels,
                        TensorDataset* data) {
  double sum = 0, sum_squares = 0;
  for (uint8_t p : pixels) {
    sum += p;
    sum_squares += static_cast<double>(p) * p;
  }
  const double n = static_cast<double>(pixels.size());
  const double mean = sum / n / 255.0;
  const double var = sum_squares / n / (255.0 * 255.0) - mean * mean;
  data->mean = static_cast<float>(mean);
  data->std = static_cast<float>(std::sqrt(std::max(var, 1e-12)));
}

absl::StatusOr<TensorDataset> Decode(const v1::DataSpec& spec, bool train) {
  const bool npy = spec.format() == "npy";
  ASSIGN_OR_RETURN(ImageDataset raw, npy ? LoadNpyDataset(spec.dir(), train)
                                         : LoadFashionMnist(spec.dir(), train));
  TensorDataset data;
  data.rows = raw.rows;
  data.cols = raw.cols;
  if (npy && !raw.pixels.empty()) SetPixelStatistics(raw.pixels, &data);
  // The tensor takes over the decoded bytes: no copy of the whole set.
  auto* pixels = new std::vector<uint8_t>(std::move(raw.pixels));
  data.images = torch::from_blob(
      pixels->data(), {raw.count, 1, raw.rows, raw.cols},
      [pixels](void*) { delete pixels; }, torch::kUInt8);
  data.labels = torch::from_blob(raw.labels.data(), {raw.count}, torch::kUInt8)
                    .to(torch::kInt64);
  return data;
}

}  // namespace

absl::StatusOr<TensorDataset> LoadSplit(const v1::DataSpec& spec, bool train) {
  const CacheKey key = std::make_tuple(spec.format(), spec.dir(), train);
  {
    absl::MutexLock lock(&cache_mu);
    if (cache != nullptr) {
      auto it = cache->find(key);
      if (it != cache->end()) return it->second;
    }
  }
  ASSIGN_OR_RETURN(TensorDataset data, Decode(spec, train));
  absl::MutexLock lock(&cache_mu);
  if (cache == nullptr) cache = new std::map<CacheKey, TensorDataset>;
  // One data set at a time: another one's splits go.
  for (auto it = cache->begin(); it != cache->end();) {
    const bool same = std::get<0>(it->first) == std::get<0>(key) &&
                      std::get<1>(it->first) == std::get<1>(key);
    it = same ? std::next(it) : cache->erase(it);
  }
  (*cache)[key] = data;
  return data;
}

void ForgetCachedData() {
  absl::MutexLock lock(&cache_mu);
  if (cache != nullptr) cache->clear();
}

absl::Status MatchTestToTrain(const v1::DataSpec& spec,
                              const TensorDataset& train, TensorDataset* test) {
  if (test->rows != train.rows || test->cols != train.cols) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the test images in ", spec.dir(), " are ", test->rows, "x", test->cols,
        " but the training images are ", train.rows, "x", train.cols));
  }
  test->mean = train.mean;
  test->std = train.std;
  return absl::OkStatus();
}

torch::Tensor Normalize(const torch::Tensor& pixels, float mean, float std) {
  return pixels.to(torch::kFloat32)
      .mul_(1.0f / (255.0f * std))
      .sub_(mean / std);
}

}  // namespace lockstep::worker
