// The prefetch thread and its hand-over of batch slots (prefetcher.h).
#include "worker/train/prefetcher.h"

namespace lockstep::worker {

Prefetcher::Prefetcher(const BatchAssembler& assembler, GlobalSampler sampler,
                       const BatchPlan& plan, int64_t first_step,
                       int64_t end_step, bool pinned)
    : assembler_(assembler),
      end_(end_step),
      sampler_(std::move(sampler)),
      next_(first_step) {
  const auto options = torch::TensorOptions().pinned_memory(pinned);
  for (Buffers& buffers : buffers_) {
    buffers.batch = assembler.NewBatch(plan.rank_batch(), options);
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

absl::StatusOr<Batch> Prefetcher::Take(int64_t step) {
  const int index = static_cast<int>(step % kDepth);
  absl::MutexLock lock(&mu_);
  auto filled = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return slots_[index].ready && slots_[index].step == step;
  };
  mu_.Await(absl::Condition(&filled));
  if (!slots_[index].status.ok()) return slots_[index].status;
  return buffers_[index].batch;
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
    Buffers& buffers = buffers_[index];
    absl::Status filled =
        assembler_.Fill(sampler_.RankBatch(step), buffers.batch,
                        buffers.scratch, sampler_.EpochKey(step));
    absl::MutexLock lock(&mu_);
    slots_[index].step = step;
    slots_[index].ready = true;
    slots_[index].status = std::move(filled);
  }
}

}  // namespace lockstep::worker
