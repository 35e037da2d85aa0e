// The one place that counts the collectives a rank enters in a generation:
// a Communicator that forwards every call to another and bumps a counter
// first. The agent sends the count with each heartbeat; the coordinator
// names a rank whose count stays behind the others' as stalled. With
// WorkerMetrics it also adds each call's bytes and time to the worker's
// /metrics.
#ifndef LOCKSTEP_WORKER_COLLECTIVE_COUNTING_COMMUNICATOR_H_
#define LOCKSTEP_WORKER_COLLECTIVE_COUNTING_COMMUNICATOR_H_

#include <atomic>
#include <cstdint>

#include "absl/time/clock.h"
#include "worker/collective/communicator.h"
#include "worker/worker_metrics.h"

namespace lockstep::worker {

// Thread-safe as the wrapped communicator is; the counter is atomic.
// `inner`, `count` and `metrics` (may be null) must outlive the wrapper.
class CountingCommunicator : public Communicator {
 public:
  CountingCommunicator(Communicator* inner, std::atomic<int64_t>* count,
                       WorkerMetrics* metrics = nullptr)
      : inner_(inner), count_(count), metrics_(metrics) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  absl::Status AllReduceSum(void* data, size_t count, DataType type) override {
    return Timed(WorkerMetrics::kAllReduce, count * ElementSize(type),
                 [&] { return inner_->AllReduceSum(data, count, type); });
  }
  absl::Status Broadcast(void* data, size_t bytes, int root) override {
    return Timed(WorkerMetrics::kBroadcast, bytes,
                 [&] { return inner_->Broadcast(data, bytes, root); });
  }
  absl::Status AllGather(const void* in, size_t bytes, void* out) override {
    return Timed(WorkerMetrics::kAllGather, bytes,
                 [&] { return inner_->AllGather(in, bytes, out); });
  }
  absl::Status Barrier() override {
    return Timed(WorkerMetrics::kBarrier, 0, [&] { return inner_->Barrier(); });
  }
  void Abort() override { inner_->Abort(); }
  bool SetAllReduceAlgorithm(AllReduceAlgorithm algorithm) override {
    return inner_->SetAllReduceAlgorithm(algorithm);
  }

  // The overloads of the base class stay visible.
  using Communicator::AllReduceSum;
  using Communicator::Broadcast;

 private:
  // Counts the call, runs it, and adds it to the metrics when it succeeded.
  template <typename Call>
  absl::Status Timed(WorkerMetrics::Collective op, size_t bytes, Call call) {
    count_->fetch_add(1);
    if (metrics_ == nullptr) return call();
    const absl::Time start = absl::Now();
    absl::Status status = call();
    if (status.ok()) metrics_->CollectiveDone(op, bytes, absl::Now() - start);
    return status;
  }

  Communicator* const inner_;
  std::atomic<int64_t>* const count_;
  WorkerMetrics* const metrics_;
};

}  // namespace lockstep::worker

#endif  // LOCKSTEP_WORKER_COLLECTIVE_COUNTING_COMMUNICATOR_H_
