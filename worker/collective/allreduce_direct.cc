// The direct all-reduce (algorithms.h): rank c owns chunk c; every rank
// sends chunk c to its owner, which sums the W contributions in rank order
// and sends the result back to everyone.
#include "common/status_macros.h"
#include "worker/collective/algorithms.h"
#include "worker/collective/reduce.h"

namespace lockstep::worker {

absl::Status DirectAllReduce(PeerExchange& exchange, CollectiveScratch& scratch,
                             void* data, size_t count, DataType type) {
  const int world = exchange.size();
  const int me = exchange.rank();
  const size_t esize = ElementSize(type);
  const size_t largest = Chunk(count, world, 0).second;
  const auto [mine_begin, mine_end] = Chunk(count, world, me);
  const size_t mine = mine_end - mine_begin;
  if (scratch.bytes.size() < (world - 1) * largest * esize) {
    scratch.bytes.resize((world - 1) * largest * esize);
  }
  std::vector<Transfer>& transfers = scratch.transfers;
  transfers.assign(world, Transfer{});
  char* bytes = static_cast<char*>(data);
  for (int peer = 0; peer < world; ++peer) {
    if (peer == me) continue;
    const auto [begin, end] = Chunk(count, world, peer);
    const int slot = peer < me ? peer : peer - 1;
    transfers[peer] = {bytes + begin * esize, (end - begin) * esize,
                       scratch.bytes.data() + slot * largest * esize,
                       mine * esize};
  }
  RETURN_IF_ERROR(exchange.Exchange("all-reduce", transfers));
  SumInRankOrder(data, scratch.bytes.data(), mine_begin, mine, largest, type,
                 me, world, &scratch.accumulator);
  for (int peer = 0; peer < world; ++peer) {
    if (peer == me) continue;
    const auto [begin, end] = Chunk(count, world, peer);
    transfers[peer] = {bytes + mine_begin * esize, mine * esize,
                       bytes + begin * esize, (end - begin) * esize};
  }
  return exchange.Exchange("all-reduce", transfers);
}

}  // namespace lockstep::worker
