// Communicator over Gloo's TCP transport. The full mesh is bootstrapped
// through the coordinator's key-value store (KvStore). Thread-compatible: one
// thread issues the collectives.
#ifndef LOCKSTEP_WORKER_COLLECTIVE_GLOO_COMMUNICATOR_H_
#define LOCKSTEP_WORKER_COLLECTIVE_GLOO_COMMUNICATOR_H_

#include <atomic>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/collective/communicator.h"
#include "worker/control_plane.h"

namespace gloo {
class Context;
}

namespace lockstep::worker {

class GlooCommunicator : public Communicator {
 public:
  struct Options {
    int rank = 0;
    int size = 1;
    // Address the TCP transport binds and advertises to peers.
    std::string host = "127.0.0.1";
    // Bounds rendezvous and every collective.
    absl::Duration timeout = absl::Seconds(60);
  };

  // Connects the full mesh. Errors: DeadlineExceeded/Aborted from the key-
  // value store when a peer does not show up, Unavailable on socket errors.
  static absl::StatusOr<std::unique_ptr<GlooCommunicator>> Connect(
      KeyValueClient* kv, const Options& options);
  ~GlooCommunicator() override;

  int rank() const override { return options_.rank; }
  int size() const override { return options_.size; }
  absl::Status AllReduceSum(float* data, size_t count) override;
  absl::Status Broadcast(float* data, size_t count, int root) override;
  void Abort() override;

 private:
  GlooCommunicator(Options options, std::shared_ptr<gloo::Context> context)
      : options_(std::move(options)), context_(std::move(context)) {}

  const Options options_;
  std::shared_ptr<gloo::Context> context_;
  uint32_t next_tag_ = 0;
  std::atomic<bool> aborted_{false};
};

}  // namespace lockstep::worker

#endif  // LOCKSTEP_WORKER_COLLECTIVE_GLOO_COMMUNICATOR_H_
