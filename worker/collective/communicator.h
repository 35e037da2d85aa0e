// The data plane: collectives among the ranks of one generation. Every call
// returns a Status and is bounded by the communicator's timeout; a dead or
// slow peer is an error naming the rank that saw it, never an exception or an
// endless wait, and Abort() from another thread ends a pending call.
#ifndef LOCKSTEP_WORKER_COLLECTIVE_COMMUNICATOR_H_
#define LOCKSTEP_WORKER_COLLECTIVE_COMMUNICATOR_H_

#include <cstddef>
#include <cstring>

#include "absl/status/status.h"

namespace lockstep::worker {

// Element types an all-reduce sums. bf16 and fp16 are summed in fp32 and
// rounded (to nearest even) once at the end.
enum class DataType { kFloat32, kBFloat16, kFloat16 };

inline size_t ElementSize(DataType type) {
  return type == DataType::kFloat32 ? 4 : 2;
}

// How AllReduceSum moves the data. Both send 2(W-1)/W of the buffer per
// rank; they differ in who talks to whom.
enum class AllReduceAlgorithm {
  // Reduce-scatter by direct exchange with every peer, then all-gather:
  // two rounds whatever W, so the fewest latencies; each element is summed
  // as x0 + x1 + ... in rank order (bf16/fp16 in fp32, rounded once).
  kDirect,
  // Reduce-scatter then all-gather around the ring of ranks: 2(W-1)
  // rounds, each rank talks only to its two neighbours, which suits
  // networks where the mesh's concurrent flows contend. Each chunk is
  // summed in a different rank order; bf16/fp16 partial sums are rounded
  // at every hop.
  kRing,
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;

  // In-place sum over every rank, of `count` elements of `type`. Same count,
  // type and call order on all ranks. Each element's sum is formed in rank
  // order (x0 + x1 + ...), so the result is bitwise the same on every rank,
  // from run to run, and however a buffer is split into calls.
  virtual absl::Status AllReduceSum(void* data, size_t count,
                                    DataType type) = 0;
  absl::Status AllReduceSum(float* data, size_t count) {
    return AllReduceSum(data, count, DataType::kFloat32);
  }
  // Overwrites `bytes` at `data` on every rank with `root`'s.
  virtual absl::Status Broadcast(void* data, size_t bytes, int root) = 0;
  absl::Status Broadcast(float* data, size_t count, int root) {
    return Broadcast(static_cast<void*>(data), count * sizeof(float), root);
  }
  // `out` (size() * bytes) receives every rank's `bytes` at rank * bytes.
  virtual absl::Status AllGather(const void* in, size_t bytes, void* out) = 0;
  // Returns once every rank called it.
  virtual absl::Status Barrier() = 0;
  // Ends the communicator: a call pending on another thread fails promptly
  // with Aborted, and so does every later call. Thread-safe.
  virtual void Abort() = 0;
  // Runs later all-reduces with `algorithm`; false where the communicator
  // has no such choice (NCCL picks its own, one rank has nothing to move).
  // Every rank must make the same choice, and never while a collective is
  // pending.
  virtual bool SetAllReduceAlgorithm(AllReduceAlgorithm algorithm) {
    (void)algorithm;
    return false;
  }
};

// The communicator of a one-replica job: every collective is the identity.
class SingleRankCommunicator : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  absl::Status AllReduceSum(void*, size_t, DataType) override {
    return absl::OkStatus();
  }
  absl::Status Broadcast(void*, size_t, int) override {
    return absl::OkStatus();
  }
  absl::Status AllGather(const void* in, size_t bytes, void* out) override {
    if (bytes > 0) std::memmove(out, in, bytes);
    return absl::OkStatus();
  }
  absl::Status Barrier() override { return absl::OkStatus(); }
  void Abort() override {}
};

}  // namespace lockstep::worker

#endif  // LOCKSTEP_WORKER_COLLECTIVE_COMMUNICATOR_H_
