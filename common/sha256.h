// SHA-256 hex digests, incremental or of one string: the checksums of
// checkpoint files and the digest of a model's weights.
#ifndef LOCKSTEP_COMMON_SHA256_H_
#define LOCKSTEP_COMMON_SHA256_H_

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace lockstep {

// Incremental SHA-256 (OpenSSL underneath). Not thread-safe.
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;

  void Update(const void* data, size_t size);
  void Update(absl::string_view data) { Update(data.data(), data.size()); }
  // The lower-case hex digest of everything given to Update. Errors:
  // Internal when OpenSSL failed at any step (out of memory): never an
  // empty or partial digest that could pass for a real one. The object must
  // not be used afterwards.
  absl::StatusOr<std::string> HexDigest();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The same for one string.
absl::StatusOr<std::string> Sha256Hex(absl::string_view data);

}  // namespace lockstep

#endif  // LOCKSTEP_COMMON_SHA256_H_
