// The checkpoint folder's operations: prepare, commit, verify, list and find
// the newest valid checkpoint (store.h); clean-up is in store_cleanup.cc.
#include "checkpoint/store.h"

#include <stdio.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "checkpoint/store_names.h"
#include "common/failpoint.h"
#include "common/files.h"
#include "common/log.h"
#include "common/proto_json.h"
#include "common/sha256.h"
#include "common/status_macros.h"

namespace lockstep::checkpoint {
namespace {

namespace fs = std::filesystem;

// The SHA-256 of a checkpoint file that must hold `expected_size` bytes.
// Opened without following a link and only if it is a regular file whose
// size is `expected_size`, so a link to /dev/zero or a FIFO is refused at
// once instead of being hashed forever. NotFound when missing, DataLoss
// otherwise.
absl::StatusOr<std::string> HashFile(const std::string& path,
                                     int64_t expected_size,
                                     absl::string_view expected_by) {
  int64_t size = 0;
  ASSIGN_OR_RETURN(int fd, OpenRegularFile(path, &size));
  auto fail = [&](absl::Status status) {
    close(fd);
    return status;
  };
  if (size != expected_size) {
    return fail(absl::DataLossError(absl::StrCat(
        path, " has ", size, " bytes; ", expected_by, " ", expected_size)));
  }
  Sha256 sha;
  std::vector<char> buffer(1 << 20);
  int64_t total = 0;
  while (true) {
    ssize_t n = read(fd, buffer.data(), buffer.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      return fail(absl::DataLossError(
          absl::StrCat("error reading ", path, ": ", std::strerror(errno))));
    }
    if (n == 0) break;
    total += n;
    if (total > expected_size) break;
    sha.Update(buffer.data(), static_cast<size_t>(n));
  }
  if (total != expected_size) {
    return fail(absl::DataLossError(
        absl::StrCat(path, " changed size while it was read (", expected_by,
                     " ", expected_size, " bytes)")));
  }
  close(fd);
  return sha.HexDigest();
}

absl::Status Rename(const std::string& from, const std::string& to) {
  if (rename(from.c_str(), to.c_str()) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot rename ", from, " to ", to, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

// The bytes of the regular files directly in `dir` (links not followed).
int64_t SizeOfTree(const std::string& dir) {
  int64_t bytes = 0;
  std::error_code error;
  for (const auto& entry : fs::directory_iterator(dir, error)) {
    struct stat st;
    if (lstat(entry.path().c_str(), &st) == 0 && S_ISREG(st.st_mode)) {
      bytes += static_cast<int64_t>(st.st_size);
    }
  }
  return bytes;
}

// Makes the folder `path` unless it is there already as a folder; a
// symbolic link or anything else in its place is refused, never followed
// (a link planted in backup_dir would send the writes, or the removal of an
// earlier attempt, wherever it points).
absl::Status MakeRealDirectory(const std::string& path) {
  if (mkdir(path.c_str(), 0755) == 0) return absl::OkStatus();
  if (errno == EEXIST && IsRealDirectory(path)) return absl::OkStatus();
  if (errno == EEXIST) {
    return absl::FailedPreconditionError(absl::StrCat(
        path,
        " is a symbolic link or not a folder; lockstep follows no link "
        "inside checkpoint.backup_dir: remove it, or give the job another "
        "checkpoint.backup_dir"));
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "cannot create the folder ", path, ": ", std::strerror(errno)));
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
  RETURN_IF_ERROR(MakeDirectories(backup_dir));
  RETURN_IF_ERROR(MakeRealDirectory(Join(backup_dir, kTmp)));
  RETURN_IF_ERROR(MakeRealDirectory(
      Join(backup_dir, absl::StrFormat("%s/worker-%05d", kTmp, rank))));
  RETURN_IF_ERROR(RemoveTree(dir));  // a link there is removed, not followed
  RETURN_IF_ERROR(MakeRealDirectory(dir));
  std::vector<v1::CheckpointFile> out;
  for (const auto& [name, contents] : files) {
    RETURN_IF_ERROR(WriteFileDurably(Join(dir, name), contents));
    v1::CheckpointFile& file = out.emplace_back();
    file.set_name(name);
    file.set_size(static_cast<int64_t>(contents.size()));
    ASSIGN_OR_RETURN(*file.mutable_sha256(), Sha256Hex(contents));
    if (out.size() == 1) FailPoint("checkpoint_after_first_file");
  }
  RETURN_IF_ERROR(FsyncDirectory(dir));
  return out;
}

namespace {

// Refuses a prepared part whose folder is not exactly what Prepare() makes
// for a rank at `step` (".tmp/worker-00001/ckpt-000001200"): no "..", no
// absolute path, no symbolic link on the way, each rank once. Defence in
// depth beside the coordinator's check of the CheckpointPrepared message.
absl::Status CheckPreparedDir(const std::string& backup_dir,
                              const std::string& dir, int64_t step,
                              std::set<int>* ranks) {
  const std::string name = CheckpointName(step);
  absl::string_view rest = dir;
  int rank = -1;
  if (absl::ConsumePrefix(&rest, absl::StrCat(kTmp, "/"))) {
    rank = RankOfWorkerFolder(rest.substr(0, rest.find('/')));
  }
  if (rank < 0 || dir != PrepareDir(rank, step)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint ", name, ": a rank's part names the folder \"", dir,
        "\", which is not the staging folder of any rank for step ", step, " (",
        kTmp, "/worker-NNNNN/", name, "); not committed"));
  }
  if (!ranks->insert(rank).second) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint ", name, ": the part of rank ", rank, " (",
                     dir, ") is listed twice; not committed"));
  }
  for (const std::string& folder :
       {Join(backup_dir, kTmp),
        Join(backup_dir,
             absl::StrCat(kTmp, "/", rest.substr(0, rest.find('/')))),
        Join(backup_dir, dir)}) {
    if (!IsRealDirectory(folder)) {
      return absl::DataLossError(absl::StrCat(
          "checkpoint ", name, ": ", folder,
          " is missing or not a folder (a symbolic link is not followed); "
          "not committed"));
    }
  }
  return absl::OkStatus();
}

// Moves one prepared file into `staging` and returns its manifest entry,
// with the SHA-256 the chief computed from the staged bytes; a file that is
// not a regular file of the prepared size, or whose bytes do not match the
// digest its rank reported, is refused.
absl::StatusOr<v1::CheckpointFile> StageFile(const std::string& backup_dir,
                                             const std::string& name,
                                             const PreparedPart& part,
                                             const v1::CheckpointFile& file,
                                             const std::string& staging) {
  const std::string source = Join(Join(backup_dir, part.dir), file.name());
  struct stat st = {};
  if (file.size() < 0 || file.size() > kMaxFileBytes ||
      lstat(source.c_str(), &st) != 0 || !S_ISREG(st.st_mode) ||
      st.st_size != file.size()) {
    return absl::DataLossError(absl::StrCat(
        "checkpoint ", name, ": ", part.dir, "/", file.name(), " has ",
        S_ISREG(st.st_mode)
            ? absl::StrCat(static_cast<int64_t>(st.st_size), " bytes")
            : "no regular file",
        ", but ", file.size(), " were prepared"));
  }
  const std::string target = Join(staging, file.name());
  RETURN_IF_ERROR(Rename(source, target));
  ASSIGN_OR_RETURN(std::string sha256,
                   HashFile(target, file.size(), "its rank prepared"));
  if (sha256 != file.sha256()) {
    return absl::DataLossError(
        absl::StrCat("checkpoint ", name, ": ", part.dir, "/", file.name(),
                     " does not hold what its rank reported (SHA-256 ", sha256,
                     ", reported ", file.sha256().substr(0, 64),
                     "): it changed after the prepare; not committed"));
  }
  v1::CheckpointFile staged;
  staged.set_name(file.name());
  staged.set_size(file.size());
  staged.set_sha256(sha256);
  return staged;
}

}  // namespace

absl::StatusOr<int64_t> Commit(const std::string& backup_dir,
                               v1::Manifest manifest,
                               const std::vector<PreparedPart>& parts) {
  FailPoint("checkpoint_before_commit");
  const std::string name = CheckpointName(manifest.step());
  std::set<int> ranks;
  for (const PreparedPart& part : parts) {
    RETURN_IF_ERROR(
        CheckPreparedDir(backup_dir, part.dir, manifest.step(), &ranks));
  }
  const std::string final_dir = Join(backup_dir, name);
  struct stat existing;
  const bool replacing = lstat(final_dir.c_str(), &existing) == 0;
  if (replacing && !IsLockstepCheckpoint(backup_dir, name)) {
    // Only a checkpoint lockstep committed is replaced, never what someone
    // else put under that name.
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint ", name, ": ", final_dir,
        " exists and is not a checkpoint lockstep committed (no folder with "
        "a MANIFEST.json of this step); not committed. Move it out of "
        "checkpoint.backup_dir, or give the job a checkpoint.backup_dir of "
        "its own"));
  }
  const std::string staging =
      Join(backup_dir, absl::StrCat(kTmp, "/", name, ".staging"));
  RETURN_IF_ERROR(RemoveTree(staging));
  RETURN_IF_ERROR(MakeRealDirectory(staging));
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
      ASSIGN_OR_RETURN(v1::CheckpointFile staged,
                       StageFile(backup_dir, name, part, file, staging));
      if (names.size() == 1) FailPoint("checkpoint_during_rename");
      bytes += staged.size();
      *manifest.add_files() = std::move(staged);
    }
  }
  const std::string json = ToJson(manifest);
  RETURN_IF_ERROR(WriteFileDurably(Join(staging, kManifestName), json));
  RETURN_IF_ERROR(FsyncDirectory(staging));

  const std::string replaced =
      Join(backup_dir, absl::StrCat(kTmp, "/", name, ".replaced"));
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
  auto json = ReadRegularFile(path, kMaxManifestBytes);
  if (!json.ok()) {
    return absl::DataLossError(
        absl::StrCat(path,
                     " is missing or unreadable: the checkpoint was "
                     "never committed or was damaged (",
                     json.status().message(), ")"));
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
  if (manifest.files_size() > kMaxManifestFiles) {
    return absl::DataLossError(
        absl::StrCat(path, " lists ", manifest.files_size(), " files; at most ",
                     kMaxManifestFiles, " are read"));
  }
  for (const v1::CheckpointFile& file : manifest.files()) {
    if (!IsPlainName(file.name()) || file.name() == kManifestName) {
      return absl::DataLossError(
          absl::StrCat(path, " lists an invalid file name \"",
                       file.name().substr(0, kMaxFileNameLength), "\""));
    }
    if (file.size() < 0 || file.size() > kMaxFileBytes) {
      return absl::DataLossError(absl::StrCat(path, " lists ", file.name(),
                                              " with an impossible size ",
                                              file.size()));
    }
    const std::string file_path = Join(checkpoint_dir, file.name());
    auto sha256 = HashFile(file_path, file.size(), "the manifest says");
    if (absl::IsNotFound(sha256.status())) {
      return absl::DataLossError(
          absl::StrCat(file_path, " is missing (listed in the manifest)"));
    }
    if (!sha256.ok()) return sha256.status();
    if (*sha256 != file.sha256()) {
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
    // A link named like a checkpoint is not followed: it is not lockstep's.
    if (step >= 0 && IsRealDirectory(entry.path().string())) {
      out.emplace_back(step, name);
    }
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
  auto latest = ReadRegularFile(Join(backup_dir, kLatestName), kMaxLatestBytes);
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

absl::StatusOr<std::string> ReadCheckpointFile(const Found& found,
                                               const std::string& name) {
  const std::string path = Join(found.dir, name);
  const auto& files = found.manifest.files();
  auto listed = std::find_if(files.begin(), files.end(),
                             [&](const auto& f) { return f.name() == name; });
  if (listed == files.end()) {
    return absl::DataLossError(
        absl::StrCat("checkpoint ", found.dir, " is corrupt: its ",
                     kManifestName, " does not list ", name,
                     ", which a restore reads; restore an earlier "
                     "checkpoint or remove this one"));
  }
  auto bytes = ReadRegularFile(path, listed->size());
  if (!bytes.ok()) {
    return absl::DataLossError(absl::StrCat(
        "checkpoint ", found.dir, " is corrupt: ", bytes.status().message()));
  }
  ASSIGN_OR_RETURN(const std::string digest, Sha256Hex(*bytes));
  if (static_cast<int64_t>(bytes->size()) != listed->size() ||
      digest != listed->sha256()) {
    return absl::DataLossError(absl::StrCat(
        "checkpoint ", found.dir, " is corrupt: ", path, " (", bytes->size(),
        " bytes) does not match the size (", listed->size(),
        ") and SHA-256 its manifest records; it changed after the commit"));
  }
  return bytes;
}

}  // namespace lockstep::checkpoint
