// The worker's roots and the check of a job's paths against them
// (path_policy.h).
#include "common/path_policy.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>

#include "absl/algorithm/container.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/export_file.h"
#include "common/job_spec.h"
#include "common/status_macros.h"

namespace lockstep {
namespace {

constexpr char kVarLib[] = "/var/lib/lockstep";

std::string TemporaryFolder() {
  const char* tmpdir = std::getenv("TMPDIR");
  return tmpdir != nullptr && tmpdir[0] == '/' ? tmpdir : "/tmp";
}

std::string ParentOf(const std::string& resolved) {
  size_t slash = resolved.find_last_of('/');
  return slash == 0 || slash == std::string::npos ? "/"
                                                  : resolved.substr(0, slash);
}

std::string Child(const std::string& dir, const std::string& name) {
  return dir == "/" ? "/" + name : dir + "/" + name;
}

bool IsUnder(const std::string& path, const std::string& root,
             RootMatch match) {
  if (path == root) return match == RootMatch::kRootOrBelow;
  return root == "/" || absl::StartsWith(path, root + "/");
}

// Every system call stops at a NUL while the walk in ResolvePath would not:
// "/etc\0/../tmp" would resolve to /tmp and then act on /etc.
absl::Status CheckNoControlCharacter(const std::string& path) {
  for (size_t i = 0; i < path.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(path[i]);
    if (c < 0x20 || c == 0x7f) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "the path holds a control character (byte 0x%02x at offset %d)", c,
          i));
    }
  }
  return absl::OkStatus();
}

std::string RootsText(const std::vector<std::string>& roots) {
  return roots.empty() ? "none" : absl::StrJoin(roots, ", ");
}

}  // namespace

PathRoots DefaultPathRoots() {
  const std::string tmp = TemporaryFolder();
  PathRoots roots;
  roots.data = {"/usr/share/datasets", kVarLib, tmp};
  roots.backup = {kVarLib, tmp};
  roots.exports = {kVarLib, tmp};
  return roots;
}

absl::StatusOr<std::vector<std::string>> ParseRoots(
    const std::vector<std::string>& values, const std::string& flag) {
  std::vector<std::string> roots;
  for (const std::string& value : values) {
    for (absl::string_view root :
         absl::StrSplit(value, ':', absl::SkipEmpty())) {
      if (root[0] != '/') {
        return absl::InvalidArgumentError(
            absl::StrCat(flag, " ", root,
                         ": a root must be an absolute path (a folder the "
                         "jobs this worker runs may use)"));
      }
      roots.emplace_back(root);
    }
  }
  return roots;
}

absl::StatusOr<std::string> ResolvePath(const std::string& path,
                                        const std::string& cwd) {
  if (path.empty()) return absl::InvalidArgumentError("the path is empty");
  RETURN_IF_ERROR(CheckNoControlCharacter(path));
  const std::string absolute = path[0] == '/' ? path : cwd + "/" + path;
  // Invariant: `resolved` is absolute and has no ".", ".." or link in the
  // part that exists, so its lexical parent is its real parent.
  std::string resolved = "/";
  for (absl::string_view part :
       absl::StrSplit(absolute, '/', absl::SkipEmpty())) {
    if (part == ".") continue;
    if (part == "..") {
      resolved = ParentOf(resolved);
      continue;
    }
    const std::string candidate = Child(resolved, std::string(part));
    struct stat st;
    if (lstat(candidate.c_str(), &st) != 0) {
      if (errno != ENOENT && errno != ENOTDIR) {
        return absl::FailedPreconditionError(
            absl::StrCat("cannot inspect ", candidate, ": ", strerror(errno)));
      }
      resolved = candidate;  // not there (yet): taken as written
      continue;
    }
    if (!S_ISLNK(st.st_mode)) {
      resolved = candidate;
      continue;
    }
    char target[PATH_MAX];
    if (realpath(candidate.c_str(), target) == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat(
          candidate, " is a symbolic link that cannot be resolved (",
          strerror(errno), ")"));
    }
    resolved = target;
  }
  return resolved;
}

absl::StatusOr<std::string> CheckUnderRoots(
    const std::string& field, const std::string& path,
    const std::vector<std::string>& roots, const std::string& flag,
    const std::string& cwd, RootMatch match) {
  if (absl::Status text = CheckNoControlCharacter(path); !text.ok()) {
    // Escaped: the path holds the very character refused.
    return absl::InvalidArgumentError(
        absl::StrCat(field, " \"", absl::CHexEscape(path),
                     "\" is refused: ", text.message(), "; remove it"));
  }
  auto resolved = ResolvePath(path, cwd);
  if (!resolved.ok()) {
    return absl::PermissionDeniedError(absl::StrCat(
        field, " \"", path, "\" is refused: ", resolved.status().message(),
        "; give the job a path under one of the folders this worker lets jobs "
        "use for it (",
        RootsText(roots), ", set with ", flag, ")"));
  }
  for (const std::string& root : roots) {
    auto resolved_root = ResolvePath(root, cwd);
    if (resolved_root.ok() && IsUnder(*resolved, *resolved_root, match)) {
      return *resolved;
    }
  }
  const bool is_a_root = match == RootMatch::kStrictlyBelow &&
                         absl::c_any_of(roots, [&](const std::string& root) {
                           auto r = ResolvePath(root, cwd);
                           return r.ok() && *r == *resolved;
                         });
  return absl::PermissionDeniedError(absl::StrCat(
      field, " \"", path, "\"",
      *resolved == path ? "" : absl::StrCat(" (resolved: ", *resolved, ")"),
      is_a_root ? " is one of the folders this worker lets jobs use for it ("
                : " is outside the folders this worker lets jobs use for it (",
      RootsText(roots),
      is_a_root ? "), not a path below one; name a file inside it"
                : "); give the job a path under one of them, or start "
                  "lockstep-worker with ",
      is_a_root ? "" : absl::StrCat(flag, " naming a folder that holds it")));
}

absl::Status CheckJobPaths(const v1::JobSpec& spec, const PathRoots& roots,
                           const std::string& cwd, const ExportOwner& owner) {
  const std::string& data =
      spec.data().dir().empty() ? kDefaultDataDir : spec.data().dir();
  RETURN_IF_ERROR(
      CheckUnderRoots("data.dir", data, roots.data, "--data-root", cwd)
          .status());
  if (!spec.model().torchscript().empty()) {
    RETURN_IF_ERROR(CheckUnderRoots("model.torchscript",
                                    spec.model().torchscript(), roots.data,
                                    "--data-root", cwd)
                        .status());
  }
  if (!spec.checkpoint().backup_dir().empty()) {
    RETURN_IF_ERROR(CheckUnderRoots("checkpoint.backup_dir",
                                    spec.checkpoint().backup_dir(),
                                    roots.backup, "--backup-root", cwd)
                        .status());
  }
  if (!spec.export_path().empty()) {
    RETURN_IF_ERROR(CheckUnderRoots("export", spec.export_path(), roots.exports,
                                    "--export-root", cwd,
                                    RootMatch::kStrictlyBelow)
                        .status());
    // Refused now rather than after training: a file that is not a
    // lockstep export is never replaced.
    absl::Status target = CheckExportTarget(spec.export_path(), owner);
    if (!target.ok()) return absl::PermissionDeniedError(target.message());
  }
  return absl::OkStatus();
}

std::string CurrentDirectory() {
  char cwd[PATH_MAX];
  return getcwd(cwd, sizeof(cwd)) != nullptr ? cwd : "/";
}

}  // namespace lockstep
