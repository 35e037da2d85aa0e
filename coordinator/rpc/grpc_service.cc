// The Coordinator's gRPC methods: each translates its request and status,
// and a worker session pumps commands and messages (grpc_service.h).
#include "coordinator/rpc/grpc_service.h"

#include <deque>
#include <optional>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "common/grpc_status.h"
#include "common/job_state.h"

namespace lockstep::coordinator {
namespace {

// Commands queued for one worker session; the handler thread drains them.
class QueueSink : public SessionSink {
 public:
  void Send(const v1::CoordinatorCommand& command) override {
    absl::MutexLock lock(&mu_);
    queue_.push_back(command);
  }

  void Close() override {
    absl::MutexLock lock(&mu_);
    closed_ = true;
  }

  // The next command; nullopt once closed or after `timeout` with nothing.
  std::optional<v1::CoordinatorCommand> Pop(absl::Duration timeout,
                                            bool* closed) {
    absl::MutexLock lock(&mu_);
    auto ready = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return closed_ || !queue_.empty();
    };
    mu_.AwaitWithTimeout(absl::Condition(&ready), timeout);
    *closed = closed_;
    if (queue_.empty()) return std::nullopt;
    v1::CoordinatorCommand command = std::move(queue_.front());
    queue_.pop_front();
    return command;
  }

 private:
  absl::Mutex mu_;
  std::deque<v1::CoordinatorCommand> queue_ ABSL_GUARDED_BY(mu_);
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace

grpc::Status GrpcService::RegisterWorker(
    grpc::ServerContext*, const v1::RegisterWorkerRequest* request,
    v1::RegisterWorkerResponse* response) {
  auto result = coordinator_->RegisterWorker(*request);
  if (!result.ok()) return ToGrpcStatus(result.status());
  *response = *std::move(result);
  return grpc::Status::OK;
}

grpc::Status GrpcService::WorkerSession(
    grpc::ServerContext* context,
    grpc::ServerReaderWriter<v1::CoordinatorCommand, v1::WorkerMessage>*
        stream) {
  v1::WorkerMessage first;
  if (!stream->Read(&first) || !first.has_hello()) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                        "a worker session must start with a SessionHello");
  }
  const std::string worker_id = first.hello().worker_id();
  const uint64_t incarnation = first.hello().incarnation();
  QueueSink sink;
  absl::Status opened =
      coordinator_->OpenSession(worker_id, incarnation, &sink);
  if (!opened.ok()) return ToGrpcStatus(opened);

  std::thread reader([&] {
    v1::WorkerMessage message;
    while (stream->Read(&message)) {
      (void)coordinator_->HandleWorkerMessage(worker_id, message);
    }
    sink.Close();
  });
  absl::Status cause = absl::UnavailableError("the worker closed its session");
  while (true) {
    bool closed = false;
    auto command = sink.Pop(absl::Milliseconds(500), &closed);
    if (command.has_value() && !stream->Write(*command)) {
      cause = absl::UnavailableError("cannot write to the worker");
      break;
    }
    if (closed) break;
    if (context->IsCancelled()) {
      cause = absl::CancelledError("the session was cancelled");
      break;
    }
  }
  coordinator_->CloseSession(worker_id, incarnation, &sink, cause);
  context->TryCancel();
  reader.join();
  return grpc::Status::OK;
}

grpc::Status GrpcService::KvSet(grpc::ServerContext*,
                                const v1::KvSetRequest* request,
                                v1::KvSetResponse*) {
  return ToGrpcStatus(coordinator_->KvSet(*request));
}

grpc::Status GrpcService::KvGet(grpc::ServerContext*,
                                const v1::KvGetRequest* request,
                                v1::KvGetResponse* response) {
  auto value = coordinator_->KvGet(*request);
  if (!value.ok()) return ToGrpcStatus(value.status());
  response->set_value(*std::move(value));
  return grpc::Status::OK;
}

grpc::Status GrpcService::Barrier(grpc::ServerContext*,
                                  const v1::BarrierRequest* request,
                                  v1::BarrierResponse*) {
  return ToGrpcStatus(coordinator_->Barrier(*request));
}

grpc::Status GrpcService::SubmitJob(grpc::ServerContext*,
                                    const v1::SubmitJobRequest* request,
                                    v1::SubmitJobResponse* response) {
  auto id = coordinator_->SubmitJob(request->spec());
  if (!id.ok()) return ToGrpcStatus(id.status());
  response->set_job_id(*id);
  return grpc::Status::OK;
}

grpc::Status GrpcService::GetJobStatus(grpc::ServerContext*,
                                       const v1::GetJobStatusRequest* request,
                                       v1::GetJobStatusResponse* response) {
  auto page = coordinator_->GetJobStatus(*request);
  if (!page.ok()) return ToGrpcStatus(page.status());
  *response = *std::move(page);
  return grpc::Status::OK;
}

grpc::Status GrpcService::WatchJob(grpc::ServerContext* context,
                                   const v1::WatchJobRequest* request,
                                   grpc::ServerWriter<v1::JobStatus>* writer) {
  int64_t version = -1;
  while (!context->IsCancelled()) {
    auto status = coordinator_->WaitForJobChange(
        request->job_id(), version, absl::Now() + absl::Seconds(1));
    if (!status.ok()) return ToGrpcStatus(status.status());
    if (status->version() == version) continue;
    version = status->version();
    if (!writer->Write(*status)) break;
    if (IsTerminal(status->state())) break;
  }
  return grpc::Status::OK;
}

grpc::Status GrpcService::StopJob(grpc::ServerContext*,
                                  const v1::StopJobRequest* request,
                                  v1::StopJobResponse*) {
  return ToGrpcStatus(coordinator_->StopJob(request->job_id()));
}

grpc::Status GrpcService::DeleteJob(grpc::ServerContext*,
                                    const v1::DeleteJobRequest* request,
                                    v1::DeleteJobResponse*) {
  return ToGrpcStatus(coordinator_->DeleteJob(request->job_id()));
}

grpc::Status GrpcService::ListWorkers(grpc::ServerContext*,
                                      const v1::ListWorkersRequest*,
                                      v1::ListWorkersResponse* response) {
  for (v1::WorkerInfo& info : coordinator_->ListWorkers()) {
    *response->add_workers() = std::move(info);
  }
  return grpc::Status::OK;
}

}  // namespace lockstep::coordinator
