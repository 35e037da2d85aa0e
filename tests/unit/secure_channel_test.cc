// The data plane's handshake and frames on byte buffers: what a member
// accepts, and every way a stranger or an altered wire is refused.
#include "worker/collective/secure_channel.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

namespace lockstep::worker {
namespace {

using ::testing::HasSubstr;

Membership Member() { return Membership{"job-7", 2, std::string(32, 'k')}; }

// Everything a sealer writes for `message`, as one string.
std::string Seal(FrameSealer& sealer, const std::string& message) {
  sealer.Start(message.data(), message.size());
  std::string wire;
  while (!sealer.done()) {
    auto pending = sealer.Pending();
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
  const Hello hello = MakeHello(Member(), 2, 0, true);
  auto checked = CheckHello(Member(), 0, 4, hello.bytes);
  ASSERT_TRUE(checked.ok()) << checked.status();
  EXPECT_EQ(checked->from, 2);
  EXPECT_TRUE(checked->encrypted);
  const std::string reply = MakeReply(Member(), *checked);
  EXPECT_TRUE(CheckReply(Member(), hello, reply).ok());
  const std::string confirm = MakeConfirm(Member(), hello, reply);
  EXPECT_TRUE(CheckConfirm(Member(), *checked, reply, confirm).ok());
  EXPECT_EQ(FrameKey(Member(), hello, reply, 2, 0),
            FrameKey(Member(), *checked, reply, 2, 0));
  EXPECT_NE(FrameKey(Member(), hello, reply, 2, 0),
            FrameKey(Member(), hello, reply, 0, 2));
}

TEST(SecureChannelTest, StrangersAndReplaysAreRefused) {
  EXPECT_TRUE(absl::IsInvalidArgument(
      CheckHello(Member(), 0, 2, std::string(kHelloSize, 'G')).status()));
  EXPECT_TRUE(
      absl::IsInvalidArgument(CheckHello(Member(), 0, 2, "short").status()));
  Membership other = Member();
  other.generation = 3;  // the last generation's secret is not this one's
  EXPECT_TRUE(absl::IsPermissionDenied(
      CheckHello(Member(), 0, 2, MakeHello(other, 1, 0, true).bytes).status()));
  // Rank 1 of a 2-rank generation calling rank 1, or rank 5.
  EXPECT_FALSE(
      CheckHello(Member(), 1, 2, MakeHello(Member(), 1, 1, true).bytes).ok());
  EXPECT_FALSE(
      CheckHello(Member(), 0, 2, MakeHello(Member(), 5, 0, true).bytes).ok());
  // Any bit changed breaks the MAC.
  std::string bent = MakeHello(Member(), 1, 0, true).bytes;
  bent[30] ^= 4;
  EXPECT_TRUE(
      absl::IsPermissionDenied(CheckHello(Member(), 0, 2, bent).status()));
  // A replayed Hello gets a fresh reply; without the secret no Confirm
  // matches it, and an old Confirm is for another reply.
  const Hello hello = MakeHello(Member(), 1, 0, true);
  const std::string old_reply = MakeReply(Member(), hello);
  const std::string old_confirm = MakeConfirm(Member(), hello, old_reply);
  const std::string new_reply = MakeReply(Member(), hello);
  EXPECT_FALSE(CheckConfirm(Member(), hello, new_reply, old_confirm).ok());
  // A reply from whoever lacks the secret.
  EXPECT_TRUE(absl::IsPermissionDenied(
      CheckReply(Member(), hello, MakeReply(other, hello))));
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
