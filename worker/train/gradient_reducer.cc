// Bucket layout, the autograd hooks and the communication thread of the
// overlapped gradient all-reduce (gradient_reducer.h).
#include "worker/train/gradient_reducer.h"

#include <cstring>

namespace lockstep::worker {

GradientReducer::GradientReducer(std::vector<torch::Tensor> params,
                                 Communicator* comm, Options options)
    : params_(std::move(params)), comm_(comm), options_(options) {
  slots_.resize(params_.size());
  size_t cap = options_.first_bucket_bytes;
  size_t bytes = 0;
  for (int i = static_cast<int>(params_.size()) - 1; i >= 0; --i) {
    size_t size = params_[i].numel() * sizeof(float);
    if (members_.empty() || (bytes > 0 && bytes + size > cap)) {
      if (!members_.empty()) cap = options_.bucket_bytes;
      members_.emplace_back();
      buffers_.emplace_back();
      bytes = 0;
    }
    slots_[i] = {static_cast<int>(members_.size()) - 1, buffers_.back().size()};
    members_.back().push_back(i);
    buffers_.back().resize(buffers_.back().size() + params_[i].numel());
    bytes += size;
  }
  if (buffers_.empty()) buffers_.emplace_back();
  buffers_.back().resize(buffers_.back().size() + 2);  // loss, stop vote
  pending_.assign(buffers_.size(), 0);
  {
    absl::MutexLock lock(&mu_);
    bucket_ready_.assign(buffers_.size(), false);
  }
  arrived_.assign(params_.size(), false);
  for (size_t i = 0; i < params_.size(); ++i) {
    torch::Tensor param = params_[i];
    hooks_.push_back(param.register_hook([this, i](torch::Tensor grad) {
      OnGradient(static_cast<int>(i), grad);
      return torch::Tensor();
    }));
  }
  if (options_.overlap) thread_ = std::thread([this] { CommunicationLoop(); });
}

GradientReducer::~GradientReducer() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
  for (size_t i = 0; i < params_.size(); ++i) {
    torch::Tensor param = params_[i];
    param.remove_hook(hooks_[i]);
  }
}

void GradientReducer::Prepare(float loss, float stop_vote) {
  std::vector<float>& last = buffers_.back();
  last[last.size() - 2] = loss;
  last[last.size() - 1] = stop_vote;
  std::fill(arrived_.begin(), arrived_.end(), false);
  armed_ = true;
  for (size_t b = 0; b < members_.size(); ++b) {
    pending_[b] = static_cast<int>(members_[b].size());
  }
  absl::MutexLock lock(&mu_);
  reduced_ = 0;
  status_ = absl::OkStatus();
  ++step_;
  // A bucket with no parameters (a model without any) is ready at once.
  for (size_t b = 0; b < buffers_.size(); ++b) {
    bucket_ready_[b] = b >= members_.size() || members_[b].empty();
  }
}

void GradientReducer::OnGradient(int param, const torch::Tensor& grad) {
  // Idle during the micro-batches before the last; a parameter used twice
  // in one pass contributes its first gradient.
  if (!armed_ || arrived_[param]) return;
  arrived_[param] = true;
  const Slot& slot = slots_[param];
  torch::Tensor dense = grad.contiguous();
  float* out = buffers_[slot.bucket].data() + slot.offset;
  std::memcpy(out, dense.data_ptr<float>(), dense.numel() * sizeof(float));
  if (options_.accumulate) {
    const torch::Tensor& earlier = params_[param].grad();
    if (earlier.defined()) {
      const float* in = earlier.data_ptr<float>();
      for (int64_t j = 0; j < dense.numel(); ++j) out[j] += in[j];
    }
  }
  if (--pending_[slot.bucket] == 0) MarkReady(slot.bucket);
}

void GradientReducer::MarkReady(int bucket) {
  absl::MutexLock lock(&mu_);
  bucket_ready_[bucket] = true;
}

void GradientReducer::CommunicationLoop() {
  const int buckets = static_cast<int>(buffers_.size());
  absl::MutexLock lock(&mu_);
  auto next_ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || (thread_step_ < step_ && reduced_ < buckets &&
                         bucket_ready_[reduced_]);
  };
  while (true) {
    // The next bucket in order, once it is ready.
    mu_.Await(absl::Condition(&next_ready));
    if (stopping_) return;
    const int bucket = reduced_;
    const bool failed = !status_.ok();  // later buckets are skipped
    mu_.Unlock();
    absl::Status status = failed ? absl::OkStatus()
                                 : comm_->AllReduceSum(buffers_[bucket].data(),
                                                       buffers_[bucket].size());
    mu_.Lock();
    if (!status.ok() && status_.ok()) status_ = status;
    ++reduced_;
    if (reduced_ == buckets) thread_step_ = step_;
  }
}

absl::Status GradientReducer::Finish(float* loss_sum, float* stop_sum) {
  // Parameters that took no part in this backward pass contribute zeros
  // (or what earlier micro-batches left in .grad).
  armed_ = false;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (arrived_[i]) continue;
    arrived_[i] = true;
    const Slot& slot = slots_[i];
    const torch::Tensor& earlier = params_[i].grad();
    if (options_.accumulate && earlier.defined()) {
      std::memcpy(buffers_[slot.bucket].data() + slot.offset,
                  earlier.data_ptr<float>(), earlier.numel() * sizeof(float));
    } else {
      std::fill_n(buffers_[slot.bucket].begin() + slot.offset,
                  params_[i].numel(), 0.0f);
    }
    if (--pending_[slot.bucket] == 0) MarkReady(slot.bucket);
  }
  absl::Status status;
  if (options_.overlap) {
    const int buckets = static_cast<int>(buffers_.size());
    absl::MutexLock lock(&mu_);
    auto all_reduced = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return reduced_ == buckets;
    };
    mu_.Await(absl::Condition(&all_reduced));
    status = status_;
  } else {
    for (std::vector<float>& buffer : buffers_) {
      status = comm_->AllReduceSum(buffer.data(), buffer.size());
      if (!status.ok()) break;
    }
  }
  if (!status.ok()) return status;

  const float inv_world = 1.0f / static_cast<float>(comm_->size());
  for (size_t i = 0; i < params_.size(); ++i) {
    torch::Tensor grad = params_[i].mutable_grad();
    if (!grad.defined()) {
      grad = torch::zeros_like(params_[i]);
      params_[i].mutable_grad() = grad;
    }
    const Slot& slot = slots_[i];
    const float* in = buffers_[slot.bucket].data() + slot.offset;
    float* out = grad.data_ptr<float>();
    for (int64_t j = 0; j < grad.numel(); ++j) out[j] = in[j] * inv_world;
  }
  const std::vector<float>& last = buffers_.back();
  *loss_sum = last[last.size() - 2];
  *stop_sum = last[last.size() - 1];
  return absl::OkStatus();
}

}  // namespace lockstep::worker
