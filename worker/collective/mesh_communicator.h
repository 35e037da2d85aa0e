// lockstep's own data-plane transport for the CPU collectives: one TCP
// connection per pair of ranks, each mutually authenticated with the
// generation's secret before any byte of it is parsed, and encrypted with
// AES-256-GCM unless the worker runs with --data-plane-encryption off
// (secure_channel.h has the wire format; docs/DESIGN.md "Data-plane
// transport" the reasons).
//
// Rendezvous: each rank listens on one port and publishes "host:port"
// under its rank in the coordinator's key-value store; it connects to
// every lower rank and accepts every higher one. The accepting side keeps
// up to kMaxPendingHandshakes unfinished handshakes, each for at most
// handshake_timeout, so a stranger who connects, sends garbage or nothing,
// or floods the port is refused (logged, rate-limited) while the real peer
// gets through: a stranger can neither crash a rank nor fail its
// generation. The port is closed once the mesh is complete.
//
// Collectives: the algorithms of algorithms.h (direct and ring all-reduce,
// fp32 or 16-bit, summed by reduce.h; shared with GlooCommunicator) over
// their one primitive, Exchange, which moves at most one message each way with
// each peer, concurrently, through non-blocking sockets and poll(2). Every wait
// also polls an eventfd, so Abort() from another thread ends it at once. A peer
// that closes, resets, sends a malformed frame or one that fails its tag
// gets its connection closed, and the call fails naming its rank and real
// address; the process never dies of it.
//
// Thread-compatible: one thread issues Connect and the collectives;
// Abort() may be called from any thread. Connect accepts the higher ranks
// on a thread of its own while it connects to the lower ones (their
// Peers are disjoint).
#ifndef LOCKSTEP_WORKER_COLLECTIVE_MESH_COMMUNICATOR_H_
#define LOCKSTEP_WORKER_COLLECTIVE_MESH_COMMUNICATOR_H_

#include <netdb.h>

#include <atomic>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "worker/collective/algorithms.h"
#include "worker/collective/communicator.h"
#include "worker/collective/link_meter.h"
#include "worker/collective/membership.h"
#include "worker/collective/secure_channel.h"
#include "worker/control_plane.h"

namespace lockstep::worker {

class MeshCommunicator : public Communicator, private PeerExchange {
 public:
  using Algorithm = AllReduceAlgorithm;
  // Unfinished handshakes the accepting side keeps; a new connection
  // beyond them closes the oldest that has not passed the Hello's MAC (or
  // is itself closed when every one has).
  static constexpr int kMaxPendingHandshakes = 64;

  struct Options {
    int rank = 0;
    int size = 1;
    // The address this rank listens on and publishes to its peers.
    std::string host = "127.0.0.1";
    // Bounds the rendezvous, and each collective's wait for progress.
    absl::Duration timeout = absl::Seconds(60);
    Algorithm algorithm = Algorithm::kDirect;
    // The generation's job, number and secret, which keys the handshakes.
    // Tests may leave the secret empty (every build of this code is then a
    // member).
    Membership membership;
    // AES-256-GCM on every frame. Off only on a network where nobody can
    // read or alter the traffic; every rank of a job must agree.
    bool encrypted = true;
    // How long an accepted connection may take to finish its handshake: a
    // member does it at once.
    absl::Duration handshake_timeout = absl::Seconds(5);
    // Where each exchange's per-peer throughput goes (null: nowhere).
    LinkMeter* links = nullptr;
  };

  // Binds this rank's listening socket; nothing is connected yet. Errors:
  // Unavailable when the address cannot be bound.
  static absl::StatusOr<std::unique_ptr<MeshCommunicator>> Create(
      const Options& options);
  // Publishes the listening address through `kv`, connects to every lower
  // rank and accepts every higher one (each with the handshake), then waits
  // until every rank has. Call once, before any collective; Abort() from
  // another thread ends it. Errors: Aborted; DeadlineExceeded naming the
  // ranks that did not publish or connect in time; Unavailable when a
  // published address cannot be reached, or what answers there does not
  // prove it holds the secret (naming the rank and address); DataLoss for a
  // malformed published address; FailedPrecondition when a member runs with
  // the other --data-plane-encryption setting.
  absl::Status Connect(KeyValueClient* kv);
  // Create, then Connect.
  static absl::StatusOr<std::unique_ptr<MeshCommunicator>> Connect(
      KeyValueClient* kv, const Options& options);
  ~MeshCommunicator() override;

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

  // "host:port" this rank listens on until Connect ends.
  const std::string& listen_address() const { return listen_address_; }
  // Connections the rendezvous refused: strangers, replays, floods.
  int refused() const { return refused_.load(); }

 private:
  // One peer's connection, once its handshake finished.
  struct Peer {
    int fd = -1;
    std::string address;  // the remote end, "host:port"
    std::unique_ptr<FrameSealer> out;
    std::unique_ptr<FrameOpener> in;
  };
  // An accepted connection whose handshake is under way.
  struct Pending;

  explicit MeshCommunicator(Options options);

  // The rendezvous' halves (mesh_rendezvous.cc).
  // ConnectTo retries HandshakeWith (one connection, one handshake) until
  // the deadline; AcceptPeers runs on a thread of its own meanwhile.
  absl::Status ConnectTo(KeyValueClient* kv, int peer, absl::Time deadline);
  absl::Status HandshakeWith(int peer, const std::string& address,
                             const addrinfo* found, absl::Time deadline);
  absl::Status AcceptPeers(absl::Time deadline);
  // Stops the rendezvous' other half (its waits end with Halted()).
  void Halt();
  absl::Status Halted() const;
  // Reads the next part of `pending`'s handshake; true when it is done
  // with (refused, or promoted to a peer). An error fails the rendezvous.
  absl::StatusOr<bool> Advance(Pending& pending);
  // Logs a refused connection (rate-limited) and counts it.
  void Refuse(const std::string& address, absl::string_view why);
  // Makes `fd` the connection with `peer` after a handshake of `hello` and
  // `reply`. Errors: Internal when its keys cannot be derived.
  absl::Status AddPeer(int peer, int fd, std::string address,
                       const Hello& hello, const std::string& reply);
  // Waits until `fd` is ready for `events` or `deadline` (fd -1: only
  // sleeps), polling the abort and halt eventfds too. Errors: Aborted,
  // Cancelled (halted), DeadlineExceeded.
  absl::Status WaitFor(int fd, short events, absl::Time deadline);
  // Reads (writes) exactly `bytes` before `deadline`; Unavailable when the
  // connection ends first.
  absl::Status ReadAll(int fd, char* data, size_t bytes, absl::Time deadline);
  absl::Status WriteAll(int fd, const char* data, size_t bytes,
                        absl::Time deadline);

  // The collectives' primitive (algorithms.h): moves `transfers` (indexed
  // by peer; this rank's entry unused) at once.
  absl::Status Exchange(absl::string_view what,
                        const std::vector<Transfer>& transfers) override;
  // Fails `what` with `peer`: closes its connection and names it.
  absl::Status PeerFailed(absl::string_view what, int peer,
                          absl::string_view why);
  absl::Status Aborted(absl::string_view what);

  // Constant after construction.
  const Options options_;
  // options_.algorithm until SetAllReduceAlgorithm.
  Algorithm algorithm_ = options_.algorithm;
  int listen_fd_ = -1;
  int wake_fd_ = -1;  // eventfd Abort() writes
  int halt_fd_ = -1;  // eventfd Halt() writes
  std::string listen_address_;

  // Touched by the calling thread only.
  std::vector<Peer> peers_;
  CollectiveScratch scratch_;

  // The accepting half's: the nonce of every Hello that passed its MAC. A
  // replayed Hello (its bytes captured on the wire) repeats one and is
  // refused at once, so replays cannot hold the handshake slots that a
  // Hello's MAC protects from eviction (issue 52 §3). Only members make
  // Hellos that pass, so it holds at most a few per peer.
  std::set<std::string> hello_nonces_;

  // Counted by both halves of the rendezvous.
  std::atomic<int> refused_{0};

  absl::Mutex mu_;
  bool aborted_ ABSL_GUARDED_BY(mu_) = false;
  // The store Connect is waiting on: Abort cancels it.
  KeyValueClient* connecting_ ABSL_GUARDED_BY(mu_) = nullptr;
};

}  // namespace lockstep::worker

#endif  // LOCKSTEP_WORKER_COLLECTIVE_MESH_COMMUNICATOR_H_
