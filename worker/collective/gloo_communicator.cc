// GlooCommunicator's mesh set-up, abortable waits and collectives: direct
// and ring all-reduce, broadcast, all-gather, barrier (gloo_communicator.h).
#include "worker/collective/gloo_communicator.h"

#include <gloo/context.h>
#include <gloo/transport/context.h>
#include <gloo/transport/pair.h>
#include <gloo/transport/tcp/address.h>
#include <gloo/transport/tcp/device.h>
#include <gloo/transport/unbound_buffer.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <algorithm>
#include <csignal>
#include <cstring>
#include <exception>
#include <mutex>
#include <stdexcept>

#include "absl/strings/str_cat.h"
#include "common/failpoint.h"
#include "common/status_macros.h"
#include "worker/collective/reduce.h"

namespace lockstep::worker {
namespace {

using gloo::transport::UnboundBuffer;

// Thrown inside a collective when Abort() released one of its waits.
struct AbortedWait : std::runtime_error {
  AbortedWait() : std::runtime_error("aborted") {}
};

// Gloo writes to its sockets without MSG_NOSIGNAL, so a peer that dies
// mid-collective would kill this process with SIGPIPE instead of failing
// the call with EPIPE. A process that left SIGPIPE at its default gets it
// ignored; one that installed its own handler keeps it.
void IgnoreSigpipeUnlessHandled() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction current {};
    if (sigaction(SIGPIPE, nullptr, &current) == 0 &&
        current.sa_handler == SIG_DFL) {
      signal(SIGPIPE, SIG_IGN);
    }
  });
}

}  // namespace

namespace {

// Whether this side of a pair connects to its peer rather than waiting for
// it: Gloo's rule in tcp::Pair::connect (the larger address, compared as
// raw bytes then port, connects). Addresses Gloo would refuse count as
// connecting.
bool ConnectsToPeer(const std::vector<char>& self_bytes,
                    const std::vector<char>& peer_bytes) {
  const gloo::transport::tcp::Address self(self_bytes);
  const gloo::transport::tcp::Address peer(peer_bytes);
  const sockaddr_storage& a = self.getSockaddr();
  const sockaddr_storage& b = peer.getSockaddr();
  int order = 0;
  if (a.ss_family == AF_INET && b.ss_family == AF_INET) {
    const auto* sa = reinterpret_cast<const sockaddr_in*>(&a);
    const auto* sb = reinterpret_cast<const sockaddr_in*>(&b);
    order = std::memcmp(&sa->sin_addr, &sb->sin_addr, sizeof(in_addr));
    if (order == 0) order = sa->sin_port - sb->sin_port;
  } else if (a.ss_family == AF_INET6 && b.ss_family == AF_INET6) {
    const auto* sa = reinterpret_cast<const sockaddr_in6*>(&a);
    const auto* sb = reinterpret_cast<const sockaddr_in6*>(&b);
    order = std::memcmp(&sa->sin6_addr, &sb->sin6_addr, sizeof(in6_addr));
    if (order == 0) order = sa->sin6_port - sb->sin6_port;
  } else {
    return true;
  }
  return order > 0;
}

// The collectives' context over pairs connected by lockstep: Gloo's
// Context holds the transport it hands out buffers of.
class MeshContext : public gloo::Context {
 public:
  MeshContext(int rank, int size,
              std::shared_ptr<gloo::transport::Device> device,
              std::shared_ptr<gloo::transport::Context> transport)
      : gloo::Context(rank, size) {
    device_ = std::move(device);
    transportContext_ = std::move(transport);
  }
};

}  // namespace

GlooCommunicator::GlooCommunicator(Options options)
    : options_(std::move(options)) {}

absl::StatusOr<std::unique_ptr<GlooCommunicator>> GlooCommunicator::Create(
    const Options& options) {
  IgnoreSigpipeUnlessHandled();
  std::unique_ptr<GlooCommunicator> comm(new GlooCommunicator(options));
  try {
    gloo::transport::tcp::attr attr;
    attr.hostname = options.host;
    comm->device_ = gloo::transport::tcp::CreateDevice(attr);
    comm->transport_ = comm->device_->createContext(options.rank, options.size);
    // Gloo waits five times this for a pair to connect; Abort() ends the
    // wait sooner.
    comm->transport_->setTimeout(absl::ToChronoMilliseconds(
        std::max(options.timeout / 5, absl::Milliseconds(1))));
    for (int peer = 0; peer < options.size; ++peer) {
      if (peer != options.rank) comm->transport_->createPair(peer);
    }
    comm->proofs_.resize(options.size);
    absl::MutexLock lock(&comm->mu_);
    comm->connects_.assign(options.size, false);
  } catch (const std::exception& e) {
    return absl::UnavailableError(
        absl::StrCat("Gloo set-up of rank ", options.rank, " of ", options.size,
                     " on ", options.host, " failed: ", e.what()));
  }
  return comm;
}

absl::StatusOr<std::unique_ptr<GlooCommunicator>> GlooCommunicator::Connect(
    KeyValueClient* kv, const Options& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<GlooCommunicator> comm, Create(options));
  RETURN_IF_ERROR(comm->Connect(kv));
  return comm;
}

absl::Status GlooCommunicator::Connect(KeyValueClient* kv) {
  {
    absl::MutexLock lock(&mu_);
    if (aborted_) return absl::AbortedError("the communicator was aborted");
    connecting_ = kv;
  }
  absl::Status status;
  try {
    status = ConnectPairs(kv);
  } catch (const std::exception& e) {
    status = absl::UnavailableError(
        absl::StrCat("Gloo rendezvous of rank ", rank(), " of ", size(), " on ",
                     options_.host, " failed: ", e.what()));
  }
  {
    absl::MutexLock lock(&mu_);
    connecting_ = nullptr;
    if (aborted_) {
      return absl::AbortedError(
          absl::StrCat("the Gloo rendezvous of rank ", rank(), " was aborted"));
    }
  }
  if (!status.ok() && report_later_) {
    // This rank's connection to a listening peer failed. If a stranger took
    // the peer's port, that peer names it within proof_timeout: let its
    // report reach the coordinator first (only the first one is kept). An
    // abort, which a dead peer's session break brings, ends the wait.
    absl::MutexLock lock(&mu_);
    auto aborted = [this]()
                       ABSL_SHARED_LOCKS_REQUIRED(mu_) { return aborted_; };
    mu_.AwaitWithTimeout(absl::Condition(&aborted),
                         options_.proof_timeout + absl::Seconds(1));
  }
  RETURN_IF_ERROR(status);
  context_ = std::make_shared<MeshContext>(rank(), size(), device_, transport_);
  // A rank's pairs can all be connected before its peers' are; closing
  // early (a short task, an abort) would break theirs. Leave together.
  return Barrier();
}

absl::Status GlooCommunicator::ConnectPairs(KeyValueClient* kv) {
  // Every rank publishes the addresses of its pairs in peer order (itself
  // skipped) under its rank; each pair connects to the address its peer
  // listed for this rank.
  std::string mine;
  size_t address_size = 0;
  for (int peer = 0; peer < size(); ++peer) {
    if (peer == rank()) continue;
    std::vector<char> bytes = transport_->getPair(peer)->address().bytes();
    address_size = bytes.size();
    mine.append(bytes.data(), bytes.size());
  }
  RETURN_IF_ERROR(kv->Set(absl::StrCat(rank()), mine));
  if (FailPointHit("gloo_hold_rendezvous")) HoldForTest();
  for (int peer = 0; peer < size(); ++peer) {
    if (peer == rank()) continue;
    auto theirs = kv->Get(absl::StrCat(peer), options_.timeout);
    if (!theirs.ok()) {
      if (absl::IsDeadlineExceeded(theirs.status())) {
        return absl::DeadlineExceededError(absl::StrCat(
            "rank ", rank(), " of ", size(), " waited ",
            absl::FormatDuration(options_.timeout), " for rank ", peer,
            " to publish its Gloo address: rank ", peer,
            " did not join the generation (see lockstep workers and its log)"));
      }
      return theirs.status();
    }
    // Untrusted: exactly one address of our size per peer of rank `peer`.
    if (theirs->size() != address_size * (size() - 1)) {
      return absl::DataLossError(
          absl::StrCat("rank ", peer, " published ", theirs->size(),
                       " bytes of Gloo addresses; rank ", rank(), " expected ",
                       address_size * (size() - 1),
                       ": it runs another lockstep or Gloo build"));
    }
    const size_t slot = rank() > peer ? rank() - 1 : rank();
    const char* begin = theirs->data() + slot * address_size;
    std::vector<char> address(begin, begin + address_size);
    const bool connects =
        ConnectsToPeer(transport_->getPair(peer)->address().bytes(), address);
    {
      absl::MutexLock lock(&mu_);
      if (aborted_) return absl::AbortedError("aborted");
      connects_[peer] = connects;
    }
    if (connects) {
      proofs_[peer].remote = gloo::transport::tcp::Address(address).str();
    }
    try {
      transport_->getPair(peer)->connect(address);
    } catch (const std::exception& e) {
      return ConnectFailed(peer, !connects, e.what());
    }
    RETURN_IF_ERROR(StartProof(peer, /*listening=*/!connects));
  }
  return FinishProofs();
}

GlooCommunicator::~GlooCommunicator() = default;

void GlooCommunicator::Abort() {
  absl::MutexLock lock(&mu_);
  aborted_ = true;
  if (connecting_ != nullptr) {
    // Ends Connect's waits: for a peer's address, and a listening pair's
    // for its peer (the pair moves to closed, which Gloo's connect wait
    // takes as done); Connect then sees aborted_. A connecting pair is left
    // alone: its wait ends as soon as the peer's kernel answers, and
    // Gloo's close() resets the connection (SO_LINGER 0), which makes a
    // peer that has not accepted it yet die in Gloo's accept handling
    // (getpeername on a reset socket). Only a peer host that does not
    // answer at all keeps it, for the rendezvous timeout.
    connecting_->Cancel();
    for (int peer = 0; peer < size(); ++peer) {
      if (peer != rank() && !connects_[peer]) {
        transport_->getPair(peer)->close();
      }
    }
  }
  for (UnboundBuffer* buffer : active_) {
    buffer->abortWaitSend();
    buffer->abortWaitRecv();
  }
}

absl::Status GlooCommunicator::Guarded(
    absl::string_view what, const std::vector<UnboundBuffer*>& buffers,
    const std::function<void()>& body) {
  {
    absl::MutexLock lock(&mu_);
    if (aborted_) return absl::AbortedError("the communicator was aborted");
    active_.clear();
    for (UnboundBuffer* buffer : buffers) {
      if (buffer != nullptr) active_.push_back(buffer);
    }
  }
  expected_.assign(size(), 0);
  completed_.assign(size(), 0);
  absl::Status status;
  try {
    body();
  } catch (const AbortedWait&) {
    status = absl::AbortedError(
        absl::StrCat(what, " on rank ", rank(), " was aborted"));
  } catch (const std::exception& e) {
    status = absl::UnavailableError(
        absl::StrCat(what, " failed on rank ", rank(), " of ", size(), ": ",
                     e.what(), "; unfinished with rank(s) ", UnfinishedPeers(),
                     ": a peer died, hung or was cut off"));
  }
  absl::MutexLock lock(&mu_);
  active_.clear();
  if (!status.ok() && aborted_) {
    return absl::AbortedError(
        absl::StrCat(what, " on rank ", rank(), " was aborted"));
  }
  return status;
}

void GlooCommunicator::Wait(UnboundBuffer& buffer, int n, bool sends) {
  const auto timeout = absl::ToChronoMilliseconds(options_.timeout);
  for (int i = 0; i < n; ++i) {
    int peer = -1;
    bool done = sends ? buffer.waitSend(&peer, timeout)
                      : buffer.waitRecv(&peer, timeout);
    if (!done) throw AbortedWait();
    if (peer >= 0) ++completed_[peer];
  }
}

std::string GlooCommunicator::UnfinishedPeers() const {
  std::string peers;
  for (int r = 0; r < size(); ++r) {
    if (completed_[r] < expected_[r]) {
      absl::StrAppend(&peers, peers.empty() ? "" : ", ", r);
    }
  }
  return peers;
}

// Reduce-scatter by direct exchange, then all-gather: rank c owns chunk c;
// every rank sends chunk c to its owner, which sums the W contributions in
// rank order (in fp32) and sends the result back to everyone. The traffic
// per rank is 2(W-1)/W of the buffer, as for a ring, and each element's sum
// is x0 + x1 + ... + x(W-1) whatever chunk it falls in.
absl::Status GlooCommunicator::AllReduceSum(void* data, size_t count,
                                            DataType type) {
  if (count == 0 || size() == 1) return Guarded("all-reduce", {}, [] {});
  switch (options_.algorithm) {
    case Algorithm::kRing:
      return RingAllReduceSum(data, count, type);
    case Algorithm::kDirect:
      break;
  }
  return DirectAllReduceSum(data, count, type);
}

absl::Status GlooCommunicator::DirectAllReduceSum(void* data, size_t count,
                                                  DataType type) {
  const int world = size();
  const int me = rank();
  const size_t esize = ElementSize(type);
  const size_t largest = Chunk(count, world, 0).second;
  // Plain variables, not a structured binding: lambdas capture them below.
  const std::pair<size_t, size_t> owned = Chunk(count, world, me);
  const size_t mine_begin = owned.first;
  const size_t mine_end = owned.second;
  const size_t mine = mine_end - mine_begin;
  // Reused across calls: fresh pages for every call cost more than the sum.
  std::vector<char>& scratch = scratch_;
  if (scratch.size() < (world - 1) * largest * esize) {
    scratch.resize((world - 1) * largest * esize);
  }
  auto out = context_->createUnboundBuffer(data, count * esize);
  std::unique_ptr<UnboundBuffer> in;
  if (!scratch.empty()) {
    in = context_->createUnboundBuffer(scratch.data(), scratch.size());
  }
  auto slot_of = [me](int peer) { return peer < me ? peer : peer - 1; };
  const uint64_t slot = NextSlot();
  return Guarded("all-reduce", {out.get(), in.get()}, [&] {
    int sends = 0, recvs = 0;
    for (int peer = 0; peer < world; ++peer) {
      if (peer == me) continue;
      auto [begin, end] = Chunk(count, world, peer);
      if (end > begin) {
        ++expected_[peer];  // before posting: a post can throw
        out->send(peer, slot, begin * esize, (end - begin) * esize);
        ++sends;
      }
      if (mine > 0) {
        ++expected_[peer];  // before posting: a post can throw
        in->recv(peer, slot, slot_of(peer) * largest * esize, mine * esize);
        ++recvs;
      }
    }
    Wait(*in, recvs, /*sends=*/false);
    Wait(*out, sends, /*sends=*/true);
    SumInRankOrder(data, scratch.data(), mine_begin, mine, largest, type, me,
                   world, &accumulator_);

    sends = recvs = 0;
    for (int peer = 0; peer < world; ++peer) {
      if (peer == me) continue;
      auto [begin, end] = Chunk(count, world, peer);
      if (mine > 0) {
        ++expected_[peer];  // before posting: a post can throw
        out->send(peer, slot + 1, mine_begin * esize, mine * esize);
        ++sends;
      }
      if (end > begin) {
        ++expected_[peer];  // before posting: a post can throw
        out->recv(peer, slot + 1, begin * esize, (end - begin) * esize);
        ++recvs;
      }
    }
    Wait(*out, recvs, /*sends=*/false);
    Wait(*out, sends, /*sends=*/true);
  });
}

// Round s of the reduce-scatter: send chunk (me - s) to the right, receive
// chunk (me - s - 1) from the left and add it in; after W-1 rounds rank r
// holds the sum of chunk r + 1. Round s of the all-gather: pass on chunk
// (me + 1 - s), receive chunk (me - s) in place.
absl::Status GlooCommunicator::RingAllReduceSum(void* data, size_t count,
                                                DataType type) {
  const int world = size();
  const int me = rank();
  const size_t esize = ElementSize(type);
  const size_t largest = Chunk(count, world, 0).second;
  if (scratch_.size() < largest * esize) scratch_.resize(largest * esize);
  const int right = (me + 1) % world;
  const int left = (me + world - 1) % world;
  auto chunk = [&](int c) { return Chunk(count, world, (c + world) % world); };
  char* bytes = static_cast<char*>(data);
  auto out = context_->createUnboundBuffer(data, count * esize);
  auto in = context_->createUnboundBuffer(scratch_.data(), scratch_.size());
  const uint64_t slot = NextSlot();
  return Guarded("all-reduce", {out.get(), in.get()}, [&] {
    // One round: send [send) right, receive [recv) from the left into `to`
    // at `to_offset` elements.
    auto round = [&](uint64_t tag, std::pair<size_t, size_t> send,
                     std::pair<size_t, size_t> recv, UnboundBuffer& to,
                     size_t to_offset) {
      int sends = 0, recvs = 0;
      if (send.second > send.first) {
        ++expected_[right];  // before posting: a post can throw
        out->send(right, tag, send.first * esize,
                  (send.second - send.first) * esize);
        ++sends;
      }
      if (recv.second > recv.first) {
        ++expected_[left];  // before posting: a post can throw
        to.recv(left, tag, to_offset * esize,
                (recv.second - recv.first) * esize);
        ++recvs;
      }
      Wait(to, recvs, /*sends=*/false);
      Wait(*out, sends, /*sends=*/true);
    };
    for (int s = 0; s < world - 1; ++s) {
      const auto recv = chunk(me - s - 1);
      round(slot + s, chunk(me - s), recv, *in, 0);
      AddInto(bytes + recv.first * esize, scratch_.data(),
              recv.second - recv.first, type);
    }
    for (int s = 0; s < world - 1; ++s) {
      const auto recv = chunk(me - s);
      round(slot + world + s, chunk(me + 1 - s), recv, *out, recv.first);
    }
  });
}

absl::Status GlooCommunicator::Broadcast(void* data, size_t bytes, int root) {
  const int world = size();
  if (bytes == 0 || world == 1) return Guarded("broadcast", {}, [] {});
  auto buffer = context_->createUnboundBuffer(data, bytes);
  const uint64_t slot = NextSlot();
  return Guarded("broadcast", {buffer.get()}, [&] {
    if (rank() == root) {
      for (int peer = 0; peer < world; ++peer) {
        if (peer == root) continue;
        ++expected_[peer];  // before posting: a post can throw
        buffer->send(peer, slot, 0, bytes);
      }
      Wait(*buffer, world - 1, /*sends=*/true);
    } else {
      ++expected_[root];  // before posting: a post can throw
      buffer->recv(root, slot, 0, bytes);

      Wait(*buffer, 1, /*sends=*/false);
    }
  });
}

absl::Status GlooCommunicator::AllGather(const void* in, size_t bytes,
                                         void* out) {
  const int world = size();
  const int me = rank();
  if (bytes > 0) {
    std::memmove(static_cast<char*>(out) + me * bytes, in, bytes);
  }
  if (bytes == 0 || world == 1) return Guarded("all-gather", {}, [] {});
  auto buffer = context_->createUnboundBuffer(out, world * bytes);
  const uint64_t slot = NextSlot();
  return Guarded("all-gather", {buffer.get()}, [&] {
    for (int peer = 0; peer < world; ++peer) {
      if (peer == me) continue;
      expected_[peer] += 2;  // before posting: a post can throw
      buffer->send(peer, slot, me * bytes, bytes);
      buffer->recv(peer, slot, peer * bytes, bytes);
    }
    Wait(*buffer, world - 1, /*sends=*/false);
    Wait(*buffer, world - 1, /*sends=*/true);
  });
}

absl::Status GlooCommunicator::Barrier() {
  char token = 1;
  std::vector<char> tokens(size());
  return AllGather(&token, 1, tokens.data());
}

}  // namespace lockstep::worker
