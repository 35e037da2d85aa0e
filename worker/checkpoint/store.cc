// The checkpoint folder's operations: prepare, commit, verify, list, find the
// newest valid checkpoint, prune and remove (store.h).
#include "worker/checkpoint/store.h"

#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "common/failpoint.h"
#include "common/files.h"
#include "common/proto_json.h"
#include "common/sha256.h"
#include "common/status_macros.h"

namespace lockstep::checkpoint {
namespace {

namespace fs = std::filesystem;

constexpr char kCheckpointPrefix[] = "ckpt-";
constexpr char kTmp[] = ".tmp";

std::string Join(const std::string& dir, const std::string& name) {
  return dir + "/" + name;
}

// The step of a "ckpt-000001200" name, or -1.
int64_t StepOfName(absl::string_view name) {
  int64_t step = -1;
  if (!absl::ConsumePrefix(&name, kCheckpointPrefix)) return -1;
  if (name.empty() || !absl::SimpleAtoi(name, &step)) return -1;
  return step;
}

// The step of a ".tmp" entry: "ckpt-000001200", "ckpt-000001200.staging".
int64_t StepOfTemporary(absl::string_view name) {
  size_t dot = name.find('.');
  return StepOfName(name.substr(0, dot));
}

struct Hashed {
  int64_t size = 0;
  std::string sha256;
};

absl::StatusOr<Hashed> HashFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::NotFoundError(
        absl::StrCat("cannot read ", path, ": ", std::strerror(errno)));
  }
  Sha256 sha;
  Hashed out;
  std::vector<char> buffer(1 << 20);
  while (in) {
    in.read(buffer.data(), static_cast<std::streamsize>(buffer.size()));
    std::streamsize n = in.gcount();
    if (n > 0) {
      sha.Update(buffer.data(), static_cast<size_t>(n));
      out.size += n;
    }
  }
  if (in.bad())
    return absl::DataLossError(absl::StrCat("error reading ", path));
  out.sha256 = sha.HexDigest();
  return out;
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

absl::Status Rename(const std::string& from, const std::string& to) {
  if (rename(from.c_str(), to.c_str()) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot rename ", from, " to ", to, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

int64_t SizeOfTree(const std::string& dir) {
  int64_t bytes = 0;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(dir, error)) {
    std::error_code size_error;
    if (entry.is_regular_file(size_error)) {
      uintmax_t size = entry.file_size(size_error);
      if (!size_error) bytes += static_cast<int64_t>(size);
    }
  }
  return bytes;
}

bool IsPlainName(const std::string& name) {
  return !name.empty() && name != "." && name != ".." &&
         name.find('/') == std::string::npos;
}

}  // namespace

std::string ToJson(const google::protobuf::Message& message) {
  return lockstep::ToJson(message, JsonStyle::kFile);
}

absl::Status FromJson(const std::string& json, const std::string& origin,
                      google::protobuf::Message* message) {
  if (!lockstep::FromJson(json, message, origin, /*ignore_unknown=*/true)
           .ok()) {
    return absl::DataLossError(absl::StrCat(
        origin, " is not valid (", json.size(), " bytes; truncated?)"));
  }
  return absl::OkStatus();
}

std::string CheckpointName(int64_t step) {
  return absl::StrFormat("%s%09d", kCheckpointPrefix, step);
}

std::string PrepareDir(int rank, int64_t step) {
  return absl::StrFormat("%s/worker-%05d/%s", kTmp, rank, CheckpointName(step));
}

std::string RankStateName(int rank) {
  return absl::StrFormat("rank-%05d.state", rank);
}

absl::StatusOr<std::vector<v1::CheckpointFile>> Prepare(
    const std::string& backup_dir, int rank, int64_t step,
    const std::vector<NamedFile>& files) {
  FailPoint("checkpoint_before_prepare");
  const std::string dir = Join(backup_dir, PrepareDir(rank, step));
  RETURN_IF_ERROR(RemoveTree(dir));
  RETURN_IF_ERROR(MakeDirectories(dir));
  std::vector<v1::CheckpointFile> out;
  for (const auto& [name, contents] : files) {
    RETURN_IF_ERROR(WriteFileDurably(Join(dir, name), contents));
    v1::CheckpointFile& file = out.emplace_back();
    file.set_name(name);
    file.set_size(static_cast<int64_t>(contents.size()));
    file.set_sha256(Sha256Hex(contents));
    if (out.size() == 1) FailPoint("checkpoint_after_first_file");
  }
  RETURN_IF_ERROR(FsyncDirectory(dir));
  return out;
}

absl::StatusOr<int64_t> Commit(const std::string& backup_dir,
                               v1::Manifest manifest,
                               const std::vector<PreparedPart>& parts) {
  FailPoint("checkpoint_before_commit");
  const std::string name = CheckpointName(manifest.step());
  const std::string staging =
      Join(backup_dir, absl::StrCat(kTmp, "/", name, ".staging"));
  RETURN_IF_ERROR(RemoveTree(staging));
  RETURN_IF_ERROR(MakeDirectories(staging));
  manifest.set_format_version(kFormatVersion);
  manifest.clear_files();
  std::set<std::string> names;
  int64_t bytes = 0;
  for (const PreparedPart& part : parts) {
    for (const v1::CheckpointFile& file : part.files) {
      if (!IsPlainName(file.name()) || file.name() == kManifestName ||
          !names.insert(file.name()).second) {
        return absl::InvalidArgumentError(
            absl::StrCat("checkpoint ", name, ": file name \"", file.name(),
                         "\" from ", part.dir, " is invalid or used twice"));
      }
      const std::string target = Join(staging, file.name());
      RETURN_IF_ERROR(
          Rename(Join(Join(backup_dir, part.dir), file.name()), target));
      if (names.size() == 1) FailPoint("checkpoint_during_rename");
      struct stat st = {};
      if (stat(target.c_str(), &st) != 0 || st.st_size != file.size()) {
        return absl::DataLossError(
            absl::StrCat("checkpoint ", name, ": ", part.dir, "/", file.name(),
                         " has ", static_cast<int64_t>(st.st_size),
                         " bytes, but ", file.size(), " were prepared"));
      }
      bytes += file.size();
      *manifest.add_files() = file;
    }
  }
  const std::string json = ToJson(manifest);
  RETURN_IF_ERROR(WriteFileDurably(Join(staging, kManifestName), json));
  RETURN_IF_ERROR(FsyncDirectory(staging));

  const std::string final_dir = Join(backup_dir, name);
  const std::string replaced =
      Join(backup_dir, absl::StrCat(kTmp, "/", name, ".replaced"));
  const bool replacing = PathExists(final_dir);
  if (replacing) {
    // The same step committed before (a commit whose LATEST update was cut
    // short, then replayed): the new one replaces it.
    RETURN_IF_ERROR(RemoveTree(replaced));
    RETURN_IF_ERROR(Rename(final_dir, replaced));
  }
  if (absl::Status renamed = Rename(staging, final_dir); !renamed.ok()) {
    if (replacing) (void)Rename(replaced, final_dir);
    return renamed;
  }
  if (replacing) (void)RemoveTree(replaced);
  RETURN_IF_ERROR(FsyncDirectory(backup_dir));
  FailPoint("checkpoint_before_latest");
  RETURN_IF_ERROR(
      WriteFileAtomically(Join(backup_dir, kLatestName), name + "\n"));
  return bytes + static_cast<int64_t>(json.size());
}

absl::StatusOr<v1::Manifest> Verify(const std::string& checkpoint_dir) {
  const std::string path = Join(checkpoint_dir, kManifestName);
  auto json = ReadFileToString(path);
  if (!json.ok()) {
    return absl::DataLossError(
        absl::StrCat(path,
                     " is missing or unreadable: the checkpoint was "
                     "never committed or was damaged"));
  }
  v1::Manifest manifest;
  RETURN_IF_ERROR(FromJson(*json, path, &manifest));
  if (manifest.format_version() < 1 ||
      manifest.format_version() > kFormatVersion) {
    return absl::FailedPreconditionError(
        absl::StrCat(path, " has format version ", manifest.format_version(),
                     "; this lockstep reads version ", kFormatVersion,
                     ": use the lockstep release that wrote it"));
  }
  if (manifest.files_size() == 0) {
    return absl::DataLossError(absl::StrCat(path, " lists no files"));
  }
  for (const v1::CheckpointFile& file : manifest.files()) {
    if (!IsPlainName(file.name())) {
      return absl::DataLossError(absl::StrCat(
          path, " lists an invalid file name \"", file.name(), "\""));
    }
    const std::string file_path = Join(checkpoint_dir, file.name());
    auto hashed = HashFile(file_path);
    if (!hashed.ok()) {
      return absl::DataLossError(
          absl::StrCat(file_path, " is missing (listed in the manifest)"));
    }
    if (hashed->size != file.size()) {
      return absl::DataLossError(absl::StrCat(file_path, " has ", hashed->size,
                                              " bytes; the manifest says ",
                                              file.size()));
    }
    if (hashed->sha256 != file.sha256()) {
      return absl::DataLossError(
          absl::StrCat(file_path,
                       " does not match its SHA-256 in the manifest (the "
                       "contents changed after the commit)"));
    }
  }
  return manifest;
}

namespace {

// The ckpt-* folders of backup_dir as (step, name), newest first.
absl::StatusOr<std::vector<std::pair<int64_t, std::string>>> CheckpointFolders(
    const std::string& backup_dir) {
  std::error_code error;
  fs::directory_iterator entries(backup_dir, error);
  if (error) {
    return absl::NotFoundError(
        absl::StrCat("cannot read the checkpoint folder ", backup_dir, ": ",
                     error.message()));
  }
  std::vector<std::pair<int64_t, std::string>> out;
  for (const auto& entry : entries) {
    std::string name = entry.path().filename().string();
    int64_t step = StepOfName(name);
    std::error_code type_error;
    if (step >= 0 && entry.is_directory(type_error))
      out.emplace_back(step, name);
  }
  std::sort(out.rbegin(), out.rend());
  return out;
}

}  // namespace

absl::StatusOr<std::vector<Listed>> List(const std::string& backup_dir) {
  ASSIGN_OR_RETURN(auto folders, CheckpointFolders(backup_dir));
  std::vector<Listed> out;
  for (const auto& [step, name] : folders) {
    Listed& listed = out.emplace_back();
    listed.name = name;
    listed.step = step;
    listed.bytes = SizeOfTree(Join(backup_dir, name));
    auto manifest = Verify(Join(backup_dir, name));
    listed.verified = manifest.status();
    if (manifest.ok()) listed.manifest = *std::move(manifest);
  }
  return out;
}

int64_t NewestStep(const std::string& backup_dir) {
  auto folders = CheckpointFolders(backup_dir);
  return folders.ok() && !folders->empty() ? folders->front().first : 0;
}

absl::StatusOr<std::string> ReadLatest(const std::string& backup_dir) {
  auto latest = ReadFileToString(Join(backup_dir, kLatestName));
  if (!latest.ok()) return latest.status();
  return std::string(absl::StripAsciiWhitespace(*latest));
}

absl::StatusOr<Found> FindNewest(
    const std::string& backup_dir,
    const std::function<void(const std::string&, const absl::Status&)>& skipped,
    int64_t above_step) {
  if (!PathExists(backup_dir)) {
    return absl::NotFoundError(absl::StrCat(backup_dir, " does not exist"));
  }
  ASSIGN_OR_RETURN(auto folders, CheckpointFolders(backup_dir));
  auto latest = ReadLatest(backup_dir);
  if (latest.ok() &&
      std::none_of(folders.begin(), folders.end(),
                   [&](const auto& f) { return f.second == *latest; })) {
    skipped(kLatestName,
            absl::DataLossError(absl::StrCat("LATEST names ", *latest,
                                             ", which does not exist")));
  }
  // Newest first, verifying only as far as needed.
  for (const auto& [step, name] : folders) {
    if (step <= above_step) break;
    auto manifest = Verify(Join(backup_dir, name));
    if (manifest.ok()) {
      return Found{Join(backup_dir, name), *std::move(manifest)};
    }
    if (latest.ok() && *latest == name) {
      skipped(kLatestName,
              absl::DataLossError(absl::StrCat("LATEST names ", name,
                                               ", which does not verify")));
    }
    skipped(name, manifest.status());
  }
  return absl::NotFoundError(absl::StrCat(
      "no checkpoint in ", backup_dir,
      above_step > 0 ? absl::StrCat(" newer than step ", above_step) : "",
      " verifies"));
}

absl::Status Prune(const std::string& backup_dir, int keep,
                   int64_t committed_step) {
  absl::Status result = absl::OkStatus();
  std::error_code error;
  std::vector<int64_t> older;
  for (const auto& entry : fs::directory_iterator(backup_dir, error)) {
    int64_t step = StepOfName(entry.path().filename().string());
    if (step >= 0 && step < committed_step) older.push_back(step);
  }
  std::sort(older.rbegin(), older.rend());
  for (size_t i = std::max(0, keep - 1); i < older.size(); ++i) {
    absl::Status removed =
        RemoveTree(Join(backup_dir, CheckpointName(older[i])));
    if (result.ok()) result = removed;
  }
  // Temporary folders: per-worker prepares and staging of finished steps.
  const std::string tmp = Join(backup_dir, kTmp);
  for (const auto& entry : fs::directory_iterator(tmp, error)) {
    std::string name = entry.path().filename().string();
    if (absl::StartsWith(name, "worker-")) {
      std::error_code inner_error;
      for (const auto& prepared :
           fs::directory_iterator(entry.path(), inner_error)) {
        int64_t step = StepOfTemporary(prepared.path().filename().string());
        if (step >= 0 && step <= committed_step) {
          absl::Status removed = RemoveTree(prepared.path().string());
          if (result.ok()) result = removed;
        }
      }
    } else {
      int64_t step = StepOfTemporary(name);
      if (step >= 0 && step <= committed_step) {
        absl::Status removed = RemoveTree(entry.path().string());
        if (result.ok()) result = removed;
      }
    }
  }
  return result;
}

absl::Status RemoveAll(const std::string& backup_dir) {
  absl::Status result = absl::OkStatus();
  std::error_code error;
  std::vector<std::string> doomed;
  for (const auto& entry : fs::directory_iterator(backup_dir, error)) {
    std::string name = entry.path().filename().string();
    if (StepOfName(name) >= 0 || name == kTmp || name == kLatestName) {
      doomed.push_back(entry.path().string());
    }
  }
  // LATEST first: a crash halfway leaves no name pointing at a removed
  // checkpoint.
  std::sort(doomed.begin(), doomed.end(),
            [](const std::string& a, const std::string& b) {
              return absl::EndsWith(a, kLatestName) >
                     absl::EndsWith(b, kLatestName);
            });
  for (const std::string& path : doomed) {
    absl::Status removed = RemoveTree(path);
    if (result.ok()) result = removed;
  }
  if (error) {
    return absl::NotFoundError(
        absl::StrCat("cannot read ", backup_dir, ": ", error.message()));
  }
  return result;
}

}  // namespace lockstep::checkpoint
