// The data plane's handshake and frames: HMAC-SHA256 and AES-256-GCM from
// OpenSSL (secure_channel.h).
#include "worker/collective/secure_channel.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace lockstep::worker {
namespace {

constexpr uint32_t kMagic = 0x5044534c;  // "LSDP" little endian
constexpr uint32_t kVersion = 1;
constexpr uint32_t kEncryptedFlag = 1;
// Where the Hello's fields start; the MAC covers [0, kHelloMacAt).
constexpr size_t kHelloNonceAt = 20;
constexpr size_t kHelloMacAt = kHelloNonceAt + kHandshakeNonceSize;

void PutU32(char* out, uint32_t value) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>(value >> (8 * i));
}
void PutU64(char* out, uint64_t value) {
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>(value >> (8 * i));
}
uint32_t GetU32(const char* in) {
  uint32_t value = 0;
  for (int i = 0; i < 4; ++i) {
    value |= uint32_t{static_cast<unsigned char>(in[i])} << (8 * i);
  }
  return value;
}
uint64_t GetU64(const char* in) {
  uint64_t value = 0;
  for (int i = 0; i < 8; ++i) {
    value |= uint64_t{static_cast<unsigned char>(in[i])} << (8 * i);
  }
  return value;
}

// HMAC-SHA256 keyed with the key of the pair {hello.from, hello.to} (the
// generation's secret without pair keys) over `label`, the job, the
// generation and `parts`. Errors: Internal (never a MAC of known bytes).
absl::StatusOr<std::string> Mac(
    const Membership& membership, int from, int to, absl::string_view label,
    std::initializer_list<absl::string_view> parts) {
  ASSIGN_OR_RETURN(absl::string_view key,
                   PairKey(membership, from == membership.rank ? to : from));
  std::vector<absl::string_view> fields = {label, membership.job_id};
  const std::string generation = absl::StrCat(membership.generation);
  fields.push_back(generation);
  fields.insert(fields.end(), parts.begin(), parts.end());
  return Hmac(key, fields);
}

bool SameMac(absl::string_view a, absl::string_view b) {
  return a.size() == b.size() &&
         CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

// A fresh nonce. Errors: Internal when OpenSSL has no randomness to give
// (never a fixed nonce).
absl::StatusOr<std::string> RandomNonce() {
  std::string nonce(kHandshakeNonceSize, '\0');
  if (CryptoFailsForTesting() ||
      RAND_bytes(reinterpret_cast<unsigned char*>(nonce.data()),
                 static_cast<int>(nonce.size())) != 1) {
    return absl::InternalError(
        "OpenSSL's RAND_bytes has no randomness for a handshake nonce; the "
        "data-plane connection is refused");
  }
  return nonce;
}

}  // namespace

// AES-256-GCM with one key; the nonce is 4 zero bytes and the sequence
// number.
class GcmCipher {
 public:
  GcmCipher(absl::string_view key, bool encrypt) : encrypt_(encrypt) {
    ctx_ = EVP_CIPHER_CTX_new();
    ok_ = ctx_ != nullptr && key.size() == 32 &&
          (encrypt ? EVP_EncryptInit_ex(
                         ctx_, EVP_aes_256_gcm(), nullptr,
                         reinterpret_cast<const unsigned char*>(key.data()),
                         nullptr)
                   : EVP_DecryptInit_ex(
                         ctx_, EVP_aes_256_gcm(), nullptr,
                         reinterpret_cast<const unsigned char*>(key.data()),
                         nullptr)) == 1;
  }
  ~GcmCipher() { EVP_CIPHER_CTX_free(ctx_); }

  // Seals (or opens and verifies) `n` bytes from `in` to `out` (which may
  // be `in`) under `header` as associated data; `tag` is written (or
  // checked). False on any failure, a wrong tag included.
  bool Run(uint64_t seq, const char* header, const char* in, char* out,
           size_t n, char* tag) {
    if (!ok_ || CryptoFailsForTesting()) return false;
    unsigned char iv[12] = {};
    PutU64(reinterpret_cast<char*>(iv) + 4, seq);
    auto u = [](const char* p) {
      return reinterpret_cast<const unsigned char*>(p);
    };
    auto w = [](char* p) { return reinterpret_cast<unsigned char*>(p); };
    int len = 0;
    if (encrypt_) {
      if (EVP_EncryptInit_ex(ctx_, nullptr, nullptr, nullptr, iv) != 1 ||
          EVP_EncryptUpdate(ctx_, nullptr, &len, u(header), kFrameHeaderSize) !=
              1 ||
          EVP_EncryptUpdate(ctx_, w(out), &len, u(in), static_cast<int>(n)) !=
              1 ||
          EVP_EncryptFinal_ex(ctx_, w(out) + len, &len) != 1) {
        return false;
      }
      return EVP_CIPHER_CTX_ctrl(ctx_, EVP_CTRL_GCM_GET_TAG, kFrameTagSize,
                                 tag) == 1;
    }
    if (EVP_DecryptInit_ex(ctx_, nullptr, nullptr, nullptr, iv) != 1 ||
        EVP_DecryptUpdate(ctx_, nullptr, &len, u(header), kFrameHeaderSize) !=
            1 ||
        EVP_DecryptUpdate(ctx_, w(out), &len, u(in), static_cast<int>(n)) !=
            1 ||
        EVP_CIPHER_CTX_ctrl(ctx_, EVP_CTRL_GCM_SET_TAG, kFrameTagSize, tag) !=
            1) {
      return false;
    }
    return EVP_DecryptFinal_ex(ctx_, w(out) + len, &len) == 1;
  }

 private:
  const bool encrypt_;
  EVP_CIPHER_CTX* ctx_ = nullptr;
  bool ok_ = false;
};

absl::StatusOr<Hello> MakeHello(const Membership& membership, int from, int to,
                                bool encrypted) {
  Hello hello;
  hello.from = from;
  hello.to = to;
  hello.encrypted = encrypted;
  ASSIGN_OR_RETURN(hello.nonce, RandomNonce());
  hello.bytes.assign(kHelloSize, '\0');
  char* out = hello.bytes.data();
  PutU32(out, kMagic);
  PutU32(out + 4, kVersion);
  PutU32(out + 8, static_cast<uint32_t>(from));
  PutU32(out + 12, static_cast<uint32_t>(to));
  PutU32(out + 16, encrypted ? kEncryptedFlag : 0);
  std::memcpy(out + kHelloNonceAt, hello.nonce.data(), kHandshakeNonceSize);
  ASSIGN_OR_RETURN(
      const std::string mac,
      Mac(membership, from, to, "lockstep data-plane hello v1",
          {absl::string_view(hello.bytes).substr(0, kHelloMacAt)}));
  std::memcpy(out + kHelloMacAt, mac.data(), kProofSize);
  return hello;
}

bool CouldBeHello(absl::string_view prefix) {
  char magic[4];
  PutU32(magic, kMagic);
  return std::memcmp(prefix.data(), magic,
                     std::min<size_t>(prefix.size(), 4)) == 0;
}

absl::StatusOr<Hello> CheckHello(const Membership& membership, int self,
                                 int world, absl::string_view bytes) {
  if (bytes.size() != kHelloSize || GetU32(bytes.data()) != kMagic) {
    return absl::InvalidArgumentError(
        "it does not speak lockstep's data-plane protocol");
  }
  if (GetU32(bytes.data() + 4) != kVersion) {
    return absl::InvalidArgumentError(
        absl::StrCat("it speaks version ", GetU32(bytes.data() + 4),
                     " of lockstep's data-plane protocol, this worker ",
                     kVersion, ": run one lockstep release in a job"));
  }
  // The ranks pick the pair's key, so they are checked (as numbers only)
  // before the MAC; nothing else is believed until the MAC is.
  const uint32_t from = GetU32(bytes.data() + 8);
  const uint32_t to = GetU32(bytes.data() + 12);
  const uint32_t flags = GetU32(bytes.data() + 16);
  if (to != static_cast<uint32_t>(self) ||
      from >= static_cast<uint32_t>(world) || from == to ||
      (flags & ~kEncryptedFlag) != 0) {
    return absl::PermissionDeniedError(
        absl::StrCat("it claims to be rank ", from, " calling rank ", to,
                     " of a ", world, "-rank generation"));
  }
  ASSIGN_OR_RETURN(
      const std::string mac,
      Mac(membership, static_cast<int>(from), self,
          "lockstep data-plane hello v1", {bytes.substr(0, kHelloMacAt)}));
  if (!SameMac(mac, bytes.substr(kHelloMacAt, kProofSize))) {
    return absl::PermissionDeniedError(absl::StrCat(
        "it did not prove it is rank ", from, " of generation ",
        membership.generation, " of job ", membership.job_id,
        ": it does not hold the key rank ", from, " shares with rank ", self));
  }
  Hello hello;
  hello.from = static_cast<int>(from);
  hello.to = static_cast<int>(to);
  hello.encrypted = (flags & kEncryptedFlag) != 0;
  hello.nonce = std::string(bytes.substr(kHelloNonceAt, kHandshakeNonceSize));
  hello.bytes = std::string(bytes);
  return hello;
}

absl::StatusOr<std::string> MakeReply(const Membership& membership,
                                      const Hello& hello) {
  ASSIGN_OR_RETURN(std::string reply, RandomNonce());
  ASSIGN_OR_RETURN(const std::string mac,
                   Mac(membership, hello.from, hello.to,
                       "lockstep data-plane reply v1", {hello.bytes, reply}));
  return reply + mac;
}

absl::Status CheckReply(const Membership& membership, const Hello& hello,
                        absl::string_view reply) {
  if (reply.size() == kReplySize) {
    ASSIGN_OR_RETURN(
        const std::string mac,
        Mac(membership, hello.from, hello.to, "lockstep data-plane reply v1",
            {hello.bytes, reply.substr(0, kHandshakeNonceSize)}));
    if (SameMac(mac, reply.substr(kHandshakeNonceSize))) {
      return absl::OkStatus();
    }
  }
  return absl::PermissionDeniedError(absl::StrCat(
      "it answered without proof that it is rank ", hello.to, " of generation ",
      membership.generation, " of job ", membership.job_id));
}

absl::StatusOr<std::string> MakeConfirm(const Membership& membership,
                                        const Hello& hello,
                                        absl::string_view reply) {
  return Mac(membership, hello.from, hello.to, "lockstep data-plane confirm v1",
             {hello.bytes, reply});
}

absl::Status CheckConfirm(const Membership& membership, const Hello& hello,
                          absl::string_view reply, absl::string_view confirm) {
  ASSIGN_OR_RETURN(const std::string expected,
                   MakeConfirm(membership, hello, reply));
  if (SameMac(expected, confirm)) return absl::OkStatus();
  return absl::PermissionDeniedError(
      "its Hello was valid but it could not finish the handshake: a replay "
      "of a member's Hello");
}

absl::StatusOr<std::string> FrameKey(const Membership& membership,
                                     const Hello& hello,
                                     absl::string_view reply, int from,
                                     int to) {
  return Mac(membership, hello.from, hello.to,
             "lockstep data-plane frame key v1",
             {hello.bytes, reply, absl::StrCat(from), absl::StrCat(to)});
}

FrameSealer::FrameSealer(absl::string_view key) {
  if (!key.empty()) cipher_ = std::make_unique<GcmCipher>(key, true);
}
FrameSealer::~FrameSealer() = default;

void FrameSealer::Start(const char* data, size_t bytes) {
  data_ = data;
  size_ = bytes;
  sent_ = 0;
  staged_.clear();
  offset_ = 0;
  plain_ = nullptr;
  plain_left_ = 0;
}

absl::Status FrameSealer::NextFrame() {
  const size_t n = std::min(size_ - sent_, kMaxFramePayload);
  const size_t framed =
      kFrameHeaderSize + (cipher_ != nullptr ? n + kFrameTagSize : 0);
  staged_.resize(framed);
  offset_ = 0;
  char* header = staged_.data();
  PutU64(header, seq_);
  PutU32(header + 8, static_cast<uint32_t>(n));
  PutU32(header + 12, 0);
  if (cipher_ != nullptr) {
    if (!cipher_->Run(seq_, header, data_ + sent_,
                      staged_.data() + kFrameHeaderSize, n,
                      staged_.data() + kFrameHeaderSize + n)) {
      // Nothing of this frame may leave: the connection must be closed.
      staged_.clear();
      offset_ = 0;
      return absl::InternalError(
          absl::StrCat("OpenSSL's AES-256-GCM could not seal frame ", seq_,
                       " (out of memory); the connection is closed"));
    }
  } else {
    plain_ = data_ + sent_;
    plain_left_ = n;
  }
  ++seq_;
  sent_ += n;
  return absl::OkStatus();
}

absl::StatusOr<absl::Span<const char>> FrameSealer::Pending() {
  if (offset_ == staged_.size()) {
    if (plain_left_ > 0) return absl::Span<const char>(plain_, plain_left_);
    if (sent_ == size_) {
      staged_.clear();
      offset_ = 0;
      return absl::Span<const char>();
    }
    RETURN_IF_ERROR(NextFrame());
  }
  return absl::Span<const char>(staged_.data() + offset_,
                                staged_.size() - offset_);
}

void FrameSealer::Advance(size_t n) {
  if (offset_ < staged_.size()) {
    offset_ += n;
  } else {
    plain_ += n;
    plain_left_ -= n;
  }
  if (offset_ == staged_.size() && plain_left_ == 0 && sent_ == size_) {
    staged_.clear();
    offset_ = 0;
  }
}

FrameOpener::FrameOpener(absl::string_view key) {
  if (!key.empty()) cipher_ = std::make_unique<GcmCipher>(key, false);
}
FrameOpener::~FrameOpener() = default;

void FrameOpener::Start(char* data, size_t bytes) {
  data_ = data;
  size_ = bytes;
  received_ = 0;
  filled_ = 0;
  state_ = bytes > 0 ? State::kHeader : State::kIdle;
}

absl::Span<char> FrameOpener::Want() {
  switch (state_) {
    case State::kIdle:
      return {};
    case State::kHeader:
      return {header_.data() + filled_, kFrameHeaderSize - filled_};
    case State::kPayload:
      return {data_ + received_ + filled_, payload_ - filled_};
    case State::kTag:
      return {tag_.data() + filled_, kFrameTagSize - filled_};
  }
  return {};
}

absl::Status FrameOpener::Received(size_t n) {
  filled_ += n;
  switch (state_) {
    case State::kIdle:
      return absl::OkStatus();
    case State::kHeader: {
      if (filled_ < kFrameHeaderSize) return absl::OkStatus();
      const uint64_t seq = GetU64(header_.data());
      const uint32_t length = GetU32(header_.data() + 8);
      const uint32_t reserved = GetU32(header_.data() + 12);
      const size_t left = size_ - received_;
      if (seq != seq_ || reserved != 0 || length == 0 || length > left ||
          length > kMaxFramePayload) {
        return absl::DataLossError(
            absl::StrCat("it sent a malformed frame header (frame ", seq, ", ",
                         length, " bytes; expected frame ", seq_, " of 1 to ",
                         std::min(left, kMaxFramePayload), " bytes)"));
      }
      payload_ = length;
      filled_ = 0;
      state_ = State::kPayload;
      return absl::OkStatus();
    }
    case State::kPayload:
      if (filled_ < payload_) return absl::OkStatus();
      filled_ = 0;
      if (cipher_ != nullptr) {
        state_ = State::kTag;
        return absl::OkStatus();
      }
      break;
    case State::kTag: {
      if (filled_ < kFrameTagSize) return absl::OkStatus();
      char* payload = data_ + received_;
      if (!cipher_->Run(seq_, header_.data(), payload, payload, payload_,
                        tag_.data())) {
        return absl::DataLossError(absl::StrCat(
            "frame ", seq_,
            " failed authentication: it was altered on the way or not sent "
            "by the peer"));
      }
      filled_ = 0;
      break;
    }
  }
  // A frame is complete.
  ++seq_;
  received_ += payload_;
  state_ = received_ == size_ ? State::kIdle : State::kHeader;
  return absl::OkStatus();
}

}  // namespace lockstep::worker
