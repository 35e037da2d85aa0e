// The gradient buckets' hand-offs: none on the CPU, CUDA events on a GPU
// (bucket_handoff.h).
#include "worker/train/bucket_handoff.h"

#ifdef LOCKSTEP_HAVE_NCCL
#include <map>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "worker/collective/cuda_events.h"
#include "worker/collective/nccl_communicator.h"
#endif

namespace lockstep::worker {

#ifdef LOCKSTEP_HAVE_NCCL
namespace {

// One event per bucket, recorded on the compute stream (LibTorch's legacy
// default stream) after the bucket's copies. With NCCL its stream waits for
// the event; staged through the host, the communication thread waits for
// it before copying the bucket out. NCCL's collectives return once they
// completed on its stream, so Reduced has nothing left to wait for.
// Thread-safe: Filled on the training thread, BeforeReduce on the
// communication thread.
class CudaHandoff : public BucketHandoff {
 public:
  CudaHandoff(int device, NcclCommunicator* nccl)
      : device_(device), nccl_(nccl) {}
  ~CudaHandoff() override {
    absl::MutexLock lock(&mu_);
    for (auto& [bucket, event] : events_) DestroyCudaEvent(event);
  }

  void Filled(int bucket) override {
    absl::MutexLock lock(&mu_);
    if (!error_.ok()) return;
    absl::StatusOr<void*> event = EventLocked(bucket);
    absl::Status recorded = event.status();
    if (recorded.ok()) recorded = SetCudaDevice(device_);
    if (recorded.ok()) recorded = RecordCudaEventOnDefaultStream(*event);
    if (!recorded.ok()) error_ = recorded;
  }

  absl::Status BeforeReduce(int bucket) override {
    void* event;
    {
      absl::MutexLock lock(&mu_);
      if (!error_.ok()) return error_;
      auto it = events_.find(bucket);
      if (it == events_.end()) {
        return absl::InternalError(
            "a gradient bucket was reduced before it "
            "was filled");
      }
      event = it->second;
    }
    absl::Status current = SetCudaDevice(device_);
    if (!current.ok()) return current;
    return nccl_ != nullptr ? nccl_->WaitForEvent(event)
                            : SynchronizeCudaEvent(event);
  }

  absl::Status Reduced() override { return absl::OkStatus(); }

 private:
  absl::StatusOr<void*> EventLocked(int bucket)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    auto it = events_.find(bucket);
    if (it != events_.end()) return it->second;
    absl::StatusOr<void*> event = CreateCudaEvent();
    if (event.ok()) events_[bucket] = *event;
    return event;
  }

  const int device_;
  NcclCommunicator* const nccl_;  // null: staged through host memory
  absl::Mutex mu_;
  std::map<int, void*> events_ ABSL_GUARDED_BY(mu_);
  absl::Status error_ ABSL_GUARDED_BY(mu_);  // the first failure, sticky
};

}  // namespace
#endif

std::unique_ptr<BucketHandoff> MakeBucketHandoff(torch::Device device,
                                                 Communicator* comm,
                                                 bool staged) {
#ifdef LOCKSTEP_HAVE_NCCL
  if (device.is_cuda()) {
    auto* nccl = staged ? nullptr : dynamic_cast<NcclCommunicator*>(comm);
    return std::make_unique<CudaHandoff>(
        device.has_index() ? device.index() : 0, nccl);
  }
#else
  (void)device;
#endif
  (void)comm;
  (void)staged;
  // The CPU; or a GPU in a build without CUDA, where LibTorch's copies on
  // its default stream are ordered with the blocking staging copies anyway.
  return std::make_unique<HostHandoff>();
}

}  // namespace lockstep::worker
