// What the TFRecord readers (tfrecord.cc, tfrecord_index.cc,
// tfrecord_salvage.cc) share: little-endian loads, the framing's length
// check, whole preads and a descriptor owner. Not for other callers.
#ifndef LOCKSTEP_WORKER_DATA_TFRECORD_INTERNAL_H_
#define LOCKSTEP_WORKER_DATA_TFRECORD_INTERNAL_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "worker/data/tfrecord.h"

namespace lockstep::worker::tfrecord_internal {

// The `bytes`-byte little-endian integer at `p`.
uint64_t LoadLe(const char* p, int bytes);
// A stored or computed CRC as 8 hex digits.
std::string Hex8(uint64_t crc);
// True when `header` (12 bytes) is a TFRecord length and its masked CRC.
bool LengthCrcMatches(const char* header);
// DataLoss naming `what`, `path` and errno.
absl::Status ErrnoStatus(absl::string_view what, const std::string& path);
// Up to `size` bytes at `offset`; fewer only at the end of the file.
absl::StatusOr<size_t> PreadFully(int fd, const std::string& path, char* out,
                                  size_t size, uint64_t offset);
// FailedPrecondition when `index.path` no longer has the size and mtime
// the index recorded when it started.
absl::Status CheckUnchangedSinceIndexed(const TfRecordIndex& index);

// The descriptor of a regular file, closed when this goes.
class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd();
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }
  int release() { return std::exchange(fd_, -1); }

 private:
  int fd_;
};

}  // namespace lockstep::worker::tfrecord_internal

#endif  // LOCKSTEP_WORKER_DATA_TFRECORD_INTERNAL_H_
