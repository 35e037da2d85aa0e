// Communicator over NCCL, for workers with a GPU. Built only when CUDA and
// NCCL are found (LOCKSTEP_CUDA=AUTO|ON). Buffers may be device memory of
// this rank's GPU (or managed memory), which NCCL reads and writes in place,
// or host memory (pageable or pinned), which is staged through a device
// buffer the communicator owns: the gradient buckets are device tensors, the
// trainer's small collectives (step agreement, state broadcast, evaluation
// sums) pass host buffers.
//
// Rank 0 creates the NCCL unique id and publishes it through the
// coordinator's key-value store (scoped by job and generation); the others
// read it. Whoever holds the id can join, so once NCCL connected the ranks
// all-gather proofs that they hold the generation's secret and check them
// before the first gradient. The communicator is non-blocking and runs on its
// own CUDA stream (created cudaStreamNonBlocking: it does not wait for the
// legacy default stream LibTorch computes on; WaitForEvent orders it after that
// work). Every call enqueues its collective, then polls NCCL's state until the
// enqueue is complete (not ncclInProgress) and the stream until the collective
// ran, watching NCCL's asynchronous error, the abort flag and the deadline; it
// uses ncclCommAbort when a peer failed, the deadline passed or Abort() was
// called, so no call waits past its timeout. Any failed call aborts the
// communicator: every later call fails with Aborted.
//
// Unlike the Gloo backend, the order in which NCCL adds the ranks'
// contributions depends on its algorithm and the buffer size: results are
// repeatable for a given world size and bucketing, not across bucketings.
//
// Thread-compatible: one thread issues the collectives (and WaitForEvent);
// Abort() may be called from any thread. Each call makes this rank's device
// current on the calling thread for its duration and restores the previous
// one; Connect leaves it current.
#ifndef LOCKSTEP_WORKER_COLLECTIVE_NCCL_COMMUNICATOR_H_
#define LOCKSTEP_WORKER_COLLECTIVE_NCCL_COMMUNICATOR_H_

#include <atomic>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/collective/communicator.h"
#include "worker/collective/membership.h"
#include "worker/control_plane.h"

namespace lockstep::worker {

class NcclCommunicator : public Communicator {
 public:
  struct Options {
    int rank = 0;
    int size = 1;
    int device = 0;  // CUDA device of this rank
    absl::Duration timeout = absl::Seconds(60);
    // The generation's job, number and secret: after NCCL connected, every
    // rank all-gathers a proof that it holds the secret (membership.h) and
    // checks the others' before any gradient moves. Tests may leave the
    // secret empty.
    Membership membership;
  };

  // The number of CUDA devices this process sees; 0 without a GPU or driver.
  static int DeviceCount();

  // A communicator not connected yet. Errors: FailedPrecondition without a
  // usable GPU.
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> Create(
      const Options& options);
  // Exchanges NCCL's unique id through `kv`, initializes NCCL, then checks
  // every rank's proof of membership with an all-gather of 32 bytes per
  // rank. Call once, before any collective; Abort() from another thread ends
  // it promptly. Errors: Aborted; DeadlineExceeded from the key-value store
  // or when a peer does not join; Unavailable when NCCL cannot connect, and
  // when a rank's proof is wrong (naming the rank: NCCL shows no addresses).
  // Leaves options.device current on the calling thread.
  absl::Status Connect(KeyValueClient* kv);
  // Create, then Connect.
  static absl::StatusOr<std::unique_ptr<NcclCommunicator>> Connect(
      KeyValueClient* kv, const Options& options);
  // Without Abort(): finalizes the NCCL communicator (bounded by the
  // timeout, then aborted) and destroys it. After Abort() (call it first
  // when the generation ended on a failure): aborts it at once. Either way
  // the stream is synchronised before the staging buffer is freed.
  ~NcclCommunicator() override;

  int rank() const override { return options_.rank; }
  int size() const override { return options_.size; }
  using Communicator::AllReduceSum;
  using Communicator::Broadcast;
  // Each returns once the collective finished on this rank and, for host
  // buffers, the result is in them. Errors: Aborted (Abort() was called, or
  // an earlier call failed), DeadlineExceeded, Unavailable (NCCL or CUDA
  // failed; a peer died), InvalidArgument (device memory of another GPU).
  absl::Status AllReduceSum(void* data, size_t count, DataType type) override;
  absl::Status Broadcast(void* data, size_t bytes, int root) override;
  absl::Status AllGather(const void* in, size_t bytes, void* out) override;
  absl::Status Barrier() override;
  void Abort() override;

  // Makes the communicator's stream wait, before its next collective, for
  // the work `cuda_event` (a cudaEvent_t) captured when it was last recorded
  // before this call (cudaStreamWaitEvent; an event never recorded is no
  // wait). Returns at once, without waiting on the host. The event may be
  // recorded again or destroyed after this returns. Called from the thread
  // that issues the collectives. Errors: Aborted; InvalidArgument for a null
  // event; Unavailable when CUDA refuses (the communicator is then aborted).
  absl::Status WaitForEvent(void* cuda_event);

 private:
  struct Impl;
  NcclCommunicator(Options options, std::unique_ptr<Impl> impl);
  // Waits for the collective (or copy) just enqueued: done once NCCL's
  // state is ncclSuccess (the enqueue completed) and the stream is idle.
  // Aborts the communicator on a peer error, the deadline or Abort().
  absl::Status Wait(const char* what, absl::Time deadline);
  // Whether `data` must be staged: host memory, pageable or pinned. Device
  // memory of another GPU is InvalidArgument.
  absl::StatusOr<bool> IsHostMemory(const void* data, const char* what);
  // Grows the device staging buffer to at least `bytes`.
  absl::Status ReserveStaging(size_t bytes, const char* what);
  // Copies `bytes` on the stream (cudaMemcpyDefault).
  absl::Status CopyOnStream(void* to, const void* from, size_t bytes,
                            const char* what);
  // Copies a staged result back to the host once the collective finished.
  absl::Status CopyOut(void* host, const void* device, size_t bytes,
                       const char* what, absl::Time deadline);
  // The all-gather of membership proofs that ends Connect.
  absl::Status CheckMembership();
  // Aborts the communicator and returns `status`.
  absl::Status Fail(absl::Status status);
  // ncclCommAbort, on the thread that issues the collectives.
  void AbortComm();

  const Options options_;
  std::unique_ptr<Impl> impl_;
  std::atomic<bool> aborted_{false};
};

}  // namespace lockstep::worker

#endif  // LOCKSTEP_WORKER_COLLECTIVE_NCCL_COMMUNICATOR_H_
