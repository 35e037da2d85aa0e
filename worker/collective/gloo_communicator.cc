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

absl::Status GlooCommunicator::Exchange(
    absl::string_view what, const std::vector<Transfer>& transfers) {
  const int world = size();
  std::vector<std::unique_ptr<UnboundBuffer>> sends(world), recvs(world);
  std::vector<UnboundBuffer*> buffers;
  for (int peer = 0; peer < world; ++peer) {
    const Transfer& t = transfers[peer];
    if (peer == rank()) continue;
    if (t.send_bytes > 0) {
      // Gloo's buffers are not const; a send only reads it.
      sends[peer] = context_->createUnboundBuffer(const_cast<void*>(t.send),
                                                  t.send_bytes);
      buffers.push_back(sends[peer].get());
    }
    if (t.recv_bytes > 0) {
      recvs[peer] = context_->createUnboundBuffer(t.recv, t.recv_bytes);
      buffers.push_back(recvs[peer].get());
    }
  }
  const uint64_t slot = NextSlot();
  return Guarded(what, buffers, [&] {
    for (int peer = 0; peer < world; ++peer) {
      if (recvs[peer] != nullptr) {
        ++expected_[peer];  // before posting: a post can throw
        recvs[peer]->recv(peer, slot, 0, transfers[peer].recv_bytes);
      }
      if (sends[peer] != nullptr) {
        ++expected_[peer];
        sends[peer]->send(peer, slot, 0, transfers[peer].send_bytes);
      }
    }
    for (int peer = 0; peer < world; ++peer) {
      if (recvs[peer] != nullptr) Wait(*recvs[peer], 1, /*sends=*/false);
    }
    for (int peer = 0; peer < world; ++peer) {
      if (sends[peer] != nullptr) Wait(*sends[peer], 1, /*sends=*/true);
    }
  });
}

absl::Status GlooCommunicator::AllReduceSum(void* data, size_t count,
                                            DataType type) {
  if (count == 0 || size() == 1) return Guarded("all-reduce", {}, [] {});
  if (algorithm_ == Algorithm::kRing) {
    return RingAllReduce(*this, scratch_, data, count, type);
  }
  return DirectAllReduce(*this, scratch_, data, count, type);
}

absl::Status GlooCommunicator::Broadcast(void* data, size_t bytes, int root) {
  return BroadcastBytes(*this, scratch_, data, bytes, root);
}

absl::Status GlooCommunicator::AllGather(const void* in, size_t bytes,
                                         void* out) {
  return AllGatherBytes(*this, scratch_, in, bytes, out);
}

absl::Status GlooCommunicator::Barrier() {
  char token = 1;
  std::vector<char> tokens(size());
  return AllGather(&token, 1, tokens.data());
}

}  // namespace lockstep::worker
