// A committed checkpoint as one ustar file (archive.h).
#include "checkpoint/archive.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "checkpoint/store_names.h"
#include "common/files.h"
#include "common/status_macros.h"

namespace lockstep::checkpoint {
namespace {

constexpr size_t kBlock = 512;
// ustar's size field: 11 octal digits.
constexpr int64_t kMaxEntryBytes = (int64_t{1} << 33) - 1;
// ustar's name field, without a prefix.
constexpr size_t kMaxEntryName = 99;

// Writes `bytes` whole to `fd`. Errors: Internal naming `path`.
absl::Status WriteAll(int fd, const std::string& path, const char* bytes,
                      size_t size) {
  while (size > 0) {
    const ssize_t wrote = write(fd, bytes, size);
    if (wrote < 0 && errno == EINTR) continue;
    if (wrote <= 0) {
      return absl::InternalError(
          absl::StrCat("cannot write the checkpoint archive ", path, ": ",
                       wrote < 0 ? std::strerror(errno) : "nothing written"));
    }
    bytes += wrote;
    size -= static_cast<size_t>(wrote);
  }
  return absl::OkStatus();
}

// Octal digits of `value` in field [offset, offset + width): width - 1
// digits and a NUL.
void Octal(char* header, size_t offset, size_t width, int64_t value) {
  const std::string digits =
      absl::StrFormat("%0*o", static_cast<int>(width - 1),
                      static_cast<unsigned long long>(value));
  std::memcpy(header + offset, digits.data(), width - 1);
  header[offset + width - 1] = '\0';
}

// The 512-byte ustar header of an entry: a regular file of `size` bytes,
// or (`directory`) a folder.
std::string Header(const std::string& name, int64_t size, int64_t mtime,
                   bool directory) {
  std::string header(kBlock, '\0');
  char* h = header.data();
  std::memcpy(h, name.data(), name.size());
  Octal(h, 100, 8, directory ? 0700 : 0600);
  Octal(h, 108, 8, 0);  // uid
  Octal(h, 116, 8, 0);  // gid
  Octal(h, 124, 12, size);
  Octal(h, 136, 12, mtime);
  h[156] = directory ? '5' : '0';
  std::memcpy(h + 257, "ustar", 6);  // magic with its NUL
  std::memcpy(h + 263, "00", 2);     // version
  // The checksum: the header's bytes summed with its own field as spaces.
  std::memset(h + 148, ' ', 8);
  unsigned sum = 0;
  for (unsigned char c : header) sum += c;
  const std::string checksum = absl::StrFormat("%06o", sum);
  std::memcpy(h + 148, checksum.data(), 6);
  h[154] = '\0';
  h[155] = ' ';
  return header;
}

class TarWriter {
 public:
  TarWriter(int fd, std::string path, int64_t mtime)
      : fd_(fd), path_(std::move(path)), mtime_(mtime) {}

  absl::Status Directory(const std::string& name) {
    const std::string header = Header(name + "/", 0, mtime_, true);
    return WriteAll(fd_, path_, header.data(), header.size());
  }

  absl::Status File(const std::string& name, const std::string& bytes) {
    if (name.size() > kMaxEntryName) {
      return absl::InvalidArgumentError(absl::StrCat(
          "checkpoint file ", name, " has a name of ", name.size(),
          " bytes; an archive entry holds at most ", kMaxEntryName));
    }
    if (static_cast<int64_t>(bytes.size()) > kMaxEntryBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "checkpoint file ", name, " has ", bytes.size(),
          " bytes; an archive entry holds less than 8 GiB, so this "
          "checkpoint cannot be uploaded; copy its folder instead"));
    }
    const std::string header =
        Header(name, static_cast<int64_t>(bytes.size()), mtime_, false);
    RETURN_IF_ERROR(WriteAll(fd_, path_, header.data(), header.size()));
    RETURN_IF_ERROR(WriteAll(fd_, path_, bytes.data(), bytes.size()));
    const std::string padding((kBlock - bytes.size() % kBlock) % kBlock, '\0');
    return WriteAll(fd_, path_, padding.data(), padding.size());
  }

  // Two zero blocks end the archive.
  absl::Status End() {
    const std::string end(2 * kBlock, '\0');
    return WriteAll(fd_, path_, end.data(), end.size());
  }

 private:
  const int fd_;
  const std::string path_;
  const int64_t mtime_;
};

}  // namespace

std::string ArchiveName(int64_t step) {
  return absl::StrCat(CheckpointName(step), ".tar");
}

absl::Status WriteArchive(const Found& found, const std::string& path) {
  const std::string name = CheckpointName(found.manifest.step());
  ASSIGN_OR_RETURN(
      const std::string manifest,
      ReadRegularFile(Join(found.dir, kManifestName), kMaxManifestBytes));
  const int fd =
      open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW,
           0600);
  if (fd < 0) {
    return absl::InternalError(
        absl::StrCat("cannot write the checkpoint archive ", path, ": ",
                     std::strerror(errno)));
  }
  TarWriter tar(fd, path, static_cast<int64_t>(found.manifest.time()));
  absl::Status written = [&]() -> absl::Status {
    RETURN_IF_ERROR(tar.Directory(name));
    for (const v1::CheckpointFile& file : found.manifest.files()) {
      ASSIGN_OR_RETURN(const std::string bytes,
                       ReadCheckpointFile(found, file.name()));
      RETURN_IF_ERROR(tar.File(Join(name, file.name()), bytes));
    }
    RETURN_IF_ERROR(tar.File(Join(name, kManifestName), manifest));
    RETURN_IF_ERROR(tar.File(kLatestName, name + "\n"));
    return tar.End();
  }();
  if (close(fd) != 0 && written.ok()) {
    written =
        absl::InternalError(absl::StrCat("cannot write the checkpoint archive ",
                                         path, ": ", std::strerror(errno)));
  }
  return written;
}

}  // namespace lockstep::checkpoint
