// The data plane's membership proofs: a member's proof is accepted, and any
// change of secret, job, generation or direction is not.
#include "worker/collective/membership.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "tests/unit/status_value.h"

namespace lockstep::worker {
namespace {

Membership Generation(int64_t number, std::string secret) {
  Membership m;
  m.job_id = "mlp-1";
  m.generation = number;
  m.secret = std::move(secret);
  return m;
}

const std::string kSecret(kSecretSize, 'k');

TEST(MembershipTest, AMembersProofIsAccepted) {
  const Membership m = Generation(3, kSecret);
  const std::string proof = Ok(MembershipProof(m, 1, 0));
  EXPECT_EQ(proof.size(), kProofSize);
  EXPECT_TRUE(ProofMatches(m, 1, 0, proof));
  // The same inputs always give the same proof: every rank computes it.
  EXPECT_EQ(proof, Ok(MembershipProof(Generation(3, kSecret), 1, 0)));
}

TEST(MembershipTest, AnotherSecretIsRefused) {
  std::string other = kSecret;
  other[31] ^= 1;
  const std::string forged = Ok(MembershipProof(Generation(3, other), 1, 0));
  EXPECT_FALSE(ProofMatches(Generation(3, kSecret), 1, 0, forged));
}

TEST(MembershipTest, AnotherGenerationOrJobIsRefused) {
  const Membership m = Generation(3, kSecret);
  EXPECT_FALSE(
      ProofMatches(m, 1, 0, Ok(MembershipProof(Generation(2, kSecret), 1, 0))));
  Membership other_job = m;
  other_job.job_id = "mlp-2";
  EXPECT_FALSE(ProofMatches(m, 1, 0, Ok(MembershipProof(other_job, 1, 0))));
}

TEST(MembershipTest, AProofIsGoodForOneDirectionOfOnePair) {
  const Membership m = Generation(3, kSecret);
  const std::string one_to_zero = Ok(MembershipProof(m, 1, 0));
  EXPECT_FALSE(ProofMatches(m, 0, 1, one_to_zero));  // swapped ranks
  EXPECT_FALSE(ProofMatches(m, 1, 2, one_to_zero));  // another receiver
  EXPECT_FALSE(ProofMatches(m, 2, 0, one_to_zero));  // another sender
  EXPECT_FALSE(ProofMatches(m, 1, kEveryRank, one_to_zero));
  // Ranks 1 and 12 must not collide with 11 and 2 (length-prefixed fields).
  EXPECT_NE(Ok(MembershipProof(m, 1, 12)), Ok(MembershipProof(m, 11, 2)));
}

TEST(MembershipTest, ATruncatedOrEmptyProofIsRefused) {
  const Membership m = Generation(3, kSecret);
  const std::string proof = Ok(MembershipProof(m, 1, 0));
  EXPECT_FALSE(ProofMatches(m, 1, 0, proof.substr(0, kProofSize - 1)));
  EXPECT_FALSE(ProofMatches(m, 1, 0, ""));
  EXPECT_FALSE(ProofMatches(m, 1, 0, std::string(kProofSize, '\0')));
}

TEST(MembershipTest, AnEmptySecretStillSeparatesGenerations) {
  // Tests run the check without a coordinator, with no secret.
  const Membership m = Generation(1, "");
  EXPECT_TRUE(ProofMatches(m, 0, 1, Ok(MembershipProof(m, 0, 1))));
  EXPECT_FALSE(
      ProofMatches(m, 0, 1, Ok(MembershipProof(Generation(2, ""), 0, 1))));
}

std::string Gathered(const Membership& m, int world) {
  std::string gathered;
  for (int rank = 0; rank < world; ++rank) {
    gathered += Ok(MembershipProof(m, rank, kEveryRank));
  }
  return gathered;
}

TEST(MembershipTest, GatheredProofsOfMembersPass) {
  const Membership m = Generation(4, kSecret);
  for (int self = 0; self < 3; ++self) {
    EXPECT_TRUE(CheckGatheredProofs(m, 3, self, Gathered(m, 3)).ok());
  }
}

TEST(MembershipTest, AGatheredForgeryNamesItsRank) {
  const Membership m = Generation(4, kSecret);
  std::string gathered = Gathered(m, 3);
  gathered.replace(2 * kProofSize, kProofSize,
                   Ok(MembershipProof(Generation(4, "guess"), 2, kEveryRank)));
  absl::Status status = CheckGatheredProofs(m, 3, 0, gathered);
  EXPECT_TRUE(absl::IsUnavailable(status)) << status;
  EXPECT_THAT(status.message(),
              ::testing::HasSubstr("wrong membership proof from rank 2"));
  EXPECT_THAT(status.message(), ::testing::HasSubstr("not a member"));
  // A rank does not check its own slot: what it sent is what it computed.
  EXPECT_TRUE(CheckGatheredProofs(m, 3, 2, gathered).ok());
}

TEST(MembershipTest, AGatheringOfTheWrongSizeIsAnInternalError) {
  const Membership m = Generation(4, kSecret);
  EXPECT_TRUE(absl::IsInternal(CheckGatheredProofs(m, 3, 0, Gathered(m, 2))));
}

// The CPU data plane's ranks get a key per peer and no secret; an
// assignment without them (an older coordinator) is refused, naming why.
TEST(MembershipTest, AnAssignmentCarriesAKeyPerPeer) {
  v1::Assignment assignment;
  assignment.set_job_id("job-1");
  assignment.set_generation(2);
  assignment.set_rank(1);
  assignment.set_world_size(3);
  absl::StatusOr<Membership> refused = MembershipOf(assignment, false);
  EXPECT_TRUE(absl::IsFailedPrecondition(refused.status()));
  EXPECT_THAT(refused.status().message(),
              ::testing::HasSubstr("0 data-plane pair keys for a 3-rank"));
  for (const char* key : {"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "",
                          "cccccccccccccccccccccccccccccccc"}) {
    assignment.add_data_plane_pair_keys(key);
  }
  absl::StatusOr<Membership> keyed = MembershipOf(assignment, false);
  ASSERT_TRUE(keyed.ok()) << keyed.status();
  EXPECT_EQ(keyed->rank, 1);
  EXPECT_TRUE(keyed->secret.empty());
  EXPECT_EQ(Ok(PairKey(*keyed, 2)), "cccccccccccccccccccccccccccccccc");
  // Its own slot must stay empty, every other hold 32 bytes.
  assignment.set_data_plane_pair_keys(1, std::string(32, 'b'));
  EXPECT_FALSE(MembershipOf(assignment, false).ok());
  // NCCL's ranks need the secret.
  EXPECT_TRUE(
      absl::IsFailedPrecondition(MembershipOf(assignment, true).status()));
  assignment.set_data_plane_secret(std::string(kSecretSize, 's'));
  EXPECT_EQ(Ok(MembershipOf(assignment, true)).secret,
            std::string(kSecretSize, 's'));
}

}  // namespace
}  // namespace lockstep::worker
