// GlooCommunicator's membership check: the proofs each pair exchanges over
// its own connection before any collective, and the addresses that name a
// process that connected without being a member (gloo_communicator.h).
//
// Why the listening side may use a short deadline: Gloo's rule makes one
// side of each pair listen and the other connect to the address the
// listener published. The connecting side sends its proof the moment its
// connect returns, before it moves on to its other peers, so a member's
// proof reaches the listener within a round trip of the connection being
// accepted, however long the rest of the rendezvous takes. The listener
// answers only after checking it. The connecting side reached the address
// the coordinator's store gave it, so it waits for the answer as long as
// the rendezvous may take: the listener may still be busy with other peers.
#include <arpa/inet.h>
#include <dirent.h>
#include <gloo/transport/context.h>
#include <gloo/transport/pair.h>
#include <gloo/transport/tcp/address.h>
#include <gloo/transport/unbound_buffer.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <exception>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/failpoint.h"
#include "common/status_macros.h"
#include "worker/collective/gloo_communicator.h"

namespace lockstep::worker {
namespace {

// The tag of the proofs: apart from the collectives' (0x40 << 56 | ...).
constexpr uint64_t kProofSlot = uint64_t{0x41} << 56;

// Whether two socket addresses are the same IPv4 or IPv6 address and port.
bool SameEndpoint(const sockaddr_storage& a, const sockaddr_storage& b) {
  if (a.ss_family != b.ss_family) return false;
  if (a.ss_family == AF_INET) {
    const auto* x = reinterpret_cast<const sockaddr_in*>(&a);
    const auto* y = reinterpret_cast<const sockaddr_in*>(&b);
    return x->sin_port == y->sin_port &&
           std::memcmp(&x->sin_addr, &y->sin_addr, sizeof(in_addr)) == 0;
  }
  if (a.ss_family == AF_INET6) {
    const auto* x = reinterpret_cast<const sockaddr_in6*>(&a);
    const auto* y = reinterpret_cast<const sockaddr_in6*>(&b);
    return x->sin6_port == y->sin6_port &&
           std::memcmp(&x->sin6_addr, &y->sin6_addr, sizeof(in6_addr)) == 0;
  }
  return false;
}

// "10.0.0.7:41234" or "[fe80::1]:41234"; "" for another family.
std::string FormatEndpoint(const sockaddr_storage& ss) {
  char host[INET6_ADDRSTRLEN] = {};
  if (ss.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
    return absl::StrCat(host, ":", ntohs(in->sin_port));
  }
  if (ss.ss_family == AF_INET6) {
    const auto* in = reinterpret_cast<const sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &in->sin6_addr, host, sizeof(host));
    return absl::StrCat("[", host, "]:", ntohs(in->sin6_port));
  }
  return "";
}

// The remote end of this process's connected TCP socket whose local end is
// `local`, or "" if there is none. Gloo keeps a pair's socket and its
// peer's address private, but a connected pair's public address() is its
// socket's local end, and no other socket of the process has that local
// end (a listener accepts one connection, then closes). So the socket is
// found among the process's descriptors, which are only read
// (getsockname, getpeername), never changed.
std::string RemoteOfLocalEndpoint(const sockaddr_storage& local) {
  DIR* fds = opendir("/proc/self/fd");
  if (fds == nullptr) return "";
  std::string remote;
  while (const dirent* entry = readdir(fds)) {
    int fd = -1;
    struct stat st {};
    if (!absl::SimpleAtoi(entry->d_name, &fd) || fd == dirfd(fds) ||
        fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) {
      continue;
    }
    sockaddr_storage mine{}, theirs{};
    socklen_t mine_size = sizeof(mine), theirs_size = sizeof(theirs);
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&mine), &mine_size) != 0 ||
        !SameEndpoint(mine, local) ||
        getpeername(fd, reinterpret_cast<sockaddr*>(&theirs), &theirs_size) !=
            0) {
      continue;
    }
    remote = FormatEndpoint(theirs);
    break;
  }
  closedir(fds);
  return remote;
}

}  // namespace

std::string GlooCommunicator::RemoteAddress(int peer) const {
  const gloo::transport::tcp::Address local(
      transport_->getPair(peer)->address().bytes());
  std::string remote = RemoteOfLocalEndpoint(local.getSockaddr());
  return remote.empty() ? "an address this rank could not read" : remote;
}

void GlooCommunicator::HoldForTest() {
  std::string ports;
  for (int peer = 0; peer < size(); ++peer) {
    if (peer == rank()) continue;
    const gloo::transport::tcp::Address self(
        transport_->getPair(peer)->address().bytes());
    absl::StrAppend(&ports, ports.empty() ? "" : ", ", "rank ", peer, " at ",
                    FormatEndpoint(self.getSockaddr()));
  }
  FailPointWait("gloo_hold_rendezvous",
                absl::StrCat("rank ", rank(), " of ", size(),
                             " published its Gloo ports (", ports,
                             ") and holds before connecting"),
                options_.timeout);
}

absl::Status GlooCommunicator::ConnectFailed(int peer, bool listening,
                                             absl::string_view what) {
  const std::string& at = proofs_[peer].remote;
  report_later_ = !listening;
  if (listening) {
    return absl::UnavailableError(absl::StrCat(
        "rank ", rank(), " of ", size(), " on ", options_.host,
        ": the Gloo connection to its port for rank ", peer,
        " failed before it proved membership: ", what,
        ". If that address is not rank ", peer,
        "'s, a process that is not a member of generation ",
        options_.membership.generation,
        " connected to this rank's Gloo port; the generation fails and is "
        "retried"));
  }
  return absl::UnavailableError(absl::StrCat(
      "rank ", rank(), " of ", size(), " could not connect to rank ", peer,
      "'s Gloo port ", at, ": ", what, ". If rank ", peer,
      " is alive, a process that is not a member of generation ",
      options_.membership.generation,
      " may have connected to that port first (rank ", peer,
      "'s log names it); the generation fails and is retried"));
}

absl::Status GlooCommunicator::ProofFailed(int peer, absl::string_view what) {
  const Proof& proof = proofs_[peer];
  report_later_ = !proof.listening;
  if (proof.listening) {
    return absl::UnavailableError(absl::StrCat(
        "rank ", rank(), " of ", size(), " on ", options_.host,
        ": the process at ", proof.remote,
        " that connected to this rank's Gloo port for rank ", peer,
        " sent no membership proof within ",
        absl::FormatDuration(options_.proof_timeout), " (", what,
        "): a process that is not a member of generation ",
        options_.membership.generation, " of job ", options_.membership.job_id,
        " connected to this rank's Gloo port; the generation fails and is "
        "retried (see docs/DESIGN.md, Data-plane membership)"));
  }
  return absl::UnavailableError(absl::StrCat(
      "rank ", rank(), " of ", size(), " got no membership proof from rank ",
      peer, " at ", proof.remote, ": ", what, "; rank ", peer,
      " died, hung, or found a process that is not a member on its port"));
}

absl::Status GlooCommunicator::StartProof(int peer, bool listening) {
  Proof& proof = proofs_[peer];
  proof.listening = listening;
  // The listener's connection may have come from anyone: note who, while
  // its socket is open (a failed wait closes it).
  if (listening) proof.remote = RemoteAddress(peer);
  ASSIGN_OR_RETURN(proof.mine,
                   MembershipProof(options_.membership, rank(), peer));
  proof.theirs.assign(kProofSize, '\0');
  proof.send = transport_->createUnboundBuffer(proof.mine.data(), kProofSize);
  proof.recv = transport_->createUnboundBuffer(proof.theirs.data(), kProofSize);
  {
    absl::MutexLock lock(&mu_);
    if (aborted_) return absl::AbortedError("the communicator was aborted");
    active_.push_back(proof.send.get());
    active_.push_back(proof.recv.get());
  }
  try {
    proof.recv->recv(peer, kProofSlot, 0, kProofSize);
    if (!listening) {
      proof.send->send(peer, kProofSlot, 0, kProofSize);
      return absl::OkStatus();
    }
    if (!proof.recv->waitRecv(
            nullptr, absl::ToChronoMilliseconds(options_.proof_timeout))) {
      return absl::AbortedError("the communicator was aborted");
    }
  } catch (const std::exception& e) {
    return ProofFailed(peer, e.what());
  }
  if (!ProofMatches(options_.membership, peer, rank(), proof.theirs)) {
    return absl::UnavailableError(absl::StrCat(
        "rank ", rank(), " of ", size(), " on ", options_.host,
        ": the process at ", proof.remote,
        " that connected to this rank's Gloo port for rank ", peer,
        " sent a wrong membership proof: a process that is not a member of "
        "generation ",
        options_.membership.generation, " of job ", options_.membership.job_id,
        " connected to this rank's Gloo port; the generation fails and is "
        "retried (see docs/DESIGN.md, Data-plane membership)"));
  }
  try {
    proof.send->send(peer, kProofSlot, 0, kProofSize);
  } catch (const std::exception& e) {
    return ProofFailed(peer, e.what());
  }
  return absl::OkStatus();
}

absl::Status GlooCommunicator::FinishProofs() {
  const auto timeout = absl::ToChronoMilliseconds(options_.timeout);
  for (int peer = 0; peer < size(); ++peer) {
    if (peer == rank()) continue;
    Proof& proof = proofs_[peer];
    try {
      if ((!proof.listening && !proof.recv->waitRecv(nullptr, timeout)) ||
          !proof.send->waitSend(nullptr, timeout)) {
        return absl::AbortedError("the communicator was aborted");
      }
    } catch (const std::exception& e) {
      return ProofFailed(peer, e.what());
    }
    if (!proof.listening &&
        !ProofMatches(options_.membership, peer, rank(), proof.theirs)) {
      return absl::UnavailableError(absl::StrCat(
          "rank ", rank(), " of ", size(), ": the process listening on rank ",
          peer, "'s Gloo port ", proof.remote,
          " answered with a wrong membership proof: it is not a member of "
          "generation ",
          options_.membership.generation, " of job ",
          options_.membership.job_id, " (it took rank ", peer,
          "'s port); the generation fails and is retried"));
    }
  }
  absl::MutexLock lock(&mu_);
  active_.clear();
  return absl::OkStatus();
}

}  // namespace lockstep::worker
