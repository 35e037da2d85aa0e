// The gradient buckets' hand-offs: none on the CPU, CUDA events on a GPU
// (bucket_handoff.h).
#include "worker/train/bucket_handoff.h"

namespace lockstep::worker {

std::unique_ptr<BucketHandoff> MakeBucketHandoff(torch::Device device,
                                                 Communicator* comm,
                                                 bool staged) {
  (void)comm;
  (void)staged;
  if (device.is_cpu()) return std::make_unique<HostHandoff>();
  // TODO(gpu): CUDA events once the NCCL communicator can wait for one.
  return std::make_unique<HostHandoff>();
}

}  // namespace lockstep::worker
