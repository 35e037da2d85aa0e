// The names of a backup folder's entries and the test of what lockstep
// wrote there (store_names.h).
#include "checkpoint/store_names.h"

#include <sys/stat.h>

#include <algorithm>
#include <filesystem>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "common/files.h"
#include "common/proto_json.h"
#include "checkpoint/store.h"

namespace lockstep::checkpoint {

namespace fs = std::filesystem;

std::string Join(const std::string& dir, const std::string& name) {
  return dir + "/" + name;
}

int64_t StepOfName(absl::string_view name) {
  absl::string_view digits = name;
  int64_t step = -1;
  if (!absl::ConsumePrefix(&digits, kCheckpointPrefix) || digits.empty() ||
      digits.size() > 18 ||
      !std::all_of(digits.begin(), digits.end(), absl::ascii_isdigit) ||
      !absl::SimpleAtoi(digits, &step) || CheckpointName(step) != name) {
    return -1;
  }
  return step;
}

int64_t StepOfTemporary(absl::string_view name) {
  size_t dot = name.find('.');
  int64_t step = StepOfName(name.substr(0, dot));
  if (dot == absl::string_view::npos) return step;
  absl::string_view suffix = name.substr(dot);
  return suffix == ".staging" || suffix == ".replaced" ? step : -1;
}

int RankOfWorkerFolder(absl::string_view name) {
  absl::string_view digits = name;
  int rank = -1;
  if (!absl::ConsumePrefix(&digits, "worker-") || digits.empty() ||
      digits.size() > 9 ||
      !std::all_of(digits.begin(), digits.end(), absl::ascii_isdigit) ||
      !absl::SimpleAtoi(digits, &rank) ||
      absl::StrFormat("worker-%05d", rank) != name) {
    return -1;
  }
  return rank;
}

bool IsRealDirectory(const std::string& path) {
  struct stat st;
  return lstat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

absl::Status RemoveTree(const std::string& path) {
  std::error_code error;
  fs::remove_all(path, error);
  if (error) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot remove ", path, ": ", error.message()));
  }
  return absl::OkStatus();
}

bool IsPlainName(const std::string& name) {
  return !name.empty() && name.size() <= kMaxFileNameLength && name != "." &&
         name != ".." && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

std::optional<v1::Manifest> LockstepManifest(const std::string& backup_dir,
                                             const std::string& name) {
  const int64_t step = StepOfName(name);
  const std::string dir = Join(backup_dir, name);
  if (step < 0 || !IsRealDirectory(dir)) return std::nullopt;
  auto json = ReadRegularFile(Join(dir, kManifestName), kMaxManifestBytes);
  v1::Manifest manifest;
  if (!json.ok() || !FromJson(*json, name, &manifest).ok() ||
      manifest.format_version() < 1 ||
      manifest.format_version() > kFormatVersion || manifest.step() != step ||
      manifest.files_size() == 0 ||
      std::any_of(manifest.files().begin(), manifest.files().end(),
                  [](const v1::CheckpointFile& file) {
                    return !IsPlainName(file.name()) ||
                           file.name() == kManifestName;
                  })) {
    return std::nullopt;
  }
  return manifest;
}

bool IsLockstepCheckpoint(const std::string& backup_dir,
                          const std::string& name) {
  return LockstepManifest(backup_dir, name).has_value();
}

}  // namespace lockstep::checkpoint
