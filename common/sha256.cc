// SHA-256 through OpenSSL's EVP digest interface (sha256.h).
#include "common/sha256.h"

#include <openssl/evp.h>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace lockstep {

struct Sha256::Impl {
  EVP_MD_CTX* ctx = nullptr;
  // The first OpenSSL call that failed, if any; every later one is skipped.
  const char* failed = nullptr;
};

Sha256::Sha256() : impl_(std::make_unique<Impl>()) {
  impl_->ctx = EVP_MD_CTX_new();
  if (impl_->ctx == nullptr) {
    impl_->failed = "EVP_MD_CTX_new";
  } else if (EVP_DigestInit_ex(impl_->ctx, EVP_sha256(), nullptr) != 1) {
    impl_->failed = "EVP_DigestInit_ex";
  }
}

Sha256::~Sha256() { EVP_MD_CTX_free(impl_->ctx); }

void Sha256::Update(const void* data, size_t size) {
  if (impl_->failed != nullptr || size == 0) return;
  if (EVP_DigestUpdate(impl_->ctx, data, size) != 1) {
    impl_->failed = "EVP_DigestUpdate";
  }
}

absl::StatusOr<std::string> Sha256::HexDigest() {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (impl_->failed == nullptr &&
      (EVP_DigestFinal_ex(impl_->ctx, digest, &length) != 1 || length != 32)) {
    impl_->failed = "EVP_DigestFinal_ex";
  }
  if (impl_->failed != nullptr) {
    return absl::InternalError(
        absl::StrCat("SHA-256 failed in OpenSSL's ", impl_->failed,
                     " (out of memory?); no digest was computed"));
  }
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(digest), length));
}

absl::StatusOr<std::string> Sha256Hex(absl::string_view data) {
  Sha256 hash;
  hash.Update(data);
  return hash.HexDigest();
}

}  // namespace lockstep
