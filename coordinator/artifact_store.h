// The trained models the coordinator keeps for their jobs under
// --artifact-dir (issue 53): the chief of a job's live generation uploads the
// job's export when the job succeeds (UploadArtifact), and its owner, an
// admin or a viewer downloads it (`lockstep artifacts get`,
// Job.download_model). The files leave with their job.
//
// Layout: DIR/<job id>/<name> and its ArtifactInfo, DIR/<job id>/<name>.info
// (binary proto). An upload is written to a temporary file in the job's
// folder (O_EXCL, mode 0600), its size and SHA-256 checked against what its
// header declared, fsynced and renamed over <name>; then its .info is
// written atomically and the folder fsynced. An artifact is listed only
// once its .info is there: a coordinator killed in the middle leaves a
// temporary file, removed at the next Open, or a file without .info,
// replaced by the next upload.
//
// Bounds: one artifact at most `artifact_bytes` (declared up front, so an
// upload over it is refused before a byte is written), an owner's artifacts
// together at most `owner_bytes` (uploads under way count).
//
// Thread-safe: uploads, reads and deletes may run at once, on different
// jobs or the same.
#ifndef LOCKSTEP_COORDINATOR_ARTIFACT_STORE_H_
#define LOCKSTEP_COORDINATOR_ARTIFACT_STORE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/sha256.h"
#include "lockstep/v1/coordinator.pb.h"

namespace lockstep::coordinator {

class ArtifactStore {
 public:
  struct Limits {
    int64_t artifact_bytes = int64_t{1} << 30;  // --max-artifact-bytes
    int64_t owner_bytes = int64_t{10} << 30;    // --max-owner-artifact-bytes
  };

  // One upload under way. Its bytes are reserved against the owner's bound
  // until Finish or destruction; destroyed before Finish succeeded, it
  // removes its temporary file.
  class Upload {
   public:
    ~Upload();
    Upload(const Upload&) = delete;
    Upload& operator=(const Upload&) = delete;

    // Errors: DataLoss past the declared size; Internal on a write error.
    absl::Status Append(absl::string_view data);
    // Checks the size and SHA-256, fsyncs, renames into place and writes
    // the .info. Returns the ArtifactInfo kept. Errors: DataLoss (fewer
    // bytes, or others, than declared), Internal.
    absl::StatusOr<v1::ArtifactInfo> Finish();

   private:
    friend class ArtifactStore;
    Upload(ArtifactStore* store, std::string job_id, std::string folder,
           std::string temp, int fd, v1::ArtifactInfo info);
    // "job J rank R": who the errors name.
    std::string Who() const;

    ArtifactStore* const store_;
    const std::string job_id_;
    const std::string folder_;
    const std::string temp_;
    int fd_;
    v1::ArtifactInfo info_;
    int64_t written_ = 0;
    Sha256 sha_;
    bool finished_ = false;
  };

  // A store under `dir` (made when missing); temporary files of an
  // interrupted upload are removed. Errors: those of the file system,
  // naming the folder.
  static absl::StatusOr<std::unique_ptr<ArtifactStore>> Open(std::string dir,
                                                             Limits limits);

  // Starts keeping `info` (name, file_name, format, bytes, sha256, step,
  // generation and rank, as the uploader declares them) for `job_id`,
  // owned by `owner`. Errors: InvalidArgument for a bad name, file name,
  // size or digest; ResourceExhausted over a bound; Internal.
  absl::StatusOr<std::unique_ptr<Upload>> Begin(const std::string& job_id,
                                                const std::string& owner,
                                                v1::ArtifactInfo info);

  // The artifacts kept for `job_id`, by name.
  std::vector<v1::ArtifactInfo> List(const std::string& job_id) const;
  // The jobs with a folder here.
  std::vector<std::string> Jobs() const;

  // Opens artifact `name` of `job_id` for reading: the descriptor (the
  // caller closes it) and its info. Errors: NotFound.
  absl::StatusOr<std::pair<int, v1::ArtifactInfo>> Read(
      const std::string& job_id, const std::string& name) const;

  // Removes everything kept for `job_id` (it was deleted or forgotten).
  absl::Status Delete(const std::string& job_id);

  // Bytes kept (and reserved by uploads) for `owner`.
  int64_t OwnerBytes(const std::string& owner) const;

  const std::string& dir() const { return dir_; }
  const Limits& limits() const { return limits_; }

 private:
  ArtifactStore(std::string dir, Limits limits)
      : dir_(std::move(dir)), limits_(limits) {}
  std::string FolderOf(const std::string& job_id) const;
  // An upload ended: its reservation of `reserved` bytes for `owner`
  // becomes `kept` (0 when it failed); `replaced`, an artifact of the same
  // owner it replaced, is released.
  void Settle(const std::string& owner, int64_t reserved, int64_t kept,
              int64_t replaced);

  const std::string dir_;
  const Limits limits_;
  mutable absl::Mutex mu_;
  std::map<std::string, int64_t> owner_bytes_ ABSL_GUARDED_BY(mu_);
};

// "model" and "checkpoint": the names an artifact may have (the files in a
// job's folder; their .info beside them).
bool IsArtifactName(absl::string_view name);

}  // namespace lockstep::coordinator

#endif  // LOCKSTEP_COORDINATOR_ARTIFACT_STORE_H_
