// Proofs that a data-plane peer is a member of the generation
// (docs/DESIGN.md, "Data-plane membership"). Neither Gloo's TCP transport
// nor NCCL authenticates who connects, so after the ranks connect, each
// proves to its peers that it holds the generation's secret, which the
// coordinator hands every rank in its Assignment over the TLS session.
//
// A proof is HMAC-SHA256 (OpenSSL), keyed with the secret, over the job id,
// the generation, the sending rank and the receiving rank (kEveryRank when
// it is gathered by every rank, as over NCCL), each field length-prefixed:
// a proof is good for one direction of one pair of one generation, so one
// overheard on the wire cannot be replayed on another connection.
//
// Thread-safe: functions of their arguments only.
#ifndef LOCKSTEP_WORKER_COLLECTIVE_MEMBERSHIP_H_
#define LOCKSTEP_WORKER_COLLECTIVE_MEMBERSHIP_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace lockstep::worker {

// The bytes of a proof (SHA-256's output) and of a generation's secret.
inline constexpr size_t kProofSize = 32;
inline constexpr size_t kSecretSize = 32;
// The receiver of a proof that every rank checks.
inline constexpr int kEveryRank = -1;

// What the ranks of one generation share and a stranger does not. The
// secret is never logged: nothing here prints it.
struct Membership {
  std::string job_id;
  int64_t generation = 0;
  std::string secret;
};

// The proof rank `from` sends rank `to` (kProofSize bytes).
std::string MembershipProof(const Membership& membership, int from, int to);

// Whether `received` is the proof `from` owes `to`; compared in constant
// time, so the time taken says nothing of how much of a forgery was right.
bool ProofMatches(const Membership& membership, int from, int to,
                  absl::string_view received);

// Checks what an all-gather of MembershipProof(m, rank, kEveryRank) over
// `world` ranks produced (rank r's proof at r * kProofSize), as seen by rank
// `self`. Errors: Unavailable naming the first rank whose proof is wrong (a
// process that is not a member of the generation joined as that rank);
// Internal when `gathered` has the wrong size.
absl::Status CheckGatheredProofs(const Membership& membership, int world,
                                 int self, absl::string_view gathered);

}  // namespace lockstep::worker

#endif  // LOCKSTEP_WORKER_COLLECTIVE_MEMBERSHIP_H_
