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
// Version 2 names the job; version 1 markers (before it) are refused.
constexpr char kMarkerHeader[] = "lockstep export 2";
constexpr char kAnyMarker[] = "lockstep export ";
constexpr int64_t kMaxMarkerBytes = 1024;

// The marker's lines before the size and the hash.
std::string OwnerLines(const ExportOwner& owner) {
  return absl::StrCat(kMarkerHeader, "\njob ", owner.job_id, "\nsubmitted_by ",
                      owner.submitted_by, "\n");
}

std::string MarkerOf(const ExportOwner& owner, int64_t size,
                     const std::string& sha256) {
  return absl::StrCat(OwnerLines(owner), "size ", size, "\nsha256 ", sha256,
                      "\n");
}

// The value of a marker's line `key` ("" when absent).
std::string MarkerField(absl::string_view marker, absl::string_view key) {
  const std::string prefix = absl::StrCat("\n", key, " ");
  const size_t at = marker.find(prefix);
  if (at == absl::string_view::npos) return "";
  const size_t start = at + prefix.size();
  const size_t end = marker.find('\n', start);
  if (end == absl::string_view::npos) return "";
  return std::string(marker.substr(start, end - start));
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

absl::Status CheckExportTarget(const std::string& path,
                               const ExportOwner& owner) {
  // The marker's own path must not hold someone else's file either.
  const std::string marker_path = ExportMarkerPath(path);
  auto marker = ReadRegularFile(marker_path, kMaxMarkerBytes);
  struct stat st;
  if (!marker.ok() && lstat(marker_path.c_str(), &st) == 0) {
    return NotOurs(path, absl::StrCat("has a file beside it, ", marker_path,
                                      ", that is not lockstep's marker"));
  }
  if (marker.ok() && !absl::StartsWith(*marker, kAnyMarker)) {
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
  if (!absl::StartsWith(*marker, kMarkerHeader)) {
    return NotOurs(path,
                   "was exported by an earlier lockstep, whose marker does "
                   "not name the job that made it");
  }
  const std::string submitted_by = MarkerField(*marker, "submitted_by");
  if (submitted_by != owner.submitted_by) {
    auto who = [](const std::string& id) {
      return id.empty() ? std::string("nobody (--insecure)") : id;
    };
    return NotOurs(
        path, absl::StrCat("is the export of job ", MarkerField(*marker, "job"),
                           ", submitted by ", who(submitted_by),
                           "; only a job of the same submitter "
                           "replaces it (job ",
                           owner.job_id, " was submitted by ",
                           who(owner.submitted_by), ")"));
  }
  // The size first: a file of another size is refused without reading it
  // (it may be large, and is not ours either way).
  const int64_t found_size = static_cast<int64_t>(st.st_size);
  // The marker's own job: a job of the same submitter may replace it.
  const ExportOwner recorded = {MarkerField(*marker, "job"), submitted_by};
  if (!absl::StartsWith(*marker, absl::StrCat(OwnerLines(recorded), "size ",
                                              found_size, "\nsha256 "))) {
    return NotOurs(path, absl::StrCat("exists and is no longer the model "
                                      "lockstep exported there (it has ",
                                      found_size,
                                      " bytes, not the size its marker "
                                      "records)"));
  }
  int64_t size = 0;
  auto sha256 = HashRegularFile(path, &size);
  if (!sha256.ok() || *marker != MarkerOf(recorded, size, *sha256)) {
    return NotOurs(path,
                   "exists and is no longer the model lockstep exported "
                   "there (its bytes changed)");
  }
  return absl::OkStatus();
}

absl::Status WriteExport(const std::string& path, absl::string_view bytes,
                         const ExportOwner& owner) {
  RETURN_IF_ERROR(CheckExportTarget(path, owner));
  RETURN_IF_ERROR(WriteFileAtomically(path, bytes));
  ASSIGN_OR_RETURN(std::string digest, Sha256Hex(bytes));
  return WriteFileAtomically(
      ExportMarkerPath(path),
      MarkerOf(owner, static_cast<int64_t>(bytes.size()), digest));
}

}  // namespace lockstep
