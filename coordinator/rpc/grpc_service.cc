// The Coordinator's gRPC methods on the callback API: the short ones answer
// at once on gRPC's thread; KvGet finishes from the coordinator's
// non-blocking waits; sessions and watches are reactors (grpc_streams.h).
#include "coordinator/rpc/grpc_service.h"

#include <unistd.h>

#include <string>
#include <utility>

#include "common/caller.h"
#include "common/grpc_status.h"
#include "coordinator/authorization.h"
#include "coordinator/rpc/artifact_streams.h"

namespace lockstep::coordinator {
namespace {

// Finishes the call at once with `status`.
grpc::ServerUnaryReactor* Answer(grpc::CallbackServerContext* context,
                                 const absl::Status& status) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  reactor->Finish(ToGrpcStatus(status));
  return reactor;
}

// A KvGet waiting in the coordinator. `done` finishes it; a
// client that gives up cancels the wait, so nothing waits past its caller.
class RendezvousReactor final : public grpc::ServerUnaryReactor {
 public:
  explicit RendezvousReactor(Coordinator* coordinator)
      : coordinator_(coordinator) {}
  // Set once, by the method that creates it, before gRPC sees the reactor.
  void set_wait_id(Coordinator::WaitId id) { wait_id_ = id; }
  void OnCancel() override { coordinator_->CancelWait(wait_id_); }
  void OnDone() override { delete this; }

 private:
  Coordinator* const coordinator_;
  Coordinator::WaitId wait_id_ = 0;
};

// A stream refused before it started (over a cap).
template <typename Base>
class Refused final : public Base {
 public:
  explicit Refused(const grpc::Status& status) { this->Finish(status); }
  void OnDone() override { delete this; }
};

}  // namespace

GrpcService::GrpcService(Coordinator* coordinator, Limits limits, bool insecure,
                         DenyList* deny)
    : coordinator_(coordinator),
      insecure_(insecure),
      deny_(deny),
      sessions_("worker sessions", "--max-sessions", limits.max_sessions,
                "--max-sessions-per-identity",
                limits.max_sessions_per_identity),
      watches_("WatchJob streams", "--max-watches", limits.max_watches,
               "--max-watches-per-identity", limits.max_watches_per_identity),
      uploads_("artifact uploads", "(built in)", limits.max_artifact_streams,
               "(built in)", limits.max_artifact_streams_per_identity),
      downloads_("artifact downloads", "(built in)",
                 limits.max_artifact_streams, "(built in)",
                 limits.max_artifact_streams_per_identity) {}

Caller GrpcService::CallerFor(
    const grpc::CallbackServerContext* context) const {
  Caller caller =
      CallerOf(context->auth_context().get(), context->peer(), insecure_);
  if (deny_ != nullptr && caller.role != Role::kInsecure &&
      caller.role != Role::kNone && deny_->Denies(caller.id)) {
    caller.role = Role::kNone;
    caller.revoked = true;
    caller.id =
        absl::StrCat(caller.id, ", a revoked identity (--deny-identities)");
  }
  return caller;
}

grpc::ServerUnaryReactor* GrpcService::RegisterWorker(
    grpc::CallbackServerContext* context,
    const v1::RegisterWorkerRequest* request,
    v1::RegisterWorkerResponse* response) {
  auto result = coordinator_->RegisterWorker(CallerFor(context), *request);
  if (result.ok()) *response = *std::move(result);
  return Answer(context, result.status());
}

grpc::ServerBidiReactor<v1::WorkerMessage, v1::CoordinatorCommand>*
GrpcService::WorkerSession(grpc::CallbackServerContext* context) {
  using Reactor =
      grpc::ServerBidiReactor<v1::WorkerMessage, v1::CoordinatorCommand>;
  Caller caller = CallerFor(context);
  // Refused before it takes a slot: strangers cannot use up the cap.
  if (absl::Status refused = AuthorizeRole(caller, Call::kWorkerSession);
      !refused.ok()) {
    return new Refused<Reactor>(ToGrpcStatus(refused));
  }
  grpc::Status slot =
      sessions_.Take(caller.role == Role::kInsecure ? "" : caller.id);
  if (!slot.ok()) return new Refused<Reactor>(slot);
  return new SessionReactor(coordinator_, &sessions_, std::move(caller));
}

grpc::ServerUnaryReactor* GrpcService::KvSet(
    grpc::CallbackServerContext* context, const v1::KvSetRequest* request,
    v1::KvSetResponse*) {
  return Answer(context, coordinator_->KvSet(CallerFor(context), *request));
}

grpc::ServerUnaryReactor* GrpcService::KvGet(
    grpc::CallbackServerContext* context, const v1::KvGetRequest* request,
    v1::KvGetResponse* response) {
  auto* reactor = new RendezvousReactor(coordinator_);
  reactor->set_wait_id(coordinator_->KvGetAsync(
      CallerFor(context), *request,
      [reactor, response](absl::StatusOr<std::string> value) {
        if (value.ok()) response->set_value(*std::move(value));
        reactor->Finish(ToGrpcStatus(value.status()));
      }));
  return reactor;
}

grpc::ServerUnaryReactor* GrpcService::SubmitJob(
    grpc::CallbackServerContext* context, const v1::SubmitJobRequest* request,
    v1::SubmitJobResponse* response) {
  const Caller caller = CallerFor(context);
  if (absl::Status refused = AuthorizeRole(caller, Call::kSubmitJob);
      !refused.ok()) {
    return Answer(context, refused);
  }
  auto id = coordinator_->SubmitJob(request->spec(), OwnerIdOf(caller));
  if (id.ok()) response->set_job_id(*id);
  return Answer(context, id.status());
}

grpc::ServerUnaryReactor* GrpcService::GetJobStatus(
    grpc::CallbackServerContext* context,
    const v1::GetJobStatusRequest* request,
    v1::GetJobStatusResponse* response) {
  if (absl::Status refused =
          AuthorizeRole(CallerFor(context), Call::kGetJobStatus);
      !refused.ok()) {
    return Answer(context, refused);
  }
  auto page = coordinator_->GetJobStatus(*request);
  if (page.ok()) *response = *std::move(page);
  return Answer(context, page.status());
}

grpc::ServerWriteReactor<v1::JobStatus>* GrpcService::WatchJob(
    grpc::CallbackServerContext* context, const v1::WatchJobRequest* request) {
  // Refused before it takes a slot: strangers cannot use up the cap.
  Caller caller = CallerFor(context);
  if (absl::Status refused = AuthorizeRole(caller, Call::kWatchJob);
      !refused.ok()) {
    return new Refused<grpc::ServerWriteReactor<v1::JobStatus>>(
        ToGrpcStatus(refused));
  }
  std::string identity = caller.role == Role::kInsecure ? "" : caller.id;
  grpc::Status slot = watches_.Take(identity);
  if (!slot.ok()) {
    return new Refused<grpc::ServerWriteReactor<v1::JobStatus>>(slot);
  }
  return new WatchReactor(coordinator_, &watches_, std::move(identity),
                          request->job_id());
}

grpc::ServerUnaryReactor* GrpcService::StopJob(
    grpc::CallbackServerContext* context, const v1::StopJobRequest* request,
    v1::StopJobResponse*) {
  const Caller caller = CallerFor(context);
  if (absl::Status refused = AuthorizeRole(caller, Call::kStopJob);
      !refused.ok()) {
    return Answer(context, refused);
  }
  return Answer(context,
                coordinator_->StopJob(request->job_id(), OwnerIdOf(caller)));
}

grpc::ServerUnaryReactor* GrpcService::DeleteJob(
    grpc::CallbackServerContext* context, const v1::DeleteJobRequest* request,
    v1::DeleteJobResponse*) {
  const Caller caller = CallerFor(context);
  if (absl::Status refused = AuthorizeRole(caller, Call::kDeleteJob);
      !refused.ok()) {
    return Answer(context, refused);
  }
  return Answer(context,
                coordinator_->DeleteJob(request->job_id(), OwnerIdOf(caller)));
}

grpc::ServerUnaryReactor* GrpcService::ListWorkers(
    grpc::CallbackServerContext* context, const v1::ListWorkersRequest* request,
    v1::ListWorkersResponse* response) {
  if (absl::Status refused =
          AuthorizeRole(CallerFor(context), Call::kListWorkers);
      !refused.ok()) {
    return Answer(context, refused);
  }
  auto page = coordinator_->ListWorkers(*request);
  if (page.ok()) *response = *std::move(page);
  return Answer(context, page.status());
}

grpc::ServerUnaryReactor* GrpcService::ListQueue(
    grpc::CallbackServerContext* context, const v1::ListQueueRequest* request,
    v1::ListQueueResponse* response) {
  if (absl::Status refused =
          AuthorizeRole(CallerFor(context), Call::kListQueue);
      !refused.ok()) {
    return Answer(context, refused);
  }
  auto page = coordinator_->ListQueue(*request);
  if (page.ok()) *response = *std::move(page);
  return Answer(context, page.status());
}

grpc::ServerReadReactor<v1::ArtifactUpload>* GrpcService::UploadArtifact(
    grpc::CallbackServerContext* context,
    v1::UploadArtifactResponse* response) {
  Caller caller = CallerFor(context);
  if (absl::Status refused = AuthorizeRole(caller, Call::kUploadArtifact);
      !refused.ok()) {
    return new Refused<grpc::ServerReadReactor<v1::ArtifactUpload>>(
        ToGrpcStatus(refused));
  }
  std::string identity = OwnerIdOf(caller);
  grpc::Status slot = uploads_.Take(identity);
  if (!slot.ok()) {
    return new Refused<grpc::ServerReadReactor<v1::ArtifactUpload>>(slot);
  }
  return new UploadReactor(coordinator_, &uploads_, std::move(caller),
                           std::move(identity), response);
}

grpc::ServerUnaryReactor* GrpcService::ListArtifacts(
    grpc::CallbackServerContext* context,
    const v1::ListArtifactsRequest* request,
    v1::ListArtifactsResponse* response) {
  auto listed =
      coordinator_->ListArtifacts(CallerFor(context), request->job_id());
  if (listed.ok()) {
    for (v1::ArtifactInfo& info : *listed) {
      *response->add_artifacts() = std::move(info);
    }
  }
  return Answer(context, listed.status());
}

grpc::ServerWriteReactor<v1::ArtifactDownload>* GrpcService::DownloadArtifact(
    grpc::CallbackServerContext* context,
    const v1::DownloadArtifactRequest* request) {
  const Caller caller = CallerFor(context);
  std::string identity = OwnerIdOf(caller);
  auto opened =
      coordinator_->OpenArtifact(caller, request->job_id(), request->name());
  if (!opened.ok()) {
    return new Refused<grpc::ServerWriteReactor<v1::ArtifactDownload>>(
        ToGrpcStatus(opened.status()));
  }
  grpc::Status slot = downloads_.Take(identity);
  if (!slot.ok()) {
    close(opened->first);
    return new Refused<grpc::ServerWriteReactor<v1::ArtifactDownload>>(slot);
  }
  return new DownloadReactor(&downloads_, std::move(identity), opened->first,
                             std::move(opened->second));
}

grpc::ServerUnaryReactor* GrpcService::CompareJobs(
    grpc::CallbackServerContext* context, const v1::CompareJobsRequest* request,
    v1::CompareJobsResponse* response) {
  if (absl::Status refused =
          AuthorizeRole(CallerFor(context), Call::kCompareJobs);
      !refused.ok()) {
    return Answer(context, refused);
  }
  auto compared = coordinator_->CompareJobs(*request);
  if (compared.ok()) *response = *std::move(compared);
  return Answer(context, compared.status());
}

}  // namespace lockstep::coordinator
