// The one place that counts the collectives a rank enters in a generation:
// a Communicator that forwards every call to another and bumps a counter
// first. The agent sends the count with each heartbeat; the coordinator
// names a rank whose count stays behind the others' as stalled.
#ifndef LOCKSTEP_WORKER_COLLECTIVE_COUNTING_COMMUNICATOR_H_
#define LOCKSTEP_WORKER_COLLECTIVE_COUNTING_COMMUNICATOR_H_

#include <atomic>
#include <cstdint>

#include "worker/collective/communicator.h"

namespace lockstep::worker {

// Thread-safe as the wrapped communicator is; the counter is atomic. Both
// `inner` and `count` must outlive the wrapper.
class CountingCommunicator : public Communicator {
 public:
  CountingCommunicator(Communicator* inner, std::atomic<int64_t>* count)
      : inner_(inner), count_(count) {}

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  absl::Status AllReduceSum(void* data, size_t count, DataType type) override {
    count_->fetch_add(1);
    return inner_->AllReduceSum(data, count, type);
  }
  absl::Status Broadcast(void* data, size_t bytes, int root) override {
    count_->fetch_add(1);
    return inner_->Broadcast(data, bytes, root);
  }
  absl::Status AllGather(const void* in, size_t bytes, void* out) override {
    count_->fetch_add(1);
    return inner_->AllGather(in, bytes, out);
  }
  absl::Status Barrier() override {
    count_->fetch_add(1);
    return inner_->Barrier();
  }
  void Abort() override { inner_->Abort(); }

  // The overloads of the base class stay visible.
  using Communicator::AllReduceSum;
  using Communicator::Broadcast;

 private:
  Communicator* const inner_;
  std::atomic<int64_t>* const count_;
};

}  // namespace lockstep::worker

#endif  // LOCKSTEP_WORKER_COLLECTIVE_COUNTING_COMMUNICATOR_H_
