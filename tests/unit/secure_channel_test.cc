// The data plane's handshake and frames on byte buffers: what a member
// accepts, and every way a stranger or an altered wire is refused.
#include "worker/collective/secure_channel.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include "tests/unit/status_value.h"

namespace lockstep::worker {
namespace {

using ::testing::HasSubstr;

Membership Member() {
  Membership m;
  m.job_id = "job-7";
  m.generation = 2;
  m.secret = std::string(32, 'k');
  return m;
}

// Everything a sealer writes for `message`, as one string.
std::string Seal(FrameSealer& sealer, const std::string& message) {
  sealer.Start(message.data(), message.size());
  std::string wire;
  while (!sealer.done()) {
    const absl::Span<const char> pending = Ok(sealer.Pending());
    // Written in pieces of at most 1000 bytes, as a socket may take them.
    const size_t n = std::min<size_t>(pending.size(), 1000);
    wire.append(pending.data(), n);
    sealer.Advance(n);
  }
  return wire;
}

// Feeds `wire` to an opener expecting `size` bytes, in pieces of `piece`.
absl::Status Open(FrameOpener& opener, const std::string& wire, size_t size,
                  std::string* out, size_t piece = 7) {
  out->assign(size, '\0');
  opener.Start(out->data(), size);
  size_t at = 0;
  while (!opener.done()) {
    auto want = opener.Want();
    const size_t n = std::min({want.size(), piece, wire.size() - at});
    if (n == 0) return absl::OutOfRangeError("the wire ended");
    std::memcpy(want.data(), wire.data() + at, n);
    at += n;
    absl::Status s = opener.Received(n);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

TEST(SecureChannelTest, AMemberCompletesTheHandshakeBothWays) {
  const Hello hello = Ok(MakeHello(Member(), 2, 0, true));
  auto checked = CheckHello(Member(), 0, 4, hello.bytes);
  ASSERT_TRUE(checked.ok()) << checked.status();
  EXPECT_EQ(checked->from, 2);
  EXPECT_TRUE(checked->encrypted);
  const std::string reply = Ok(MakeReply(Member(), *checked));
  EXPECT_TRUE(CheckReply(Member(), hello, reply).ok());
  const std::string confirm = Ok(MakeConfirm(Member(), hello, reply));
  EXPECT_TRUE(CheckConfirm(Member(), *checked, reply, confirm).ok());
  EXPECT_EQ(Ok(FrameKey(Member(), hello, reply, 2, 0)),
            Ok(FrameKey(Member(), *checked, reply, 2, 0)));
  EXPECT_NE(Ok(FrameKey(Member(), hello, reply, 2, 0)),
            Ok(FrameKey(Member(), hello, reply, 0, 2)));
}

TEST(SecureChannelTest, StrangersAndReplaysAreRefused) {
  EXPECT_TRUE(absl::IsInvalidArgument(
      CheckHello(Member(), 0, 2, std::string(kHelloSize, 'G')).status()));
  EXPECT_TRUE(
      absl::IsInvalidArgument(CheckHello(Member(), 0, 2, "short").status()));
  Membership other = Member();
  other.generation = 3;  // the last generation's secret is not this one's
  EXPECT_TRUE(absl::IsPermissionDenied(
      CheckHello(Member(), 0, 2, Ok(MakeHello(other, 1, 0, true)).bytes)
          .status()));
  // Rank 1 of a 2-rank generation calling rank 1, or rank 5.
  EXPECT_FALSE(
      CheckHello(Member(), 1, 2, Ok(MakeHello(Member(), 1, 1, true)).bytes)
          .ok());
  EXPECT_FALSE(
      CheckHello(Member(), 0, 2, Ok(MakeHello(Member(), 5, 0, true)).bytes)
          .ok());
  // Any bit changed breaks the MAC.
  std::string bent = Ok(MakeHello(Member(), 1, 0, true)).bytes;
  bent[30] ^= 4;
  EXPECT_TRUE(
      absl::IsPermissionDenied(CheckHello(Member(), 0, 2, bent).status()));
  // A replayed Hello gets a fresh reply; without the secret no Confirm
  // matches it, and an old Confirm is for another reply.
  const Hello hello = Ok(MakeHello(Member(), 1, 0, true));
  const std::string old_reply = Ok(MakeReply(Member(), hello));
  const std::string old_confirm = Ok(MakeConfirm(Member(), hello, old_reply));
  const std::string new_reply = Ok(MakeReply(Member(), hello));
  EXPECT_FALSE(CheckConfirm(Member(), hello, new_reply, old_confirm).ok());
  // A reply from whoever lacks the secret.
  EXPECT_TRUE(absl::IsPermissionDenied(
      CheckReply(Member(), hello, Ok(MakeReply(other, hello)))));
}

// Rank `rank`'s membership in a `world`-rank generation with pair keys.
Membership Keyed(int rank, int world) {
  return FixedKeysForTesting("job-7", 2, rank, world);
}

// Issue 35: with one secret for the whole generation, rank 2 could call rank
// 0 as rank 1 (or answer as rank 1 at an address it published for it). With
// pair keys the Hello, the Reply and the frame keys of {0, 1} need the key
// only ranks 0 and 1 hold.
TEST(SecureChannelTest, AThirdRankCannotPoseAsAnotherWithPairKeys) {
  // The real rank 1 gets through.
  const Hello real = Ok(MakeHello(Keyed(1, 3), 1, 0, true));
  auto checked = CheckHello(Keyed(0, 3), 0, 3, real.bytes);
  ASSERT_TRUE(checked.ok()) << checked.status();
  const std::string reply = Ok(MakeReply(Keyed(0, 3), *checked));
  EXPECT_TRUE(CheckReply(Keyed(1, 3), real, reply).ok());
  EXPECT_EQ(Ok(FrameKey(Keyed(0, 3), *checked, reply, 1, 0)),
            Ok(FrameKey(Keyed(1, 3), real, reply, 1, 0)));

  // Rank 2 with its own keys, claiming to be rank 1.
  const Hello forged = Ok(MakeHello(Keyed(2, 3), 1, 0, true));
  absl::StatusOr<Hello> refused = CheckHello(Keyed(0, 3), 0, 3, forged.bytes);
  EXPECT_TRUE(absl::IsPermissionDenied(refused.status())) << refused.status();
  EXPECT_THAT(refused.status().message(),
              HasSubstr("did not prove it is rank 1"));
  // Rank 2 answering rank 1's call to rank 0 (it published rank 0's address).
  const Hello to_zero = Ok(MakeHello(Keyed(1, 3), 1, 0, true));
  Hello as_seen = to_zero;
  const std::string fake_reply = Ok(MakeReply(Keyed(2, 3), as_seen));
  EXPECT_TRUE(
      absl::IsPermissionDenied(CheckReply(Keyed(1, 3), to_zero, fake_reply)));
  // Rank 2 holds no key for a pair it is not in, and a rank out of range
  // has none: an error, never an empty key.
  EXPECT_TRUE(absl::IsInternal(PairKey(Keyed(2, 3), 2).status()));
  EXPECT_TRUE(absl::IsInternal(PairKey(Keyed(2, 3), 3).status()));
  EXPECT_EQ(Ok(PairKey(Keyed(2, 3), 0)), Ok(PairKey(Keyed(0, 3), 2)));
}

// Issue 35: a failed HMAC gave 32 zero bytes (and then an all-zero AES
// key), a failed RAND_bytes a fixed nonce, a failed seal a frame with a
// zero tag that was sent anyway. Each is now an error.
TEST(SecureChannelTest, CryptoFailuresAreErrorsNeverKnownBytes) {
  FrameSealer sealer(std::string(32, 'q'));
  const std::string message(100, 'm');
  SetCryptoFailsForTesting(true);
  EXPECT_TRUE(absl::IsInternal(MakeHello(Member(), 1, 0, true).status()));
  EXPECT_TRUE(absl::IsInternal(Hmac("key", {"a", "b"}).status()));
  EXPECT_TRUE(absl::IsInternal(MembershipProof(Member(), 1, 0).status()));
  EXPECT_FALSE(ProofMatches(Member(), 1, 0, std::string(kProofSize, '\0')));
  sealer.Start(message.data(), message.size());
  absl::StatusOr<absl::Span<const char>> sealed = sealer.Pending();
  EXPECT_TRUE(absl::IsInternal(sealed.status())) << sealed.status();
  SetCryptoFailsForTesting(false);
  const Hello hello = Ok(MakeHello(Member(), 1, 0, true));
  SetCryptoFailsForTesting(true);
  EXPECT_TRUE(
      absl::IsInternal(CheckHello(Member(), 0, 2, hello.bytes).status()));
  EXPECT_TRUE(absl::IsInternal(MakeReply(Member(), hello).status()));
  EXPECT_TRUE(absl::IsInternal(
      FrameKey(Member(), hello, std::string(kReplySize, 'r'), 1, 0).status()));
  SetCryptoFailsForTesting(false);
}

class FramesTest : public ::testing::TestWithParam<bool> {
 protected:
  std::string Key() const { return GetParam() ? std::string(32, 'q') : ""; }
};

TEST_P(FramesTest, MessagesOfAnySizeArriveWhole) {
  FrameSealer sealer(Key());
  FrameOpener opener(Key());
  for (size_t size : {size_t{1}, size_t{15}, size_t{1000}, kMaxFramePayload,
                      kMaxFramePayload + 3}) {
    std::string message(size, '\0');
    for (size_t i = 0; i < size; ++i) message[i] = static_cast<char>(i * 31);
    const std::string wire = Seal(sealer, message);
    const size_t frames = (size + kMaxFramePayload - 1) / kMaxFramePayload;
    EXPECT_EQ(wire.size(),
              size + frames * (kFrameHeaderSize + (GetParam() ? 16 : 0)));
    std::string out;
    ASSERT_TRUE(Open(opener, wire, size, &out, 4096).ok());
    EXPECT_TRUE(out == message) << size;
    if (GetParam() && size >= 64) {
      EXPECT_EQ(wire.find(message.substr(0, 64)), std::string::npos);
    }
  }
}

TEST_P(FramesTest, AHeaderThatAsksForMoreThanExpectedIsRefused) {
  FrameSealer sealer(Key());
  const std::string wire = Seal(sealer, std::string(100, 'a'));
  FrameOpener opener(Key());
  std::string out;
  absl::Status s = Open(opener, wire, 50, &out);
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  EXPECT_THAT(s.message(), HasSubstr("malformed frame header"));
}

TEST_P(FramesTest, AReplayedOrReorderedFrameIsRefused) {
  FrameSealer sealer(Key());
  const std::string first = Seal(sealer, std::string(10, 'a'));
  FrameOpener opener(Key());
  std::string out;
  ASSERT_TRUE(Open(opener, first, 10, &out).ok());
  absl::Status s = Open(opener, first, 10, &out);  // frame 0 again
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
}

TEST(EncryptedFramesTest, AnAlteredFrameFailsItsTag) {
  const std::string key(32, 'q');
  for (size_t at : {size_t{3}, size_t{20}, size_t{16 + 100 + 5}}) {
    FrameSealer sealer(key);
    std::string wire = Seal(sealer, std::string(100, 'z'));
    wire[at] ^= 0x10;
    FrameOpener opener(key);
    std::string out;
    absl::Status s = Open(opener, wire, 100, &out);
    EXPECT_TRUE(absl::IsDataLoss(s)) << at << " " << s;
  }
  FrameSealer sealer(key);
  FrameOpener wrong(std::string(32, 'r'));
  std::string out;
  EXPECT_THAT(Open(wrong, Seal(sealer, "hello"), 5, &out).message(),
              HasSubstr("failed authentication"));
}

INSTANTIATE_TEST_SUITE_P(Encryption, FramesTest, ::testing::Bool(),
                         [](const auto& info) {
                           return info.param ? "Encrypted" : "Clear";
                         });

}  // namespace
}  // namespace lockstep::worker
