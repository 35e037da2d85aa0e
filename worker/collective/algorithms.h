// lockstep's CPU collectives, written once over one primitive that every
// CPU transport provides (MeshCommunicator over its own sockets,
// GlooCommunicator over Gloo's pairs): an exchange that moves at most one
// message each way with each peer, concurrently. One algorithm per file
// (allreduce_direct.cc, allreduce_ring.cc, broadcast_gather.cc), so the
// bit-identical results of every transport rest on one copy of each, with
// the arithmetic of reduce.h.
//
// Thread-compatible: a transport calls them from the thread that issues its
// collectives, with scratch space of its own.
#ifndef LOCKSTEP_WORKER_COLLECTIVE_ALGORITHMS_H_
#define LOCKSTEP_WORKER_COLLECTIVE_ALGORITHMS_H_

#include <cstddef>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "worker/collective/communicator.h"

namespace lockstep::worker {

// What one exchange moves with one peer: a message each way, either of which
// may be empty (0 bytes).
struct Transfer {
  const void* send = nullptr;
  size_t send_bytes = 0;
  void* recv = nullptr;
  size_t recv_bytes = 0;
};

// A transport's primitive.
class PeerExchange {
 public:
  virtual ~PeerExchange() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Moves transfers[peer] with every peer at once (this rank's entry is
  // unused) and returns when all arrived. `what` names the collective in
  // errors. Errors: the transport's (Aborted, Unavailable naming the peer,
  // DeadlineExceeded).
  virtual absl::Status Exchange(absl::string_view what,
                                const std::vector<Transfer>& transfers) = 0;
};

// Space the algorithms reuse from call to call (fresh pages every call cost
// more than the sums).
struct CollectiveScratch {
  std::vector<char> bytes;
  std::vector<float> accumulator;
  std::vector<Transfer> transfers;
};

// Sums `count` elements of `type` at `data` over every rank, in place, each
// element x0 + x1 + ... in rank order (16-bit types summed in fp32, rounded
// once), so every rank gets the same bits however the buffer is split.
// Direct: reduce-scatter by direct exchange (rank c sums chunk c), then
// all-gather. Ring: W-1 rounds of reduce-scatter, W-1 of all-gather, to the
// neighbours only. Either moves 2(W-1)/W of the buffer per rank.
absl::Status DirectAllReduce(PeerExchange& exchange, CollectiveScratch& scratch,
                             void* data, size_t count, DataType type);
absl::Status RingAllReduce(PeerExchange& exchange, CollectiveScratch& scratch,
                           void* data, size_t count, DataType type);
// `bytes` at `data` from rank `root` to every rank.
absl::Status BroadcastBytes(PeerExchange& exchange, CollectiveScratch& scratch,
                            void* data, size_t bytes, int root);
// Every rank's `bytes` at `in` into `out`, rank r's at r * bytes.
absl::Status AllGatherBytes(PeerExchange& exchange, CollectiveScratch& scratch,
                            const void* in, size_t bytes, void* out);

}  // namespace lockstep::worker

#endif  // LOCKSTEP_WORKER_COLLECTIVE_ALGORITHMS_H_
