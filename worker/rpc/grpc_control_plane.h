// ControlPlane over gRPC to a lockstep-coordinator.
#ifndef LOCKSTEP_WORKER_RPC_GRPC_CONTROL_PLANE_H_
#define LOCKSTEP_WORKER_RPC_GRPC_CONTROL_PLANE_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "lockstep/v1/coordinator.grpc.pb.h"
#include "worker/control_plane.h"

namespace lockstep::worker {

class GrpcControlPlane : public ControlPlane {
 public:
  // `address` is the coordinator's host:port; `credentials` are this
  // worker's (common/tls.h: mutual TLS, or insecure with --insecure).
  GrpcControlPlane(const std::string& address,
                   std::shared_ptr<grpc::ChannelCredentials> credentials);

  absl::StatusOr<v1::RegisterWorkerResponse> Register(
      const v1::RegisterWorkerRequest& request) override;
  absl::StatusOr<std::unique_ptr<Session>> OpenSession(
      const std::string& worker_id, uint64_t incarnation) override;
  std::unique_ptr<KeyValueClient> KeyValue(
      const std::string& job_id, int64_t generation, int rank,
      const std::string& rank_token) override;
  absl::StatusOr<v1::ArtifactInfo> UploadArtifact(
      v1::ArtifactUpload::Header header, const std::string& path,
      absl::Duration timeout) override;

 private:
  const std::string address_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
};

}  // namespace lockstep::worker

#endif  // LOCKSTEP_WORKER_RPC_GRPC_CONTROL_PLANE_H_
