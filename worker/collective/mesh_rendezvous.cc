// MeshCommunicator's set-up: the listening socket, the rendezvous through
// the coordinator's key-value store, and the handshakes that let only the
// generation's members in (mesh_communicator.h, secure_channel.h).
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/failpoint.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "worker/collective/mesh_communicator.h"

namespace lockstep::worker {
namespace {

// Refusals logged per rendezvous one by one; the rest are counted.
constexpr int kRefusalsLogged = 8;
// The longest "host:port" a rank may publish.
constexpr size_t kMaxAddressSize = 300;

std::string Errno(int error) { return std::strerror(error); }

// "1.2.3.4:5" or "[::1]:5" for a socket address; the port in host order.
std::string FormatAddress(const sockaddr_storage& address) {
  char host[INET6_ADDRSTRLEN] = "?";
  if (address.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&address);
    inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
    return absl::StrCat(host, ":", ntohs(in->sin_port));
  }
  if (address.ss_family == AF_INET6) {
    const auto* in = reinterpret_cast<const sockaddr_in6*>(&address);
    inet_ntop(AF_INET6, &in->sin6_addr, host, sizeof(host));
    return absl::StrCat("[", host, "]:", ntohs(in->sin6_port));
  }
  return "an address of an unknown family";
}

std::string PeerAddress(int fd) {
  sockaddr_storage address{};
  socklen_t size = sizeof(address);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&address), &size) != 0) {
    return "an unknown address";
  }
  return FormatAddress(address);
}

void SetNonBlocking(int fd) {
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
}

void SetNoDelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// Splits a published "host:port" (untrusted: bounded, port checked).
absl::StatusOr<std::pair<std::string, std::string>> SplitAddress(
    absl::string_view address) {
  const size_t colon = address.rfind(':');
  int port = 0;
  if (address.empty() || address.size() > kMaxAddressSize ||
      colon == absl::string_view::npos || colon == 0 ||
      !absl::SimpleAtoi(address.substr(colon + 1), &port) || port < 1 ||
      port > 65535) {
    return absl::DataLossError("not a host:port");
  }
  std::string host(address.substr(0, colon));
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return std::make_pair(host, std::string(address.substr(colon + 1)));
}

int64_t MillisecondsUntil(absl::Time deadline) {
  return std::max<int64_t>(0,
                           absl::ToInt64Milliseconds(deadline - absl::Now() +
                                                     absl::Microseconds(999)));
}

}  // namespace

// An accepted connection: the Hello is read, then (once answered) the
// Confirm.
struct MeshCommunicator::Pending {
  int fd = -1;
  std::string address;
  absl::Time deadline;
  std::string buffer;  // what arrived of the current message
  bool replied = false;
  Hello hello;
  std::string reply;
};

MeshCommunicator::MeshCommunicator(Options options)
    : options_(std::move(options)) {}

MeshCommunicator::~MeshCommunicator() {
  for (Peer& peer : peers_) {
    if (peer.fd >= 0) close(peer.fd);
  }
  if (listen_fd_ >= 0) close(listen_fd_);
  if (wake_fd_ >= 0) close(wake_fd_);
  if (halt_fd_ >= 0) close(halt_fd_);
}

absl::StatusOr<std::unique_ptr<MeshCommunicator>> MeshCommunicator::Create(
    const Options& options) {
  std::unique_ptr<MeshCommunicator> comm(new MeshCommunicator(options));
  comm->peers_.resize(std::max(options.size, 1));
  if (options.links != nullptr) options.links->Reset(options.size);
  comm->wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  comm->halt_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (comm->wake_fd_ < 0 || comm->halt_fd_ < 0) {
    return absl::UnavailableError(absl::StrCat(
        "rank ", options.rank, ": eventfd failed: ", Errno(errno)));
  }
  auto failed = [&](absl::string_view what) {
    return absl::UnavailableError(absl::StrCat(
        "rank ", options.rank, " of ", options.size,
        " cannot listen for its data-plane peers on ", options.host, ": ", what,
        "; check --host (the address peers reach this worker on)"));
  };
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  if (int error = getaddrinfo(options.host.c_str(), "0", &hints, &found);
      error != 0) {
    return failed(gai_strerror(error));
  }
  std::string why = "no address";
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
                    a->ai_protocol);
    if (fd < 0) {
      why = Errno(errno);
      continue;
    }
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, 128) != 0) {
      why = Errno(errno);
      close(fd);
      continue;
    }
    comm->listen_fd_ = fd;
    break;
  }
  freeaddrinfo(found);
  if (comm->listen_fd_ < 0) return failed(why);
  sockaddr_storage bound{};
  socklen_t size = sizeof(bound);
  getsockname(comm->listen_fd_, reinterpret_cast<sockaddr*>(&bound), &size);
  const int port =
      ntohs(bound.ss_family == AF_INET6
                ? reinterpret_cast<sockaddr_in6*>(&bound)->sin6_port
                : reinterpret_cast<sockaddr_in*>(&bound)->sin_port);
  comm->listen_address_ = options.host.find(':') != std::string::npos
                              ? absl::StrCat("[", options.host, "]:", port)
                              : absl::StrCat(options.host, ":", port);
  return comm;
}

absl::StatusOr<std::unique_ptr<MeshCommunicator>> MeshCommunicator::Connect(
    KeyValueClient* kv, const Options& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<MeshCommunicator> comm, Create(options));
  RETURN_IF_ERROR(comm->Connect(kv));
  return comm;
}

absl::Status MeshCommunicator::Connect(KeyValueClient* kv) {
  {
    absl::MutexLock lock(&mu_);
    if (aborted_) return Aborted("the data-plane rendezvous");
    connecting_ = kv;
  }
  if (!options_.encrypted && options_.rank == 0) {
    LogWarning("rank 0 of job ", options_.membership.job_id, " generation ",
               options_.membership.generation,
               ": the data plane is NOT ENCRYPTED (--data-plane-encryption "
               "off): gradients and model state cross the network in clear "
               "text; use this only where nobody can read the traffic");
  }
  const absl::Time deadline = absl::Now() + options_.timeout;
  absl::Status status = kv->Set(absl::StrCat(rank()), listen_address_);
  if (status.ok() && FailPointHit("data_plane_hold_rendezvous")) {
    FailPointWait(
        "data_plane_hold_rendezvous",
        absl::StrCat("rank ", rank(), " of ", size(),
                     " published its data-plane address (rank ", rank(), " at ",
                     listen_address_, ") and holds before connecting"),
        options_.timeout);
  }
  // The higher ranks are accepted while this rank connects to the lower
  // ones, so its listen queue is drained from the start: a stranger's
  // connects cannot fill it while this rank waits for a peer of its own.
  absl::Status accepted;
  if (status.ok()) {
    std::thread acceptor([&] {
      accepted = AcceptPeers(deadline);
      if (!accepted.ok()) Halt();
    });
    for (int peer = 0; status.ok() && peer < rank(); ++peer) {
      status = ConnectTo(kv, peer, deadline);
    }
    if (!status.ok()) Halt();
    acceptor.join();
    // The first failure is the one to report; a side that only stopped
    // because the other failed says Cancelled.
    if (status.ok() || (absl::IsCancelled(status) && !accepted.ok())) {
      status = accepted;
    }
  }
  {
    absl::MutexLock lock(&mu_);
    connecting_ = nullptr;
  }
  close(listen_fd_);
  listen_fd_ = -1;
  if (const int refused = refused_.load(); refused > kRefusalsLogged) {
    LogWarning("rank ", rank(), " refused ", refused - kRefusalsLogged,
               " more data-plane connection(s) in this rendezvous");
  }
  {
    absl::MutexLock lock(&mu_);
    if (aborted_) return Aborted("the data-plane rendezvous");
  }
  RETURN_IF_ERROR(status);
  // A rank's connections can all be up before its peers' are; closing
  // early (a short task, an abort) would break theirs. Leave together.
  return Barrier();
}

absl::Status MeshCommunicator::ConnectTo(KeyValueClient* kv, int peer,
                                         absl::Time deadline) {
  auto published = kv->Get(absl::StrCat(peer), std::max(deadline - absl::Now(),
                                                        absl::ZeroDuration()));
  if (!published.ok()) {
    if (absl::IsDeadlineExceeded(published.status())) {
      return absl::DeadlineExceededError(absl::StrCat(
          "rank ", rank(), " of ", size(), " waited ",
          absl::FormatDuration(options_.timeout), " for rank ", peer,
          " to publish its data-plane address: rank ", peer,
          " did not join the generation (see lockstep workers and its log)"));
    }
    return published.status();
  }
  auto split = SplitAddress(*published);
  if (!split.ok()) {
    return absl::DataLossError(absl::StrCat(
        "rank ", peer, " published a data-plane address rank ", rank(),
        " cannot read (", published->size(),
        " bytes, not host:port): it runs another lockstep release"));
  }
  const std::string& address = *published;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (int error = getaddrinfo(split->first.c_str(), split->second.c_str(),
                              &hints, &found);
      error != 0) {
    return absl::UnavailableError(absl::StrCat(
        "rank ", rank(), " cannot resolve rank ", peer,
        "'s data-plane address ", address, ": ", gai_strerror(error)));
  }
  std::unique_ptr<addrinfo, void (*)(addrinfo*)> cleanup(found, freeaddrinfo);
  // A handshake that fails is retried whole, on a new connection, until the
  // deadline: the peer's listener may have closed it unfinished (a flood of
  // strangers), or something else answered first.
  for (int attempt = 1;; ++attempt) {
    absl::Status status = HandshakeWith(peer, address, found, deadline);
    if (status.ok() || absl::IsAborted(status) || absl::IsCancelled(status) ||
        absl::IsInternal(status) || absl::IsDeadlineExceeded(status) ||
        absl::Now() >= deadline) {
      return status;
    }
    if (attempt == 1) {
      LogWarning(status.message(),
                 "; retrying the handshake until the rendezvous deadline");
    }
    absl::Status waited = WaitFor(
        -1, 0, std::min(deadline, absl::Now() + absl::Milliseconds(50)));
    if (absl::IsAborted(waited) || absl::IsCancelled(waited)) return waited;
  }
}

absl::Status MeshCommunicator::HandshakeWith(int peer,
                                             const std::string& address,
                                             const addrinfo* found,
                                             absl::Time deadline) {
  // The peer listens before it publishes, so a refusal means it is gone,
  // or the network is not there yet (a pod's first seconds): retry until
  // the deadline.
  std::string why;
  int fd = -1;
  while (fd < 0) {
    fd = socket(found->ai_family,
                found->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK,
                found->ai_protocol);
    if (fd < 0) return absl::UnavailableError(Errno(errno));
    int error = 0;
    if (connect(fd, found->ai_addr, found->ai_addrlen) != 0) {
      error = errno;
      if (error == EINPROGRESS) {
        if (absl::Status waited = WaitFor(fd, POLLOUT, deadline);
            !waited.ok()) {
          close(fd);
          if (absl::IsAborted(waited) || absl::IsCancelled(waited)) {
            return waited;
          }
          return absl::DeadlineExceededError(absl::StrCat(
              "rank ", rank(), " of ", size(), " waited ",
              absl::FormatDuration(options_.timeout), " to connect to rank ",
              peer, " at its data-plane address ", address,
              ": the peer's host does not answer (check the NetworkPolicy "
              "and --host)"));
        }
        socklen_t size = sizeof(error);
        getsockopt(fd, SOL_SOCKET, SO_ERROR, &error, &size);
      }
    }
    if (error == 0) break;
    close(fd);
    fd = -1;
    why = Errno(error);
    if (absl::Now() >= deadline) {
      return absl::UnavailableError(absl::StrCat(
          "rank ", rank(), " of ", size(), " cannot connect to rank ", peer,
          " at its data-plane address ", address, ": ", why,
          "; the peer died, or a firewall or NetworkPolicy blocks the "
          "workers' data-plane ports"));
    }
    absl::Status waited = WaitFor(
        -1, 0, std::min(deadline, absl::Now() + absl::Milliseconds(100)));
    if (absl::IsAborted(waited) || absl::IsCancelled(waited)) return waited;
  }
  auto fail = [&](absl::Status status) {
    close(fd);
    if (absl::IsAborted(status) || absl::IsCancelled(status) ||
        absl::IsInternal(status)) {
      return status;
    }
    return absl::UnavailableError(absl::StrCat(
        "rank ", rank(), " of ", size(), ": the handshake with rank ", peer,
        " at ", address, " failed: ", status.message(),
        absl::IsPermissionDenied(status)
            ? "; whatever listens there is not rank " + absl::StrCat(peer) +
                  " of this generation"
            : ""));
  };
  absl::StatusOr<Hello> made =
      MakeHello(options_.membership, rank(), peer, options_.encrypted);
  if (!made.ok()) return fail(made.status());
  const Hello& hello = *made;
  if (absl::Status s = WriteAll(fd, hello.bytes.data(), kHelloSize, deadline);
      !s.ok()) {
    return fail(s);
  }
  std::string reply(kReplySize, '\0');
  if (absl::Status s = ReadAll(fd, reply.data(), kReplySize, deadline);
      !s.ok()) {
    return fail(s);
  }
  if (absl::Status s = CheckReply(options_.membership, hello, reply); !s.ok()) {
    return fail(s);
  }
  absl::StatusOr<std::string> confirm =
      MakeConfirm(options_.membership, hello, reply);
  if (!confirm.ok()) return fail(confirm.status());
  if (absl::Status s = WriteAll(fd, confirm->data(), kConfirmSize, deadline);
      !s.ok()) {
    return fail(s);
  }
  if (absl::Status s = AddPeer(peer, fd, PeerAddress(fd), hello, reply);
      !s.ok()) {
    return fail(s);
  }
  return absl::OkStatus();
}

absl::Status MeshCommunicator::AcceptPeers(absl::Time deadline) {
  int missing = size() - 1 - rank();
  std::deque<Pending> pending;
  auto drop = [&](std::deque<Pending>::iterator it, absl::string_view why) {
    Refuse(it->address, why);
    close(it->fd);
    return pending.erase(it);
  };
  absl::Status status;
  while (missing > 0 && status.ok()) {
    std::vector<pollfd> fds = {
        {wake_fd_, POLLIN, 0}, {halt_fd_, POLLIN, 0}, {listen_fd_, POLLIN, 0}};
    absl::Time wake = deadline;
    for (const Pending& p : pending) {
      fds.push_back({p.fd, POLLIN, 0});
      wake = std::min(wake, p.deadline);
    }
    const int ready = poll(
        fds.data(), fds.size(),
        static_cast<int>(std::min<int64_t>(MillisecondsUntil(wake), 1 << 30)));
    if (ready < 0 && errno != EINTR) {
      status = absl::UnavailableError(absl::StrCat("poll: ", Errno(errno)));
      break;
    }
    if (fds[0].revents != 0) {
      status = Aborted("the data-plane rendezvous");
      break;
    }
    if (fds[1].revents != 0) {
      status = Halted();
      break;
    }
    // Handshakes first: fds[3 + i] is pending[i] as it was at the poll.
    size_t index = 3;
    for (auto it = pending.begin(); it != pending.end(); ++index) {
      if (fds[index].revents == 0) {
        if (absl::Now() >= it->deadline) {
          it = drop(it, absl::StrCat(
                            "no handshake within ",
                            absl::FormatDuration(options_.handshake_timeout)));
        } else {
          ++it;
        }
        continue;
      }
      absl::StatusOr<bool> finished = Advance(*it);
      if (!finished.ok()) {
        status = finished.status();
        break;
      }
      if (!*finished) {
        ++it;
      } else {
        if (it->fd >= 0) {
          close(it->fd);  // refused by Advance
        } else {
          --missing;  // promoted to a peer
        }
        it = pending.erase(it);
      }
    }
    if (!status.ok()) break;
    // Every connection the kernel queued: a queue left to fill would drop
    // the real peer's connect.
    while (fds[2].revents != 0) {
      sockaddr_storage from{};
      socklen_t size = sizeof(from);
      const int fd = accept4(listen_fd_, reinterpret_cast<sockaddr*>(&from),
                             &size, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) break;  // EAGAIN: drained (or a connection already gone)
      if (pending.size() >= kMaxPendingHandshakes) {
        // The oldest that has not proved anything yet goes; a handshake
        // that passed the Hello's MAC is never closed for a newcomer (the
        // newcomer is, when all of them have).
        auto oldest = std::find_if(pending.begin(), pending.end(),
                                   [](const Pending& p) { return !p.replied; });
        if (oldest == pending.end()) {
          Refuse(FormatAddress(from),
                 "too many authenticated handshakes under way");
          close(fd);
          continue;
        }
        drop(oldest, "too many unfinished handshakes at once");
      }
      Pending p;
      p.fd = fd;
      p.address = FormatAddress(from);
      p.deadline = absl::Now() + options_.handshake_timeout;
      pending.push_back(std::move(p));
    }
    if (missing > 0 && absl::Now() >= deadline) {
      std::vector<int> absent;
      for (int r = rank() + 1; r < size(); ++r) {
        if (peers_[r].fd < 0) absent.push_back(r);
      }
      status = absl::DeadlineExceededError(absl::StrCat(
          "rank ", rank(), " of ", size(), " waited ",
          absl::FormatDuration(options_.timeout), " for rank(s) ",
          absl::StrJoin(absent, ", "), " to connect to its data plane at ",
          listen_address_,
          ": they did not join, or cannot reach this address (check --host "
          "and the NetworkPolicy)"));
    }
  }
  for (Pending& p : pending) close(p.fd);
  return status;
}

absl::StatusOr<bool> MeshCommunicator::Advance(Pending& p) {
  const size_t want = p.replied ? kConfirmSize : kHelloSize;
  char bytes[kHelloSize];
  const ssize_t n = recv(p.fd, bytes, want - p.buffer.size(), 0);
  if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
    return false;
  }
  if (n <= 0) {
    Refuse(p.address,
           n == 0 ? "it closed the connection mid-handshake" : Errno(errno));
    return true;
  }
  p.buffer.append(bytes, n);
  if (!p.replied && !CouldBeHello(p.buffer)) {
    Refuse(p.address, "it does not speak lockstep's data-plane protocol");
    return true;
  }
  if (p.buffer.size() < want) return false;
  if (!p.replied) {
    auto hello = CheckHello(options_.membership, rank(), size(), p.buffer);
    if (absl::IsInternal(hello.status())) return hello.status();
    if (!hello.ok()) {
      Refuse(p.address, hello.status().message());
      return true;
    }
    if (!hello_nonces_.insert(hello->nonce).second) {
      Refuse(p.address,
             absl::StrCat("it sent rank ", hello->from,
                          "'s Hello again (a nonce already seen): a replay"));
      return true;
    }
    if (hello->from < rank()) {
      Refuse(p.address,
             absl::StrCat("rank ", hello->from, " should be called, not call"));
      return true;
    }
    if (peers_[hello->from].fd >= 0) {
      Refuse(p.address,
             absl::StrCat("rank ", hello->from, " is already connected"));
      return true;
    }
    if (hello->encrypted != options_.encrypted) {
      return absl::FailedPreconditionError(
          absl::StrCat("rank ", hello->from, " (", p.address,
                       ") runs with "
                       "--data-plane-encryption ",
                       hello->encrypted ? "on" : "off", ", rank ", rank(),
                       " with ", options_.encrypted ? "on" : "off",
                       ": every worker of a job must use the same setting"));
    }
    p.hello = *std::move(hello);
    absl::StatusOr<std::string> reply = MakeReply(options_.membership, p.hello);
    if (!reply.ok()) return reply.status();
    p.reply = *std::move(reply);
    // 64 bytes into a fresh connection's empty send buffer: all or error.
    if (send(p.fd, p.reply.data(), kReplySize, MSG_NOSIGNAL | MSG_DONTWAIT) !=
        static_cast<ssize_t>(kReplySize)) {
      Refuse(p.address, "it did not take the handshake's reply");
      return true;
    }
    p.replied = true;
    p.buffer.clear();
    return false;
  }
  if (absl::Status s =
          CheckConfirm(options_.membership, p.hello, p.reply, p.buffer);
      !s.ok()) {
    if (absl::IsInternal(s)) return s;
    Refuse(p.address, s.message());
    return true;
  }
  // Two connections may both pass the Hello (a member's and a replay of
  // it); the first to confirm is the peer.
  if (peers_[p.hello.from].fd >= 0) {
    Refuse(p.address,
           absl::StrCat("rank ", p.hello.from, " is already connected"));
    return true;
  }
  RETURN_IF_ERROR(AddPeer(p.hello.from, p.fd, p.address, p.hello, p.reply));
  p.fd = -1;
  return true;
}

void MeshCommunicator::Refuse(const std::string& address,
                              absl::string_view why) {
  const int count = ++refused_;
  if (count <= kRefusalsLogged) {
    LogWarning(
        "rank ", rank(), " of job ", options_.membership.job_id, " generation ",
        options_.membership.generation,
        " refused a data-plane connection from ", address, ": ", why,
        count == kRefusalsLogged ? " (further refusals are counted)" : "");
  }
}

absl::Status MeshCommunicator::AddPeer(int peer, int fd, std::string address,
                                       const Hello& hello,
                                       const std::string& reply) {
  std::string out_key, in_key;
  if (options_.encrypted) {
    ASSIGN_OR_RETURN(out_key,
                     FrameKey(options_.membership, hello, reply, rank(), peer));
    ASSIGN_OR_RETURN(in_key,
                     FrameKey(options_.membership, hello, reply, peer, rank()));
  }
  SetNonBlocking(fd);
  SetNoDelay(fd);
  Peer& p = peers_[peer];
  p.fd = fd;
  p.address = std::move(address);
  p.out = std::make_unique<FrameSealer>(out_key);
  p.in = std::make_unique<FrameOpener>(in_key);
  return absl::OkStatus();
}

void MeshCommunicator::Halt() {
  const uint64_t one = 1;
  (void)!write(halt_fd_, &one, sizeof(one));
}

absl::Status MeshCommunicator::Halted() const {
  return absl::CancelledError(
      absl::StrCat("rank ", rank(),
                   " stopped its data-plane rendezvous: its other half "
                   "failed"));
}

absl::Status MeshCommunicator::WaitFor(int fd, short events,
                                       absl::Time deadline) {
  while (true) {
    pollfd fds[3] = {
        {wake_fd_, POLLIN, 0}, {halt_fd_, POLLIN, 0}, {fd, events, 0}};
    const int n = fd < 0 ? 2 : 3;
    const int ready = poll(fds, n,
                           static_cast<int>(std::min<int64_t>(
                               MillisecondsUntil(deadline), 1 << 30)));
    if (ready < 0 && errno == EINTR) continue;
    if (ready < 0) return absl::UnavailableError(Errno(errno));
    if (fds[0].revents != 0) return Aborted("the data-plane rendezvous");
    if (fds[1].revents != 0) return Halted();
    if (n == 3 && fds[2].revents != 0) return absl::OkStatus();
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError("no answer in time");
    }
  }
}

absl::Status MeshCommunicator::ReadAll(int fd, char* data, size_t bytes,
                                       absl::Time deadline) {
  size_t done = 0;
  while (done < bytes) {
    RETURN_IF_ERROR(WaitFor(fd, POLLIN, deadline));
    const ssize_t n = recv(fd, data + done, bytes - done, 0);
    if (n == 0) return absl::UnavailableError("it closed the connection");
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
      return absl::UnavailableError(Errno(errno));
    }
    done += n;
  }
  return absl::OkStatus();
}

absl::Status MeshCommunicator::WriteAll(int fd, const char* data, size_t bytes,
                                        absl::Time deadline) {
  size_t done = 0;
  while (done < bytes) {
    RETURN_IF_ERROR(WaitFor(fd, POLLOUT, deadline));
    const ssize_t n = send(fd, data + done, bytes - done, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) continue;
      return absl::UnavailableError(Errno(errno));
    }
    done += n;
  }
  return absl::OkStatus();
}

}  // namespace lockstep::worker
