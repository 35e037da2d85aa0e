// The coordinator's gRPC service, in process on 127.0.0.1: the caps on
// worker sessions and watch streams (RESOURCE_EXHAUSTED naming the cap and
// its flag; a closed stream frees its slot) and that watch streams hold no
// thread each.
#include <dirent.h>
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "coordinator/coordinator.h"
#include "coordinator/rpc/grpc_service.h"
#include "coordinator/rpc/grpc_streams.h"
#include "lockstep/v1/coordinator.grpc.pb.h"

namespace lockstep::coordinator {
namespace {

using ::testing::HasSubstr;
using Session =
    grpc::ClientReaderWriter<v1::WorkerMessage, v1::CoordinatorCommand>;

// Threads of this process.
int CountThreads() {
  int count = 0;
  DIR* dir = opendir("/proc/self/task");
  if (dir == nullptr) return -1;
  while (dirent* entry = readdir(dir)) {
    if (entry->d_name[0] != '.') ++count;
  }
  closedir(dir);
  return count;
}

class CoordinatorRpcTest : public ::testing::Test {
 protected:
  void Serve(GrpcService::Limits limits) {
    auto created = Coordinator::Create(Coordinator::Options());
    ASSERT_TRUE(created.ok()) << created.status();
    coordinator_ = *std::move(created);
    service_ = std::make_unique<GrpcService>(coordinator_.get(), limits,
                                             /*insecure=*/true);
    grpc::ServerBuilder builder;
    int port = 0;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(),
                             &port);
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_NE(port, 0);
    stub_ = v1::Coordinator::NewStub(grpc::CreateChannel(
        absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials()));
  }

  void TearDown() override {
    if (coordinator_ != nullptr) coordinator_->Shutdown();
    if (server_ != nullptr) {
      server_->Shutdown(std::chrono::system_clock::now() +
                        std::chrono::seconds(5));
    }
  }

  // Registers a free worker; returns its id.
  std::string Register(uint64_t incarnation) {
    grpc::ClientContext context;
    v1::RegisterWorkerRequest request;
    request.set_incarnation(incarnation);
    request.set_host("127.0.0.1");
    v1::RegisterWorkerResponse response;
    grpc::Status status = stub_->RegisterWorker(&context, request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return response.worker_id();
  }

  // Opens the worker's session and sends its hello.
  std::unique_ptr<Session> Open(grpc::ClientContext* context,
                                const std::string& id, uint64_t incarnation) {
    std::unique_ptr<Session> session = stub_->WorkerSession(context);
    v1::WorkerMessage hello;
    hello.mutable_hello()->set_worker_id(id);
    hello.mutable_hello()->set_incarnation(incarnation);
    session->Write(hello);
    return session;
  }

  // Waits until ListWorkers shows the workers connected.
  void AwaitConnected(int workers) {
    for (absl::Time give_up = absl::Now() + absl::Seconds(30);
         absl::Now() < give_up;) {
      grpc::ClientContext context;
      v1::ListWorkersResponse response;
      ASSERT_TRUE(
          stub_->ListWorkers(&context, v1::ListWorkersRequest(), &response)
              .ok());
      int connected = 0;
      for (const v1::WorkerInfo& info : response.workers()) {
        connected += info.connected();
      }
      if (connected == workers) return;
    }
    FAIL() << "the sessions never connected";
  }

  std::string SubmitJob() {
    grpc::ClientContext context;
    v1::SubmitJobRequest request;
    request.mutable_spec()->set_name("watched");
    request.mutable_spec()->set_global_batch_size(64);
    request.mutable_spec()->set_num_workers(1);
    v1::SubmitJobResponse response;
    grpc::Status status = stub_->SubmitJob(&context, request, &response);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return response.job_id();
  }

  // A watch of `job` that has delivered its first status.
  struct Watch {
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientReader<v1::JobStatus>> reader;
    v1::JobStatus first;
    bool open = false;
  };
  std::unique_ptr<Watch> StartWatch(const std::string& job) {
    auto watch = std::make_unique<Watch>();
    v1::WatchJobRequest request;
    request.set_job_id(job);
    watch->reader = stub_->WatchJob(&watch->context, request);
    watch->open = watch->reader->Read(&watch->first);
    return watch;
  }

  std::unique_ptr<Coordinator> coordinator_;
  std::unique_ptr<GrpcService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
};

TEST_F(CoordinatorRpcTest, SessionsOverTheCapAreRefusedUntilOneCloses) {
  Serve({.max_sessions = 2, .max_watches = 10});
  std::string a = Register(1), b = Register(2), c = Register(3);
  grpc::ClientContext context_a, context_b;
  auto session_a = Open(&context_a, a, 1);
  auto session_b = Open(&context_b, b, 2);
  AwaitConnected(2);

  grpc::ClientContext context_c;
  auto refused = Open(&context_c, c, 3);
  v1::CoordinatorCommand command;
  EXPECT_FALSE(refused->Read(&command));
  grpc::Status status = refused->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(status.error_message(), HasSubstr("cap of 2 worker sessions"));
  EXPECT_THAT(status.error_message(), HasSubstr("--max-sessions"));

  // Closing a session frees its slot; the slot is released just after the
  // client sees the stream end, so the third worker retries until it is in.
  session_a->WritesDone();
  EXPECT_TRUE(session_a->Finish().ok());
  for (absl::Time give_up = absl::Now() + absl::Seconds(30);;) {
    ASSERT_LT(absl::Now(), give_up) << "the closed session's slot never freed";
    grpc::ClientContext context;
    auto session = Open(&context, c, 3);
    session->WritesDone();
    status = session->Finish();
    if (status.error_code() != grpc::StatusCode::RESOURCE_EXHAUSTED) break;
  }
  EXPECT_TRUE(status.ok()) << status.error_message();
}

TEST_F(CoordinatorRpcTest, WatchesOverTheCapAreRefusedUntilOneCloses) {
  Serve({.max_sessions = 10, .max_watches = 2});
  std::string job = SubmitJob();
  auto first = StartWatch(job);
  auto second = StartWatch(job);
  ASSERT_TRUE(first->open);
  ASSERT_TRUE(second->open);
  EXPECT_EQ(first->first.state(), v1::JOB_STATE_QUEUED);

  auto refused = StartWatch(job);
  EXPECT_FALSE(refused->open);
  grpc::Status status = refused->reader->Finish();
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(status.error_message(), HasSubstr("cap of 2 WatchJob streams"));
  EXPECT_THAT(status.error_message(), HasSubstr("--max-watches"));

  first->context.TryCancel();
  EXPECT_EQ(first->reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  for (absl::Time give_up = absl::Now() + absl::Seconds(30);;) {
    ASSERT_LT(absl::Now(), give_up) << "the closed watch's slot never freed";
    auto watch = StartWatch(job);
    if (watch->open) break;
    EXPECT_EQ(watch->reader->Finish().error_code(),
              grpc::StatusCode::RESOURCE_EXHAUSTED);
  }
  second->context.TryCancel();
}

TEST_F(CoordinatorRpcTest, WatchStreamsHoldNoThreadEach) {
  Serve({.max_sessions = 10, .max_watches = 1000});
  std::string job = SubmitJob();
  // One watch first, so gRPC's own threads are started before the count.
  std::unique_ptr<Watch> warm = StartWatch(job);
  ASSERT_TRUE(warm->open);
  const int before = CountThreads();
  std::vector<std::unique_ptr<Watch>> watches;
  for (int i = 0; i < 200; ++i) {
    watches.push_back(StartWatch(job));
    ASSERT_TRUE(watches.back()->open) << "watch " << i;
  }
  const int after = CountThreads();
  // A thread per stream would add 200; gRPC's pools may grow a little.
  EXPECT_LT(after - before, 20)
      << before << " threads before, " << after << " with 200 watches open";
  // A change reaches every watch.
  grpc::ClientContext context;
  v1::StopJobRequest stop;
  stop.set_job_id(job);
  v1::StopJobResponse stopped;
  ASSERT_TRUE(stub_->StopJob(&context, stop, &stopped).ok());
  for (auto& watch : watches) {
    v1::JobStatus status;
    ASSERT_TRUE(watch->reader->Read(&status));
    EXPECT_EQ(status.state(), v1::JOB_STATE_STOPPED);
    EXPECT_TRUE(watch->reader->Finish().ok());
  }
  warm->context.TryCancel();
}

// One identity (a viewer's script) cannot take every watch: it is stopped
// at its own cap while an operator still gets slots; the global cap stays
// the last line, also for callers without an identity (--insecure).
TEST(StreamSlotsTest, OneIdentityCannotTakeEverySlot) {
  const std::string viewer = "spiffe://lockstep/viewer/grafana";
  const std::string alice = "spiffe://lockstep/operator/alice";
  StreamSlots slots("WatchJob streams", "--max-watches", 5,
                    "--max-watches-per-identity", 2);
  ASSERT_TRUE(slots.Take(viewer).ok());
  ASSERT_TRUE(slots.Take(viewer).ok());
  grpc::Status third = slots.Take(viewer);
  EXPECT_EQ(third.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(
      third.error_message(),
      ::testing::AllOf(::testing::HasSubstr(viewer),
                       ::testing::HasSubstr("--max-watches-per-identity 2")));
  ASSERT_TRUE(slots.Take(alice).ok());
  ASSERT_TRUE(slots.Take("").ok());
  ASSERT_TRUE(slots.Take("").ok());
  grpc::Status full = slots.Take("");
  EXPECT_EQ(full.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_THAT(full.error_message(), ::testing::HasSubstr("--max-watches 5"));
  EXPECT_EQ(slots.used(), 5);
  // A released slot is the viewer's again at once.
  slots.Release(viewer);
  EXPECT_TRUE(slots.Take(viewer).ok());
  EXPECT_EQ(slots.Take(alice).error_code(),
            grpc::StatusCode::RESOURCE_EXHAUSTED);
}

}  // namespace
}  // namespace lockstep::coordinator
