// The worker's ControlPlane, Session and KeyValueClient over gRPC
// (grpc_control_plane.h).
#include "worker/rpc/grpc_control_plane.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/files.h"
#include "common/grpc_status.h"
#include "common/rpc_limits.h"
#include "common/sha256.h"
#include "common/status_macros.h"

namespace lockstep::worker {
namespace {

absl::Status Annotate(const grpc::Status& status, const std::string& address,
                      absl::string_view what) {
  absl::Status result = FromGrpcStatus(status);
  if (result.ok()) return result;
  return absl::Status(
      result.code(),
      absl::StrCat(what, " at coordinator ", address, ": ", result.message()));
}

// A restarted coordinator is back within a second or two (Kubernetes,
// lockstep local): reconnect attempts start 100 ms apart and back off to
// 2 s at most, not gRPC's default 1 s growing to 2 minutes.
grpc::ChannelArguments ReconnectQuickly() {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 2000);
  args.SetMaxReceiveMessageSize(kMaxRpcMessageBytes);
  args.SetMaxSendMessageSize(kMaxRpcMessageBytes);
  return args;
}

class GrpcSession : public Session {
 public:
  GrpcSession(std::unique_ptr<grpc::ClientContext> context,
              std::unique_ptr<grpc::ClientReaderWriter<v1::WorkerMessage,
                                                       v1::CoordinatorCommand>>
                  stream)
      : context_(std::move(context)), stream_(std::move(stream)) {}

  ~GrpcSession() override { context_->TryCancel(); }

  bool Send(const v1::WorkerMessage& message) override {
    absl::MutexLock lock(&write_mu_);
    return !writes_done_ && stream_->Write(message);
  }

  bool Receive(v1::CoordinatorCommand* command) override {
    return stream_->Read(command);
  }

  absl::Status Finish() override {
    CloseWrites();
    return FromGrpcStatus(stream_->Finish());
  }

  void CloseWrites() override {
    absl::MutexLock lock(&write_mu_);
    if (writes_done_) return;
    writes_done_ = true;
    stream_->WritesDone();
  }

 private:
  std::unique_ptr<grpc::ClientContext> context_;
  absl::Mutex write_mu_;
  bool writes_done_ ABSL_GUARDED_BY(write_mu_) = false;
  std::unique_ptr<
      grpc::ClientReaderWriter<v1::WorkerMessage, v1::CoordinatorCommand>>
      stream_;
};

class GrpcKeyValue : public KeyValueClient {
 public:
  GrpcKeyValue(v1::Coordinator::Stub* stub, std::string address,
               std::string job_id, int64_t generation, int rank,
               std::string rank_token)
      : stub_(stub),
        address_(std::move(address)),
        job_id_(std::move(job_id)),
        generation_(generation),
        rank_(rank),
        rank_token_(std::move(rank_token)) {}

  absl::Status Set(const std::string& key, const std::string& value) override {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(30));
    if (!Track(&context)) return Cancelled(key);
    v1::KvSetRequest request;
    request.set_job_id(job_id_);
    request.set_generation(generation_);
    request.set_key(key);
    request.set_value(value);
    request.set_rank(rank_);
    request.set_rank_token(rank_token_);
    v1::KvSetResponse response;
    grpc::Status status = stub_->KvSet(&context, request, &response);
    if (!Untrack(&context)) return Cancelled(key);
    return Annotate(status, address_, absl::StrCat("setting key '", key, "'"));
  }

  absl::StatusOr<std::string> Get(const std::string& key,
                                  absl::Duration timeout) override {
    grpc::ClientContext context;
    // The coordinator enforces `timeout`; the RPC deadline is a backstop.
    context.set_deadline(
        absl::ToChronoTime(absl::Now() + timeout + absl::Seconds(10)));
    if (!Track(&context)) return Cancelled(key);
    v1::KvGetRequest request;
    request.set_job_id(job_id_);
    request.set_generation(generation_);
    request.set_key(key);
    request.set_timeout_ms(absl::ToInt64Milliseconds(timeout));
    request.set_rank(rank_);
    request.set_rank_token(rank_token_);
    v1::KvGetResponse response;
    grpc::Status status = stub_->KvGet(&context, request, &response);
    if (!Untrack(&context)) return Cancelled(key);
    if (!status.ok()) {
      return Annotate(status, address_,
                      absl::StrCat("getting key '", key, "'"));
    }
    return std::move(*response.mutable_value());
  }

  void Cancel() override {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
    for (grpc::ClientContext* context : pending_) context->TryCancel();
  }

 private:
  // Registers a call for Cancel(); false once cancelled.
  bool Track(grpc::ClientContext* context) {
    absl::MutexLock lock(&mu_);
    if (cancelled_) return false;
    pending_.insert(context);
    return true;
  }
  // The call is over; false when Cancel() ended it (or came after it).
  bool Untrack(grpc::ClientContext* context) {
    absl::MutexLock lock(&mu_);
    pending_.erase(context);
    return !cancelled_;
  }
  absl::Status Cancelled(const std::string& key) const {
    return absl::AbortedError(
        absl::StrCat("key '", key, "' of job ", job_id_, " generation ",
                     generation_, ": this worker left the generation"));
  }

  v1::Coordinator::Stub* const stub_;
  const std::string address_;
  const std::string job_id_;
  const int64_t generation_;
  const int rank_;
  const std::string rank_token_;
  absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::set<grpc::ClientContext*> pending_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

GrpcControlPlane::GrpcControlPlane(
    const std::string& address,
    std::shared_ptr<grpc::ChannelCredentials> credentials)
    : address_(address),
      channel_(grpc::CreateCustomChannel(address, std::move(credentials),
                                         ReconnectQuickly())),
      stub_(v1::Coordinator::NewStub(channel_)) {}

absl::StatusOr<v1::RegisterWorkerResponse> GrpcControlPlane::Register(
    const v1::RegisterWorkerRequest& request) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(10));
  context.set_wait_for_ready(true);
  v1::RegisterWorkerResponse response;
  grpc::Status status = stub_->RegisterWorker(&context, request, &response);
  if (status.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) {
    // Waiting for the channel hides why it failed to connect (a refused
    // handshake, a server that is not the coordinator): once more without
    // waiting, which fails with the channel's last error, or registers.
    grpc::ClientContext fail_fast;
    fail_fast.set_deadline(std::chrono::system_clock::now() +
                           std::chrono::seconds(2));
    status = stub_->RegisterWorker(&fail_fast, request, &response);
  }
  if (!status.ok()) return Annotate(status, address_, "registration");
  return response;
}

absl::StatusOr<std::unique_ptr<Session>> GrpcControlPlane::OpenSession(
    const std::string& worker_id, uint64_t incarnation) {
  auto context = std::make_unique<grpc::ClientContext>();
  auto stream = stub_->WorkerSession(context.get());
  v1::WorkerMessage hello;
  hello.mutable_hello()->set_worker_id(worker_id);
  hello.mutable_hello()->set_incarnation(incarnation);
  if (!stream->Write(hello)) {
    return Annotate(stream->Finish(), address_, "opening the worker session");
  }
  return std::unique_ptr<Session>(
      new GrpcSession(std::move(context), std::move(stream)));
}

std::unique_ptr<KeyValueClient> GrpcControlPlane::KeyValue(
    const std::string& job_id, int64_t generation, int rank,
    const std::string& rank_token) {
  return std::make_unique<GrpcKeyValue>(stub_.get(), address_, job_id,
                                        generation, rank, rank_token);
}

absl::StatusOr<v1::ArtifactInfo> GrpcControlPlane::UploadArtifact(
    v1::ArtifactUpload::Header header, const std::string& path,
    absl::Duration timeout) {
  const std::string what =
      absl::StrCat("uploading ", path, " (job ", header.job_id(), " rank ",
                   header.rank(), ")");
  // Its size and digest first: the coordinator checks the bytes against
  // them, so a file that changes meanwhile is refused, never kept torn.
  int64_t size = 0;
  {
    ASSIGN_OR_RETURN(int fd, OpenRegularFile(path, &size));
    Sha256 sha;
    std::string chunk(kMaxArtifactChunkBytes, '\0');
    for (;;) {
      const ssize_t n = read(fd, chunk.data(), chunk.size());
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) {
        close(fd);
        return absl::InternalError(
            absl::StrCat(what, ": ", std::strerror(errno)));
      }
      if (n == 0) break;
      sha.Update(chunk.data(), static_cast<size_t>(n));
    }
    close(fd);
    ASSIGN_OR_RETURN(*header.mutable_info()->mutable_sha256(), sha.HexDigest());
  }
  header.mutable_info()->set_bytes(size);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  v1::UploadArtifactResponse response;
  std::unique_ptr<grpc::ClientWriter<v1::ArtifactUpload>> stream =
      stub_->UploadArtifact(&context, &response);
  v1::ArtifactUpload message;
  *message.mutable_header() = header;
  bool sent = stream->Write(message);
  int64_t size_now = 0;
  absl::StatusOr<int> fd = OpenRegularFile(path, &size_now);
  if (!fd.ok()) {
    context.TryCancel();
    stream->Finish();
    return fd.status();
  }
  message.Clear();
  std::string* data = message.mutable_data();
  while (sent) {
    data->resize(kMaxArtifactChunkBytes);
    ssize_t n;
    do {
      n = read(*fd, data->data(), data->size());
    } while (n < 0 && errno == EINTR);
    if (n <= 0) break;
    data->resize(static_cast<size_t>(n));
    sent = stream->Write(message);
  }
  close(*fd);
  stream->WritesDone();
  grpc::Status status = stream->Finish();
  if (!status.ok()) return Annotate(status, address_, what);
  return response.info();
}

}  // namespace lockstep::worker
