// Where a job may make a worker read and write (docs/DESIGN.md §6, "Paths"):
// the roots an operator gives lockstep-worker (--data-root, --backup-root,
// --export-root) and the check of every path a job names against them.
//
// A job's paths come from whoever submitted it, who need not own the worker's
// machine. Each path is made absolute (against the worker's working folder),
// and resolved as the kernel would: "." and ".." step through the folders
// that exist, a symbolic link among them is followed to its target, and the
// part that does not exist yet is taken as written. The result must be a
// root or lie below one. A dangling symbolic link is refused: creating a file
// through it would create its target wherever it points.
//
// The check runs when a worker gets an assignment; a path swapped for a link
// after it is not caught here, which is why the checkpoint files are also
// opened without following links (checkpoint/store.h).
//
// Thread-compatible; the functions read only the filesystem.
#ifndef LOCKSTEP_COMMON_PATH_POLICY_H_
#define LOCKSTEP_COMMON_PATH_POLICY_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/export_file.h"
#include "lockstep/v1/job.pb.h"

namespace lockstep {

// The folders a worker lets jobs use, by kind of path. Each list is what the
// operator gave, in order; empty means nothing of that kind is allowed.
struct PathRoots {
  std::vector<std::string> data;     // data.dir, model.torchscript
  std::vector<std::string> backup;   // checkpoint.backup_dir
  std::vector<std::string> exports;  // export
};

// The documented defaults: data under /usr/share/datasets (Debian's
// dataset-fashion-mnist), /var/lib/lockstep and the temporary folder;
// backups and exports under /var/lib/lockstep and the temporary folder.
// The temporary folder is $TMPDIR, else /tmp.
PathRoots DefaultPathRoots();

// Splits a flag's values ("a:b", given once or more) into roots; empty
// entries are skipped. InvalidArgument for a relative root, naming `flag`.
absl::StatusOr<std::vector<std::string>> ParseRoots(
    const std::vector<std::string>& values, const std::string& flag);

// `path` made absolute against `cwd` and resolved as described above.
// InvalidArgument for an empty path, a path holding a control character
// (NUL included) or a dangling link; FailedPrecondition
// when a folder on the way cannot be inspected.
absl::StatusOr<std::string> ResolvePath(const std::string& path,
                                        const std::string& cwd);

// Whether a path may be a root itself (a folder: data.dir, backup_dir) or
// must lie strictly below one (a file that is replaced: export).
enum class RootMatch { kRootOrBelow, kStrictlyBelow };

// `path` resolved, when it is one of `roots` (resolved) or lies below one
// (strictly below for kStrictlyBelow). InvalidArgument, naming the field,
// for a path holding a control character (a NUL would end the path every
// system call sees). PermissionDenied otherwise, naming the field, the path,
// what it resolved to, the roots and `flag`, the worker option that would
// allow it.
absl::StatusOr<std::string> CheckUnderRoots(
    const std::string& field, const std::string& path,
    const std::vector<std::string>& roots, const std::string& flag,
    const std::string& cwd, RootMatch match = RootMatch::kRootOrBelow);

// Checks every path `spec` names: data.dir (its default when empty),
// model.torchscript, checkpoint.backup_dir and export (strictly below an
// export root: the root itself is a folder, never an export, and one that
// another submitter's job exported is not replaced by `owner`'s: see
// common/export_file.h). The first violation, as CheckUnderRoots reports
// it.
absl::Status CheckJobPaths(const v1::JobSpec& spec, const PathRoots& roots,
                           const std::string& cwd, const ExportOwner& owner);

// The worker's working folder, for the functions above ("/" when it cannot
// be read).
std::string CurrentDirectory();

}  // namespace lockstep

#endif  // LOCKSTEP_COMMON_PATH_POLICY_H_
