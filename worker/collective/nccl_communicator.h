// Communicator over NCCL, for workers with a GPU. Built only when CUDA and
// NCCL are found (LOCKSTEP_CUDA=AUTO|ON). Buffers are device pointers on
// this rank's GPU.
//
// Rank 0 creates the NCCL unique id and publishes it through the
// coordinator's key-value store (scoped by job and generation); the others
// read it. The communicator is non-blocking and runs on its own CUDA stream:
// every call enqueues its collective, then polls the stream, NCCL's
// asynchronous error state, the abort flag and the deadline, and uses
// ncclCommAbort when a peer failed, the deadline passed or Abort() was
// called, so no call waits past its timeout.
//
// Unlike the Gloo backend, the order in which NCCL adds the ranks'
// contributions depends on its algorithm and the buffer size: results are
// repeatable for a given world size and bucketing, not across bucketings.
//
// Thread-compatible: one thread issues the collectives; Abort() may be
// called from any thread.
#ifndef LOCKSTEP_WORKER_COLLECTIVE_NCCL_COMMUNICATOR_H_
#define LOCKSTEP_WORKER_COLLECTIVE_NCCL_COMMUNICATOR_H_

#include <atomic>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/collective/communicator.h"
#include "worker/control_plane.h"

namespace lockstep::worker {

class NcclCommunicator : public Communicator {
 public:
  struct Options {
    int rank = 0;
    int size = 1;
    int device = 0;  // CUDA device of this rank
    absl::Duration timeout = absl::Seconds(60);
  };

  // The number of CUDA devices this process sees; 0 without a GPU or driver.
  static int DeviceCount();

  // Errors: FailedPrecondition without a usable GPU; DeadlineExceeded or
  // Aborted from the key-value store; Unavailable when NCCL cannot connect.
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> Connect(
      KeyValueClient* kv, const Options& options);
  ~NcclCommunicator() override;

  int rank() const override { return options_.rank; }
  int size() const override { return options_.size; }
  using Communicator::AllReduceSum;
  using Communicator::Broadcast;
  absl::Status AllReduceSum(void* data, size_t count, DataType type) override;
  absl::Status Broadcast(void* data, size_t bytes, int root) override;
  absl::Status AllGather(const void* in, size_t bytes, void* out) override;
  absl::Status Barrier() override;
  void Abort() override;

 private:
  struct Impl;
  NcclCommunicator(Options options, std::unique_ptr<Impl> impl);
  // Waits for the collective just enqueued; aborts the communicator on a
  // peer error, the deadline or Abort().
  absl::Status Wait(const char* what);
  // ncclCommAbort, on the thread that issues the collectives.
  void AbortComm();

  const Options options_;
  std::unique_ptr<Impl> impl_;
  std::atomic<bool> aborted_{false};
};

}  // namespace lockstep::worker

#endif  // LOCKSTEP_WORKER_COLLECTIVE_NCCL_COMMUNICATOR_H_
