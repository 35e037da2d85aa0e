// What the checkpoint store's files share (store.cc, store_names.cc,
// store_cleanup.cc): the names lockstep gives the entries of a backup folder,
// the bounds on what a folder's files can make a reader trust, and the test
// of what lockstep itself wrote there. Internal to worker/checkpoint/.
#ifndef LOCKSTEP_CHECKPOINT_STORE_NAMES_H_
#define LOCKSTEP_CHECKPOINT_STORE_NAMES_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "lockstep/v1/checkpoint.pb.h"

namespace lockstep::checkpoint {

inline constexpr char kCheckpointPrefix[] = "ckpt-";
inline constexpr char kTmp[] = ".tmp";

// Bounds on what a manifest (or a LATEST) read from the folder can make a
// reader allocate or trust; far above any real checkpoint.
inline constexpr int64_t kMaxManifestBytes = int64_t{16} << 20;
inline constexpr int kMaxManifestFiles = 1 << 16;
inline constexpr size_t kMaxFileNameLength = 255;
inline constexpr int64_t kMaxFileBytes = int64_t{1} << 42;  // 4 TiB
inline constexpr int64_t kMaxLatestBytes = 64;

std::string Join(const std::string& dir, const std::string& name);

// The step of a "ckpt-000001200" name, or -1: only the exact name
// CheckpointName() gives a step ("ckpt-7" and "ckpt-+7" are not lockstep's).
int64_t StepOfName(absl::string_view name);

// The step of a ".tmp" entry lockstep makes: "ckpt-000001200" (in a
// worker-NNNNN folder), "ckpt-000001200.staging", "ckpt-000001200.replaced";
// -1 for any other name.
int64_t StepOfTemporary(absl::string_view name);

// The rank of a "worker-00001" folder of .tmp, or -1.
int RankOfWorkerFolder(absl::string_view name);

// Whether `path` is a folder itself, not a symbolic link to one.
bool IsRealDirectory(const std::string& path);

// Removes `path` and everything below it. Errors: FailedPrecondition.
absl::Status RemoveTree(const std::string& path);

// A file name a manifest may list: no folder part, not "." or "..".
bool IsPlainName(const std::string& name);

// The manifest of backup_dir/`name` when it is a checkpoint lockstep
// committed: its exact name, a folder (not a link), and a MANIFEST.json of
// lockstep's format for that step listing only plain file names. Clean-up
// removes nothing else.
std::optional<v1::Manifest> LockstepManifest(const std::string& backup_dir,
                                             const std::string& name);

bool IsLockstepCheckpoint(const std::string& backup_dir,
                          const std::string& name);

}  // namespace lockstep::checkpoint

#endif  // LOCKSTEP_CHECKPOINT_STORE_NAMES_H_
