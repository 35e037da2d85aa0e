// Fuzz target: lockstep's data-plane wire (worker/collective/secure_channel.h)
// as a stranger or an altered network would present it. The first byte picks
// what the rest is:
//   0: a Hello, a Reply and a Confirm, checked as a member would;
//   1, 2: frames read by a clear (1) or encrypted (2) receiver that expects
//      a message of the size in the next two bytes (1..4096), in pieces of
//      the size in the byte after; the message lies alone on the heap, so
//      AddressSanitizer sees any write past it;
//   3, 4: the rest sealed (clear, encrypted) and opened again, whole; with
//      one byte the input picks flipped, an encrypted frame must fail.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "tests/fuzz/fuzz_files.h"
#include "worker/collective/secure_channel.h"

namespace {

using lockstep::fuzz::Check;
namespace w = lockstep::worker;

const w::Membership& Member() {
  static const w::Membership* member = new w::Membership([] {
    w::Membership m;
    m.job_id = "job-fuzz";
    m.generation = 5;
    m.secret = std::string(32, 'f');
    return m;
  }());
  return *member;
}

const std::string kKey(32, 'k');

// Feeds `wire` to `opener` expecting `size` bytes; true when all arrived.
bool Open(w::FrameOpener& opener, absl::string_view wire, size_t size,
          size_t piece, std::unique_ptr<char[]>* out) {
  out->reset(new char[size]);
  opener.Start(out->get(), size);
  size_t at = 0;
  while (!opener.done()) {
    auto want = opener.Want();
    Check(!want.empty(), "an unfinished opener wants nothing");
    const size_t n = std::min({want.size(), piece, wire.size() - at});
    if (n == 0) return false;
    std::memcpy(want.data(), wire.data() + at, n);
    at += n;
    if (!opener.Received(n).ok()) return false;
  }
  return true;
}

std::string Seal(w::FrameSealer& sealer, absl::string_view message) {
  sealer.Start(message.data(), message.size());
  std::string wire;
  while (!sealer.done()) {
    auto sealed = sealer.Pending();
    Check(sealed.ok(), "a frame could not be sealed");
    auto pending = *sealed;
    Check(!pending.empty(), "an unfinished sealer has nothing to send");
    wire.append(pending.data(), pending.size());
    sealer.Advance(pending.size());
  }
  return wire;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const int mode = data[0] % 5;
  absl::string_view rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (mode == 0) {
    auto hello = w::CheckHello(Member(), 0, 4, rest.substr(0, w::kHelloSize));
    if (hello.ok()) {
      // Only a MAC made with the secret gets here.
      Check(hello->from > 0 && hello->from < 4, "a Hello from a bad rank");
      const absl::string_view reply = rest.substr(w::kHelloSize, w::kReplySize);
      (void)w::CheckConfirm(Member(), *hello, reply,
                            rest.substr(w::kHelloSize + w::kReplySize));
    }
    absl::StatusOr<w::Hello> made = w::MakeHello(Member(), 1, 0, true);
    Check(made.ok(), "a Hello could not be made");
    const w::Hello& mine = *made;
    (void)w::CheckReply(Member(), mine, rest.substr(0, w::kReplySize));
    return 0;
  }
  if (mode == 1 || mode == 2) {
    if (rest.size() < 3) return 0;
    const size_t expected = 1 + ((static_cast<uint8_t>(rest[0]) |
                                  (static_cast<uint8_t>(rest[1]) << 8)) %
                                 4096);
    const size_t piece = 1 + static_cast<uint8_t>(rest[2]);
    w::FrameOpener opener(mode == 2 ? kKey : "");
    std::unique_ptr<char[]> out;
    (void)Open(opener, rest.substr(3), expected, piece, &out);
    return 0;
  }
  // 3, 4: round trip, then one byte flipped.
  if (rest.empty()) return 0;
  const bool encrypted = mode == 4;
  const std::string key = encrypted ? kKey : "";
  const size_t flip = static_cast<uint8_t>(rest[0]);
  const absl::string_view message = rest.substr(1);
  if (message.empty()) return 0;
  w::FrameSealer sealer(key);
  std::string wire = Seal(sealer, message);
  w::FrameOpener opener(key);
  std::unique_ptr<char[]> out;
  Check(Open(opener, wire, message.size(), 1 + flip, &out),
        "a sealed message did not open");
  Check(std::memcmp(out.get(), message.data(), message.size()) == 0,
        "a sealed message opened to other bytes");
  if (encrypted) {
    w::FrameSealer again(key);
    std::string bent = Seal(again, message);
    bent[flip % bent.size()] ^= 0x20;
    w::FrameOpener fresh(key);
    Check(!Open(fresh, bent, message.size(), bent.size(), &out),
          "an altered encrypted frame was accepted");
  }
  return 0;
}
