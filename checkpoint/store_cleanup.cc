// Clean-up of a backup folder: Prune keeps the newest checkpoints, RemoveAll
// empties the folder after a job succeeded; both remove only what lockstep
// wrote (store.h).
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "checkpoint/store.h"
#include "checkpoint/store_names.h"

namespace lockstep::checkpoint {

namespace fs = std::filesystem;

namespace {

absl::Status Unlink(const std::string& path) {
  if (unlink(path.c_str()) != 0 && errno != ENOENT) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot remove ", path, ": ", std::strerror(errno),
                     "; remove it by hand or fix its folder's permissions"));
  }
  return absl::OkStatus();
}

// Removes a checkpoint lockstep committed: the files its manifest lists,
// then MANIFEST.json (last: a crash halfway leaves a folder that is still
// recognised and removed next time), then the folder if that emptied it.
// Anything else a person put in the folder is left, with the folder.
absl::Status RemoveCheckpoint(const std::string& backup_dir,
                              const std::string& name,
                              const v1::Manifest& manifest) {
  const std::string dir = Join(backup_dir, name);
  for (const v1::CheckpointFile& file : manifest.files()) {
    RETURN_IF_ERROR(Unlink(Join(dir, file.name())));
  }
  RETURN_IF_ERROR(Unlink(Join(dir, kManifestName)));
  if (rmdir(dir.c_str()) != 0 && errno != ENOENT) {
    if (errno == ENOTEMPTY || errno == EEXIST) {
      LogWarning("removed checkpoint ", name, "'s files but left ", dir,
                 ": it holds files lockstep did not write; remove them by "
                 "hand if they are not needed");
      return absl::OkStatus();
    }
    return absl::FailedPreconditionError(
        absl::StrCat("cannot remove ", dir, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

// The names in `dir`, or none when it cannot be listed.
std::vector<std::string> NamesIn(const std::string& dir) {
  std::vector<std::string> names;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(dir, error)) {
    names.push_back(entry.path().filename().string());
  }
  return names;
}

void KeepFirstError(absl::Status* result, absl::Status status) {
  if (result->ok()) *result = std::move(status);
}

// Removes the temporary folders lockstep made for steps up to `up_to_step`:
// .tmp/worker-NNNNN/ckpt-S and .tmp/ckpt-S.staging|.replaced, folders with
// exactly those names and no links; anything else in .tmp stays. With
// `remove_empty`, then the worker-NNNNN folders and .tmp if that emptied
// them (not while a job runs: a rank may be creating its folder).
absl::Status RemoveTemporaryFolders(const std::string& backup_dir,
                                    int64_t up_to_step, bool remove_empty) {
  absl::Status result = absl::OkStatus();
  const std::string tmp = Join(backup_dir, kTmp);
  if (!IsRealDirectory(tmp)) return result;
  for (const std::string& name : NamesIn(tmp)) {
    const std::string path = Join(tmp, name);
    if (!IsRealDirectory(path)) continue;
    if (RankOfWorkerFolder(name) >= 0) {
      for (const std::string& prepared : NamesIn(path)) {
        int64_t step = StepOfName(prepared);
        if (step >= 0 && step <= up_to_step &&
            IsRealDirectory(Join(path, prepared))) {
          KeepFirstError(&result, RemoveTree(Join(path, prepared)));
        }
      }
      if (remove_empty) (void)rmdir(path.c_str());
    } else if (int64_t step = StepOfTemporary(name);
               step >= 0 && step <= up_to_step && name.find('.') != name.npos) {
      KeepFirstError(&result, RemoveTree(path));
    }
  }
  if (remove_empty) (void)rmdir(tmp.c_str());
  return result;
}

}  // namespace

absl::Status Prune(const std::string& backup_dir, int keep,
                   int64_t committed_step) {
  absl::Status result = absl::OkStatus();
  std::vector<std::pair<int64_t, v1::Manifest>> older;
  for (const std::string& name : NamesIn(backup_dir)) {
    int64_t step = StepOfName(name);
    if (step < 0 || step >= committed_step) continue;
    if (auto manifest = LockstepManifest(backup_dir, name)) {
      older.emplace_back(step, *std::move(manifest));
    }
  }
  std::sort(older.begin(), older.end(),
            [](const auto& a, const auto& b) { return a.first > b.first; });
  for (size_t i = std::max(0, keep - 1); i < older.size(); ++i) {
    KeepFirstError(&result,
                   RemoveCheckpoint(backup_dir, CheckpointName(older[i].first),
                                    older[i].second));
  }
  // Temporary folders: per-worker prepares and staging of finished steps.
  KeepFirstError(&result, RemoveTemporaryFolders(backup_dir, committed_step,
                                                 /*remove_empty=*/false));
  return result;
}

absl::Status RemoveAll(const std::string& backup_dir) {
  if (!IsRealDirectory(backup_dir)) {
    return absl::NotFoundError(
        absl::StrCat("cannot read ", backup_dir,
                     ": it is missing or not a folder (a link is not "
                     "followed)"));
  }
  absl::Status result = absl::OkStatus();
  // LATEST first, and only lockstep's (one checkpoint name): a crash halfway
  // leaves no name pointing at a removed checkpoint.
  const std::string latest_path = Join(backup_dir, kLatestName);
  if (auto latest = ReadLatest(backup_dir);
      latest.ok() && StepOfName(*latest) >= 0) {
    if (unlink(latest_path.c_str()) != 0 && errno != ENOENT) {
      KeepFirstError(&result, absl::FailedPreconditionError(
                                  absl::StrCat("cannot remove ", latest_path,
                                               ": ", std::strerror(errno))));
    }
  }
  for (const std::string& name : NamesIn(backup_dir)) {
    if (auto manifest = LockstepManifest(backup_dir, name)) {
      KeepFirstError(&result, RemoveCheckpoint(backup_dir, name, *manifest));
    }
  }
  KeepFirstError(&result, RemoveTemporaryFolders(
                              backup_dir, std::numeric_limits<int64_t>::max(),
                              /*remove_empty=*/true));
  return result;
}

}  // namespace lockstep::checkpoint
