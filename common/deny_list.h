// Revoked identities: `--deny-identities FILE`, one SPIFFE ID a line
// (`spiffe://lockstep/worker/worker/3`), blank lines and `#` comments
// ignored. A certificate whose SPIFFE ID is listed is treated as no
// certificate at all: its calls are refused as unauthenticated, and a
// worker of that identity loses its session (Coordinator::Sweep).
//
// The file is read at start (an error there stops the daemon) and again
// whenever its size, modification time or inode changes, looked at no more
// than once per `recheck` on the injected clock: an operator revokes an
// identity by editing the file (or a ConfigMap mounted there), without a
// restart and without waiting for the certificate to expire. A later
// version that cannot be read or is malformed keeps the last good list and
// is logged once per version.
//
// Thread-safe.
#ifndef LOCKSTEP_COMMON_DENY_LIST_H_
#define LOCKSTEP_COMMON_DENY_LIST_H_

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <set>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/clock.h"

namespace lockstep {

class DenyList {
 public:
  // At most this many bytes and identities: a revocation list, not a
  // directory of users.
  static constexpr int64_t kMaxBytes = 1 << 20;
  static constexpr size_t kMaxIdentities = 10000;

  // Reads `path`. `clock` must outlive the list. Errors: FailedPrecondition
  // naming the file (and the line) when it cannot be read, is too large, or
  // holds a line that is not a spiffe:// ID.
  static absl::StatusOr<std::unique_ptr<DenyList>> Open(
      const std::string& path, const Clock* clock,
      absl::Duration recheck = absl::Seconds(1));

  // Whether `spiffe_id` is revoked, after reading the file again if it
  // changed (see above).
  bool Denies(absl::string_view spiffe_id) ABSL_LOCKS_EXCLUDED(mu_);

  // How many identities the list holds now.
  size_t size() const ABSL_LOCKS_EXCLUDED(mu_);

  // The identities of `text` (the file's contents). Errors:
  // FailedPrecondition naming `path` and the line.
  static absl::StatusOr<std::set<std::string>> Parse(const std::string& path,
                                                     absl::string_view text);

 private:
  // What identifies a version of the file.
  struct Version {
    dev_t device = 0;
    ino_t inode = 0;
    int64_t size = -1;
    int64_t mtime_ns = -1;
    bool operator==(const Version& other) const {
      return device == other.device && inode == other.inode &&
             size == other.size && mtime_ns == other.mtime_ns;
    }
  };

  DenyList(std::string path, const Clock* clock, absl::Duration recheck)
      : path_(std::move(path)), clock_(clock), recheck_(recheck) {}

  // Reads the file if its version changed. `initial`: errors are returned
  // rather than logged.
  absl::Status ReloadLocked(bool initial) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string path_;
  const Clock* const clock_;
  const absl::Duration recheck_;
  mutable absl::Mutex mu_;
  std::set<std::string, std::less<>> ids_ ABSL_GUARDED_BY(mu_);
  Version version_ ABSL_GUARDED_BY(mu_);
  // The version last tried (good or bad), so a bad one is logged once.
  Version tried_ ABSL_GUARDED_BY(mu_);
  absl::Time checked_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace lockstep

#endif  // LOCKSTEP_COMMON_DENY_LIST_H_
