// The ring all-reduce (algorithms.h). Round s of the reduce-scatter: send
// chunk (me - s) to the right, receive chunk (me - s - 1) from the left and
// add it in; after W-1 rounds rank r holds the sum of chunk r + 1. Round s
// of the all-gather: pass on chunk (me + 1 - s), receive chunk (me - s) in
// place.
#include "common/status_macros.h"
#include "worker/collective/algorithms.h"
#include "worker/collective/reduce.h"

namespace lockstep::worker {

absl::Status RingAllReduce(PeerExchange& exchange, CollectiveScratch& scratch,
                           void* data, size_t count, DataType type) {
  const int world = exchange.size();
  const int me = exchange.rank();
  const size_t esize = ElementSize(type);
  const size_t largest = Chunk(count, world, 0).second;
  if (scratch.bytes.size() < largest * esize) {
    scratch.bytes.resize(largest * esize);
  }
  const int right = (me + 1) % world;
  const int left = (me + world - 1) % world;
  auto chunk = [&](int c) { return Chunk(count, world, (c + world) % world); };
  char* bytes = static_cast<char*>(data);
  std::vector<Transfer>& transfers = scratch.transfers;
  auto round = [&](std::pair<size_t, size_t> send,
                   std::pair<size_t, size_t> recv, char* into) {
    transfers.assign(world, Transfer{});
    transfers[right].send = bytes + send.first * esize;
    transfers[right].send_bytes = (send.second - send.first) * esize;
    transfers[left].recv = into;
    transfers[left].recv_bytes = (recv.second - recv.first) * esize;
    return exchange.Exchange("all-reduce", transfers);
  };
  for (int s = 0; s < world - 1; ++s) {
    const auto recv = chunk(me - s - 1);
    RETURN_IF_ERROR(round(chunk(me - s), recv, scratch.bytes.data()));
    AddInto(bytes + recv.first * esize, scratch.bytes.data(),
            recv.second - recv.first, type);
  }
  for (int s = 0; s < world - 1; ++s) {
    const auto recv = chunk(me - s);
    RETURN_IF_ERROR(round(chunk(me + 1 - s), recv, bytes + recv.first * esize));
  }
  return absl::OkStatus();
}

}  // namespace lockstep::worker
