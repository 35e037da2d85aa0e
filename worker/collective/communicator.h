// The data plane: collectives among the ranks of one generation. Every call
// returns a Status and is bounded by the communicator's timeout; a dead or
// slow peer is an error naming it, never an exception or an endless wait.
#ifndef LOCKSTEP_WORKER_COLLECTIVE_COMMUNICATOR_H_
#define LOCKSTEP_WORKER_COLLECTIVE_COMMUNICATOR_H_

#include <cstddef>

#include "absl/status/status.h"

namespace lockstep::worker {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // In-place sum over every rank. Same `count` and call order on all ranks.
  virtual absl::Status AllReduceSum(float* data, size_t count) = 0;
  // Overwrites `data` on every rank with `root`'s.
  virtual absl::Status Broadcast(float* data, size_t count, int root) = 0;
  // Closes the connections so a collective pending on another thread fails
  // promptly; every later call fails too. Thread-safe.
  virtual void Abort() = 0;
};

// The communicator of a one-replica job: every collective is the identity.
class SingleRankCommunicator : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  absl::Status AllReduceSum(float*, size_t) override {
    return absl::OkStatus();
  }
  absl::Status Broadcast(float*, size_t, int) override {
    return absl::OkStatus();
  }
  void Abort() override {}
};

}  // namespace lockstep::worker

#endif  // LOCKSTEP_WORKER_COLLECTIVE_COMMUNICATOR_H_
