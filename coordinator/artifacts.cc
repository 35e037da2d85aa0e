// The Coordinator's artifacts (issue 53): who may upload a job's export
// and who may read it; the files are the ArtifactStore's.
#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "coordinator/authorization.h"
#include "coordinator/coordinator.h"
#include "coordinator/message_checks.h"

namespace lockstep::coordinator {
namespace {

// The export's file name: the last part of its path.
std::string BaseName(const std::string& path) {
  return path.substr(path.rfind('/') + 1);
}

// OK when `info` declares an artifact the job makes: its export ("model",
// the export's file name and format) or, when it asks for it
// (checkpoint.upload_last), its checkpoint ("checkpoint",
// ckpt-<step>.tar, format "checkpoint"). `who` names the uploader.
absl::Status CheckDeclared(const std::string& who, const v1::JobSpec& spec,
                           const v1::ArtifactInfo& info) {
  if (info.name() == "checkpoint") {
    if (!spec.checkpoint().upload_last() ||
        spec.checkpoint().backup_dir().empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          who,
          ": the job does not ask for its checkpoint "
          "(checkpoint.upload_last), so the coordinator keeps none"));
    }
    const std::string& file = info.file_name();
    // checkpoint::ArchiveName(step).
    const bool tar_name = file == absl::StrFormat("ckpt-%09d.tar", info.step());
    if (!tar_name || info.format() != "checkpoint") {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: the upload declares a checkpoint file \"%s\" of format "
          "\"%s\" at step %d; a checkpoint is uploaded as "
          "ckpt-<step, 9 digits>.tar of format \"checkpoint\"",
          who, file, info.format(), info.step()));
    }
    return absl::OkStatus();
  }
  if (spec.export_path().empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(who,
                     ": the job exports nothing (no `export` in its "
                     "spec), so there is nothing to keep"));
  }
  const std::string format =
      spec.export_format().empty() ? "archive" : spec.export_format();
  if (info.name() != "model" ||
      info.file_name() != BaseName(spec.export_path()) ||
      info.format() != format) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: the upload declares artifact \"%s\", file \"%s\", format "
        "\"%s\"; the job's export is \"model\", file \"%s\", format "
        "\"%s\"",
        who, info.name(), info.file_name(), info.format(),
        BaseName(spec.export_path()), format));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<ArtifactStore::Upload>>
Coordinator::BeginArtifactUpload(const Caller& caller,
                                 const v1::ArtifactUpload::Header& header) {
  RETURN_IF_ERROR(AuthorizeRole(caller, Call::kUploadArtifact));
  if (absl::Status bad = CheckArtifactHeader(header); !bad.ok()) {
    return Refused(bad);
  }
  const std::string who =
      absl::StrCat("job ", header.job_id(), " rank ", header.rank());
  v1::ArtifactInfo info = header.info();
  std::string owner;
  {
    absl::MutexLock lock(&mu_);
    RETURN_IF_ERROR(AuthorizeRankLocked(caller, Call::kUploadArtifact,
                                        header.job_id(), header.generation(),
                                        header.rank(), header.rank_token()));
    // Under --insecure the rank is not proven, but the generation must
    // still be live.
    RETURN_IF_ERROR(
        CurrentGenerationLocked(header.job_id(), header.generation()).status());
    if (artifacts_ == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          who,
          ": this coordinator keeps no artifacts (no --artifact-dir); "
          "the export stays where the job wrote it"));
    }
    if (header.rank() != 0) {
      return Denied(caller, Call::kUploadArtifact,
                    absl::StrCat(who,
                                 " is not the chief: only rank 0 "
                                 "uploads its job's artifacts"));
    }
    const Job& job = jobs_[header.job_id()];
    RETURN_IF_ERROR(CheckDeclared(who, job.status.spec(), info));
    owner = job.status.owner();
    info.set_generation(header.generation());
    info.set_rank(header.rank());
    info.set_time(NowSeconds());
  }
  // Disk work outside the lock.
  return artifacts_->Begin(header.job_id(), owner, std::move(info));
}

void Coordinator::ArtifactUploadEnded(
    const std::string& job_id, int rank, const std::string& name,
    const absl::StatusOr<v1::ArtifactInfo>& kept) {
  // "export" for the model, as the spec calls it.
  const std::string what = name == "model" ? "export" : name;
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return;
  Job& job = it->second;
  if (kept.ok()) {
    AddEventLocked(
        job, "artifact_kept", nullptr,
        absl::StrFormat("the coordinator keeps the %s %s (%s, %d bytes, "
                        "step %d, SHA-256 %s) from rank %d: `lockstep "
                        "artifacts get %s%s`",
                        what, kept->file_name(), kept->format(), kept->bytes(),
                        kept->step(), kept->sha256().substr(0, 16), rank,
                        job_id, name == "model" ? "" : " " + name));
  } else {
    LogWarning("job ", job_id, " rank ", rank, ": its ", what,
               " was not kept: ", kept.status().message());
    AddEventLocked(
        job, "artifact_not_kept", nullptr,
        absl::StrCat(
            "the coordinator did not keep the ", what, " of rank ", rank, ": ",
            kept.status().message(),
            name == "model" ? "; it stays where the job wrote it" : ""));
  }
  ChangedLocked(job);
  PersistLocked(job);
}

absl::Status Coordinator::AuthorizeArtifactReader(const Caller& caller,
                                                  Call call,
                                                  const std::string& job_id,
                                                  const std::string& name) {
  RETURN_IF_ERROR(AuthorizeRole(caller, call));
  if (absl::Status bad = CheckArtifactRequest(CallName(call), job_id, name);
      !bad.ok()) {
    return Refused(bad);
  }
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) {
    return absl::NotFoundError(absl::StrCat("no job ", job_id));
  }
  if (caller.role == Role::kViewer) return absl::OkStatus();
  const std::string by = caller.role == Role::kInsecure ? "" : caller.id;
  return AuthorizeOwnerLocked(it->second, by, "read the artifacts of");
}

absl::StatusOr<std::vector<v1::ArtifactInfo>> Coordinator::ListArtifacts(
    const Caller& caller, const std::string& job_id) {
  RETURN_IF_ERROR(
      AuthorizeArtifactReader(caller, Call::kListArtifacts, job_id, ""));
  if (artifacts_ == nullptr) return std::vector<v1::ArtifactInfo>();
  return artifacts_->List(job_id);
}

absl::StatusOr<std::pair<int, v1::ArtifactInfo>> Coordinator::OpenArtifact(
    const Caller& caller, const std::string& job_id, const std::string& name) {
  RETURN_IF_ERROR(
      AuthorizeArtifactReader(caller, Call::kDownloadArtifact, job_id, name));
  if (artifacts_ == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("job ", job_id, " has no artifact \"", name,
                     "\": this coordinator keeps none (no --artifact-dir)"));
  }
  return artifacts_->Read(job_id, name);
}

void Coordinator::ForgetOrphanArtifactsLocked() {
  if (artifacts_ == nullptr) return;
  for (const std::string& job_id : artifacts_->Jobs()) {
    if (jobs_.count(job_id) > 0) continue;
    if (absl::Status deleted = artifacts_->Delete(job_id); !deleted.ok()) {
      LogError("the artifacts of forgotten job ", job_id, ": ",
               deleted.message());
    }
  }
}

}  // namespace lockstep::coordinator
