// Gradient averaging that overlaps the backward pass (docs/DESIGN.md §5).
//
// Parameters are packed into buckets in reverse registration order (the
// order autograd produces their gradients): a small first bucket so
// communication starts early, then buckets of about `bucket_bytes`. An
// autograd hook copies each gradient into its bucket as soon as it is
// computed; when a bucket is complete, a communication thread all-reduces it
// while backward goes on with earlier layers. Buckets are always reduced in
// index order, the same on every rank. Finish() waits for the last bucket
// and writes the averaged gradients (sum / world size) into each `.grad`.
// The step's loss and stop vote ride in the last bucket.
//
// On a GPU the buckets are device tensors. A hook's copy runs on the compute
// stream; the BucketHandoff orders it before the bucket's reduction on the
// communicator's stream (an event the communication stream waits on), and
// with Gloo the bucket is staged through pinned host memory. On the CPU the
// hand-off has nothing to order.
//
// Lifecycle per step: Prepare() before backward, Finish() after it. With
// gradient accumulation, the micro-batches before the last run backward
// without Prepare(): the hooks are idle and gradients add up in `.grad`;
// Prepare() arms them for the last one, which reduces `.grad` plus its own
// gradient.
// Alone (a communicator of one rank, a 1-worker job) there is nothing to
// average: no hooks, no buckets, no thread. Prepare() lets the last
// backward write fresh gradients into `.grad` (or add to what earlier
// micro-batches left there), and Finish() only gives a parameter that took
// no part zeros: the same bits as the bucketed path, whose copies and
// hand-offs were pure overhead for one rank.
//
// Thread-safety: Prepare/Finish on the training thread; hooks run there too
// (LibTorch's CPU autograd runs backward on the calling thread). The
// communication thread is the reducer's own.
#ifndef LOCKSTEP_WORKER_TRAIN_GRADIENT_REDUCER_H_
#define LOCKSTEP_WORKER_TRAIN_GRADIENT_REDUCER_H_

#include <torch/torch.h>

#include <cstdint>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "worker/collective/communicator.h"
#include "worker/train/bucket_handoff.h"

namespace lockstep::worker {

class GradientReducer {
 public:
  struct Options {
    size_t bucket_bytes = 25 << 20;
    size_t first_bucket_bytes = 1 << 20;
    // False: reduce every bucket after backward (for measuring the overlap).
    bool overlap = true;
    // Gradients of earlier micro-batches wait in `.grad`: add them in.
    bool accumulate = false;
    // Where the parameters live; the buckets live there too.
    torch::Device device = torch::kCPU;
    // The communicator takes only host memory (Gloo): device buckets are
    // reduced through pinned host copies.
    bool stage_through_host = false;
    // Orders copies and reductions; null: HostHandoff. Must outlive the
    // reducer.
    BucketHandoff* handoff = nullptr;
    // communication.compression "bf16": each gradient is rounded to
    // bfloat16 for the all-reduce (half the bytes on the wire) and widened
    // back to fp32 after it. The loss and stop vote stay fp32 (a separate
    // all-reduce of two floats). Host buckets only: a device bucket is
    // staged through the host first.
    bool bf16_wire = false;
  };

  // `params` in registration order; `comm` must outlive the reducer.
  GradientReducer(std::vector<torch::Tensor> params, Communicator* comm,
                  Options options);
  ~GradientReducer();
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  // Arms the hooks for one backward pass; `extras` (this rank's loss and
  // stop vote) are summed along with the gradients.
  void Prepare(float loss, float stop_vote);
  // The same with the loss as a one-element tensor on the device, so
  // reading it needs no synchronisation.
  void Prepare(const torch::Tensor& loss, float stop_vote);
  // Waits for every bucket; then each parameter's .grad holds the average
  // over ranks and `*loss_sum`, `*stop_sum` the sums of the extras.
  absl::Status Finish(float* loss_sum, float* stop_sum);

  // Parameter indices of each bucket, in reduction order.
  const std::vector<std::vector<int>>& buckets() const { return members_; }

 private:
  struct Slot {
    int bucket;
    size_t offset;  // in floats, within the bucket
  };

  void Arm();
  // Alone: what Prepare and Finish do instead (see the file comment).
  void PrepareAlone(float loss, float stop_vote);
  void FinishAlone(float* loss_sum, float* stop_sum);
  void OnGradient(int param, const torch::Tensor& grad);
  // Copies `param`'s part of its bucket in: `grad` (plus what earlier
  // micro-batches left in .grad), or zeros when it took no part.
  void Fill(int param, const torch::Tensor* grad);
  void MarkReady(int bucket);
  absl::Status Reduce(int bucket);
  // All-reduces `count` floats at `host` (bucket `bucket`'s host copy): as
  // they are, or through `wire_` in bf16.
  absl::Status ReduceHost(int bucket, float* host, size_t count);
  void CommunicationLoop();
  // The averaged gradients into each .grad.
  void WriteGradients();
  bool on_device() const { return !options_.device.is_cpu(); }
  // The bucket's floats (host memory on the CPU, device memory on a GPU).
  float* data(int bucket) { return buckets_[bucket].data_ptr<float>(); }

  const std::vector<torch::Tensor> params_;
  Communicator* const comm_;
  const Options options_;
  const bool alone_;                 // one rank: nothing to reduce
  float alone_extras_[2] = {0, 0};   // alone: the loss and stop vote
  torch::Tensor alone_device_loss_;  // alone on a GPU: the loss, read in Finish
  std::vector<Slot> slots_;          // per parameter
  std::vector<std::vector<int>> members_;  // per bucket
  // Per bucket, flat float32 on the device (+2 extras in the last); with
  // staging, pinned host copies of them.
  std::vector<torch::Tensor> buckets_;
  std::vector<torch::Tensor> staging_;
  // bf16_wire: the buckets' gradients as bfloat16 bits, per bucket (the
  // communication thread's own while it reduces that bucket).
  std::vector<std::vector<uint16_t>> wire_;
  HostHandoff host_handoff_;
  BucketHandoff* const handoff_;
  std::vector<int> pending_;   // gradients still missing, per bucket
  std::vector<bool> arrived_;  // per parameter, this step
  std::vector<unsigned> hooks_;

  bool armed_ = false;  // between Prepare and Finish (training thread only)

  // A bucket's buffer belongs to the training thread until it is ready, then
  // to the communication thread until it is reduced.
  absl::Mutex mu_;
  std::vector<bool> bucket_ready_ ABSL_GUARDED_BY(mu_);  // per bucket
  // Buckets all-reduced this step, in order.
  int reduced_ ABSL_GUARDED_BY(mu_) = 0;
  int step_ ABSL_GUARDED_BY(mu_) = 0;         // bumped by Prepare
  int thread_step_ ABSL_GUARDED_BY(mu_) = 0;  // the step the thread finished
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);  // the step's first failure
  std::thread thread_;
};

}  // namespace lockstep::worker

#endif  // LOCKSTEP_WORKER_TRAIN_GRADIENT_REDUCER_H_
