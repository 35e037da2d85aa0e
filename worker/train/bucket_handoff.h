// How a gradient bucket's copies and its reduction are ordered when they
// run on different streams: the interface the gradient reducer calls, the
// CPU's version (nothing to order), and the one for a GPU, where the copies
// run on the compute stream and NCCL reduces on its own stream.
#ifndef LOCKSTEP_WORKER_TRAIN_BUCKET_HANDOFF_H_
#define LOCKSTEP_WORKER_TRAIN_BUCKET_HANDOFF_H_

#include <torch/torch.h>

#include <memory>

#include "absl/status/status.h"
#include "worker/collective/communicator.h"

namespace lockstep::worker {

// Orders the copies of gradients into a bucket before the bucket's
// reduction, and the reduction before the averaged gradients are read.
class BucketHandoff {
 public:
  virtual ~BucketHandoff() = default;
  // Training thread: every copy into `bucket` for this step is enqueued.
  virtual void Filled(int bucket) = 0;
  // Communication thread, before `bucket` is reduced: the reduction (or the
  // copy to host memory that stages it) must see those copies.
  virtual absl::Status BeforeReduce(int bucket) = 0;
  // Training thread, once every bucket was reduced, before the averaged
  // gradients are read.
  virtual absl::Status Reduced() = 0;
};

// The CPU's hand-off: one thread's copies are done when they return.
class HostHandoff : public BucketHandoff {
 public:
  void Filled(int) override {}
  absl::Status BeforeReduce(int) override { return absl::OkStatus(); }
  absl::Status Reduced() override { return absl::OkStatus(); }
};

// The hand-off for gradient buckets on `device` reduced by `comm`; `staged`:
// through pinned host memory (Gloo on a GPU). On a GPU with NCCL, each
// bucket's copies are marked by a CUDA event recorded on the compute stream,
// and NCCL's stream waits for it before the reduction; staged, the
// communication thread waits for the event before copying the bucket out.
std::unique_ptr<BucketHandoff> MakeBucketHandoff(torch::Device device,
                                                 Communicator* comm,
                                                 bool staged);

}  // namespace lockstep::worker

#endif  // LOCKSTEP_WORKER_TRAIN_BUCKET_HANDOFF_H_
