// The prefetch thread and its hand-over of batch slots (prefetcher.h).
#include "worker/train/prefetcher.h"

namespace lockstep::worker {

Prefetcher::Prefetcher(const TensorDataset& data, uint64_t seed,
                       const BatchPlan& plan, int rank, int64_t first_step,
                       int64_t end_step, bool pinned)
    : data_(data),
      end_(end_step),
      sampler_(seed, data.size(), plan, rank),
      next_(first_step) {
  const auto options = torch::TensorOptions().pinned_memory(pinned);
  for (Buffers& buffers : buffers_) {
    buffers.images = torch::empty({plan.rank_batch(), 1, data.rows, data.cols},
                                  options.dtype(torch::kFloat32));
    buffers.labels =
        torch::empty({plan.rank_batch()}, options.dtype(torch::kInt64));
  }
  thread_ = std::thread([this] { Loop(); });
}

Prefetcher::~Prefetcher() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
}

std::pair<torch::Tensor, torch::Tensor> Prefetcher::Take(int64_t step) {
  const int index = static_cast<int>(step % kDepth);
  absl::MutexLock lock(&mu_);
  auto filled = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return slots_[index].ready && slots_[index].step == step;
  };
  mu_.Await(absl::Condition(&filled));
  return {buffers_[index].images, buffers_[index].labels};
}

void Prefetcher::Release(int64_t step) {
  absl::MutexLock lock(&mu_);
  slots_[step % kDepth].ready = false;
}

void Prefetcher::Loop() {
  while (true) {
    int64_t step;
    {
      absl::MutexLock lock(&mu_);
      auto work = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || (next_ < end_ && !slots_[next_ % kDepth].ready);
      };
      mu_.Await(absl::Condition(&work));
      if (stopping_) return;
      step = next_++;
    }
    const int index = static_cast<int>(step % kDepth);
    Fill(sampler_.RankBatch(step), buffers_[index]);
    absl::MutexLock lock(&mu_);
    slots_[index].step = step;
    slots_[index].ready = true;
  }
}

void Prefetcher::Fill(const std::vector<int64_t>& indices,
                      Buffers& buffers) const {
  const int64_t pixels = data_.rows * data_.cols;
  const uint8_t* images = data_.images.data_ptr<uint8_t>();
  const int64_t* labels = data_.labels.data_ptr<int64_t>();
  float* x = buffers.images.data_ptr<float>();
  int64_t* y = buffers.labels.data_ptr<int64_t>();
  const float scale = 1.0f / (255.0f * data_.std);
  const float shift = data_.mean / data_.std;
  for (size_t i = 0; i < indices.size(); ++i) {
    const uint8_t* src = images + indices[i] * pixels;
    float* dst = x + static_cast<int64_t>(i) * pixels;
    for (int64_t j = 0; j < pixels; ++j) dst[j] = src[j] * scale - shift;
    y[i] = labels[indices[i]];
  }
}

}  // namespace lockstep::worker
