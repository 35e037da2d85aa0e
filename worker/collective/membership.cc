// Membership proofs: OpenSSL's HMAC-SHA256 over the length-prefixed fields
// (membership.h).
#include "worker/collective/membership.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace lockstep::worker {
namespace {

// Separates these proofs from any other use of the secret.
constexpr absl::string_view kLabel = "lockstep data-plane membership v1";

// `field` preceded by its length as 8 little-endian bytes, so that no two
// different field lists encode to the same message.
void AppendField(std::string* message, absl::string_view field) {
  uint64_t size = field.size();
  for (int i = 0; i < 8; ++i) {
    message->push_back(static_cast<char>((size >> (8 * i)) & 0xff));
  }
  message->append(field.data(), field.size());
}

}  // namespace

std::string MembershipProof(const Membership& membership, int from, int to) {
  std::string message;
  AppendField(&message, kLabel);
  AppendField(&message, membership.job_id);
  AppendField(&message, absl::StrCat(membership.generation));
  AppendField(&message, absl::StrCat(from));
  AppendField(&message, absl::StrCat(to));
  std::string proof(kProofSize, '\0');
  unsigned int size = 0;
  // std::string::data() is never null, so an empty secret (tests that run
  // the check without a coordinator) is a valid zero-length key.
  const unsigned char* mac = HMAC(
      EVP_sha256(), membership.secret.data(),
      static_cast<int>(membership.secret.size()),
      reinterpret_cast<const unsigned char*>(message.data()), message.size(),
      reinterpret_cast<unsigned char*>(proof.data()), &size);
  // Fails only without memory; an all-zero proof then matches nothing a
  // peer computes, so the check fails closed.
  if (mac == nullptr || size != kProofSize) return std::string(kProofSize, 0);
  return proof;
}

bool ProofMatches(const Membership& membership, int from, int to,
                  absl::string_view received) {
  if (received.size() != kProofSize) return false;
  const std::string expected = MembershipProof(membership, from, to);
  return CRYPTO_memcmp(expected.data(), received.data(), kProofSize) == 0;
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

}  // namespace lockstep::worker
