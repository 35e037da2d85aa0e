// Every call of the coordinator over real gRPC with mutual TLS on
// 127.0.0.1, made without a certificate, with one from another CA, with
// identities that may not make it, and with the right one: only the right
// one succeeds, and each refusal has its code (no certificate:
// UNAUTHENTICATED; another CA: the handshake fails, UNAVAILABLE; a known
// identity not allowed: PERMISSION_DENIED).
//
// The cluster: static tasks worker:0 and worker:1 (certificates
// worker/worker/0 and worker/worker/1) with live sessions, running job A in
// generation 1; a spare registered by worker/pool-7; an operator and a
// viewer.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/caller.h"
#include "common/cert_maker.h"
#include "common/health_service.h"
#include "common/tf_config.h"
#include "common/tls.h"
#include "coordinator/coordinator.h"
#include "coordinator/rpc/grpc_service.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "lockstep/v1/coordinator.grpc.pb.h"

namespace lockstep::coordinator {
namespace {

using ::testing::HasSubstr;
using Stub = v1::Coordinator::Stub;
using Session =
    grpc::ClientReaderWriter<v1::WorkerMessage, v1::CoordinatorCommand>;

constexpr uint64_t kIncarnation0 = 0x1000;
constexpr uint64_t kIncarnation1 = 0x1001;
constexpr uint64_t kPoolIncarnation = 0x2000;

const grpc::StatusCode kOk = grpc::StatusCode::OK;
const grpc::StatusCode kNoIdentity = grpc::StatusCode::UNAUTHENTICATED;
const grpc::StatusCode kHandshake = grpc::StatusCode::UNAVAILABLE;
const grpc::StatusCode kDenied = grpc::StatusCode::PERMISSION_DENIED;

// Who calls: no certificate, another CA's certificate, or one of ours.
const char kNone[] = "no certificate";
const char kForeign[] = "another CA's worker/worker/0";
const char kWorker0[] = "spiffe://lockstep/worker/worker/0";
const char kWorker1[] = "spiffe://lockstep/worker/worker/1";
// A hot spare of the static cluster: it holds no rank.
const char kPool[] = "spiffe://lockstep/spare/pool-7";
const char kOperator[] = "spiffe://lockstep/operator/alice";
const char kViewer[] = "spiffe://lockstep/viewer/grafana";

void Deadline(grpc::ClientContext* context) {
  context->set_deadline(std::chrono::system_clock::now() +
                        std::chrono::seconds(10));
}

// One coordinator served with mutual TLS, and a channel per caller. The CAs
// and certificates are made once (key generation is the slow part), the
// coordinator once per test.
class CoordinatorTlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto ca = MakeCertificateAuthority("coordinator_tls_test CA");
    auto foreign = MakeCertificateAuthority("a foreign CA");
    ASSERT_TRUE(ca.ok() && foreign.ok());
    ca_ = new KeyAndCertificate(*ca);
    materials_ = new std::map<std::string, TlsMaterial>();
    for (const char* id : {kWorker0, kWorker1, kPool, kOperator, kViewer,
                           "spiffe://lockstep/coordinator"}) {
      (*materials_)[id] = Material(*ca, id);
    }
    (*materials_)[kForeign] = Material(*foreign, kWorker0);
  }
  static void TearDownTestSuite() {
    delete ca_;
    delete materials_;
  }

  // A certificate for `spiffe_id` issued by `issuer`, trusting our CA.
  static TlsMaterial Material(const KeyAndCertificate& issuer,
                              const std::string& spiffe_id) {
    CertificateSpec spec;
    spec.spiffe_id = spiffe_id;
    auto issued = IssueCertificate(issuer, spec);
    EXPECT_TRUE(issued.ok()) << issued.status();
    TlsMaterial material;
    material.cert_pem = issued->cert_pem;
    material.key_pem = issued->key_pem;
    material.ca_pem = ca_->cert_pem;
    return material;
  }

  void SetUp() override {
    Coordinator::Options options;
    options.cluster =
        ParseTfConfig(R"({"cluster": {"worker": ["a:1", "b:1"]}})")->cluster;
    auto created = Coordinator::Create(std::move(options));
    ASSERT_TRUE(created.ok()) << created.status();
    coordinator_ = *std::move(created);
    service_ = std::make_unique<GrpcService>(
        coordinator_.get(), GrpcService::Limits(), /*insecure=*/false);
    health_ = std::make_unique<HealthService>(/*insecure=*/false);
    grpc::ServerBuilder builder;
    builder.AddListeningPort(
        "127.0.0.1:0",
        ServerCredentials(materials_->at("spiffe://lockstep/coordinator")),
        &port_);
    builder.RegisterService(service_.get());
    builder.RegisterService(health_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    StartJob();
  }

  void TearDown() override {
    for (auto& [session, context] : sessions_) context->TryCancel();
    coordinator_->Shutdown();
    server_->Shutdown(std::chrono::system_clock::now() +
                      std::chrono::seconds(5));
    sessions_.clear();
  }

  std::shared_ptr<grpc::Channel> ChannelOf(const std::string& who) {
    std::shared_ptr<grpc::ChannelCredentials> credentials;
    if (who == kNone) {
      grpc::SslCredentialsOptions trust_only;
      trust_only.pem_root_certs = ca_->cert_pem;
      credentials = grpc::SslCredentials(trust_only);
    } else {
      credentials = ChannelCredentials(materials_->at(who));
    }
    return grpc::CreateChannel(absl::StrCat("127.0.0.1:", port_), credentials);
  }
  std::unique_ptr<Stub> StubOf(const std::string& who) {
    return v1::Coordinator::NewStub(ChannelOf(who));
  }

  static v1::RegisterWorkerRequest Task(int index, uint64_t incarnation) {
    v1::RegisterWorkerRequest request;
    request.mutable_task()->set_type("worker");
    request.mutable_task()->set_index(index);
    request.set_incarnation(incarnation);
    request.set_host("127.0.0.1");
    return request;
  }

  // Opens a session of `worker_id` as `who`; the stream, once the hello is
  // written (its status comes with the first read).
  std::unique_ptr<Session> OpenSession(const std::string& who,
                                       const std::string& worker_id,
                                       uint64_t incarnation,
                                       grpc::ClientContext* context) {
    std::unique_ptr<Session> session = StubOf(who)->WorkerSession(context);
    v1::WorkerMessage hello;
    hello.mutable_hello()->set_worker_id(worker_id);
    hello.mutable_hello()->set_incarnation(incarnation);
    session->Write(hello);
    return session;
  }

  // Registers and connects both tasks and the spare, and starts job A.
  void StartJob() {
    for (auto [who, index, incarnation] :
         {std::tuple{kWorker0, 0, kIncarnation0},
          std::tuple{kWorker1, 1, kIncarnation1}}) {
      grpc::ClientContext context;
      Deadline(&context);
      v1::RegisterWorkerResponse response;
      ASSERT_TRUE(
          StubOf(who)
              ->RegisterWorker(&context, Task(index, incarnation), &response)
              .ok());
      auto context_owner = std::make_unique<grpc::ClientContext>();
      auto session = OpenSession(who, response.worker_id(), incarnation,
                                 context_owner.get());
      sessions_.emplace_back(std::move(session), std::move(context_owner));
    }
    v1::RegisterWorkerRequest spare;
    spare.set_spare(true);
    spare.set_incarnation(kPoolIncarnation);
    spare.set_host("127.0.0.1");
    grpc::ClientContext context;
    Deadline(&context);
    v1::RegisterWorkerResponse response;
    ASSERT_TRUE(StubOf(kPool)->RegisterWorker(&context, spare, &response).ok());
    pool_id_ = response.worker_id();

    job_a_ = Submit();
    ASSERT_FALSE(job_a_.empty());
    for (auto& [session, context] : sessions_) {
      v1::CoordinatorCommand command;
      ASSERT_TRUE(session->Read(&command));
      ASSERT_TRUE(command.has_assignment());
      EXPECT_EQ(command.assignment().generation(), 1);
      if (command.assignment().rank() == 0) {
        rank0_token_ = command.assignment().rank_token();
      } else {
        rank1_token_ = command.assignment().rank_token();
      }
    }
  }

  std::string Submit() {
    grpc::ClientContext context;
    Deadline(&context);
    v1::SubmitJobRequest request;
    request.mutable_spec()->set_name("job");
    request.mutable_spec()->set_global_batch_size(64);
    v1::SubmitJobResponse response;
    grpc::Status status =
        StubOf(kOperator)->SubmitJob(&context, request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return response.job_id();
  }

  // A call of the coordinator as `who`.
  using Rpc = std::function<grpc::Status(const std::string& who)>;
  // Calls `rpc` as each caller in order and expects its code; the right
  // caller comes last, so that what it changes comes after the refusals.
  void Expect(
      const std::string& name, const Rpc& rpc,
      const std::vector<std::pair<std::string, grpc::StatusCode>>& callers) {
    for (const auto& [who, code] : callers) {
      SCOPED_TRACE(absl::StrCat(name, " by ", who));
      grpc::Status status = rpc(who);
      EXPECT_EQ(status.error_code(), code) << status.error_message();
      if (code == kDenied || code == kNoIdentity) {
        // The refusal names who tried what.
        EXPECT_THAT(status.error_message(), HasSubstr(name));
        EXPECT_THAT(status.error_message(), HasSubstr("127.0.0.1"));
        if (who != kNone) {
          EXPECT_THAT(status.error_message(), HasSubstr(who));
        }
      }
    }
  }

  // As rank 1 reads: with its rank and token.
  v1::KvGetRequest KvGet(const std::string& key) const {
    v1::KvGetRequest request;
    request.set_job_id(job_a_);
    request.set_generation(1);
    request.set_key(key);
    request.set_rank(1);
    request.set_rank_token(rank1_token_);
    return request;
  }

  static KeyAndCertificate* ca_;
  static std::map<std::string, TlsMaterial>* materials_;
  std::unique_ptr<Coordinator> coordinator_;
  std::unique_ptr<GrpcService> service_;
  std::unique_ptr<HealthService> health_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  std::vector<
      std::pair<std::unique_ptr<Session>, std::unique_ptr<grpc::ClientContext>>>
      sessions_;
  std::string pool_id_;
  std::string job_a_;
  // Rank 0's Assignment.rank_token: its keys need it.
  std::string rank0_token_;
  std::string rank1_token_;
};

KeyAndCertificate* CoordinatorTlsTest::ca_ = nullptr;
std::map<std::string, TlsMaterial>* CoordinatorTlsTest::materials_ = nullptr;

TEST_F(CoordinatorTlsTest, RegisterWorker) {
  // The right one: worker:0's own process registering again.
  Expect("RegisterWorker",
         [&](const std::string& who) {
           grpc::ClientContext context;
           Deadline(&context);
           v1::RegisterWorkerResponse response;
           return StubOf(who)->RegisterWorker(&context, Task(0, kIncarnation0),
                                              &response);
         },
         {{kNone, kNoIdentity},
          {kForeign, kHandshake},
          {kViewer, kDenied},
          {kWorker1, kDenied},
          {kWorker0, kOk}});
}

TEST_F(CoordinatorTlsTest, WorkerSession) {
  // The spare's session: only its registrant opens it (and is told to
  // stand by for job A).
  Expect("WorkerSession",
         [&](const std::string& who) {
           grpc::ClientContext context;
           Deadline(&context);
           auto session =
               OpenSession(who, pool_id_, kPoolIncarnation, &context);
           v1::CoordinatorCommand command;
           if (session->Read(&command)) {
             EXPECT_TRUE(command.has_standby());
             context.TryCancel();
             return grpc::Status::OK;
           }
           return session->Finish();
         },
         {{kNone, kNoIdentity},
          {kForeign, kHandshake},
          {kViewer, kDenied},
          {kWorker1, kDenied},
          {kPool, kOk}});
}

TEST_F(CoordinatorTlsTest, KvSetAndKvGet) {
  Expect("KvSet",
         [&](const std::string& who) {
           grpc::ClientContext context;
           Deadline(&context);
           v1::KvSetRequest request;
           request.set_job_id(job_a_);
           request.set_generation(1);
           request.set_key("rank0");
           request.set_value(absl::StrCat("address set by ", who));
           request.set_rank(0);
           request.set_rank_token(rank0_token_);
           v1::KvSetResponse response;
           return StubOf(who)->KvSet(&context, request, &response);
         },
         {{kNone, kNoIdentity},
          {kForeign, kHandshake},
          {kViewer, kDenied},
          {kPool, kDenied},  // a worker that holds no rank of the generation
          {kWorker0, kOk}});
  std::string value;
  Expect("KvGet",
         [&](const std::string& who) {
           grpc::ClientContext context;
           Deadline(&context);
           v1::KvGetResponse response;
           grpc::Status status =
               StubOf(who)->KvGet(&context, KvGet("rank0"), &response);
           value = response.value();
           return status;
         },
         {{kNone, kNoIdentity},
          {kForeign, kHandshake},
          {kViewer, kDenied},
          {kPool, kDenied},
          {kWorker1, kOk}});
  // What the ranks read is what a rank wrote.
  EXPECT_EQ(value, absl::StrCat("address set by ", kWorker0));
}

TEST_F(CoordinatorTlsTest, SubmitStopAndDeleteJob) {
  const std::vector<std::pair<std::string, grpc::StatusCode>> operators = {
      {kNone, kNoIdentity},
      {kForeign, kHandshake},
      {kViewer, kDenied},
      {kWorker0, kDenied},
      {kOperator, kOk}};
  std::string job_b;
  Expect(
      "SubmitJob",
      [&](const std::string& who) {
        grpc::ClientContext context;
        Deadline(&context);
        v1::SubmitJobRequest request;
        request.mutable_spec()->set_name("b");
        request.mutable_spec()->set_global_batch_size(64);
        v1::SubmitJobResponse response;
        grpc::Status status =
            StubOf(who)->SubmitJob(&context, request, &response);
        if (status.ok()) job_b = response.job_id();
        return status;
      },
      operators);
  ASSERT_FALSE(job_b.empty());
  Expect(
      "StopJob",
      [&](const std::string& who) {
        grpc::ClientContext context;
        Deadline(&context);
        v1::StopJobRequest request;
        request.set_job_id(job_b);
        v1::StopJobResponse response;
        return StubOf(who)->StopJob(&context, request, &response);
      },
      operators);
  Expect(
      "DeleteJob",
      [&](const std::string& who) {
        grpc::ClientContext context;
        Deadline(&context);
        v1::DeleteJobRequest request;
        request.set_job_id(job_b);
        v1::DeleteJobResponse response;
        return StubOf(who)->DeleteJob(&context, request, &response);
      },
      operators);
}

TEST_F(CoordinatorTlsTest, ReadsNeedAnOperatorOrAViewer) {
  const std::vector<std::pair<std::string, grpc::StatusCode>> readers = {
      {kNone, kNoIdentity}, {kForeign, kHandshake}, {kWorker0, kDenied},
      {kWorker1, kDenied},  {kOperator, kOk},       {kViewer, kOk}};
  Expect(
      "GetJobStatus",
      [&](const std::string& who) {
        grpc::ClientContext context;
        Deadline(&context);
        v1::GetJobStatusRequest request;
        request.set_job_id(job_a_);
        v1::GetJobStatusResponse response;
        grpc::Status status =
            StubOf(who)->GetJobStatus(&context, request, &response);
        if (status.ok()) EXPECT_EQ(response.jobs(0).job_id(), job_a_);
        return status;
      },
      readers);
  Expect(
      "WatchJob",
      [&](const std::string& who) {
        grpc::ClientContext context;
        Deadline(&context);
        v1::WatchJobRequest request;
        request.set_job_id(job_a_);
        auto reader = StubOf(who)->WatchJob(&context, request);
        v1::JobStatus status;
        if (reader->Read(&status)) {
          EXPECT_EQ(status.job_id(), job_a_);
          context.TryCancel();
          return grpc::Status::OK;
        }
        return reader->Finish();
      },
      readers);
  Expect(
      "ListWorkers",
      [&](const std::string& who) {
        grpc::ClientContext context;
        Deadline(&context);
        v1::ListWorkersResponse response;
        grpc::Status status = StubOf(who)->ListWorkers(
            &context, v1::ListWorkersRequest(), &response);
        if (status.ok()) EXPECT_EQ(response.workers_size(), 3);
        return status;
      },
      readers);
}

TEST_F(CoordinatorTlsTest, HealthAnswersAnyKnownIdentity) {
  for (const auto& [who, code] :
       std::vector<std::pair<std::string, grpc::StatusCode>>{
           {kNone, kNoIdentity},
           {kForeign, kHandshake},
           {kWorker0, kOk},
           {kOperator, kOk},
           {kViewer, kOk}}) {
    SCOPED_TRACE(who);
    auto stub = grpc::health::v1::Health::NewStub(ChannelOf(who));
    grpc::ClientContext context;
    Deadline(&context);
    grpc::health::v1::HealthCheckResponse response;
    grpc::Status status = stub->Check(
        &context, grpc::health::v1::HealthCheckRequest(), &response);
    EXPECT_EQ(status.error_code(), code) << status.error_message();
    if (status.ok()) {
      EXPECT_EQ(response.status(),
                grpc::health::v1::HealthCheckResponse::SERVING);
    }
  }
}

TEST_F(CoordinatorTlsTest, ALiveSessionCannotBeTakenOver) {
  // worker:1's certificate, a new process: refused while the session of
  // the one that runs is live, and the job goes on.
  grpc::ClientContext context;
  Deadline(&context);
  v1::RegisterWorkerResponse response;
  grpc::Status status =
      StubOf(kWorker1)->RegisterWorker(&context, Task(1, 0xbad), &response);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(status.error_message(), HasSubstr("live session"));
  v1::GetJobStatusRequest request;
  request.set_job_id(job_a_);
  auto jobs = coordinator_->GetJobStatus(request);
  ASSERT_TRUE(jobs.ok()) << jobs.status();
  EXPECT_EQ(jobs->jobs(0).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(jobs->jobs(0).generation(), 1);
}

}  // namespace
}  // namespace lockstep::coordinator
