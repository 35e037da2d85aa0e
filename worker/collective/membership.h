// Proofs that a data-plane peer is a member of the generation
// (docs/DESIGN.md, "Data-plane membership"). Neither Gloo's TCP transport
// nor NCCL authenticates who connects, so after the ranks connect, each
// proves to its peers that it holds the generation's secret, which the
// coordinator hands every rank in its Assignment over the TLS session.
//
// On the CPU data plane the coordinator hands each rank, instead of the
// secret, a key per peer: the pair {i, j}'s key, which only ranks i and j
// hold, so a proof (or a handshake, secure_channel.h) between them can come
// from no third rank.
//
// A proof is HMAC-SHA256 (OpenSSL), keyed with the secret or the pair's key,
// over the job id,
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
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "lockstep/v1/coordinator.pb.h"

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
  // This rank, whose pair keys these are.
  int rank = 0;
  // The generation's secret (NCCL, whose proofs every rank checks).
  std::string secret;
  // The CPU data plane: pair_keys[j] is the key this rank shares with rank j
  // alone (empty at `rank`). Without them (tests) every pair uses `secret`.
  std::vector<std::string> pair_keys;
};

// HMAC-SHA256 keyed with `key` over `fields`, each preceded by its length
// (8 bytes, little endian), so no two field lists encode alike. Errors:
// Internal when OpenSSL fails: never a MAC of known bytes.
absl::StatusOr<std::string> Hmac(absl::string_view key,
                                 absl::Span<const absl::string_view> fields);

// The key of the pair {membership.rank, peer}: its pair key, or the secret
// without pair keys. Errors: Internal for a peer out of range or a key of
// the wrong size (never an empty or known key).
absl::StatusOr<absl::string_view> PairKey(const Membership& membership,
                                          int peer);

// What rank `assignment.rank()` proves to its peers with: NCCL's ranks
// (`nccl`) the generation's secret, the CPU data plane's a key per pair.
// Errors: FailedPrecondition when the coordinator sent no secret or keys of
// the right size (an older coordinator).
absl::StatusOr<Membership> MembershipOf(const v1::Assignment& assignment,
                                        bool nccl);

// The proof rank `from` sends rank `to` (kProofSize bytes): keyed with the
// secret when `to` is kEveryRank, else with the key of the pair, one of
// which is membership.rank. Errors: Internal (Hmac, PairKey).
absl::StatusOr<std::string> MembershipProof(const Membership& membership,
                                            int from, int to);

// Tests and benchmarks only: rank `rank` of a `world`-rank generation
// `generation` of `job_id` with fixed, well-known pair keys (the pair
// {i, j}: 32 bytes of 'a' + i + 8j, i < j), as the coordinator would hand
// them out. Never a real generation's keys.
Membership FixedKeysForTesting(const std::string& job_id, int64_t generation,
                               int rank, int world);

// Tests only: while set, every HMAC, nonce and AES-GCM operation of the data
// plane fails as OpenSSL's do without memory.
void SetCryptoFailsForTesting(bool fails);
bool CryptoFailsForTesting();

// Whether `received` is the proof `from` owes `to`; compared in constant
// time, so the time taken says nothing of how much of a forgery was right.
// False also when the proof cannot be computed.
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
