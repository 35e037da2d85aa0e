// The artifacts kept under --artifact-dir (artifact_store.h).
#include "coordinator/artifact_store.h"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/files.h"
#include "common/log.h"
#include "common/status_macros.h"

namespace lockstep::coordinator {
namespace {

constexpr char kInfoSuffix[] = ".info";
constexpr char kUploadPrefix[] = ".upload-";
// An .info file is a few hundred bytes.
constexpr int64_t kMaxInfoBytes = 64 << 10;

std::string Errno(const std::string& what, const std::string& path) {
  return absl::StrCat(what, " ", path, ": ", std::strerror(errno));
}

// A job id as a folder name: what CheckJobId lets through, and never a
// path of its own.
bool SafeFolderName(const std::string& name) {
  return !name.empty() && name != "." && name != ".." &&
         name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos && name[0] != '.';
}

bool IsHexDigest(const std::string& digest) {
  return digest.size() == 64 &&
         std::all_of(digest.begin(), digest.end(), [](char c) {
           return absl::ascii_isdigit(c) || (c >= 'a' && c <= 'f');
         });
}

// The entries of folder `path` (without . and ..); empty when it is
// missing.
std::vector<std::string> Entries(const std::string& path) {
  std::vector<std::string> names;
  DIR* dir = opendir(path.c_str());
  if (dir == nullptr) return names;
  while (dirent* entry = readdir(dir)) {
    const std::string name = entry->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  closedir(dir);
  std::sort(names.begin(), names.end());
  return names;
}

absl::StatusOr<v1::ArtifactInfo> ReadInfo(const std::string& path) {
  auto bytes = ReadRegularFile(path, kMaxInfoBytes);
  if (!bytes.ok()) return bytes.status();
  v1::ArtifactInfo info;
  if (!info.ParseFromString(*bytes)) {
    return absl::DataLossError(absl::StrCat(path, " is not an ArtifactInfo"));
  }
  return info;
}

}  // namespace

bool IsArtifactName(absl::string_view name) {
  return name == "model" || name == "checkpoint";
}

absl::StatusOr<std::unique_ptr<ArtifactStore>> ArtifactStore::Open(
    std::string dir, Limits limits) {
  if (absl::Status made = MakeDirectories(dir); !made.ok()) {
    return absl::Status(made.code(), absl::StrCat("--artifact-dir ", dir, ": ",
                                                  made.message()));
  }
  std::unique_ptr<ArtifactStore> store(
      new ArtifactStore(std::move(dir), limits));
  // What an interrupted upload left goes; what is kept counts against its
  // owner.
  for (const std::string& job : Entries(store->dir_)) {
    const std::string folder = store->FolderOf(job);
    for (const std::string& name : Entries(folder)) {
      if (absl::StartsWith(name, kUploadPrefix)) {
        unlink(absl::StrCat(folder, "/", name).c_str());
        continue;
      }
      if (!absl::EndsWith(name, kInfoSuffix)) continue;
      auto info = ReadInfo(absl::StrCat(folder, "/", name));
      if (!info.ok()) {
        LogWarning("artifact store: ", info.status().message(),
                   "; it is not counted");
        continue;
      }
      absl::MutexLock lock(&store->mu_);
      store->owner_bytes_[info->owner()] += info->bytes();
    }
  }
  return store;
}

std::string ArtifactStore::FolderOf(const std::string& job_id) const {
  return absl::StrCat(dir_, "/", job_id);
}

absl::StatusOr<std::unique_ptr<ArtifactStore::Upload>> ArtifactStore::Begin(
    const std::string& job_id, const std::string& owner,
    v1::ArtifactInfo info) {
  const std::string who =
      absl::StrCat("the artifact of job ", job_id, " rank ", info.rank());
  if (!SafeFolderName(job_id)) {
    return absl::InvalidArgumentError(
        absl::StrCat("artifact: job id \"", job_id, "\" is not a name"));
  }
  if (!IsArtifactName(info.name())) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, " is named \"", info.name(),
                     "\"; the names are: model, checkpoint"));
  }
  const std::string& file = info.file_name();
  if (file.empty() || file.size() > 255 || !SafeFolderName(file)) {
    return absl::InvalidArgumentError(absl::StrCat(
        who, ": its file name \"", file.substr(0, 64),
        "\" is not a base name (1 to 255 bytes, no '/', not starting with "
        "'.')"));
  }
  if (info.format() != "archive" && info.format() != "torchscript" &&
      info.format() != "state_dict" && info.format() != "checkpoint") {
    return absl::InvalidArgumentError(absl::StrCat(
        who, ": format \"", info.format().substr(0, 32),
        "\" is none of archive, torchscript, state_dict, checkpoint"));
  }
  if (!IsHexDigest(info.sha256())) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": its SHA-256 is not 64 lower-case hex digits"));
  }
  if (info.bytes() < 0 || info.bytes() > limits_.artifact_bytes) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "%s is %d bytes; the coordinator keeps at most %d bytes per artifact "
        "(--max-artifact-bytes)",
        who, info.bytes(), limits_.artifact_bytes));
  }
  // An upload that replaces the job's artifact of that name frees its
  // bytes once it is kept: they do not count against it.
  int64_t replacing = 0;
  if (auto old = ReadInfo(
          absl::StrCat(FolderOf(job_id), "/", info.name(), kInfoSuffix));
      old.ok() && old->owner() == owner) {
    replacing = old->bytes();
  }
  {
    absl::MutexLock lock(&mu_);
    int64_t& used = owner_bytes_[owner];
    if (used - replacing + info.bytes() > limits_.owner_bytes) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "%s (%d bytes) would take the artifacts of %s to %d bytes, past "
          "the bound of %d (--max-owner-artifact-bytes); delete finished "
          "jobs to free their artifacts",
          who, info.bytes(), owner.empty() ? "the anonymous owner" : owner,
          used - replacing + info.bytes(), limits_.owner_bytes));
    }
    used += info.bytes();  // reserved until the upload ends
  }
  info.set_owner(owner);
  const std::string folder = FolderOf(job_id);
  absl::Status made = MakeDirectories(folder);
  int fd = -1;
  std::string temp;
  if (made.ok()) {
    absl::BitGen random;
    for (int attempt = 0; attempt < 8 && fd < 0; ++attempt) {
      temp = absl::StrFormat("%s/%s%s-%016x", folder, kUploadPrefix,
                             info.name(), absl::Uniform<uint64_t>(random));
      fd = open(temp.c_str(),
                O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    }
    if (fd < 0) made = absl::InternalError(Errno("cannot create", temp));
  }
  if (!made.ok()) {
    Settle(owner, info.bytes(), 0, 0);
    return absl::Status(made.code(), absl::StrCat(who, ": ", made.message()));
  }
  return std::unique_ptr<Upload>(
      new Upload(this, job_id, folder, temp, fd, std::move(info)));
}

void ArtifactStore::Settle(const std::string& owner, int64_t reserved,
                           int64_t kept, int64_t replaced) {
  absl::MutexLock lock(&mu_);
  int64_t& used = owner_bytes_[owner];
  used = std::max<int64_t>(0, used - reserved + kept - replaced);
}

ArtifactStore::Upload::Upload(ArtifactStore* store, std::string job_id,
                              std::string folder, std::string temp, int fd,
                              v1::ArtifactInfo info)
    : store_(store),
      job_id_(std::move(job_id)),
      folder_(std::move(folder)),
      temp_(std::move(temp)),
      fd_(fd),
      info_(std::move(info)) {}

ArtifactStore::Upload::~Upload() {
  if (fd_ >= 0) close(fd_);
  if (!finished_) {
    unlink(temp_.c_str());
    store_->Settle(info_.owner(), info_.bytes(), 0, 0);
  }
}

std::string ArtifactStore::Upload::Who() const {
  return absl::StrCat("the artifact \"", info_.name(), "\" of job ", job_id_,
                      " rank ", info_.rank());
}

absl::Status ArtifactStore::Upload::Append(absl::string_view data) {
  if (finished_ || fd_ < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(Who(), ": the upload is over"));
  }
  if (written_ + static_cast<int64_t>(data.size()) > info_.bytes()) {
    return absl::DataLossError(
        absl::StrFormat("%s: more bytes came than the %d its header declared",
                        Who(), info_.bytes()));
  }
  sha_.Update(data);
  while (!data.empty()) {
    const ssize_t n = write(fd_, data.data(), data.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return absl::InternalError(
          absl::StrCat(Who(), ": ", Errno("cannot write", temp_)));
    }
    data.remove_prefix(static_cast<size_t>(n));
    written_ += n;
  }
  return absl::OkStatus();
}

absl::StatusOr<v1::ArtifactInfo> ArtifactStore::Upload::Finish() {
  if (finished_ || fd_ < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(Who(), ": the upload is over"));
  }
  if (written_ != info_.bytes()) {
    return absl::DataLossError(absl::StrFormat(
        "%s: %d of the %d bytes its header declared came; the upload was "
        "cut short",
        Who(), written_, info_.bytes()));
  }
  ASSIGN_OR_RETURN(std::string digest, sha_.HexDigest());
  if (digest != info_.sha256()) {
    return absl::DataLossError(absl::StrCat(
        Who(), ": the bytes that came have SHA-256 ", digest,
        ", not the declared ", info_.sha256(), ": they were corrupted"));
  }
  if (fsync(fd_) != 0) {
    return absl::InternalError(
        absl::StrCat(Who(), ": ", Errno("cannot fsync", temp_)));
  }
  close(fd_);
  fd_ = -1;
  const std::string path = absl::StrCat(folder_, "/", info_.name());
  const std::string info_path = path + kInfoSuffix;
  int64_t replaced = 0;
  if (auto old = ReadInfo(info_path); old.ok()) {
    // The same job's earlier upload: its bytes were its owner's.
    replaced = old->bytes();
  }
  if (rename(temp_.c_str(), path.c_str()) != 0) {
    return absl::InternalError(
        absl::StrCat(Who(), ": ", Errno("cannot rename into", path)));
  }
  finished_ = true;  // the file is in place: no longer the temporary's
  store_->Settle(info_.owner(), info_.bytes(), info_.bytes(), replaced);
  RETURN_IF_ERROR(
      WriteFileAtomically(info_path, info_.SerializeAsString(), 0600));
  RETURN_IF_ERROR(FsyncDirectory(folder_));
  RETURN_IF_ERROR(FsyncDirectory(store_->dir_));
  return info_;
}

std::vector<v1::ArtifactInfo> ArtifactStore::List(
    const std::string& job_id) const {
  std::vector<v1::ArtifactInfo> out;
  if (!SafeFolderName(job_id)) return out;
  const std::string folder = FolderOf(job_id);
  for (const std::string& name : Entries(folder)) {
    if (!absl::EndsWith(name, kInfoSuffix)) continue;
    auto info = ReadInfo(absl::StrCat(folder, "/", name));
    if (info.ok()) out.push_back(*std::move(info));
  }
  return out;
}

std::vector<std::string> ArtifactStore::Jobs() const {
  std::vector<std::string> jobs;
  for (std::string& name : Entries(dir_)) {
    if (SafeFolderName(name)) jobs.push_back(std::move(name));
  }
  return jobs;
}

absl::StatusOr<std::pair<int, v1::ArtifactInfo>> ArtifactStore::Read(
    const std::string& job_id, const std::string& name) const {
  if (!SafeFolderName(job_id) || !IsArtifactName(name)) {
    return absl::NotFoundError(absl::StrCat(
        "job ", job_id, " has no artifact \"", name.substr(0, 64), "\""));
  }
  const std::string path = absl::StrCat(FolderOf(job_id), "/", name);
  auto info = ReadInfo(path + kInfoSuffix);
  if (!info.ok()) {
    return absl::NotFoundError(
        absl::StrCat("job ", job_id, " has no artifact \"", name, "\""));
  }
  int64_t size = 0;
  ASSIGN_OR_RETURN(int fd, OpenRegularFile(path, &size));
  if (size != info->bytes()) {
    close(fd);
    return absl::DataLossError(absl::StrFormat(
        "the artifact \"%s\" of job %s holds %d bytes, not the %d kept with "
        "it: the file under --artifact-dir was changed",
        name, job_id, size, info->bytes()));
  }
  return std::pair(fd, *std::move(info));
}

absl::Status ArtifactStore::Delete(const std::string& job_id) {
  if (!SafeFolderName(job_id)) return absl::OkStatus();
  for (const v1::ArtifactInfo& info : List(job_id)) {
    Settle(info.owner(), 0, 0, info.bytes());
  }
  RETURN_IF_ERROR(RemoveRecursively(FolderOf(job_id)));
  return FsyncDirectory(dir_);
}

int64_t ArtifactStore::OwnerBytes(const std::string& owner) const {
  absl::MutexLock lock(&mu_);
  auto it = owner_bytes_.find(owner);
  return it == owner_bytes_.end() ? 0 : it->second;
}

}  // namespace lockstep::coordinator
