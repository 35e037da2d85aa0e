// MeshCommunicator's collectives: Exchange over non-blocking sockets, and
// the algorithms of algorithms.h on it (mesh_communicator.h).
#include "worker/collective/mesh_communicator.h"

#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

namespace lockstep::worker {
namespace {

// Reads or writes per peer before the others get a turn.
constexpr int kBurst = 16;

// What one exchange tells of the link from a peer: the bytes that crossed
// it while this rank read, from the first read on. Bytes that were already
// queued in the socket then (the peer was early, or this rank late) arrived
// at an unknown time and do not count; neither does the time before the
// peer's first byte (its compute, not the link).
struct Arrival {
  absl::Time first = absl::InfinitePast();
  absl::Time last = absl::InfinitePast();
  int64_t bytes = 0;   // read from the first read on, queued ones included
  int64_t queued = 0;  // queued at the first read
};

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
  std::vector<Arrival> arrivals(size());  // for the link meter
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
    if (fds.size() == 1) {
      if (options_.links != nullptr) {
        for (int peer = 0; peer < size(); ++peer) {
          const Arrival& a = arrivals[peer];
          if (a.bytes <= a.queued) continue;
          options_.links->Record(peer, static_cast<size_t>(a.bytes - a.queued),
                                 absl::ToDoubleSeconds(a.last - a.first));
        }
      }
      return absl::OkStatus();
    }
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
          Arrival& a = arrivals[peer];
          if (a.first == absl::InfinitePast()) {
            int queued = 0;
            a.first = progress;
            a.queued = ioctl(p.fd, FIONREAD, &queued) == 0 ? n + queued : n;
          }
          a.last = progress;
          a.bytes += n;
          if (absl::Status s = p.in->Received(n); !s.ok()) {
            return PeerFailed(what, peer, s.message());
          }
        }
      }
      if ((revents & (POLLOUT | POLLERR | POLLHUP)) != 0 && !p.out->done() &&
          p.fd >= 0) {
        for (int burst = 0; burst < kBurst && !p.out->done(); ++burst) {
          absl::StatusOr<absl::Span<const char>> sealed = p.out->Pending();
          if (!sealed.ok())
            return PeerFailed(what, peer, sealed.status().message());
          const absl::Span<const char> pending = *sealed;
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
  if (algorithm_ == Algorithm::kRing) {
    return RingAllReduce(*this, scratch_, data, count, type);
  }
  return DirectAllReduce(*this, scratch_, data, count, type);
}

absl::Status MeshCommunicator::Broadcast(void* data, size_t bytes, int root) {
  return BroadcastBytes(*this, scratch_, data, bytes, root);
}

absl::Status MeshCommunicator::AllGather(const void* in, size_t bytes,
                                         void* out) {
  return AllGatherBytes(*this, scratch_, in, bytes, out);
}

absl::Status MeshCommunicator::Barrier() {
  char token = 1;
  std::vector<char> tokens(size());
  return AllGather(&token, 1, tokens.data());
}

}  // namespace lockstep::worker
