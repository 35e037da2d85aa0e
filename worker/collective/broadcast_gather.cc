// Broadcast and all-gather (algorithms.h): one exchange each, the root
// sending to every peer, or every rank sending its block to every peer.
#include <cstring>

#include "worker/collective/algorithms.h"

namespace lockstep::worker {

absl::Status BroadcastBytes(PeerExchange& exchange, CollectiveScratch& scratch,
                            void* data, size_t bytes, int root) {
  std::vector<Transfer>& transfers = scratch.transfers;
  transfers.assign(exchange.size(), Transfer{});
  if (exchange.size() > 1 && bytes > 0) {
    for (int peer = 0; peer < exchange.size(); ++peer) {
      if (exchange.rank() == root) {
        transfers[peer].send = data;
        transfers[peer].send_bytes = bytes;
      } else if (peer == root) {
        transfers[peer].recv = data;
        transfers[peer].recv_bytes = bytes;
      }
    }
  }
  return exchange.Exchange("broadcast", transfers);
}

absl::Status AllGatherBytes(PeerExchange& exchange, CollectiveScratch& scratch,
                            const void* in, size_t bytes, void* out) {
  char* all = static_cast<char*>(out);
  const int me = exchange.rank();
  if (bytes > 0) std::memmove(all + me * bytes, in, bytes);
  std::vector<Transfer>& transfers = scratch.transfers;
  transfers.assign(exchange.size(), Transfer{});
  for (int peer = 0; peer < exchange.size() && bytes > 0; ++peer) {
    transfers[peer] = {all + me * bytes, bytes, all + peer * bytes, bytes};
  }
  return exchange.Exchange("all-gather", transfers);
}

}  // namespace lockstep::worker
