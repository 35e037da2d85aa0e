// The artifact calls of the coordinator's gRPC service as callback
// reactors (issue 53): an upload (the chief's export, message by message
// into the ArtifactStore) and a download (the file, a chunk per write). No
// call holds a thread while it waits for the network; the disk work of a
// message runs in its reaction.
#ifndef LOCKSTEP_COORDINATOR_RPC_ARTIFACT_STREAMS_H_
#define LOCKSTEP_COORDINATOR_RPC_ARTIFACT_STREAMS_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "common/caller.h"
#include "coordinator/coordinator.h"
#include "coordinator/rpc/grpc_streams.h"
#include "lockstep/v1/coordinator.pb.h"

namespace lockstep::coordinator {

// One UploadArtifact stream: the first message's header starts the upload
// (Coordinator::BeginArtifactUpload), each later message's bytes are
// appended, and the end of the stream finishes it (size and SHA-256
// checked). A stream cut short, or one whose bytes do not match, keeps
// nothing; the job's events say how its upload ended.
class UploadReactor final : public grpc::ServerReadReactor<v1::ArtifactUpload> {
 public:
  // Holds one slot of `slots` (taken by the caller for `identity`).
  UploadReactor(Coordinator* coordinator, StreamSlots* slots, Caller caller,
                std::string identity, v1::UploadArtifactResponse* response);

  void OnReadDone(bool ok) override;
  void OnDone() override;

 private:
  // Ends the call with `status`; a started upload that did not finish is
  // reported to the coordinator.
  void End(const absl::Status& status);

  Coordinator* const coordinator_;
  StreamSlots* const slots_;
  const Caller caller_;
  const std::string identity_;
  v1::UploadArtifactResponse* const response_;
  // Touched only by reactions, which gRPC runs one at a time.
  v1::ArtifactUpload incoming_;
  std::unique_ptr<ArtifactStore::Upload> upload_;
  std::string job_id_;
  int rank_ = 0;
  std::string name_;  // the artifact's, from the header
};

// One DownloadArtifact stream: the ArtifactInfo, then the file's bytes a
// chunk at a time, each read when the last is written.
class DownloadReactor final
    : public grpc::ServerWriteReactor<v1::ArtifactDownload> {
 public:
  // Owns `fd`; holds one slot of `slots` (taken for `identity`).
  DownloadReactor(StreamSlots* slots, std::string identity, int fd,
                  v1::ArtifactInfo info);

  void OnWriteDone(bool ok) override;
  void OnDone() override;

 private:
  void WriteNext();

  StreamSlots* const slots_;
  const std::string identity_;
  const int fd_;
  const v1::ArtifactInfo info_;
  v1::ArtifactDownload outgoing_;
  int64_t sent_ = 0;
};

}  // namespace lockstep::coordinator

#endif  // LOCKSTEP_COORDINATOR_RPC_ARTIFACT_STREAMS_H_
