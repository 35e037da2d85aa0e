// The wire format of lockstep's data-plane transport (mesh_communicator.h),
// apart from the sockets so that it can be tested and fuzzed on byte
// buffers (docs/DESIGN.md, "Data-plane transport").
//
// A connection between ranks i and j of one generation starts with a
// handshake keyed by their pair's key, which the coordinator derives from
// the generation's secret and hands only ranks i and j, over their TLS
// sessions (membership.h); nothing else a peer sends is parsed before the
// handshake proved it holds that key, so no third rank can pose as i or j:
//
//   connecting rank                         listening rank
//   Hello  {magic, version, from, to,  -->  checks magic, version, ranks and
//           flags, nonce_c, mac}            the MAC over job, generation
//                                           and every field (84 bytes)
//          <--  Reply {nonce_s, mac}        MAC over Hello and nonce_s
//   Confirm {mac}                      -->  MAC over Hello and Reply
//
// The Hello's MAC alone could be replayed by someone who overheard it;
// the Reply and Confirm MACs cover both fresh nonces, so only a holder of
// the pair's key finishes a handshake. Each direction then has its own key,
// derived from the pair's key, both nonces and the two ranks.
//
// After the handshake a message is a run of frames, each
//   header {seq: u64, length: u32, reserved: u32 = 0} (16 bytes, little
//           endian), then `length` bytes, then (encrypted) a 16-byte tag.
// Encrypted frames are AES-256-GCM (OpenSSL, which uses the CPU's AES
// instructions) with the header as associated data and the sequence number
// as the nonce; a frame that was altered, replayed, reordered or cut fails
// its tag. Unencrypted frames (--data-plane-encryption off) carry the same
// header, checked the same way, but nothing protects their bytes. Either
// way a frame must announce the next sequence number and no more bytes than
// the receiver still expects (and at most kMaxFramePayload), so a peer
// cannot make the receiver write past its buffer or allocate anything.
//
// Thread-compatible: each object belongs to one connection's direction.
#ifndef LOCKSTEP_WORKER_COLLECTIVE_SECURE_CHANNEL_H_
#define LOCKSTEP_WORKER_COLLECTIVE_SECURE_CHANNEL_H_

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "worker/collective/membership.h"

namespace lockstep::worker {

inline constexpr size_t kHandshakeNonceSize = 32;
inline constexpr size_t kHelloSize = 20 + kHandshakeNonceSize + kProofSize;
inline constexpr size_t kReplySize = kHandshakeNonceSize + kProofSize;
inline constexpr size_t kConfirmSize = kProofSize;
inline constexpr size_t kFrameHeaderSize = 16;
inline constexpr size_t kFrameTagSize = 16;
// The most bytes one frame carries.
inline constexpr size_t kMaxFramePayload = size_t{1} << 20;

// A Hello as decoded; the fields are only trusted once the MAC was checked.
struct Hello {
  int from = 0;
  int to = 0;
  bool encrypted = true;
  std::string nonce;  // kHandshakeNonceSize bytes
  std::string bytes;  // the whole message, kHelloSize bytes
};

// The Hello rank `from` sends rank `to`, with a fresh nonce. Every function
// below that makes a nonce, MAC or key fails with Internal when OpenSSL
// does (no randomness, no memory): never a value of known bytes, and the
// connection must then be closed.
absl::StatusOr<Hello> MakeHello(const Membership& membership, int from, int to,
                                bool encrypted);

// Whether `prefix`, the first bytes of a connection, can still be a Hello:
// the rest of a stranger's connection need not be awaited.
bool CouldBeHello(absl::string_view prefix);

// Decodes and checks a received Hello (kHelloSize bytes) for rank `self` of
// a `world`-rank generation. Errors, to be logged and the connection
// closed (the sender is not trusted with anything):
//   - InvalidArgument: not lockstep's data plane, or another version;
//   - PermissionDenied: it names ranks this rank does not expect, or the MAC
//     is wrong (the sender does not hold the key of the pair it names).
// The MAC is keyed with the key of the pair {from, self}, so only rank
// `from` (or rank `self`) can make it.
absl::StatusOr<Hello> CheckHello(const Membership& membership, int self,
                                 int world, absl::string_view bytes);

// The listening side's Reply to `hello` (kReplySize bytes, fresh nonce),
// and the check of it on the connecting side: PermissionDenied when the
// MAC is wrong (whoever answered does not hold the pair's key).
absl::StatusOr<std::string> MakeReply(const Membership& membership,
                                      const Hello& hello);
absl::Status CheckReply(const Membership& membership, const Hello& hello,
                        absl::string_view reply);
// The connecting side's Confirm, and the listening side's check of it.
absl::StatusOr<std::string> MakeConfirm(const Membership& membership,
                                        const Hello& hello,
                                        absl::string_view reply);
absl::Status CheckConfirm(const Membership& membership, const Hello& hello,
                          absl::string_view reply, absl::string_view confirm);

// The AES-256 key for frames rank `from` sends rank `to` on the connection
// whose handshake was `hello` and `reply`.
absl::StatusOr<std::string> FrameKey(const Membership& membership,
                                     const Hello& hello,
                                     absl::string_view reply, int from, int to);

class GcmCipher;

// Turns messages into frames, one direction of a connection. Start a
// message, then write Pending() and report it with Advance() until done().
//   idle --Start--> sending --(all bytes Advanced)--> idle
class FrameSealer {
 public:
  // `key` empty: frames unencrypted.
  explicit FrameSealer(absl::string_view key);
  ~FrameSealer();
  FrameSealer(const FrameSealer&) = delete;
  FrameSealer& operator=(const FrameSealer&) = delete;

  // Sends `bytes` at `data`, which must stay valid and unchanged until
  // done(). A message of 0 bytes sends nothing.
  void Start(const char* data, size_t bytes);
  // The bytes to write next; empty when done(). Errors: Internal when a
  // frame cannot be sealed (the connection must be closed; nothing of the
  // frame was given out).
  absl::StatusOr<absl::Span<const char>> Pending();
  // `n` bytes of Pending() were written.
  void Advance(size_t n);
  bool done() const { return sent_ == size_ && staged_.empty(); }

 private:
  // Seals the next frame into staged_ (its header into header_ when
  // unencrypted, the payload then read from the message itself).
  absl::Status NextFrame();

  std::unique_ptr<GcmCipher> cipher_;  // null: unencrypted
  uint64_t seq_ = 0;
  const char* data_ = nullptr;
  size_t size_ = 0;
  size_t sent_ = 0;  // message bytes framed so far
  // The frame being written: staged_[offset_..] (encrypted: header,
  // ciphertext, tag; unencrypted: the header, then plain_ bytes of data_).
  std::string staged_;
  size_t offset_ = 0;
  const char* plain_ = nullptr;
  size_t plain_left_ = 0;
};

// Checks and opens frames, one direction of a connection. Start a message,
// then read into Want() and report it with Received() until done().
//   idle --Start--> header --> payload --> tag (encrypted) --> header ...
//   ... --> idle once the message's bytes all arrived
class FrameOpener {
 public:
  explicit FrameOpener(absl::string_view key);
  ~FrameOpener();
  FrameOpener(const FrameOpener&) = delete;
  FrameOpener& operator=(const FrameOpener&) = delete;

  // Expects a message of exactly `bytes` bytes into `data`.
  void Start(char* data, size_t bytes);
  // Where the next bytes read go (empty when done()).
  absl::Span<char> Want();
  // `n` bytes arrived into Want(). Errors (the connection must be closed):
  // DataLoss for a header with a wrong sequence number, a non-zero
  // reserved field, a length of 0 or more than the message still expects
  // (or kMaxFramePayload), and for a frame whose tag does not verify. The
  // message then holds unauthenticated bytes: the caller fails it.
  absl::Status Received(size_t n);
  bool done() const { return state_ == State::kIdle; }

 private:
  enum class State { kIdle, kHeader, kPayload, kTag };

  std::unique_ptr<GcmCipher> cipher_;
  uint64_t seq_ = 0;
  State state_ = State::kIdle;
  char* data_ = nullptr;
  size_t size_ = 0;
  size_t received_ = 0;  // message bytes received, of finished frames
  std::array<char, kFrameHeaderSize> header_{};
  std::array<char, kFrameTagSize> tag_{};
  size_t filled_ = 0;   // bytes of the current part (header, payload, tag)
  size_t payload_ = 0;  // the current frame's length
};

}  // namespace lockstep::worker

#endif  // LOCKSTEP_WORKER_COLLECTIVE_SECURE_CHANNEL_H_
