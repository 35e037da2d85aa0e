// A file mapped read-only into memory: data sets are read in place, so a
// worker's resident memory does not grow with them (the pages are the page
// cache's, dropped under memory pressure and shared by the workers of one
// machine).
//
// Thread-safe after Open: the mapping is immutable.
#ifndef LOCKSTEP_WORKER_DATA_MAPPED_FILE_H_
#define LOCKSTEP_WORKER_DATA_MAPPED_FILE_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace lockstep::worker {

class MappedFile {
 public:
  // Maps the regular file at `path`. Errors: NotFound or
  // FailedPrecondition naming the path.
  static absl::StatusOr<std::unique_ptr<MappedFile>> Open(
      const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::string& path() const { return path_; }
  int64_t size() const { return size_; }
  absl::string_view bytes() const {
    return absl::string_view(data_, static_cast<size_t>(size_));
  }
  const char* data() const { return data_; }
  // The file's modification time when it was mapped.
  int64_t mtime_ns() const { return mtime_ns_; }
  // Tells the kernel samples will be read in no order (no readahead: a
  // fault reads its page, not the 128 KiB after it) or in order. Advisory:
  // a failure changes nothing but speed.
  enum class Access { kRandom, kSequential };
  void Advise(Access access) const;

 private:
  MappedFile(std::string path, const char* data, int64_t size, int64_t mtime)
      : path_(std::move(path)), data_(data), size_(size), mtime_ns_(mtime) {}

  const std::string path_;
  const char* const data_;  // null for an empty file
  const int64_t size_;
  const int64_t mtime_ns_;
};

}  // namespace lockstep::worker

#endif  // LOCKSTEP_WORKER_DATA_MAPPED_FILE_H_
