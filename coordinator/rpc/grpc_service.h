// gRPC adapter for the Coordinator: translates protos and statuses, nothing
// else. Each worker session runs its command writer on the handler thread and
// reads heartbeats and reports on a second thread.
#ifndef LOCKSTEP_COORDINATOR_RPC_GRPC_SERVICE_H_
#define LOCKSTEP_COORDINATOR_RPC_GRPC_SERVICE_H_

#include "coordinator/coordinator.h"
#include "lockstep/v1/coordinator.grpc.pb.h"

namespace lockstep::coordinator {

class GrpcService final : public v1::Coordinator::Service {
 public:
  // `coordinator` must outlive the service.
  explicit GrpcService(Coordinator* coordinator) : coordinator_(coordinator) {}

  grpc::Status RegisterWorker(grpc::ServerContext* context,
                              const v1::RegisterWorkerRequest* request,
                              v1::RegisterWorkerResponse* response) override;
  grpc::Status WorkerSession(
      grpc::ServerContext* context,
      grpc::ServerReaderWriter<v1::CoordinatorCommand, v1::WorkerMessage>*
          stream) override;
  grpc::Status KvSet(grpc::ServerContext* context,
                     const v1::KvSetRequest* request,
                     v1::KvSetResponse* response) override;
  grpc::Status KvGet(grpc::ServerContext* context,
                     const v1::KvGetRequest* request,
                     v1::KvGetResponse* response) override;
  grpc::Status Barrier(grpc::ServerContext* context,
                       const v1::BarrierRequest* request,
                       v1::BarrierResponse* response) override;
  grpc::Status SubmitJob(grpc::ServerContext* context,
                         const v1::SubmitJobRequest* request,
                         v1::SubmitJobResponse* response) override;
  grpc::Status GetJobStatus(grpc::ServerContext* context,
                            const v1::GetJobStatusRequest* request,
                            v1::GetJobStatusResponse* response) override;
  grpc::Status WatchJob(grpc::ServerContext* context,
                        const v1::WatchJobRequest* request,
                        grpc::ServerWriter<v1::JobStatus>* writer) override;
  grpc::Status StopJob(grpc::ServerContext* context,
                       const v1::StopJobRequest* request,
                       v1::StopJobResponse* response) override;
  grpc::Status DeleteJob(grpc::ServerContext* context,
                         const v1::DeleteJobRequest* request,
                         v1::DeleteJobResponse* response) override;
  grpc::Status ListWorkers(grpc::ServerContext* context,
                           const v1::ListWorkersRequest* request,
                           v1::ListWorkersResponse* response) override;

 private:
  Coordinator* const coordinator_;
};

}  // namespace lockstep::coordinator

#endif  // LOCKSTEP_COORDINATOR_RPC_GRPC_SERVICE_H_
