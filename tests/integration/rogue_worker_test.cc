// Issue 27's cases that need a real coordinator and a client that breaks
// the rules: RogueWorker holds a real worker certificate of the cluster's
// CA and speaks the worker protocol itself, to forge a job's outcome or
// flood its status; then one viewer's 1,000 watches, 20,000 spares and a
// 4 MiB key-value value. Each outcome is checked through the CLI, as a
// user would see it.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/files.h"
#include "common/sha256.h"
#include "common/tls.h"
#include "tests/integration/harness.h"
#include "worker/rpc/grpc_control_plane.h"

namespace lockstep::integration {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

// A client holding a real worker certificate of the cluster's CA that
// speaks the worker protocol itself: it registers as its task, opens a
// session and sends whatever it likes instead of training (issue 27 #4: a
// compromised worker certificate).
class RogueWorker {
 public:
  RogueWorker(const std::string& address, int index)
      : files_(IssueTestCertificate(
            absl::StrCat("spiffe://lockstep/worker/worker/", index))) {
    grpc::SslCredentialsOptions options;
    options.pem_root_certs = ReadFileToString(files_.ca_file).value_or("");
    options.pem_cert_chain = ReadFileToString(files_.cert_file).value_or("");
    options.pem_private_key = ReadFileToString(files_.key_file).value_or("");
    stub_ = v1::Coordinator::NewStub(
        grpc::CreateChannel(address, grpc::SslCredentials(options)));
    v1::RegisterWorkerRequest request;
    request.mutable_task()->set_type("worker");
    request.mutable_task()->set_index(index);
    request.set_incarnation(0x7000 + index);
    request.set_host("127.0.0.1");
    v1::RegisterWorkerResponse response;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(20));
    grpc::Status status = stub_->RegisterWorker(&context, request, &response);
    EXPECT_TRUE(status.ok())
        << "worker:" << index << " " << status.error_message();
    context_.set_deadline(std::chrono::system_clock::now() +
                          std::chrono::minutes(3));
    stream_ = stub_->WorkerSession(&context_);
    v1::WorkerMessage hello;
    hello.mutable_hello()->set_worker_id(response.worker_id());
    hello.mutable_hello()->set_incarnation(0x7000 + index);
    Send(hello);
  }

  ~RogueWorker() {
    context_.TryCancel();
    stream_->Finish();
  }

  void Send(const v1::WorkerMessage& message) {
    EXPECT_TRUE(stream_->Write(message)) << "the session ended";
  }

  v1::Coordinator::Stub* stub() { return stub_.get(); }

  // The next assignment the coordinator sends (a failed test when the
  // session ends first).
  v1::Assignment NextAssignment() {
    v1::CoordinatorCommand command;
    while (stream_->Read(&command)) {
      if (command.has_assignment()) return command.assignment();
    }
    ADD_FAILURE() << "the session ended before an assignment";
    return v1::Assignment();
  }

 private:
  TlsOptions files_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
  grpc::ClientContext context_;
  std::unique_ptr<
      grpc::ClientReaderWriter<v1::WorkerMessage, v1::CoordinatorCommand>>
      stream_;
};

// A cluster of `workers` tasks whose coordinator runs alone: the test's
// rogue workers take the tasks.
class RogueWorkerTest : public ClusterTest {
 protected:
  void StartCoordinatorAlone(int workers) {
    dir_ = TempDir("cluster");
    workers_ = workers;
    StartCoordinator("127.0.0.1:0");
  }
};

// Issue 27 #4, with real certificates over real gRPC: both ranks of a job
// held by rogue clients reported success at step 999,999 of a 1,000-step
// plan with a forged digest, the chief a progress of step 1048576/1000 and
// a checkpoint commit for a job that saves none. The job fails naming the
// rank and the step, and nothing forged is shown as the job's.
TEST_F(RogueWorkerTest, TwoRogueWorkersCannotForgeAJobsOutcome) {
  StartCoordinatorAlone(2);
  RogueWorker chief(address_, 0), other(address_, 1);
  const std::string job = Submit({"max_steps=1000", "global_batch_size=64"});
  ASSERT_FALSE(job.empty());
  const v1::Assignment assigned = chief.NextAssignment();
  ASSERT_EQ(assigned.job_id(), job);
  ASSERT_EQ(assigned.rank(), 0);
  ASSERT_EQ(other.NextAssignment().rank(), 1);

  v1::WorkerMessage progress;
  progress.mutable_progress()->set_job_id(job);
  progress.mutable_progress()->set_generation(assigned.generation());
  progress.mutable_progress()->set_step(1048576);
  progress.mutable_progress()->set_total_steps(1000);
  chief.Send(progress);
  v1::WorkerMessage committed;
  v1::CheckpointCommitted* c = committed.mutable_committed();
  c->set_job_id(job);
  c->set_generation(assigned.generation());
  c->set_step(999999999);
  c->set_ok(true);
  c->set_name("ckpt-999999999");
  chief.Send(committed);
  for (auto [worker, rank] : {std::pair{&chief, 0}, std::pair{&other, 1}}) {
    v1::WorkerMessage result;
    v1::TaskResult* r = result.mutable_result();
    r->set_job_id(job);
    r->set_generation(assigned.generation());
    r->set_rank(rank);
    r->set_ok(true);
    r->set_steps(999999);
    r->set_model_digest("forged-digest-0000");
    worker->Send(result);
  }

  v1::JobStatus done = WatchUntil(job, Ended);
  EXPECT_EQ(done.state(), v1::JOB_STATE_FAILED) << History(job);
  EXPECT_THAT(done.error(),
              AllOf(HasSubstr("step 999999"), HasSubstr("max_steps 1000")));
  EXPECT_NE(done.step(), 1048576);
  EXPECT_LE(done.applied_step(), 1000);
  EXPECT_EQ(done.checkpoints_size(), 0);
  EXPECT_EQ(FindEvent(done, "checkpoint_committed"), nullptr);
  // `lockstep status` says it failed, not that it succeeded.
  Result status = RunCommand({kBin + "/lockstep", "status", job},
                             {"LOCKSTEP_COORDINATOR=" + address_});
  EXPECT_THAT(status.out, HasSubstr("failed")) << status.err;
}

// Issue 53, over real gRPC with the chief's certificate and token: an
// upload cut short and one whose bytes are not those declared are refused
// (DATA_LOSS naming the job and the rank), nothing of them is kept, and the
// job's events say why; the same upload whole is kept.
TEST_F(RogueWorkerTest, ATruncatedOrCorruptUploadIsRefusedAndNotKept) {
  coordinator_flags_ = {"--artifact-dir", TempDir("artifacts")};
  StartCoordinatorAlone(1);
  RogueWorker chief(address_, 0);
  const std::string job = Submit(
      {"max_steps=1000", "global_batch_size=64", "export=/exports/model.pt"});
  ASSERT_FALSE(job.empty());
  const v1::Assignment assigned = chief.NextAssignment();
  ASSERT_EQ(assigned.job_id(), job);
  ASSERT_TRUE(assigned.upload_export());
  const std::string model(3 << 20, 'm');  // three messages of 1 MiB
  auto upload = [&](const std::string& sent) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(30));
    v1::UploadArtifactResponse response;
    auto writer = chief.stub()->UploadArtifact(&context, &response);
    v1::ArtifactUpload header;
    v1::ArtifactUpload::Header* h = header.mutable_header();
    h->set_job_id(job);
    h->set_generation(assigned.generation());
    h->set_rank(0);
    h->set_rank_token(assigned.rank_token());
    h->mutable_info()->set_name("model");
    h->mutable_info()->set_file_name("model.pt");
    h->mutable_info()->set_format("archive");
    h->mutable_info()->set_bytes(static_cast<int64_t>(model.size()));
    h->mutable_info()->set_sha256(*Sha256Hex(model));
    writer->Write(header);
    for (size_t at = 0; at < sent.size(); at += 1 << 20) {
      v1::ArtifactUpload chunk;
      chunk.set_data(sent.substr(at, 1 << 20));
      if (!writer->Write(chunk)) break;
    }
    writer->WritesDone();
    return writer->Finish();
  };
  grpc::Status truncated = upload(model.substr(0, model.size() - 100));
  EXPECT_EQ(truncated.error_code(), grpc::StatusCode::DATA_LOSS);
  EXPECT_THAT(truncated.error_message(),
              AllOf(HasSubstr("job " + job + " rank 0"),
                    HasSubstr(absl::StrCat(model.size() - 100))));
  std::string flipped = model;
  flipped[123456] ^= 1;
  grpc::Status corrupt = upload(flipped);
  EXPECT_EQ(corrupt.error_code(), grpc::StatusCode::DATA_LOSS);
  EXPECT_THAT(corrupt.error_message(),
              AllOf(HasSubstr("job " + job + " rank 0"), HasSubstr("SHA-256")));
  Result none = RunCommand({kBin + "/lockstep", "artifacts", "list", job},
                           {"LOCKSTEP_COORDINATOR=" + address_});
  EXPECT_EQ(none.code, 0) << none.err;
  EXPECT_THAT(none.out, Not(HasSubstr("model.pt")));
  v1::JobStatus refused = WatchUntil(job, [](const v1::JobStatus& s) {
    return std::count_if(s.events().begin(), s.events().end(),
                         [](const v1::JobEvent& e) {
                           return e.kind() == "artifact_not_kept";
                         }) >= 2;
  });
  EXPECT_THAT(FindEvent(refused, "artifact_not_kept")->message(),
              AllOf(HasSubstr("export of rank 0"), HasSubstr("bytes")));

  ASSERT_TRUE(upload(model).ok());
  Result kept = RunCommand({kBin + "/lockstep", "artifacts", "list", job},
                           {"LOCKSTEP_COORDINATOR=" + address_});
  EXPECT_THAT(kept.out, HasSubstr("model.pt")) << kept.err;
}

// Issue 14, through real gRPC: a rank writing its generation's store without
// bound (100 values of 4 MB under keys of its own, with its token) is
// refused past --kv-max-bytes, naming the flag and the job.
TEST_F(RogueWorkerTest, KeyValueWritesPastTheCapAreRefused) {
  coordinator_flags_ = {"--kv-max-bytes", "67108864"};  // 64 MiB: 16 writes
  StartCoordinatorAlone(1);
  RogueWorker chief(address_, 0);
  const std::string job = Submit({"max_steps=1000", "global_batch_size=64"});
  ASSERT_FALSE(job.empty());
  const v1::Assignment assigned = chief.NextAssignment();
  ASSERT_EQ(assigned.job_id(), job);
  auto credentials = LoadChannelCredentials(
      IssueTestCertificate("spiffe://lockstep/worker/worker/0"));
  ASSERT_TRUE(credentials.ok()) << credentials.status();
  worker::GrpcControlPlane plane(address_, *credentials);
  auto kv = plane.KeyValue(job, assigned.generation(), assigned.rank(),
                           assigned.rank_token());
  int accepted = 0;
  absl::Status refused;
  for (int i = 0; i < 100; ++i) {
    absl::Status stored =
        kv->Set(absl::StrCat("bulk-", i), std::string(4000000, 'x'));
    if (stored.ok()) {
      ++accepted;
    } else if (refused.ok()) {
      refused = stored;
    }
  }
  EXPECT_EQ(accepted, 16);
  EXPECT_TRUE(absl::IsResourceExhausted(refused)) << refused;
  EXPECT_THAT(refused.message(),
              AllOf(HasSubstr(job), HasSubstr("--kv-max-bytes (67108864)")));
}

// Issue 27 #7: the documented 4 MiB key-value value could not be sent
// (4194327 vs. 4194304 bytes). The worker's own key-value client, holding
// the rank of a real generation, sets one and reads it back over TLS; a
// byte more is refused by the coordinator's check, not by gRPC's limit.
TEST_F(RogueWorkerTest, AFourMiBKeyValueValueTravelsOverGrpc) {
  StartCoordinatorAlone(1);
  RogueWorker chief(address_, 0);
  const std::string job = Submit({"max_steps=1000", "global_batch_size=64"});
  ASSERT_FALSE(job.empty());
  const v1::Assignment assigned = chief.NextAssignment();
  ASSERT_EQ(assigned.job_id(), job);
  auto credentials = LoadChannelCredentials(
      IssueTestCertificate("spiffe://lockstep/worker/worker/0"));
  ASSERT_TRUE(credentials.ok()) << credentials.status();
  worker::GrpcControlPlane plane(address_, *credentials);
  auto kv = plane.KeyValue(job, assigned.generation(), assigned.rank(),
                           assigned.rank_token());

  std::string value(size_t{4} << 20, '\0');
  for (size_t i = 0; i < value.size(); ++i) {
    value[i] = static_cast<char>(i * 2654435761u >> 24);
  }
  absl::Status stored = kv->Set("big", value);
  ASSERT_TRUE(stored.ok()) << stored;
  absl::StatusOr<std::string> got = kv->Get("big", absl::Seconds(10));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(*got == value) << got->size() << " bytes back";

  absl::Status over = kv->Set("bigger", value + "x");
  EXPECT_TRUE(absl::IsInvalidArgument(over)) << over;
  EXPECT_THAT(std::string(over.message()), HasSubstr("value"));
}

// Issue 27 #7: a loss history of 2^20 steps broke `lockstep metrics`. A
// chief that reports 3 x 2^20 + 5 losses over real gRPC: the history is
// thinned to every fourth step, spans the whole job, and the CLI follows
// its pages (status, metrics as CSV and JSON).
TEST_F(RogueWorkerTest, AJobOfThreeMillionStepsStillShowsItsLossCurve) {
  StartCoordinatorAlone(1);
  RogueWorker chief(address_, 0);
  const int64_t steps = 3 * (int64_t{1} << 20) + 5;
  const std::string job = Submit(
      {absl::StrCat("max_steps=", steps + 1000), "global_batch_size=64"});
  ASSERT_FALSE(job.empty());
  const v1::Assignment assigned = chief.NextAssignment();
  ASSERT_EQ(assigned.job_id(), job);
  const int64_t per_report = int64_t{1} << 18;
  for (int64_t first = 0; first < steps; first += per_report) {
    const int64_t last = std::min(steps, first + per_report);
    v1::WorkerMessage message;
    v1::ProgressReport* p = message.mutable_progress();
    p->set_job_id(job);
    p->set_generation(assigned.generation());
    p->set_first_step(first);
    p->set_step(last);
    p->set_total_steps(steps + 1000);
    // Loss of step s (from 1): s, exact in a float below 2^24; its
    // learning rate s / 1024, exact too.
    for (int64_t s = first + 1; s <= last; ++s) {
      p->add_step_losses(static_cast<float>(s));
      p->add_step_lrs(static_cast<float>(s) / 1024);
    }
    chief.Send(message);
  }
  WatchUntil(job, [&](const v1::JobStatus& s) { return s.step() >= steps; });

  Result status = RunCommand({kBin + "/lockstep", "status", job},
                             {"LOCKSTEP_COORDINATOR=" + address_});
  EXPECT_EQ(status.code, 0) << status.err;
  Result csv = RunCommand({kBin + "/lockstep", "metrics", job, "--csv"},
                          {"LOCKSTEP_COORDINATOR=" + address_});
  ASSERT_EQ(csv.code, 0) << csv.err;
  const std::vector<std::string> rows =
      absl::StrSplit(csv.out, '\n', absl::SkipEmpty());
  // A header, then steps 1, 5, 9, ..., 3 x 2^20 + 5, each with its
  // learning rate (paged beside the losses).
  ASSERT_EQ(rows.size(), 1 + (steps + 3) / 4);
  auto row = [](int64_t step) {
    return absl::StrCat(step, ",", step * 64, ",", step, ",",
                        absl::StrFormat("%.9g", step / 1024.0), ",,");
  };
  EXPECT_EQ(rows[1], row(1));
  EXPECT_EQ(rows[2], row(5));
  EXPECT_EQ(rows.back(), row(steps));
  Result json = RunCommand({kBin + "/lockstep", "metrics", job, "--json"},
                           {"LOCKSTEP_COORDINATOR=" + address_});
  ASSERT_EQ(json.code, 0) << json.err;
  const google::protobuf::Struct metrics = LastJsonLine(json.out);
  const auto& points = metrics.fields().at("steps").list_value().values();
  ASSERT_EQ(points.size(), rows.size() - 1);
  const auto& last = points.rbegin()->struct_value().fields();
  EXPECT_EQ(last.at("step").number_value(), steps);
  EXPECT_EQ(last.at("loss").number_value(), steps);
  EXPECT_EQ(last.at("lr").number_value(), steps / 1024.0);
  // And the comparison, plotted to the job's last step.
  const std::string svg = TempDir("compare") + "/curves.svg";
  Result compare =
      RunCommand({kBin + "/lockstep", "compare", job, job, "--svg", svg},
                 {"LOCKSTEP_COORDINATOR=" + address_});
  EXPECT_EQ(compare.code, 0) << compare.err;
  const std::string plot = ReadFileToString(svg).value_or("");
  EXPECT_THAT(plot, HasSubstr("<svg"));
  EXPECT_LT(plot.size(), size_t{1} << 20);
}

// Issue 27 #7: 150,000 progress reports with an evaluation each made
// `lockstep status`, `events` and `watch` of the job fail (a 4.8 MB
// status). The evaluations are thinned to at most 1,000 spanning the job,
// and every command answers.
TEST_F(RogueWorkerTest, AHundredAndFiftyThousandEvaluationsStillShow) {
  StartCoordinatorAlone(1);
  RogueWorker chief(address_, 0);
  const int64_t reports = 150000;
  const std::string job =
      Submit({absl::StrCat("max_steps=", reports), "global_batch_size=64"});
  ASSERT_FALSE(job.empty());
  const v1::Assignment assigned = chief.NextAssignment();
  ASSERT_EQ(assigned.job_id(), job);
  for (int64_t step = 1; step <= reports; ++step) {
    v1::WorkerMessage message;
    v1::ProgressReport* p = message.mutable_progress();
    p->set_job_id(job);
    p->set_generation(assigned.generation());
    p->set_step(step);
    p->set_total_steps(reports);
    p->set_test_accuracy(0.5);
    p->set_test_loss(1.0);
    chief.Send(message);
  }
  v1::JobStatus seen = WatchUntil(
      job, [&](const v1::JobStatus& s) { return s.step() >= reports; });
  EXPECT_LE(seen.evals_size(), 1000);
  EXPECT_EQ(seen.evals_size() + seen.dropped_evals(), reports);
  for (const char* command : {"status", "events", "metrics"}) {
    Result r = RunCommand({kBin + "/lockstep", command, job},
                          {"LOCKSTEP_COORDINATOR=" + address_});
    EXPECT_EQ(r.code, 0) << command << ": " << r.err;
  }
  // The rank reports the end; the watch shows it.
  v1::WorkerMessage result;
  v1::TaskResult* r = result.mutable_result();
  r->set_job_id(job);
  r->set_generation(assigned.generation());
  r->set_rank(0);
  r->set_ok(true);
  r->set_steps(reports);
  r->set_model_digest("d");
  chief.Send(result);
  Result watch = RunCommand({kBin + "/lockstep", "watch", job},
                            {"LOCKSTEP_COORDINATOR=" + address_});
  EXPECT_EQ(watch.code, 0) << watch.err;
  EXPECT_THAT(watch.out, HasSubstr("succeeded"));
}

// Issue 27 #8: the 1,000-watch cap was global, so one viewer's script
// holding 1,000 watches locked an operator's `lockstep watch` out. The
// viewer gets its own 100 (--max-watches-per-identity) and is refused past
// them, naming itself and the flag; the operator follows the job to its end.
TEST_F(RogueWorkerTest, OneViewersThousandWatchesLeaveTheOperatorsWatch) {
  StartCoordinatorAlone(1);
  const std::string job = Submit({"max_steps=20", "global_batch_size=64"});
  ASSERT_FALSE(job.empty());
  const std::string viewer = "spiffe://lockstep/viewer/grafana";
  const TlsOptions files = IssueTestCertificate(viewer);
  auto credentials = LoadChannelCredentials(files);
  ASSERT_TRUE(credentials.ok()) << credentials.status();
  auto stub =
      v1::Coordinator::NewStub(grpc::CreateChannel(address_, *credentials));
  struct Watch {
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientReader<v1::JobStatus>> reader;
  };
  std::vector<std::unique_ptr<Watch>> watches;
  int open = 0, refused = 0;
  std::string refusal;
  v1::WatchJobRequest request;
  request.set_job_id(job);
  for (int i = 0; i < 1000; ++i) {
    auto watch = std::make_unique<Watch>();
    watch->context.set_deadline(std::chrono::system_clock::now() +
                                std::chrono::minutes(3));
    watch->reader = stub->WatchJob(&watch->context, request);
    v1::JobStatus first;
    if (watch->reader->Read(&first)) {
      ++open;
      watches.push_back(std::move(watch));  // held open
    } else {
      grpc::Status status = watch->reader->Finish();
      EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
      refusal = status.error_message();
      ++refused;
    }
  }
  EXPECT_EQ(open, 100);
  EXPECT_EQ(refused, 900);
  EXPECT_THAT(refusal, AllOf(HasSubstr(viewer),
                             HasSubstr("--max-watches-per-identity 100")));

  // The job's worker comes, the job ends, and the operator's watch (the
  // CLI, started while the viewer holds its 100) shows it to the end.
  StartWorker(0);
  Result watch = RunCommand({kBin + "/lockstep", "watch", job},
                            {"LOCKSTEP_COORDINATOR=" + address_});
  EXPECT_EQ(watch.code, 0) << watch.err;
  EXPECT_THAT(watch.out, HasSubstr("succeeded"));
  for (auto& held : watches) held->context.TryCancel();
  for (auto& held : watches) held->reader->Finish();
}

// Issue 27 #7: 20,000 spare registrations made `lockstep workers` fail for
// an hour (one response over gRPC's 4 MiB). Under --insecure nothing ties a
// registration to an identity, so the flood is possible there; the list
// comes in pages and the CLI follows them.
TEST_F(RogueWorkerTest, TwentyThousandSparesStillList) {
  dir_ = TempDir("cluster");
  workers_ = 1;
  coordinator_flags_ = {"--insecure"};
  StartCoordinator("127.0.0.1:0");
  auto stub = v1::Coordinator::NewStub(
      grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
  const int spares = 20000;
  for (int i = 0; i < spares; ++i) {
    v1::RegisterWorkerRequest request;
    request.set_spare(true);
    request.set_incarnation(0x100000 + i);
    request.set_host(absl::StrCat("spare-host-", i, ".example.com"));
    v1::RegisterWorkerResponse response;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(20));
    grpc::Status status = stub->RegisterWorker(&context, request, &response);
    ASSERT_TRUE(status.ok()) << i << ": " << status.error_message();
  }
  Result list = RunCommand({kBin + "/lockstep", "workers", "--insecure"},
                           {"LOCKSTEP_COORDINATOR=" + address_});
  ASSERT_EQ(list.code, 0) << list.err;
  for (int i : {0, spares / 2, spares - 1}) {
    EXPECT_THAT(list.out, HasSubstr(absl::StrCat("spare-host-", i, "."))) << i;
  }
  Result json =
      RunCommand({kBin + "/lockstep", "workers", "--json", "--insecure"},
                 {"LOCKSTEP_COORDINATOR=" + address_});
  ASSERT_EQ(json.code, 0) << json.err;
  size_t listed = 0;
  for (size_t at = 0;
       (at = json.out.find("\"worker_id\"", at)) != std::string::npos; ++at) {
    ++listed;
  }
  EXPECT_EQ(listed, size_t{spares}) << json.out.substr(0, 500);
}

}  // namespace
}  // namespace lockstep::integration
