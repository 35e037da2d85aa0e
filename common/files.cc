// Reading and writing whole files durably, and creating and removing
// directories (files.h).
#include "common/files.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <system_error>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/status_macros.h"

namespace lockstep {
namespace {

absl::Status ErrnoError(absl::string_view what, const std::string& path) {
  return absl::Status(errno == ENOENT ? absl::StatusCode::kNotFound
                                      : absl::StatusCode::kFailedPrecondition,
                      absl::StrCat(what, " ", path, ": ", strerror(errno)));
}

std::string ParentDirectory(const std::string& path) {
  size_t slash = path.find_last_of('/');
  if (slash == std::string::npos) return ".";
  if (slash == 0) return "/";
  return path.substr(0, slash);
}

absl::Status FsyncPath(const std::string& path, int flags) {
  int fd = open(path.c_str(), flags);
  if (fd < 0) return ErrnoError("cannot open", path);
  int rc = fsync(fd);
  close(fd);
  if (rc != 0) return ErrnoError("cannot fsync", path);
  return absl::OkStatus();
}

absl::Status FilesystemError(absl::string_view what,
                             const std::filesystem::path& path,
                             const std::error_code& error) {
  return absl::FailedPreconditionError(
      absl::StrCat(what, " ", path.string(), ": ", error.message()));
}

}  // namespace

absl::StatusOr<std::string> ReadFileToString(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return ErrnoError("cannot read", path);
  std::ostringstream contents;
  contents << in.rdbuf();
  if (in.bad()) return ErrnoError("error reading", path);
  return contents.str();
}

absl::StatusOr<int> OpenRegularFile(const std::string& path, int64_t* size) {
  // O_NONBLOCK: opening a FIFO for reading would wait for a writer.
  int fd = open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ELOOP) {
      return absl::DataLossError(absl::StrCat(
          path, " is a symbolic link, not a file; it is not followed"));
    }
    return ErrnoError("cannot open", path);
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return absl::DataLossError(
        absl::StrCat(path,
                     " is not a regular file (a device, a FIFO or a "
                     "folder); it is not read"));
  }
  *size = static_cast<int64_t>(st.st_size);
  return fd;
}

absl::StatusOr<std::string> ReadRegularFile(const std::string& path,
                                            int64_t max_bytes) {
  int64_t size = 0;
  ASSIGN_OR_RETURN(int fd, OpenRegularFile(path, &size));
  if (size > max_bytes) {
    close(fd);
    return absl::DataLossError(absl::StrCat(path, " has ", size,
                                            " bytes; at most ", max_bytes,
                                            " are expected there"));
  }
  std::string contents(static_cast<size_t>(size), '\0');
  size_t done = 0;
  while (done < contents.size()) {
    ssize_t n = read(fd, contents.data() + done, contents.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      absl::Status status =
          n < 0 ? ErrnoError("error reading", path)
                : absl::DataLossError(absl::StrCat(path, " shrank while read"));
      close(fd);
      return status;
    }
    done += static_cast<size_t>(n);
  }
  close(fd);
  return contents;
}

namespace {

// Writes `contents` to the open `fd` (named `path` in errors), fsyncs it and
// closes it, whatever happens.
absl::Status WriteAndClose(int fd, const std::string& path,
                           absl::string_view contents) {
  // Chunks, each handed to writeback as soon as it is written: the disk works
  // while the next chunk is copied, and the final fsync has little left.
  constexpr size_t kChunk = size_t{1} << 20;
  const char* data = contents.data();
  size_t left = contents.size();
  off_t offset = 0;
  while (left > 0) {
    ssize_t n = write(fd, data, std::min(left, kChunk));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      absl::Status status = ErrnoError("cannot write", path);
      close(fd);
      return status;
    }
    (void)sync_file_range(fd, offset, n, SYNC_FILE_RANGE_WRITE);
    data += n;
    offset += n;
    left -= static_cast<size_t>(n);
  }
  if (fsync(fd) != 0) {
    absl::Status status = ErrnoError("cannot fsync", path);
    close(fd);
    return status;
  }
  if (close(fd) != 0) return ErrnoError("cannot close", path);
  return absl::OkStatus();
}

// A temporary file beside `path` that this call created: "<path>.tmp.<16
// random hex digits>", opened with O_EXCL and O_NOFOLLOW, so a file or link
// another user planted under the name (in /tmp, say) is never written
// through; a name taken is retried with another suffix.
absl::StatusOr<int> CreateTemporaryBeside(const std::string& path, mode_t mode,
                                          std::string* tmp) {
  static thread_local std::mt19937_64 random(std::random_device{}() ^
                                             static_cast<uint64_t>(getpid()));
  for (int attempt = 0; attempt < 16; ++attempt) {
    *tmp = absl::StrFormat("%s.tmp.%016x", path, random());
    int fd = open(tmp->c_str(),
                  O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
    if (fd >= 0) return fd;
    if (errno != EEXIST) return ErrnoError("cannot create", *tmp);
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "cannot create a temporary file beside ", path,
      ": 16 random names were all taken; clear out the files named ", path,
      ".tmp.* there"));
}

}  // namespace

absl::Status WriteFileDurably(const std::string& path,
                              absl::string_view contents) {
  int fd = open(path.c_str(),
                O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError("cannot create", path);
  return WriteAndClose(fd, path, contents);
}

absl::Status FsyncDirectory(const std::string& path) {
  return FsyncPath(path, O_RDONLY | O_DIRECTORY);
}

absl::Status WriteFileAtomically(const std::string& path,
                                 absl::string_view contents, mode_t mode) {
  std::string tmp;
  ASSIGN_OR_RETURN(int fd, CreateTemporaryBeside(path, mode, &tmp));
  absl::Status written = WriteAndClose(fd, tmp, contents);
  if (!written.ok()) {
    unlink(tmp.c_str());
    return written;
  }
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    absl::Status status = ErrnoError("cannot rename into", path);
    unlink(tmp.c_str());
    return status;
  }
  return FsyncPath(ParentDirectory(path), O_RDONLY | O_DIRECTORY);
}

absl::Status MakeDirectories(const std::string& path) {
  if (path.empty()) return absl::OkStatus();
  std::string prefix;
  size_t pos = 0;
  while (pos != std::string::npos) {
    pos = path.find('/', pos + 1);
    prefix = path.substr(0, pos);
    if (prefix.empty()) continue;
    if (mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) {
      return ErrnoError("cannot create directory", prefix);
    }
  }
  struct stat st;
  if (stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, " exists and is not a directory"));
  }
  return absl::OkStatus();
}

bool PathExists(const std::string& path) {
  struct stat st;
  return stat(path.c_str(), &st) == 0;
}

absl::Status RemoveRecursively(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code error;
  // lstat: a link is an entry like a file, whatever it points to.
  const fs::file_status status = fs::symlink_status(path, error);
  if (status.type() == fs::file_type::not_found) return absl::OkStatus();
  if (error) return FilesystemError("cannot inspect", path, error);
  if (status.type() == fs::file_type::directory) {
    // Listed first, removed after: no removal while the folder is read.
    std::vector<fs::path> children;
    for (fs::directory_iterator it(path, error), end; !error && it != end;
         it.increment(error)) {
      children.push_back(it->path());
    }
    if (error) return FilesystemError("cannot list", path, error);
    for (const fs::path& child : children) {
      RETURN_IF_ERROR(RemoveRecursively(child.string()));
    }
  }
  if (!fs::remove(path, error) && error) {
    return FilesystemError("cannot remove", path, error);
  }
  return absl::OkStatus();
}

}  // namespace lockstep
