// Communicator over Gloo's TCP transport. The full mesh is bootstrapped
// through the coordinator's key-value store: each rank publishes the
// addresses of its listening sockets, one per peer, and connects each pair.
// lockstep does this itself rather than with Gloo's connectFullMesh so that
// Abort() reaches a rank waiting for a peer that died (closing the pairs
// ends Gloo's connect wait). Gloo's TCP transport authenticates no one, so
// before any collective the ranks prove to each other, pair by pair and over
// the pair's own connection, that they hold the key of their pair
// (membership.h): a process that is not a member and connected to a rank's
// port first is found and named instead of being trusted with the data. The
// collectives are lockstep's own algorithms (algorithms.h, the same code
// MeshCommunicator runs) over Gloo's unbound buffers, because their waits
// can be aborted from another thread (Gloo's built-in algorithms can only
// time out, and a hung peer keeps its sockets open), and because the direct
// all-reduce sums each element in rank order whatever the buffer split.
//
// Thread-compatible: one thread issues the collectives; Abort() may be called
// from any thread.
#ifndef LOCKSTEP_WORKER_COLLECTIVE_GLOO_COMMUNICATOR_H_
#define LOCKSTEP_WORKER_COLLECTIVE_GLOO_COMMUNICATOR_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/collective/algorithms.h"
#include "worker/collective/communicator.h"
#include "worker/collective/membership.h"
#include "worker/control_plane.h"

namespace gloo {
class Context;
namespace transport {
class Context;
class Device;
class UnboundBuffer;
}  // namespace transport
}  // namespace gloo

namespace lockstep::worker {

class GlooCommunicator : public Communicator, private PeerExchange {
 public:
  // How AllReduceSum moves the data (communicator.h).
  using Algorithm = AllReduceAlgorithm;

  struct Options {
    int rank = 0;
    int size = 1;
    // Address the TCP transport binds and advertises to peers.
    std::string host = "127.0.0.1";
    // Bounds rendezvous and every collective.
    absl::Duration timeout = absl::Seconds(60);
    Algorithm algorithm = Algorithm::kDirect;
    // The generation's job, number and secret, which every peer must prove
    // it holds. Ranks of one generation must agree; tests may leave the
    // secret empty (then any build of this code is a member).
    Membership membership;
    // How long the listening side of a pair waits for its peer's proof once
    // the pair connected: a member sends it at once, so this is short.
    absl::Duration proof_timeout = absl::Seconds(5);
  };

  // Binds this rank's listening sockets, one per peer; nothing is connected
  // yet. Errors: Unavailable when the address cannot be bound. Sets SIGPIPE
  // to ignored if the process left it at its default, so that a dead peer
  // fails the collective instead of killing the process.
  static absl::StatusOr<std::unique_ptr<GlooCommunicator>> Create(
      const Options& options);
  // Connects the full mesh through `kv`, checks every peer's proof of
  // membership, then waits until every rank has. Per pair, the side that
  // connects sends its proof as soon as it connected; the listening side
  // waits up to proof_timeout for it, checks it, and only then answers with
  // its own. Call once, before any collective. Abort() from another thread
  // ends it promptly. Errors: Aborted; DeadlineExceeded when a peer does not
  // publish its address in time (naming the rank); Unavailable on socket
  // errors, and when the process that connected to this rank's port for a
  // peer sent a wrong proof or none in time (naming its address), or a peer
  // could not be reached; DataLoss for a malformed address.
  absl::Status Connect(KeyValueClient* kv);
  // Create, then Connect.
  static absl::StatusOr<std::unique_ptr<GlooCommunicator>> Connect(
      KeyValueClient* kv, const Options& options);
  ~GlooCommunicator() override;

  int rank() const override { return options_.rank; }
  int size() const override { return options_.size; }
  using Communicator::AllReduceSum;
  using Communicator::Broadcast;
  absl::Status AllReduceSum(void* data, size_t count, DataType type) override;
  absl::Status Broadcast(void* data, size_t bytes, int root) override;
  absl::Status AllGather(const void* in, size_t bytes, void* out) override;
  absl::Status Barrier() override;
  void Abort() override;
  bool SetAllReduceAlgorithm(Algorithm algorithm) override {
    algorithm_ = algorithm;
    return size() > 1;
  }

 private:
  explicit GlooCommunicator(Options options);
  // Connects the pair of every peer and exchanges the proofs; throws on
  // Gloo's errors.
  absl::Status ConnectPairs(KeyValueClient* kv);
  // The membership check of one pair (gloo_membership.cc), once the pair of
  // `peer` connected. A listening side waits for the peer's proof, checks
  // it and sends its own; a connecting side sends its own and posts the
  // receive of the peer's, which FinishProofs waits for.
  absl::Status StartProof(int peer, bool listening);
  absl::Status FinishProofs();
  // The pair's connection failed with `what` while its proof was awaited.
  absl::Status ProofFailed(int peer, absl::string_view what);
  // The remote address of the pair's connection, "host:port".
  std::string RemoteAddress(int peer) const;
  // The failure to connect the pair of `peer`, with Gloo's reason `what`.
  absl::Status ConnectFailed(int peer, bool listening, absl::string_view what);
  // The failure point gloo_hold_rendezvous (common/failpoint.h): logs this
  // rank's Gloo addresses and waits for the test to release it.
  void HoldForTest();

  // Runs `body` with `buffers` registered for Abort; turns Gloo exceptions
  // and aborts into a Status.
  absl::Status Guarded(
      absl::string_view what,
      const std::vector<gloo::transport::UnboundBuffer*>& buffers,
      const std::function<void()>& body);
  // Waits for `n` pending sends (or receives) of `buffer`, counting each
  // peer's completions; throws on abort so `body` unwinds.
  void Wait(gloo::transport::UnboundBuffer& buffer, int n, bool sends);
  // The collectives' primitive (algorithms.h) over Gloo's unbound buffers,
  // one per message, on a fresh slot per call.
  absl::Status Exchange(absl::string_view what,
                        const std::vector<Transfer>& transfers) override;
  // The peers whose sends/receives of the current call did not complete.
  std::string UnfinishedPeers() const;
  // Each exchange's tag.
  uint64_t NextSlot() { return (uint64_t{0x40} << 56) | (next_call_++ << 20); }

  const Options options_;
  // options_.algorithm until SetAllReduceAlgorithm.
  Algorithm algorithm_ = options_.algorithm;
  // The transport and its pairs, made by Create; the collectives' context
  // wraps them once Connect has connected them.
  std::shared_ptr<gloo::transport::Device> device_;
  std::shared_ptr<gloo::transport::Context> transport_;
  std::shared_ptr<gloo::Context> context_;
  uint64_t next_call_ = 0;
  // Per peer: sends and receives posted and completed in the current call.
  std::vector<int> expected_;
  std::vector<int> completed_;
  // Receive space and the fp32 sums, reused by every collective.
  CollectiveScratch scratch_;
  // Per peer, while Connect runs: this rank's proof, the peer's, and their
  // buffers (declared after the bytes they point into, so destroyed first).
  struct Proof {
    std::string mine;
    std::string theirs;
    bool listening = false;
    // The remote end: the address the listener published, or the one that
    // connected to the listener.
    std::string remote;
    std::unique_ptr<gloo::transport::UnboundBuffer> send;
    std::unique_ptr<gloo::transport::UnboundBuffer> recv;
  };
  std::vector<Proof> proofs_;
  // Set when this rank failed to connect to, or hear from, a listening peer:
  // Connect then delays its error (see there).
  bool report_later_ = false;

  absl::Mutex mu_;
  bool aborted_ ABSL_GUARDED_BY(mu_) = false;
  // The store Connect is using while it runs: Abort cancels it and closes
  // the pairs to end Connect's waits.
  KeyValueClient* connecting_ ABSL_GUARDED_BY(mu_) = nullptr;
  // Per peer: this side connects to it (Gloo's rule), rather than listens.
  std::vector<bool> connects_ ABSL_GUARDED_BY(mu_);
  std::vector<gloo::transport::UnboundBuffer*> active_ ABSL_GUARDED_BY(mu_);
};

}  // namespace lockstep::worker

#endif  // LOCKSTEP_WORKER_COLLECTIVE_GLOO_COMMUNICATOR_H_
