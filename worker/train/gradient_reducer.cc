// Bucket layout, the autograd hooks and the communication thread of the
// overlapped gradient all-reduce (gradient_reducer.h).
#include "worker/train/gradient_reducer.h"

#include <algorithm>
#include <cstring>

#include "worker/collective/half.h"

namespace lockstep::worker {
namespace {

torch::Tensor Flat(const torch::Tensor& t) { return t.reshape({-1}); }

}  // namespace

GradientReducer::GradientReducer(std::vector<torch::Tensor> params,
                                 Communicator* comm, Options options)
    : params_(std::move(params)),
      comm_(comm),
      options_(options),
      alone_(comm->size() == 1),
      handoff_(options.handoff != nullptr ? options.handoff : &host_handoff_) {
  slots_.resize(params_.size());
  std::vector<size_t> sizes;  // floats per bucket
  size_t cap = options_.first_bucket_bytes;
  size_t bytes = 0;
  for (int i = static_cast<int>(params_.size()) - 1; i >= 0; --i) {
    size_t size = params_[i].numel() * sizeof(float);
    if (members_.empty() || (bytes > 0 && bytes + size > cap)) {
      if (!members_.empty()) cap = options_.bucket_bytes;
      members_.emplace_back();
      sizes.push_back(0);
      bytes = 0;
    }
    slots_[i] = {static_cast<int>(members_.size()) - 1, sizes.back()};
    members_.back().push_back(i);
    sizes.back() += params_[i].numel();
    bytes += size;
  }
  if (sizes.empty()) sizes.push_back(0);
  sizes.back() += 2;  // loss, stop vote
  const auto floats = torch::TensorOptions().dtype(torch::kFloat32);
  for (size_t floats_in_bucket : sizes) {
    const int64_t n = static_cast<int64_t>(floats_in_bucket);
    buckets_.push_back(torch::zeros({n}, floats.device(options_.device)));
    if (on_device() && options_.stage_through_host) {
      staging_.push_back(torch::empty({n}, floats.pinned_memory(true)));
    }
    if (options_.bf16_wire) wire_.emplace_back(floats_in_bucket);
  }
  pending_.assign(buckets_.size(), 0);
  {
    absl::MutexLock lock(&mu_);
    bucket_ready_.assign(buckets_.size(), false);
  }
  arrived_.assign(params_.size(), false);
  if (alone_) {
    buckets_.clear();  // the layout stays, for buckets()
    staging_.clear();
    return;
  }
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
  for (size_t i = 0; i < hooks_.size(); ++i) {
    torch::Tensor param = params_[i];
    param.remove_hook(hooks_[i]);
  }
}

void GradientReducer::Prepare(float loss, float stop_vote) {
  if (alone_) return PrepareAlone(loss, stop_vote);
  if (on_device()) {
    Prepare(torch::full({1}, loss, options_.device), stop_vote);
    return;
  }
  float* last = data(static_cast<int>(buckets_.size()) - 1);
  const int64_t n = buckets_.back().numel();
  last[n - 2] = loss;
  last[n - 1] = stop_vote;
  Arm();
}

void GradientReducer::Prepare(const torch::Tensor& loss, float stop_vote) {
  if (alone_) {
    // Read in Finish, after backward was launched: no synchronisation here.
    PrepareAlone(0, stop_vote);
    alone_device_loss_ = loss.detach();
    return;
  }
  if (!on_device()) {
    Prepare(loss.item<float>(), stop_vote);
    return;
  }
  torch::Tensor extras =
      buckets_.back().narrow(0, buckets_.back().numel() - 2, 2);
  extras.narrow(0, 0, 1).copy_(Flat(loss.detach()).to(torch::kFloat32));
  extras.narrow(0, 1, 1).fill_(stop_vote);
  Arm();
}

void GradientReducer::Arm() {
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
  for (size_t b = 0; b < buckets_.size(); ++b) {
    const bool empty = b >= members_.size() || members_[b].empty();
    if (empty) handoff_->Filled(static_cast<int>(b));
    bucket_ready_[b] = empty;
  }
}

void GradientReducer::OnGradient(int param, const torch::Tensor& grad) {
  // Idle during the micro-batches before the last; a parameter used twice
  // in one pass contributes its first gradient.
  if (!armed_ || arrived_[param]) return;
  arrived_[param] = true;
  Fill(param, &grad);
  const int bucket = slots_[param].bucket;
  if (--pending_[bucket] == 0) MarkReady(bucket);
}

void GradientReducer::Fill(int param, const torch::Tensor* grad) {
  const Slot& slot = slots_[param];
  const torch::Tensor& earlier = params_[param].grad();
  const bool add_earlier = options_.accumulate && earlier.defined();
  const int64_t n = params_[param].numel();
  if (on_device()) {
    torch::Tensor part =
        buckets_[slot.bucket].narrow(0, static_cast<int64_t>(slot.offset), n);
    if (grad != nullptr) {
      part.copy_(Flat(*grad));
      if (add_earlier) part.add_(Flat(earlier));
    } else if (add_earlier) {
      part.copy_(Flat(earlier));
    } else {
      part.zero_();
    }
    return;
  }
  float* out = data(slot.bucket) + slot.offset;
  if (grad != nullptr) {
    torch::Tensor dense = grad->contiguous();
    std::memcpy(out, dense.data_ptr<float>(), n * sizeof(float));
    if (add_earlier) {
      const float* in = earlier.data_ptr<float>();
      for (int64_t j = 0; j < n; ++j) out[j] += in[j];
    }
  } else if (add_earlier) {
    std::memcpy(out, earlier.data_ptr<float>(), n * sizeof(float));
  } else {
    std::fill_n(out, n, 0.0f);
  }
}

void GradientReducer::MarkReady(int bucket) {
  handoff_->Filled(bucket);
  absl::MutexLock lock(&mu_);
  bucket_ready_[bucket] = true;
}

absl::Status GradientReducer::Reduce(int bucket) {
  absl::Status ordered = handoff_->BeforeReduce(bucket);
  if (!ordered.ok()) return ordered;
  const size_t count = static_cast<size_t>(buckets_[bucket].numel());
  if (staging_.empty() && on_device()) {
    // NCCL reduces device memory in place; it has no bf16 wire here (the
    // generation refuses communication.compression with NCCL).
    return comm_->AllReduceSum(data(bucket), count);
  }
  if (staging_.empty()) return ReduceHost(bucket, data(bucket), count);
  // Gloo on a GPU: through pinned host memory, each copy complete before
  // the next stage reads it.
  torch::Tensor& host = staging_[bucket];
  host.copy_(buckets_[bucket]);
  absl::Status reduced = ReduceHost(bucket, host.data_ptr<float>(), count);
  if (reduced.ok()) buckets_[bucket].copy_(host);
  return reduced;
}

absl::Status GradientReducer::ReduceHost(int bucket, float* host,
                                         size_t count) {
  if (!options_.bf16_wire) return comm_->AllReduceSum(host, count);
  // The last bucket's two extras (loss, stop vote) are not gradients: a
  // loss rounded to 8 bits of mantissa would be a wrong report.
  const bool last = bucket == static_cast<int>(buckets_.size()) - 1;
  const size_t gradients = last ? count - 2 : count;
  std::vector<uint16_t>& wire = wire_[bucket];
  for (size_t i = 0; i < gradients; ++i) wire[i] = FloatToBFloat16(host[i]);
  absl::Status reduced =
      comm_->AllReduceSum(wire.data(), gradients, DataType::kBFloat16);
  if (!reduced.ok()) return reduced;
  for (size_t i = 0; i < gradients; ++i) host[i] = BFloat16ToFloat(wire[i]);
  return last ? comm_->AllReduceSum(host + gradients, 2) : absl::OkStatus();
}

void GradientReducer::CommunicationLoop() {
  const int buckets = static_cast<int>(buckets_.size());
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
    absl::Status status = failed ? absl::OkStatus() : Reduce(bucket);
    mu_.Lock();
    if (!status.ok() && status_.ok()) status_ = status;
    ++reduced_;
    if (reduced_ == buckets) thread_step_ = step_;
  }
}

void GradientReducer::PrepareAlone(float loss, float stop_vote) {
  alone_device_loss_ = torch::Tensor();
  alone_extras_[0] = loss;
  alone_extras_[1] = stop_vote;
  if (options_.accumulate) return;  // .grad holds the earlier micro-batches
  // No .grad: autograd hands the last backward's gradient over as it is,
  // as the bucketed path copies it (adding it to zeroed .grad would turn a
  // -0.0 into +0.0).
  for (const torch::Tensor& param : params_) {
    param.mutable_grad() = torch::Tensor();
  }
}

void GradientReducer::FinishAlone(float* loss_sum, float* stop_sum) {
  for (const torch::Tensor& param : params_) {
    if (!param.grad().defined()) {
      param.mutable_grad() = torch::zeros_like(param);
    }
  }
  if (alone_device_loss_.defined()) {
    alone_extras_[0] =
        alone_device_loss_.to(torch::kCPU, torch::kFloat32).item<float>();
    alone_device_loss_ = torch::Tensor();
  }
  *loss_sum = alone_extras_[0];
  *stop_sum = alone_extras_[1];
}

absl::Status GradientReducer::Finish(float* loss_sum, float* stop_sum) {
  if (alone_) {
    FinishAlone(loss_sum, stop_sum);
    return absl::OkStatus();
  }
  // Parameters that took no part in this backward pass contribute zeros
  // (or what earlier micro-batches left in .grad).
  armed_ = false;
  for (size_t i = 0; i < params_.size(); ++i) {
    if (arrived_[i]) continue;
    arrived_[i] = true;
    Fill(static_cast<int>(i), nullptr);
    const int bucket = slots_[i].bucket;
    if (--pending_[bucket] == 0) MarkReady(bucket);
  }
  absl::Status status;
  if (options_.overlap) {
    const int buckets = static_cast<int>(buckets_.size());
    absl::MutexLock lock(&mu_);
    auto all_reduced = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return reduced_ == buckets;
    };
    mu_.Await(absl::Condition(&all_reduced));
    status = status_;
  } else {
    for (int b = 0; b < static_cast<int>(buckets_.size()); ++b) {
      status = Reduce(b);
      if (!status.ok()) break;
    }
  }
  if (status.ok()) status = handoff_->Reduced();
  if (!status.ok()) return status;
  WriteGradients();
  torch::Tensor extras =
      buckets_.back().narrow(0, buckets_.back().numel() - 2, 2).to(torch::kCPU);
  *loss_sum = extras.data_ptr<float>()[0];
  *stop_sum = extras.data_ptr<float>()[1];
  return absl::OkStatus();
}

void GradientReducer::WriteGradients() {
  const float inv_world = 1.0f / static_cast<float>(comm_->size());
  for (size_t i = 0; i < params_.size(); ++i) {
    torch::Tensor grad = params_[i].mutable_grad();
    if (!grad.defined()) {
      grad = torch::zeros_like(params_[i]);
      params_[i].mutable_grad() = grad;
    }
    const Slot& slot = slots_[i];
    if (on_device()) {
      torch::Tensor part = buckets_[slot.bucket].narrow(
          0, static_cast<int64_t>(slot.offset), grad.numel());
      grad.copy_(part.view_as(grad)).mul_(inv_world);
      continue;
    }
    const float* in = data(slot.bucket) + slot.offset;
    float* out = grad.data_ptr<float>();
    for (int64_t j = 0; j < grad.numel(); ++j) out[j] = in[j] * inv_world;
  }
}

}  // namespace lockstep::worker
