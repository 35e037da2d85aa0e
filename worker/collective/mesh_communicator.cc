// MeshCommunicator's collectives: Exchange over non-blocking sockets, and
// the direct and ring all-reduce, broadcast, all-gather and barrier on it
// (mesh_communicator.h).
#include "worker/collective/mesh_communicator.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "worker/collective/reduce.h"

namespace lockstep::worker {
namespace {

// Reads or writes per peer before the others get a turn.
constexpr int kBurst = 16;

}  // namespace

void MeshCommunicator::Abort() {
  absl::MutexLock lock(&mu_);
  aborted_ = true;
  if (connecting_ != nullptr) connecting_->Cancel();
  const uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));
}

absl::Status MeshCommunicator::Aborted(absl::string_view what) {
  return absl::AbortedError(
      absl::StrCat(what, " on rank ", rank(), " was aborted"));
}

absl::Status MeshCommunicator::PeerFailed(absl::string_view what, int peer,
                                          absl::string_view why) {
  Peer& p = peers_[peer];
  if (p.fd >= 0) {
    close(p.fd);
    p.fd = -1;
  }
  return absl::UnavailableError(absl::StrCat(
      what, " failed on rank ", rank(), " of ", size(), ": rank ", peer, " (",
      p.address, ") ", why,
      "; its data-plane connection is closed and the generation fails (a "
      "peer died or was cut off, or something on the network altered the "
      "traffic)"));
}

absl::Status MeshCommunicator::Exchange(
    absl::string_view what, const std::vector<Transfer>& transfers) {
  {
    absl::MutexLock lock(&mu_);
    if (aborted_) return Aborted(what);
  }
  for (int peer = 0; peer < size(); ++peer) {
    const Transfer& t = transfers[peer];
    if (peer == rank() || (t.send_bytes == 0 && t.recv_bytes == 0)) continue;
    Peer& p = peers_[peer];
    if (p.fd < 0) {
      return PeerFailed(what, peer, "lost its connection in an earlier call");
    }
    p.out->Start(static_cast<const char*>(t.send), t.send_bytes);
    p.in->Start(static_cast<char*>(t.recv), t.recv_bytes);
  }
  std::vector<pollfd> fds;
  std::vector<int> owners;
  absl::Time progress = absl::Now();
  while (true) {
    fds.assign(1, pollfd{wake_fd_, POLLIN, 0});
    owners.assign(1, -1);
    for (int peer = 0; peer < size(); ++peer) {
      Peer& p = peers_[peer];
      if (peer == rank() || p.fd < 0) continue;
      short events = 0;
      if (!p.in->done()) events |= POLLIN;
      if (!p.out->done()) events |= POLLOUT;
      if (events != 0) {
        fds.push_back({p.fd, events, 0});
        owners.push_back(peer);
      }
    }
    if (fds.size() == 1) return absl::OkStatus();
    const int64_t left =
        absl::ToInt64Milliseconds(progress + options_.timeout - absl::Now());
    const int ready =
        poll(fds.data(), fds.size(),
             static_cast<int>(std::clamp<int64_t>(left, 0, 1 << 30)));
    if (ready < 0 && errno != EINTR) {
      return absl::UnavailableError(
          absl::StrCat(what, " on rank ", rank(), ": poll: ", strerror(errno)));
    }
    if (fds[0].revents != 0) return Aborted(what);
    if (ready <= 0) {
      if (absl::Now() - progress < options_.timeout) continue;
      std::vector<int> waiting(owners.begin() + 1, owners.end());
      return absl::DeadlineExceededError(absl::StrCat(
          what, " on rank ", rank(), " of ", size(), " made no progress for ",
          absl::FormatDuration(options_.timeout), " with rank(s) ",
          absl::StrJoin(waiting, ", "),
          ": a peer hung, or the network between them stalls"));
    }
    for (size_t i = 1; i < fds.size(); ++i) {
      const short revents = fds[i].revents;
      if (revents == 0) continue;
      const int peer = owners[i];
      Peer& p = peers_[peer];
      if ((revents & (POLLIN | POLLERR | POLLHUP)) != 0 && !p.in->done()) {
        for (int burst = 0; burst < kBurst && !p.in->done(); ++burst) {
          absl::Span<char> want = p.in->Want();
          const ssize_t n = recv(p.fd, want.data(), want.size(), 0);
          if (n == 0) {
            return PeerFailed(what, peer,
                              "closed its connection in the middle of it");
          }
          if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) break;
            return PeerFailed(
                what, peer,
                absl::StrCat("broke its connection: ", strerror(errno)));
          }
          progress = absl::Now();
          if (absl::Status s = p.in->Received(n); !s.ok()) {
            return PeerFailed(what, peer, s.message());
          }
        }
      }
      if ((revents & (POLLOUT | POLLERR | POLLHUP)) != 0 && !p.out->done() &&
          p.fd >= 0) {
        for (int burst = 0; burst < kBurst && !p.out->done(); ++burst) {
          absl::Span<const char> pending = p.out->Pending();
          if (pending.empty()) break;
          const ssize_t n =
              send(p.fd, pending.data(), pending.size(), MSG_NOSIGNAL);
          if (n < 0) {
            if (errno == EINTR) continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK) break;
            return PeerFailed(
                what, peer,
                absl::StrCat("broke its connection: ", strerror(errno)));
          }
          progress = absl::Now();
          p.out->Advance(n);
        }
      }
    }
  }
}

absl::Status MeshCommunicator::AllReduceSum(void* data, size_t count,
                                            DataType type) {
  if (count == 0 || size() == 1) {
    absl::MutexLock lock(&mu_);
    return aborted_ ? Aborted("all-reduce") : absl::OkStatus();
  }
  if (options_.algorithm == Algorithm::kRing) {
    return RingAllReduceSum(data, count, type);
  }
  return DirectAllReduceSum(data, count, type);
}

// Reduce-scatter by direct exchange, then all-gather: rank c owns chunk c;
// every rank sends chunk c to its owner, which sums the W contributions in
// rank order and sends the result back to everyone (as GlooCommunicator).
absl::Status MeshCommunicator::DirectAllReduceSum(void* data, size_t count,
                                                  DataType type) {
  const int world = size();
  const int me = rank();
  const size_t esize = ElementSize(type);
  const size_t largest = Chunk(count, world, 0).second;
  const auto [mine_begin, mine_end] = Chunk(count, world, me);
  const size_t mine = mine_end - mine_begin;
  if (scratch_.size() < (world - 1) * largest * esize) {
    scratch_.resize((world - 1) * largest * esize);
  }
  char* bytes = static_cast<char*>(data);
  for (int peer = 0; peer < world; ++peer) {
    if (peer == me) continue;
    const auto [begin, end] = Chunk(count, world, peer);
    const int slot = peer < me ? peer : peer - 1;
    transfers_[peer] = {bytes + begin * esize, (end - begin) * esize,
                        scratch_.data() + slot * largest * esize, mine * esize};
  }
  RETURN_IF_ERROR(Exchange("all-reduce", transfers_));
  SumInRankOrder(data, scratch_.data(), mine_begin, mine, largest, type, me,
                 world, &accumulator_);
  for (int peer = 0; peer < world; ++peer) {
    if (peer == me) continue;
    const auto [begin, end] = Chunk(count, world, peer);
    transfers_[peer] = {bytes + mine_begin * esize, mine * esize,
                        bytes + begin * esize, (end - begin) * esize};
  }
  return Exchange("all-reduce", transfers_);
}

// Round s of the reduce-scatter: send chunk (me - s) to the right, receive
// chunk (me - s - 1) from the left and add it in; after W-1 rounds rank r
// holds the sum of chunk r + 1. Round s of the all-gather: pass on chunk
// (me + 1 - s), receive chunk (me - s) in place.
absl::Status MeshCommunicator::RingAllReduceSum(void* data, size_t count,
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
  auto round = [&](std::pair<size_t, size_t> send,
                   std::pair<size_t, size_t> recv, char* into) {
    for (Transfer& t : transfers_) t = Transfer{};
    transfers_[right].send = bytes + send.first * esize;
    transfers_[right].send_bytes = (send.second - send.first) * esize;
    transfers_[left].recv = into;
    transfers_[left].recv_bytes = (recv.second - recv.first) * esize;
    return Exchange("all-reduce", transfers_);
  };
  for (int s = 0; s < world - 1; ++s) {
    const auto recv = chunk(me - s - 1);
    RETURN_IF_ERROR(round(chunk(me - s), recv, scratch_.data()));
    AddInto(bytes + recv.first * esize, scratch_.data(),
            recv.second - recv.first, type);
  }
  for (int s = 0; s < world - 1; ++s) {
    const auto recv = chunk(me - s);
    RETURN_IF_ERROR(round(chunk(me + 1 - s), recv, bytes + recv.first * esize));
  }
  return absl::OkStatus();
}

absl::Status MeshCommunicator::Broadcast(void* data, size_t bytes, int root) {
  for (Transfer& t : transfers_) t = Transfer{};
  if (size() > 1 && bytes > 0) {
    for (int peer = 0; peer < size(); ++peer) {
      if (rank() == root) {
        transfers_[peer].send = data;
        transfers_[peer].send_bytes = bytes;
      } else if (peer == root) {
        transfers_[peer].recv = data;
        transfers_[peer].recv_bytes = bytes;
      }
    }
  }
  return Exchange("broadcast", transfers_);
}

absl::Status MeshCommunicator::AllGather(const void* in, size_t bytes,
                                         void* out) {
  char* all = static_cast<char*>(out);
  if (bytes > 0) std::memmove(all + rank() * bytes, in, bytes);
  for (int peer = 0; peer < size(); ++peer) {
    transfers_[peer] = bytes == 0 ? Transfer{}
                                  : Transfer{all + rank() * bytes, bytes,
                                             all + peer * bytes, bytes};
  }
  return Exchange("all-gather", transfers_);
}

absl::Status MeshCommunicator::Barrier() {
  char token = 1;
  std::vector<char> tokens(size());
  return AllGather(&token, 1, tokens.data());
}

}  // namespace lockstep::worker
