// Writing the exported model and recognising a previous lockstep export by
// its marker (export_file.h).
#include "common/export_file.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/files.h"
#include "common/sha256.h"
#include "common/status_macros.h"

namespace lockstep {
namespace {

constexpr char kMarkerSuffix[] = ".lockstep";
constexpr char kMarkerHeader[] = "lockstep export 1";
constexpr int64_t kMaxMarkerBytes = 1024;

std::string MarkerOf(int64_t size, const std::string& sha256) {
  return absl::StrCat(kMarkerHeader, "\nsize ", size, "\nsha256 ", sha256,
                      "\n");
}

// The SHA-256 of the regular file `path` (not followed if a link).
absl::StatusOr<std::string> HashRegularFile(const std::string& path,
                                            int64_t* size) {
  ASSIGN_OR_RETURN(int fd, OpenRegularFile(path, size));
  Sha256 sha;
  std::vector<char> buffer(1 << 20);
  while (true) {
    ssize_t n = read(fd, buffer.data(), buffer.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      close(fd);
      if (n < 0) {
        return absl::FailedPreconditionError(
            absl::StrCat("error reading ", path, ": ", strerror(errno)));
      }
      return sha.HexDigest();
    }
    sha.Update(buffer.data(), static_cast<size_t>(n));
  }
}

absl::Status NotOurs(const std::string& path, absl::string_view what) {
  return absl::FailedPreconditionError(absl::StrCat(
      "export ", path, " ", what,
      "; lockstep replaces only a model it exported there itself (recorded in ",
      ExportMarkerPath(path),
      "): choose another export path, or move that file away"));
}

}  // namespace

std::string ExportMarkerPath(const std::string& path) {
  return path + kMarkerSuffix;
}

absl::Status CheckExportTarget(const std::string& path) {
  // The marker's own path must not hold someone else's file either.
  const std::string marker_path = ExportMarkerPath(path);
  auto marker = ReadRegularFile(marker_path, kMaxMarkerBytes);
  struct stat st;
  if (!marker.ok() && lstat(marker_path.c_str(), &st) == 0) {
    return NotOurs(path, absl::StrCat("has a file beside it, ", marker_path,
                                      ", that is not lockstep's marker"));
  }
  if (marker.ok() && !absl::StartsWith(*marker, kMarkerHeader)) {
    return NotOurs(path, absl::StrCat("has a file beside it, ", marker_path,
                                      ", that is not lockstep's marker"));
  }
  if (lstat(path.c_str(), &st) != 0) {
    if (errno == ENOENT || errno == ENOTDIR) return absl::OkStatus();
    return absl::FailedPreconditionError(
        absl::StrCat("cannot inspect export ", path, ": ", strerror(errno)));
  }
  if (S_ISLNK(st.st_mode)) return NotOurs(path, "is a symbolic link");
  if (!S_ISREG(st.st_mode)) return NotOurs(path, "is not a regular file");
  if (!marker.ok()) {
    return NotOurs(path, "exists and is not a lockstep export");
  }
  // The size first: a file of another size is refused without reading it
  // (it may be large, and is not ours either way).
  const int64_t found_size = static_cast<int64_t>(st.st_size);
  if (!absl::StartsWith(*marker, absl::StrCat(kMarkerHeader, "\nsize ",
                                              found_size, "\nsha256 "))) {
    return NotOurs(path, absl::StrCat("exists and is no longer the model "
                                      "lockstep exported there (it has ",
                                      found_size,
                                      " bytes, not the size its marker "
                                      "records)"));
  }
  int64_t size = 0;
  auto sha256 = HashRegularFile(path, &size);
  if (!sha256.ok() || *marker != MarkerOf(size, *sha256)) {
    return NotOurs(path,
                   "exists and is no longer the model lockstep exported "
                   "there (its bytes changed)");
  }
  return absl::OkStatus();
}

absl::Status WriteExport(const std::string& path, absl::string_view bytes) {
  RETURN_IF_ERROR(CheckExportTarget(path));
  RETURN_IF_ERROR(WriteFileAtomically(path, bytes));
  Sha256 sha;
  sha.Update(bytes);
  return WriteFileAtomically(
      ExportMarkerPath(path),
      MarkerOf(static_cast<int64_t>(bytes.size()), sha.HexDigest()));
}

}  // namespace lockstep
