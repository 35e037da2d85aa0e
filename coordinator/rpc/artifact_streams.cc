// The artifact streams of the coordinator's gRPC service
// (artifact_streams.h).
#include "coordinator/rpc/artifact_streams.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/grpc_status.h"
#include "common/rpc_limits.h"

namespace lockstep::coordinator {

UploadReactor::UploadReactor(Coordinator* coordinator, StreamSlots* slots,
                             Caller caller, std::string identity,
                             v1::UploadArtifactResponse* response)
    : coordinator_(coordinator),
      slots_(slots),
      caller_(std::move(caller)),
      identity_(std::move(identity)),
      response_(response) {
  StartRead(&incoming_);
}

void UploadReactor::OnReadDone(bool ok) {
  if (!ok) {
    // The uploader closed its side (or the call was cancelled: then the
    // upload is short, and Finish says so).
    if (upload_ == nullptr) {
      End(absl::InvalidArgumentError(
          "UploadArtifact: the stream ended before its header"));
      return;
    }
    absl::StatusOr<v1::ArtifactInfo> kept = upload_->Finish();
    upload_.reset();
    coordinator_->ArtifactUploadEnded(job_id_, rank_, name_, kept);
    if (kept.ok()) *response_->mutable_info() = *kept;
    End(kept.status());
    return;
  }
  if (upload_ == nullptr) {
    if (!incoming_.has_header()) {
      End(absl::InvalidArgumentError(
          "UploadArtifact: the first message must carry the header"));
      return;
    }
    auto begun = coordinator_->BeginArtifactUpload(caller_, incoming_.header());
    if (!begun.ok()) {
      // A bound reached by a rank that may upload is the job's news; other
      // refusals (a stranger, a generation that is over) are only logged.
      if (begun.status().code() == absl::StatusCode::kResourceExhausted) {
        coordinator_->ArtifactUploadEnded(
            incoming_.header().job_id(), incoming_.header().rank(),
            incoming_.header().info().name(), begun.status());
      }
      End(begun.status());
      return;
    }
    upload_ = *std::move(begun);
    job_id_ = incoming_.header().job_id();
    rank_ = incoming_.header().rank();
    name_ = incoming_.header().info().name();
  } else if (incoming_.has_header()) {
    End(absl::InvalidArgumentError(absl::StrCat("UploadArtifact of job ",
                                                job_id_, " rank ", rank_,
                                                ": a second header")));
    return;
  }
  if (incoming_.data().size() > static_cast<size_t>(kMaxArtifactChunkBytes)) {
    End(absl::InvalidArgumentError(absl::StrFormat(
        "UploadArtifact of job %s rank %d: a message of %d bytes; at most "
        "%d",
        job_id_, rank_, incoming_.data().size(), kMaxArtifactChunkBytes)));
    return;
  }
  if (!incoming_.data().empty()) {
    if (absl::Status appended = upload_->Append(incoming_.data());
        !appended.ok()) {
      End(appended);
      return;
    }
  }
  StartRead(&incoming_);
}

void UploadReactor::End(const absl::Status& status) {
  if (upload_ != nullptr) {
    // Cut off before its end: nothing is kept (the destructor removes the
    // temporary file).
    upload_.reset();
    coordinator_->ArtifactUploadEnded(job_id_, rank_, name_, status);
  }
  Finish(ToGrpcStatus(status));
}

void UploadReactor::OnDone() {
  slots_->Release(identity_);
  delete this;
}

DownloadReactor::DownloadReactor(StreamSlots* slots, std::string identity,
                                 int fd, v1::ArtifactInfo info)
    : slots_(slots),
      identity_(std::move(identity)),
      fd_(fd),
      info_(std::move(info)) {
  *outgoing_.mutable_info() = info_;
  StartWrite(&outgoing_);
}

void DownloadReactor::OnWriteDone(bool ok) {
  if (!ok) {
    Finish(grpc::Status(grpc::StatusCode::CANCELLED,
                        "the download was cancelled"));
    return;
  }
  WriteNext();
}

void DownloadReactor::WriteNext() {
  outgoing_.Clear();
  std::string* data = outgoing_.mutable_data();
  data->resize(kMaxArtifactChunkBytes);
  ssize_t n;
  do {
    n = read(fd_, data->data(), data->size());
  } while (n < 0 && errno == EINTR);
  if (n < 0) {
    Finish(ToGrpcStatus(absl::InternalError(
        absl::StrCat("reading the artifact \"", info_.name(),
                     "\": ", std::strerror(errno)))));
    return;
  }
  if (n == 0) {
    Finish(sent_ == info_.bytes()
               ? grpc::Status::OK
               : ToGrpcStatus(absl::DataLossError(absl::StrFormat(
                     "the artifact \"%s\" ended after %d of its %d bytes",
                     info_.name(), sent_, info_.bytes()))));
    return;
  }
  data->resize(static_cast<size_t>(n));
  sent_ += n;
  StartWrite(&outgoing_);
}

void DownloadReactor::OnDone() {
  close(fd_);
  slots_->Release(identity_);
  delete this;
}

}  // namespace lockstep::coordinator
