// Membership proofs: OpenSSL's HMAC-SHA256 over the length-prefixed fields
// (membership.h).
#include "worker/collective/membership.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <algorithm>
#include <atomic>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace lockstep::worker {
namespace {

// Separates these proofs from any other use of the secret.
constexpr absl::string_view kLabel = "lockstep data-plane membership v1";

std::atomic<bool> crypto_fails{false};

}  // namespace

void SetCryptoFailsForTesting(bool fails) { crypto_fails = fails; }
bool CryptoFailsForTesting() { return crypto_fails; }

absl::StatusOr<std::string> Hmac(absl::string_view key,
                                 absl::Span<const absl::string_view> fields) {
  std::string message;
  for (absl::string_view field : fields) {
    const uint64_t size = field.size();
    for (int i = 0; i < 8; ++i) {
      message.push_back(static_cast<char>((size >> (8 * i)) & 0xff));
    }
    message.append(field.data(), field.size());
  }
  std::string mac(kProofSize, '\0');
  unsigned int size = 0;
  // A zero-length key (tests without a coordinator) needs a non-null
  // pointer; absl::string_view's data() may be null.
  static const unsigned char kNoKey = 0;
  const unsigned char* done =
      CryptoFailsForTesting()
          ? nullptr
          : HMAC(EVP_sha256(),
                 key.empty()
                     ? &kNoKey
                     : reinterpret_cast<const unsigned char*>(key.data()),
                 static_cast<int>(key.size()),
                 reinterpret_cast<const unsigned char*>(message.data()),
                 message.size(), reinterpret_cast<unsigned char*>(mac.data()),
                 &size);
  if (done == nullptr || size != kProofSize) {
    return absl::InternalError(
        "OpenSSL's HMAC-SHA256 failed (out of memory); the data-plane "
        "connection is refused");
  }
  return mac;
}

Membership FixedKeysForTesting(const std::string& job_id, int64_t generation,
                               int rank, int world) {
  Membership m;
  m.job_id = job_id;
  m.generation = generation;
  m.rank = rank;
  m.pair_keys.resize(world);
  for (int peer = 0; peer < world; ++peer) {
    if (peer == rank) continue;
    const int low = std::min(rank, peer), high = std::max(rank, peer);
    m.pair_keys[peer] =
        std::string(kSecretSize, static_cast<char>('a' + low + 8 * high));
  }
  return m;
}

absl::StatusOr<absl::string_view> PairKey(const Membership& membership,
                                          int peer) {
  if (membership.pair_keys.empty()) return absl::string_view(membership.secret);
  if (peer < 0 || peer >= static_cast<int>(membership.pair_keys.size()) ||
      peer == membership.rank ||
      membership.pair_keys[peer].size() != kSecretSize) {
    return absl::InternalError(absl::StrCat(
        "rank ", membership.rank, " of job ", membership.job_id, " generation ",
        membership.generation, " holds no data-plane key for rank ", peer));
  }
  return absl::string_view(membership.pair_keys[peer]);
}

absl::StatusOr<std::string> MembershipProof(const Membership& membership,
                                            int from, int to) {
  absl::string_view key = membership.secret;
  if (to != kEveryRank) {
    ASSIGN_OR_RETURN(key,
                     PairKey(membership, from == membership.rank ? to : from));
  }
  return Hmac(key,
              {kLabel, membership.job_id, absl::StrCat(membership.generation),
               absl::StrCat(from), absl::StrCat(to)});
}

bool ProofMatches(const Membership& membership, int from, int to,
                  absl::string_view received) {
  if (received.size() != kProofSize) return false;
  const absl::StatusOr<std::string> expected =
      MembershipProof(membership, from, to);
  return expected.ok() &&
         CRYPTO_memcmp(expected->data(), received.data(), kProofSize) == 0;
}

absl::Status CheckGatheredProofs(const Membership& membership, int world,
                                 int self, absl::string_view gathered) {
  if (world < 1 || gathered.size() != kProofSize * world) {
    return absl::InternalError(
        absl::StrCat("rank ", self, " gathered ", gathered.size(),
                     " bytes of membership proofs from ", world,
                     " ranks; expected ", kProofSize * std::max(world, 0)));
  }
  for (int rank = 0; rank < world; ++rank) {
    if (rank == self) continue;
    if (!ProofMatches(membership, rank, kEveryRank,
                      gathered.substr(rank * kProofSize, kProofSize))) {
      return absl::UnavailableError(absl::StrCat(
          "rank ", self, " of generation ", membership.generation, " of job ",
          membership.job_id, " got a wrong membership proof from rank ", rank,
          ": a process that is not a member of the generation joined the "
          "data plane as rank ",
          rank,
          "; the generation fails and is retried (check who can reach "
          "the workers and read the coordinator's key-value store)"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Membership> MembershipOf(const v1::Assignment& assignment,
                                        bool nccl) {
  Membership membership;
  membership.job_id = assignment.job_id();
  membership.generation = assignment.generation();
  membership.rank = assignment.rank();
  auto older = [&](absl::string_view what) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", assignment.rank(), " of job ", assignment.job_id(), " got ",
        what,
        " from the coordinator: the coordinator is older than this "
        "worker; upgrade it"));
  };
  if (nccl) {
    if (assignment.data_plane_secret().size() != kSecretSize) {
      return older(absl::StrCat("a data-plane secret of ",
                                assignment.data_plane_secret().size(),
                                " bytes, not ", kSecretSize));
    }
    membership.secret = assignment.data_plane_secret();
    return membership;
  }
  const int world = assignment.world_size();
  if (world > 1) {
    const auto& keys = assignment.data_plane_pair_keys();
    bool whole = keys.size() == world;
    for (int peer = 0; whole && peer < world; ++peer) {
      whole =
          keys[peer].size() == (peer == assignment.rank() ? 0 : kSecretSize);
    }
    if (!whole) {
      return older(absl::StrCat(keys.size(), " data-plane pair keys for a ",
                                world, "-rank generation (one of ", kSecretSize,
                                " bytes per peer expected)"));
    }
    membership.pair_keys.assign(keys.begin(), keys.end());
  }
  return membership;
}

}  // namespace lockstep::worker
