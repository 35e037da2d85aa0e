#include "common/deny_list.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <utility>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/log.h"

namespace lockstep {
namespace {

absl::Status FileError(const std::string& path, absl::string_view what) {
  return absl::FailedPreconditionError(
      absl::StrCat("--deny-identities ", path, ": ", what));
}

// The file's contents and version. The operator names the file, so a link
// is followed (a ConfigMap's files are links), but it must end at a regular
// file of at most kMaxBytes.
absl::StatusOr<std::string> ReadDenyFile(const std::string& path,
                                         struct stat* st) {
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    return FileError(path, absl::StrCat("cannot open it: ", strerror(errno)));
  }
  std::string text;
  absl::Status status;
  if (fstat(fd, st) != 0 || !S_ISREG(st->st_mode)) {
    status = FileError(path, "is not a regular file");
  } else if (st->st_size > DenyList::kMaxBytes) {
    status = FileError(path, absl::StrCat("holds ", st->st_size,
                                          " bytes; a deny list may hold at "
                                          "most ",
                                          DenyList::kMaxBytes));
  } else {
    text.resize(static_cast<size_t>(st->st_size));
    size_t done = 0;
    while (done < text.size()) {
      const ssize_t n = read(fd, text.data() + done, text.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
    text.resize(done);  // shorter if it shrank while read: the next check
  }
  close(fd);
  if (!status.ok()) return status;
  return text;
}

}  // namespace

absl::StatusOr<std::set<std::string>> DenyList::Parse(const std::string& path,
                                                      absl::string_view text) {
  std::set<std::string> ids;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++line_number;
    const size_t hash = line.find('#');
    if (hash != absl::string_view::npos) line = line.substr(0, hash);
    line = absl::StripAsciiWhitespace(line);
    if (line.empty()) continue;
    // Any spiffe:// ID may be listed (one of another role than lockstep
    // knows is refused anyway); anything else is a mistake worth stopping.
    if (!absl::StartsWith(line, "spiffe://") || line.size() > 2048 ||
        absl::StrContains(line, ' ') || absl::StrContains(line, '\t')) {
      return FileError(path, absl::StrCat("line ", line_number,
                                          " is not a SPIFFE ID; give one "
                                          "spiffe://DOMAIN/ROLE/NAME a line"));
    }
    if (ids.size() == kMaxIdentities) {
      return FileError(path, absl::StrCat("holds more than ", kMaxIdentities,
                                          " identities"));
    }
    ids.emplace(line);
  }
  return ids;
}

absl::StatusOr<std::unique_ptr<DenyList>> DenyList::Open(
    const std::string& path, const Clock* clock, absl::Duration recheck) {
  std::unique_ptr<DenyList> list(new DenyList(path, clock, recheck));
  absl::MutexLock lock(&list->mu_);
  absl::Status loaded = list->ReloadLocked(/*initial=*/true);
  if (!loaded.ok()) return loaded;
  return list;
}

absl::Status DenyList::ReloadLocked(bool initial) {
  checked_ = clock_->Now();
  struct stat st;
  if (stat(path_.c_str(), &st) != 0) {
    absl::Status gone =
        FileError(path_, absl::StrCat("cannot read it: ", strerror(errno)));
    if (initial) return gone;
    if (!(tried_ == Version())) {
      LogWarning(gone.message(), "; keeping the ", ids_.size(),
                 " identities read before");
      tried_ = Version();
    }
    return gone;
  }
  Version now{st.st_dev, st.st_ino, static_cast<int64_t>(st.st_size),
              static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 +
                  st.st_mtim.tv_nsec};
  if (!initial && (now == version_ || now == tried_)) return absl::OkStatus();
  tried_ = now;
  absl::StatusOr<std::string> text = ReadDenyFile(path_, &st);
  absl::StatusOr<std::set<std::string>> ids =
      text.ok() ? Parse(path_, *text)
                : absl::StatusOr<std::set<std::string>>(text.status());
  if (!ids.ok()) {
    if (initial) return ids.status();
    LogWarning(ids.status().message(), "; keeping the ", ids_.size(),
               " identities read before");
    return ids.status();
  }
  if (!initial) {
    LogInfo("--deny-identities ", path_, " changed: ", ids->size(),
            " identities are refused (were ", ids_.size(), ")");
  }
  ids_ = std::set<std::string, std::less<>>(ids->begin(), ids->end());
  version_ = now;
  return absl::OkStatus();
}

bool DenyList::Denies(absl::string_view spiffe_id) {
  absl::MutexLock lock(&mu_);
  if (clock_->Now() - checked_ >= recheck_) {
    ReloadLocked(/*initial=*/false).IgnoreError();
  }
  return ids_.find(spiffe_id) != ids_.end();
}

size_t DenyList::size() const {
  absl::MutexLock lock(&mu_);
  return ids_.size();
}

}  // namespace lockstep
