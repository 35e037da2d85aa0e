// Read-only mappings of data files (mapped_file.h).
#include "worker/data/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace lockstep::worker {

absl::StatusOr<std::unique_ptr<MappedFile>> MappedFile::Open(
    const std::string& path) {
  // O_NONBLOCK: a FIFO in its place must not block the open; it is
  // refused below as not a regular file.
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    const int error = errno;
    const std::string message =
        absl::StrCat("cannot open ", path, ": ", std::strerror(error));
    return error == ENOENT ? absl::NotFoundError(message)
                           : absl::FailedPreconditionError(message);
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat(path, " is not a regular file"));
  }
  const int64_t size = st.st_size;
  const int64_t mtime =
      int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
  const char* data = nullptr;
  if (size > 0) {
    void* mapped =
        mmap(nullptr, static_cast<size_t>(size), PROT_READ, MAP_SHARED, fd, 0);
    if (mapped == MAP_FAILED) {
      const int error = errno;
      close(fd);
      return absl::FailedPreconditionError(
          absl::StrCat("cannot map ", path, ": ", std::strerror(error)));
    }
    data = static_cast<const char*>(mapped);
  }
  close(fd);  // the mapping keeps the file
  return std::unique_ptr<MappedFile>(new MappedFile(path, data, size, mtime));
}

void MappedFile::Advise(Access access) const {
  if (data_ == nullptr) return;
  (void)madvise(const_cast<char*>(data_), static_cast<size_t>(size_),
                access == Access::kRandom ? MADV_RANDOM : MADV_SEQUENTIAL);
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) {
    munmap(const_cast<char*>(data_), static_cast<size_t>(size_));
  }
}

}  // namespace lockstep::worker
