// gRPC adapter for the Coordinator: translates protos and statuses, nothing
// else. Every method is served on gRPC's callback API, so no call holds a
// thread while it waits: worker sessions and job watches are reactors fed by
// the coordinator (grpc_streams.h), and KvGet finishes from the
// coordinator's non-blocking waits. The number of sessions and watches is
// capped; over a cap a new one gets RESOURCE_EXHAUSTED naming the cap.
//
// Every call is authorized first (coordinator/authorization.h): the caller
// is the identity in the client certificate of the call's mutual-TLS
// connection (common/caller.h). The job calls are checked by role here; the
// worker calls by role and state in the Coordinator, which gets the caller.
#ifndef LOCKSTEP_COORDINATOR_RPC_GRPC_SERVICE_H_
#define LOCKSTEP_COORDINATOR_RPC_GRPC_SERVICE_H_

#include "common/deny_list.h"
#include "coordinator/coordinator.h"
#include "coordinator/rpc/grpc_streams.h"
#include "lockstep/v1/coordinator.grpc.pb.h"

namespace lockstep::coordinator {

class GrpcService final : public v1::Coordinator::CallbackService {
 public:
  struct Limits {
    // Open worker sessions (lockstep-coordinator --max-sessions).
    int max_sessions = 10000;
    // Open WatchJob streams (lockstep-coordinator --max-watches).
    int max_watches = 1000;
    // The same for one identity (--max-sessions-per-identity: a worker
    // needs one, a few while it reconnects; --max-watches-per-identity).
    int max_sessions_per_identity = 8;
    int max_watches_per_identity = 100;
    // Artifact uploads and downloads open at once, in all and per
    // identity (a chief uploads one export; a script downloads a few).
    int max_artifact_streams = 64;
    int max_artifact_streams_per_identity = 4;
  };

  // `coordinator` must outlive the service and every call it serves.
  // `insecure`: the server runs without TLS (--insecure), so nobody is
  // authenticated and every caller may make every call. `deny` (may be
  // null; must outlive the service): identities treated as having no
  // certificate (--deny-identities).
  GrpcService(Coordinator* coordinator, Limits limits, bool insecure,
              DenyList* deny = nullptr);

  grpc::ServerUnaryReactor* RegisterWorker(
      grpc::CallbackServerContext* context,
      const v1::RegisterWorkerRequest* request,
      v1::RegisterWorkerResponse* response) override;
  grpc::ServerBidiReactor<v1::WorkerMessage, v1::CoordinatorCommand>*
  WorkerSession(grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* KvSet(grpc::CallbackServerContext* context,
                                  const v1::KvSetRequest* request,
                                  v1::KvSetResponse* response) override;
  grpc::ServerUnaryReactor* KvGet(grpc::CallbackServerContext* context,
                                  const v1::KvGetRequest* request,
                                  v1::KvGetResponse* response) override;
  grpc::ServerUnaryReactor* SubmitJob(grpc::CallbackServerContext* context,
                                      const v1::SubmitJobRequest* request,
                                      v1::SubmitJobResponse* response) override;
  grpc::ServerUnaryReactor* GetJobStatus(
      grpc::CallbackServerContext* context,
      const v1::GetJobStatusRequest* request,
      v1::GetJobStatusResponse* response) override;
  grpc::ServerWriteReactor<v1::JobStatus>* WatchJob(
      grpc::CallbackServerContext* context,
      const v1::WatchJobRequest* request) override;
  grpc::ServerUnaryReactor* StopJob(grpc::CallbackServerContext* context,
                                    const v1::StopJobRequest* request,
                                    v1::StopJobResponse* response) override;
  grpc::ServerUnaryReactor* DeleteJob(grpc::CallbackServerContext* context,
                                      const v1::DeleteJobRequest* request,
                                      v1::DeleteJobResponse* response) override;
  grpc::ServerUnaryReactor* ListWorkers(
      grpc::CallbackServerContext* context,
      const v1::ListWorkersRequest* request,
      v1::ListWorkersResponse* response) override;
  grpc::ServerUnaryReactor* ListQueue(grpc::CallbackServerContext* context,
                                      const v1::ListQueueRequest* request,
                                      v1::ListQueueResponse* response) override;
  grpc::ServerReadReactor<v1::ArtifactUpload>* UploadArtifact(
      grpc::CallbackServerContext* context,
      v1::UploadArtifactResponse* response) override;
  grpc::ServerUnaryReactor* ListArtifacts(
      grpc::CallbackServerContext* context,
      const v1::ListArtifactsRequest* request,
      v1::ListArtifactsResponse* response) override;
  grpc::ServerWriteReactor<v1::ArtifactDownload>* DownloadArtifact(
      grpc::CallbackServerContext* context,
      const v1::DownloadArtifactRequest* request) override;
  grpc::ServerUnaryReactor* CompareJobs(
      grpc::CallbackServerContext* context,
      const v1::CompareJobsRequest* request,
      v1::CompareJobsResponse* response) override;

 private:
  // Who makes the call (Role::kInsecure for every caller with --insecure;
  // Role::kNone for a denied identity).
  Caller CallerFor(const grpc::CallbackServerContext* context) const;
  // The caller's SPIFFE ID as the coordinator records it: "" under
  // --insecure (nobody is authenticated).
  static std::string OwnerIdOf(const Caller& caller) {
    return caller.role == Role::kInsecure ? "" : caller.id;
  }

  Coordinator* const coordinator_;
  const bool insecure_;
  DenyList* const deny_;
  StreamSlots sessions_;
  StreamSlots watches_;
  StreamSlots uploads_;
  StreamSlots downloads_;
};

}  // namespace lockstep::coordinator

#endif  // LOCKSTEP_COORDINATOR_RPC_GRPC_SERVICE_H_
