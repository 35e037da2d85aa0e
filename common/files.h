// File helpers with the durability rules lockstep relies on: a write that
// must survive a crash goes to a temporary file, is fsynced, renamed over the
// target, and the directory is fsynced.
#ifndef LOCKSTEP_COMMON_FILES_H_
#define LOCKSTEP_COMMON_FILES_H_

#include <sys/types.h>

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace lockstep {

absl::StatusOr<std::string> ReadFileToString(const std::string& path);

// Opens `path` for reading only if it is a regular file: a symbolic link is
// not followed and a device or FIFO is refused without blocking. Returns the
// descriptor (the caller closes it) and its size in `*size`. Errors: NotFound
// when it is missing, DataLoss when it is something else.
absl::StatusOr<int> OpenRegularFile(const std::string& path, int64_t* size);

// The contents of `path`, opened as OpenRegularFile does, when it holds at
// most `max_bytes`; DataLoss naming the bound otherwise. For files that
// another process or a job's submitter may have put there.
absl::StatusOr<std::string> ReadRegularFile(const std::string& path,
                                            int64_t max_bytes);

// Atomically replaces `path` with `contents` (write temp, fsync, rename,
// fsync the parent directory). A crash leaves either the old or new file.
// The temporary file, "<path>.tmp.<random>", is created with O_EXCL and
// O_NOFOLLOW: a name someone else made first (in /tmp, say) is never
// written through, another is tried. The file is created with `mode` (less
// the umask) before anything is written: 0600 keeps a private key unread.
absl::Status WriteFileAtomically(const std::string& path,
                                 absl::string_view contents,
                                 mode_t mode = 0644);

// Writes `contents` to `path` (created or truncated) and fsyncs the file, not
// the directory: for files inside a folder that is fsynced and renamed into
// place as a whole.
absl::Status WriteFileDurably(const std::string& path,
                              absl::string_view contents);

// fsync of a directory, so the entries created or renamed in it survive a
// crash.
absl::Status FsyncDirectory(const std::string& path);

// mkdir -p.
absl::Status MakeDirectories(const std::string& path);

bool PathExists(const std::string& path);

// rm -rf: removes `path` and, when it is a folder, everything in it. A
// symbolic link is removed, never followed, so nothing outside `path` is
// touched. A missing `path` is not an error. Errors name the entry that could
// not be listed or removed; what could be removed is gone.
absl::Status RemoveRecursively(const std::string& path);

}  // namespace lockstep

#endif  // LOCKSTEP_COMMON_FILES_H_
