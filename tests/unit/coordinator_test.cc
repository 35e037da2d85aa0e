#include "coordinator/coordinator.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/tf_config.h"

namespace lockstep::coordinator {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

class FakeSink : public SessionSink {
 public:
  void Send(const v1::CoordinatorCommand& command) override {
    commands.push_back(command);
  }
  void Close() override { closed = true; }
  std::vector<v1::CoordinatorCommand> commands;
  bool closed = false;
};

v1::RegisterWorkerRequest Free(uint64_t incarnation) {
  v1::RegisterWorkerRequest request;
  request.set_incarnation(incarnation);
  request.set_host("127.0.0.1");
  return request;
}

v1::JobSpec Spec(int workers) {
  v1::JobSpec spec;
  spec.set_name("test");
  spec.set_global_batch_size(64);
  spec.set_num_workers(workers);
  return spec;
}

class CoordinatorTest : public ::testing::Test {
 protected:
  void Make(std::optional<v1::ClusterSpec> cluster = std::nullopt,
            std::unique_ptr<JobStore> store = nullptr) {
    Coordinator::Options options;
    options.cluster = std::move(cluster);
    options.clock = &clock_;
    options.heartbeat_timeout = absl::Seconds(10);
    options.error_grace = absl::Seconds(1);
    options.stall_after = absl::Seconds(3);
    options.store = std::move(store);
    auto created = Coordinator::Create(std::move(options));
    ASSERT_TRUE(created.ok()) << created.status();
    coordinator_ = *std::move(created);
  }

  // Registers a free worker and opens its session.
  std::string Connect(uint64_t incarnation, FakeSink* sink) {
    auto registered = coordinator_->RegisterWorker(Free(incarnation));
    EXPECT_TRUE(registered.ok()) << registered.status();
    EXPECT_TRUE(
        coordinator_->OpenSession(registered->worker_id(), incarnation, sink)
            .ok());
    return registered->worker_id();
  }

  // A heartbeat from worker `id` in generation 1 of `job`, `seq`
  // collectives in.
  void Beat(const std::string& id, const std::string& job, int64_t seq) {
    v1::WorkerMessage message;
    message.mutable_heartbeat()->set_job_id(job);
    message.mutable_heartbeat()->set_generation(1);
    message.mutable_heartbeat()->set_collective_seq(seq);
    ASSERT_TRUE(coordinator_->HandleWorkerMessage(id, message).ok());
  }

  // Registers worker:`index` of a static cluster and opens its session.
  void ConnectTask(int index, uint64_t incarnation, FakeSink* sink) {
    v1::RegisterWorkerRequest request = Free(incarnation);
    request.mutable_task()->set_type("worker");
    request.mutable_task()->set_index(index);
    auto id = coordinator_->RegisterWorker(request);
    ASSERT_TRUE(id.ok()) << id.status();
    ASSERT_TRUE(
        coordinator_->OpenSession(id->worker_id(), incarnation, sink).ok());
  }

  v1::JobStatus Status(const std::string& job) {
    return (*coordinator_->GetJobStatus(job, true))[0];
  }

  FakeClock clock_;
  std::unique_ptr<Coordinator> coordinator_;
};

TEST_F(CoordinatorTest, JobStartsWhenEnoughWorkersAndAssignsRanksInOrder) {
  Make();
  FakeSink a, b;
  std::string id_a = Connect(1, &a);
  auto job = coordinator_->SubmitJob(Spec(2));
  ASSERT_TRUE(job.ok());
  EXPECT_EQ(Status(*job).state(), v1::JOB_STATE_QUEUED);
  EXPECT_TRUE(a.commands.empty());
  Connect(2, &b);
  EXPECT_EQ(Status(*job).state(), v1::JOB_STATE_RUNNING);
  ASSERT_EQ(a.commands.size(), 1u);
  ASSERT_EQ(b.commands.size(), 1u);
  EXPECT_EQ(a.commands[0].assignment().rank(), 0);
  EXPECT_EQ(b.commands[0].assignment().rank(), 1);
  EXPECT_EQ(a.commands[0].assignment().world_size(), 2);
  EXPECT_EQ(a.commands[0].assignment().generation(), 1);
  EXPECT_EQ(a.commands[0].assignment().spec().model().name(),
            "mlp");  // defaults applied
}

TEST_F(CoordinatorTest, ResultsFromEveryRankSucceedTheJob) {
  Make();
  FakeSink a, b;
  std::string id_a = Connect(1, &a);
  std::string id_b = Connect(2, &b);
  std::string job = *coordinator_->SubmitJob(Spec(2));
  v1::WorkerMessage progress;
  progress.mutable_progress()->set_job_id(job);
  progress.mutable_progress()->set_generation(1);
  progress.mutable_progress()->set_step(2);
  progress.mutable_progress()->set_first_step(0);
  progress.mutable_progress()->add_step_losses(2.0f);
  progress.mutable_progress()->add_step_losses(1.5f);
  ASSERT_TRUE(coordinator_->HandleWorkerMessage(id_a, progress).ok());
  for (const auto& [id, rank] : {std::pair{id_a, 0}, std::pair{id_b, 1}}) {
    v1::WorkerMessage result;
    result.mutable_result()->set_job_id(job);
    result.mutable_result()->set_generation(1);
    result.mutable_result()->set_rank(rank);
    result.mutable_result()->set_ok(true);
    result.mutable_result()->set_steps(2);
    result.mutable_result()->set_model_digest("abc");
    ASSERT_TRUE(coordinator_->HandleWorkerMessage(id, result).ok());
  }
  v1::JobStatus status = Status(job);
  EXPECT_EQ(status.state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(status.step_losses_size(), 2);
  EXPECT_EQ(status.ranks(1).model_digest(), "abc");
  EXPECT_EQ(status.generations(), 1);
}

TEST_F(CoordinatorTest, LostSessionEndsTheGenerationAndAbortsSurvivors) {
  Make();
  FakeSink a, b;
  std::string id_a = Connect(1, &a);
  std::string id_b = Connect(2, &b);
  std::string job = *coordinator_->SubmitJob(Spec(2));
  coordinator_->CloseSession(id_b, 2, &b, absl::UnavailableError("reset"));
  v1::JobStatus status = Status(job);
  EXPECT_EQ(status.state(), v1::JOB_STATE_RECOVERING);
  EXPECT_THAT(status.error(), AllOf(HasSubstr(id_b), HasSubstr("rank 1"),
                                    HasSubstr("127.0.0.1")));
  ASSERT_EQ(a.commands.size(), 2u);
  EXPECT_TRUE(a.commands[1].has_abort());
  EXPECT_FALSE(a.closed);
  bool found = false;
  for (const v1::JobEvent& event : status.events()) {
    if (event.kind() == "worker_failed") {
      found = true;
      EXPECT_EQ(event.worker_id(), id_b);
      EXPECT_EQ(event.rank(), 1);
      EXPECT_EQ(event.generation(), 1);
    }
  }
  EXPECT_TRUE(found);

  // A replacement registers: generation 2 starts with the survivor at rank 0.
  FakeSink c;
  Connect(3, &c);
  status = Status(job);
  EXPECT_EQ(status.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(status.generation(), 2);
  ASSERT_EQ(a.commands.size(), 3u);
  EXPECT_EQ(a.commands[2].assignment().generation(), 2);
  EXPECT_EQ(a.commands[2].assignment().rank(), 0);
  EXPECT_EQ(c.commands[0].assignment().rank(), 1);
}

TEST_F(CoordinatorTest, HeartbeatTimeoutFailsTheWorkerExactlyAfterTheTimeout) {
  Make();
  FakeSink a, b;
  std::string id_a = Connect(1, &a);
  std::string id_b = Connect(2, &b);
  std::string job = *coordinator_->SubmitJob(Spec(2));
  v1::WorkerMessage beat;
  beat.mutable_heartbeat();
  clock_.Advance(absl::Seconds(10));
  ASSERT_TRUE(coordinator_->HandleWorkerMessage(id_a, beat).ok());
  coordinator_->Sweep();  // exactly the timeout: not yet
  EXPECT_EQ(Status(job).state(), v1::JOB_STATE_RUNNING);
  clock_.Advance(absl::Milliseconds(1));
  coordinator_->Sweep();
  v1::JobStatus status = Status(job);
  EXPECT_EQ(status.state(), v1::JOB_STATE_RECOVERING);
  EXPECT_THAT(status.error(),
              AllOf(HasSubstr(id_b), HasSubstr("missed heartbeats")));
  EXPECT_TRUE(b.closed);
  EXPECT_FALSE(a.closed);
}

TEST_F(CoordinatorTest, ReRegistrationWithNewIncarnationIsARestart) {
  auto config = ParseTfConfig(R"({"cluster": {"worker": ["a:1", "b:1"]}})");
  Make(config->cluster);
  FakeSink a, b;
  ConnectTask(0, 10, &a);
  ConnectTask(1, 11, &b);
  std::string job = *coordinator_->SubmitJob(Spec(0));
  EXPECT_EQ(Status(job).generation(), 1);

  v1::RegisterWorkerRequest again = Free(99);
  again.mutable_task()->set_type("worker");
  again.mutable_task()->set_index(1);
  ASSERT_TRUE(coordinator_->RegisterWorker(again).ok());
  v1::JobStatus status = Status(job);
  EXPECT_EQ(status.state(), v1::JOB_STATE_RECOVERING);
  EXPECT_THAT(status.error(),
              AllOf(HasSubstr("worker:1"), HasSubstr("restarted")));
  EXPECT_TRUE(b.closed);

  FakeSink b2;
  ASSERT_TRUE(coordinator_->OpenSession("worker:1", 99, &b2).ok());
  status = Status(job);
  EXPECT_EQ(status.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(status.generation(), 2);
  EXPECT_EQ(b2.commands[0].assignment().rank(), 1);  // static rank kept
}

TEST_F(CoordinatorTest, OlderGenerationIsFenced) {
  Make();
  FakeSink a, b;
  Connect(1, &a);
  std::string id_b = Connect(2, &b);
  std::string job = *coordinator_->SubmitJob(Spec(2));
  coordinator_->CloseSession(id_b, 2, &b, absl::UnavailableError("reset"));
  FakeSink c;
  Connect(3, &c);
  ASSERT_EQ(Status(job).generation(), 2);
  v1::KvSetRequest old;
  old.set_job_id(job);
  old.set_generation(1);
  old.set_key("rank_0");
  absl::Status fenced = coordinator_->KvSet(old);
  EXPECT_EQ(fenced.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(fenced.message(), HasSubstr("generation 1 is over"));
  old.set_generation(2);
  EXPECT_TRUE(coordinator_->KvSet(old).ok());
}

TEST_F(CoordinatorTest, ReportedCollectiveErrorWaitsForAnExplanation) {
  Make();
  FakeSink a, b;
  std::string id_a = Connect(1, &a);
  std::string id_b = Connect(2, &b);
  std::string job = *coordinator_->SubmitJob(Spec(2));
  v1::WorkerMessage result;
  result.mutable_result()->set_job_id(job);
  result.mutable_result()->set_generation(1);
  result.mutable_result()->set_ok(false);
  result.mutable_result()->set_code(
      static_cast<int>(absl::StatusCode::kUnavailable));
  result.mutable_result()->set_error("all-reduce failed: connection reset");
  ASSERT_TRUE(coordinator_->HandleWorkerMessage(id_a, result).ok());
  EXPECT_EQ(Status(job).state(), v1::JOB_STATE_RUNNING);
  // The dead peer's session break arrives and is named as the cause.
  coordinator_->CloseSession(id_b, 2, &b, absl::UnavailableError("reset"));
  EXPECT_THAT(Status(job).error(), HasSubstr(id_b));

  // Without an explanation, the error ends the generation after the grace.
  FakeSink c;
  std::string id_c = Connect(3, &c);
  ASSERT_EQ(Status(job).generation(), 2);
  result.mutable_result()->set_generation(2);
  ASSERT_TRUE(coordinator_->HandleWorkerMessage(id_a, result).ok());
  clock_.Advance(absl::Milliseconds(999));
  coordinator_->Sweep();
  EXPECT_EQ(Status(job).state(), v1::JOB_STATE_RUNNING);
  clock_.Advance(absl::Milliseconds(1));
  coordinator_->Sweep();
  // Both workers are still connected, so the job re-forms at once.
  v1::JobStatus status = Status(job);
  EXPECT_EQ(status.generation(), 3);
  EXPECT_THAT(status.error(),
              AllOf(HasSubstr("rank 0"), HasSubstr("connection reset")));
}

TEST_F(CoordinatorTest, MaxRestartsFailsTheJobWithTheCause) {
  Make();
  v1::JobSpec spec = Spec(1);
  spec.set_max_restarts(1);
  FakeSink s1;
  std::string id = Connect(1, &s1);
  std::string job = *coordinator_->SubmitJob(spec);
  coordinator_->CloseSession(id, 1, &s1, absl::UnavailableError("gone"));
  FakeSink s2;
  std::string id2 = Connect(2, &s2);
  ASSERT_EQ(Status(job).generation(), 2);
  coordinator_->CloseSession(id2, 2, &s2, absl::UnavailableError("gone again"));
  v1::JobStatus status = Status(job);
  EXPECT_EQ(status.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(status.error(),
              AllOf(HasSubstr("gone again"), HasSubstr("max_restarts 1")));
}

TEST_F(CoordinatorTest, ElasticJobRunsBetweenMinAndMaxWorkers) {
  Make();
  v1::JobSpec spec = Spec(0);
  spec.clear_global_batch_size();
  spec.set_per_replica_batch_size(16);
  spec.set_min_workers(2);
  spec.set_max_workers(3);
  FakeSink a, b, c, d;
  std::string id_a = Connect(1, &a);
  std::string job = *coordinator_->SubmitJob(spec);
  EXPECT_EQ(Status(job).state(), v1::JOB_STATE_QUEUED);
  Connect(2, &b);
  EXPECT_EQ(Status(job).world_size(), 2);
  Connect(3, &c);
  Connect(4, &d);
  coordinator_->CloseSession(id_a, 1, &a, absl::UnavailableError("gone"));
  // Survivor b keeps rank 0; c and d join up to max_workers.
  v1::JobStatus status = Status(job);
  EXPECT_EQ(status.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(status.generation(), 2);
  EXPECT_EQ(status.world_size(), 3);
  EXPECT_EQ(status.ranks(0).worker_id(), "free:1");
}

TEST_F(CoordinatorTest, ElasticJobWaitsBelowMinWorkers) {
  Make();
  v1::JobSpec spec = Spec(0);
  spec.set_min_workers(2);
  spec.set_max_workers(2);
  FakeSink a, b;
  std::string id_a = Connect(1, &a);
  Connect(2, &b);
  std::string job = *coordinator_->SubmitJob(spec);
  coordinator_->CloseSession(id_a, 1, &a, absl::UnavailableError("gone"));
  EXPECT_EQ(Status(job).state(), v1::JOB_STATE_RECOVERING);
}

TEST_F(CoordinatorTest, StatusNamesAStraggler) {
  Make();
  FakeSink a, b;
  std::string id_a = Connect(1, &a);
  std::string id_b = Connect(2, &b);
  std::string job = *coordinator_->SubmitJob(Spec(2));
  auto beat = [&](const std::string& id, int64_t seq) { Beat(id, job, seq); };
  beat(id_a, 812);
  beat(id_b, 811);
  EXPECT_EQ(Status(job).stall(), "");
  clock_.Advance(absl::Seconds(14));
  beat(id_a, 812);
  beat(id_b, 811);
  EXPECT_EQ(
      Status(job).stall(),
      "rank 1 (" + id_b + " on 127.0.0.1) stalled at all-reduce #812 for 14 s");
}

// Collective counts arrive with heartbeats, every few seconds: a rank that
// has not sent one since the others moved on is not a straggler yet.
TEST_F(CoordinatorTest, ARankNotHeardFromYetIsNoStraggler) {
  Make();
  FakeSink a, b;
  std::string id_a = Connect(1, &a);
  std::string id_b = Connect(2, &b);
  std::string job = *coordinator_->SubmitJob(Spec(2));
  auto beat = [&](const std::string& id, int64_t seq) { Beat(id, job, seq); };
  beat(id_a, 300);
  clock_.Advance(absl::Seconds(4));
  beat(id_a, 700);
  EXPECT_EQ(Status(job).stall(), "");
  beat(id_b, 650);  // it had moved on too
  clock_.Advance(absl::Seconds(4));
  beat(id_a, 1100);
  EXPECT_EQ(Status(job).stall(), "");
}

TEST_F(CoordinatorTest, FailedRankFailsTheJobWithItsError) {
  Make();
  FakeSink a;
  std::string id_a = Connect(1, &a);
  std::string job = *coordinator_->SubmitJob(Spec(1));
  v1::WorkerMessage result;
  result.mutable_result()->set_job_id(job);
  result.mutable_result()->set_generation(1);
  result.mutable_result()->set_ok(false);
  result.mutable_result()->set_error("cannot open data file /x");
  ASSERT_TRUE(coordinator_->HandleWorkerMessage(id_a, result).ok());
  EXPECT_THAT(Status(job).error(),
              AllOf(HasSubstr("rank 0"), HasSubstr("cannot open data file")));
}

TEST_F(CoordinatorTest, IndivisibleBatchIsRejectedAtSubmit) {
  Make();
  auto job = coordinator_->SubmitJob(Spec(3));
  EXPECT_EQ(job.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(job.status().message(), HasSubstr("does not divide by 3"));
}

TEST_F(CoordinatorTest, KeyValueIsScopedAndFencedByGeneration) {
  Make();
  FakeSink a;
  std::string id_a = Connect(1, &a);
  std::string job = *coordinator_->SubmitJob(Spec(1));
  v1::KvSetRequest set;
  set.set_job_id(job);
  set.set_generation(1);
  set.set_key("k");
  set.set_value("v");
  ASSERT_TRUE(coordinator_->KvSet(set).ok());
  v1::KvGetRequest get;
  get.set_job_id(job);
  get.set_generation(1);
  get.set_key("k");
  EXPECT_EQ(*coordinator_->KvGet(get), "v");
  get.set_generation(0);
  EXPECT_EQ(coordinator_->KvGet(get).status().code(),
            absl::StatusCode::kAborted);
  get.set_generation(1);
  get.set_key("missing");
  get.set_timeout_ms(1);
  auto missing = coordinator_->KvGet(get);
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(missing.status().message(), HasSubstr("missing"));
}

TEST_F(CoordinatorTest, KvGetWaitsForTheKey) {
  Make();
  FakeSink a;
  Connect(1, &a);
  std::string job = *coordinator_->SubmitJob(Spec(1));
  v1::KvGetRequest get;
  get.set_job_id(job);
  get.set_generation(1);
  get.set_key("late");
  get.set_timeout_ms(60000);
  std::thread setter([&] {
    v1::KvSetRequest set;
    set.set_job_id(job);
    set.set_generation(1);
    set.set_key("late");
    set.set_value("here");
    ASSERT_TRUE(coordinator_->KvSet(set).ok());
  });
  EXPECT_EQ(*coordinator_->KvGet(get), "here");
  setter.join();
}

TEST_F(CoordinatorTest, BarrierTimeoutNamesMissingRanks) {
  Make();
  FakeSink a, b;
  Connect(1, &a);
  std::string id_b = Connect(2, &b);
  std::string job = *coordinator_->SubmitJob(Spec(2));
  v1::BarrierRequest request;
  request.set_job_id(job);
  request.set_generation(1);
  request.set_name("start");
  request.set_rank(0);
  request.set_timeout_ms(1);
  absl::Status status = coordinator_->Barrier(request);
  EXPECT_EQ(status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(status.message(), HasSubstr("rank 1 (" + id_b + ")"));
}

TEST_F(CoordinatorTest, StopQueuedJob) {
  Make();
  std::string job = *coordinator_->SubmitJob(Spec(2));
  ASSERT_TRUE(coordinator_->StopJob(job).ok());
  EXPECT_EQ(Status(job).state(), v1::JOB_STATE_STOPPED);
  EXPECT_EQ(coordinator_->StopJob(job).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(coordinator_->StopJob("nope").code(), absl::StatusCode::kNotFound);
}

TEST_F(CoordinatorTest, StaticClusterRefusesStrangersAndDisagreeingViews) {
  auto config = ParseTfConfig(R"({"cluster": {"worker": ["a:1", "b:1"]}})");
  ASSERT_TRUE(config.ok());
  Make(config->cluster);
  v1::RegisterWorkerRequest request = Free(1);
  auto no_identity = coordinator_->RegisterWorker(request);
  EXPECT_EQ(no_identity.status().code(), absl::StatusCode::kInvalidArgument);

  request.mutable_task()->set_type("worker");
  request.mutable_task()->set_index(5);
  EXPECT_THAT(coordinator_->RegisterWorker(request).status().message(),
              HasSubstr("worker:5"));

  request.mutable_task()->set_index(1);
  auto other = ParseTfConfig(R"({"cluster": {"worker": ["a:1", "c:1"]}})");
  *request.mutable_cluster() = other->cluster;
  auto disagree = coordinator_->RegisterWorker(request);
  EXPECT_EQ(disagree.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(
      disagree.status().message(),
      AllOf(HasSubstr("worker:[a:1,c:1]"), HasSubstr("worker:[a:1,b:1]")));

  *request.mutable_cluster() = config->cluster;
  auto ok = coordinator_->RegisterWorker(request);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->worker_id(), "worker:1");
}

TEST_F(CoordinatorTest, StaleIncarnationCannotOpenASession) {
  Make();
  FakeSink a;
  auto registered = coordinator_->RegisterWorker(Free(1));
  EXPECT_EQ(coordinator_->OpenSession(registered->worker_id(), 99, &a).code(),
            absl::StatusCode::kAborted);
}

TEST_F(CoordinatorTest, JobsSurviveARestart) {
  std::string tmpl = ::testing::TempDir() + "coordinator_test_XXXXXX";
  std::string dir = mkdtemp(tmpl.data());
  Make(std::nullopt, *JobStore::Open(dir));
  FakeSink a;
  Connect(1, &a);
  std::string running = *coordinator_->SubmitJob(Spec(1));
  std::string queued = *coordinator_->SubmitJob(Spec(1));
  coordinator_.reset();

  Make(std::nullopt, *JobStore::Open(dir));
  v1::JobStatus was_running = Status(running);
  EXPECT_EQ(was_running.state(), v1::JOB_STATE_RECOVERING);
  EXPECT_EQ(was_running.events(was_running.events_size() - 1).kind(),
            "coordinator_restarted");
  EXPECT_EQ(Status(queued).state(), v1::JOB_STATE_QUEUED);
  // The worker reconnects (same process) and the job re-forms.
  FakeSink again;
  auto registered = coordinator_->RegisterWorker(Free(1));
  ASSERT_TRUE(
      coordinator_->OpenSession(registered->worker_id(), 1, &again).ok());
  EXPECT_EQ(Status(running).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Status(running).generation(), 2);
  std::string next = *coordinator_->SubmitJob(Spec(1));
  EXPECT_NE(next, running);
  EXPECT_NE(next, queued);
}

// ---- checkpoints and preemption --------------------------------------------

// A rank's CheckpointPrepared for `step`, with one file named after the rank.
v1::WorkerMessage Prepared(const std::string& job, int64_t generation, int rank,
                           int64_t step, bool ok = true,
                           const std::string& error = "") {
  v1::WorkerMessage message;
  v1::CheckpointPrepared* prepared = message.mutable_prepared();
  prepared->set_job_id(job);
  prepared->set_generation(generation);
  prepared->set_rank(rank);
  prepared->set_step(step);
  prepared->set_ok(ok);
  prepared->set_error(error);
  if (ok) {
    prepared->set_dir(
        absl::StrFormat(".tmp/worker-%05d/ckpt-%09d", rank, step));
    v1::CheckpointFile* file = prepared->add_files();
    file->set_name(absl::StrFormat("rank-%05d.state", rank));
    file->set_size(100 + rank);
    file->set_sha256(std::string(64, 'a' + rank));
  }
  return message;
}

v1::WorkerMessage Committed(const std::string& job, int64_t generation,
                            int64_t step, bool ok = true) {
  v1::WorkerMessage message;
  v1::CheckpointCommitted* committed = message.mutable_committed();
  committed->set_job_id(job);
  committed->set_generation(generation);
  committed->set_step(step);
  committed->set_ok(ok);
  committed->set_name(absl::StrFormat("ckpt-%09d", step));
  committed->set_epoch(1);
  committed->set_bytes(4096);
  if (!ok) committed->set_error("rename failed");
  return message;
}

v1::WorkerMessage Preempt(const std::string& job, const std::string& reason) {
  v1::WorkerMessage message;
  message.mutable_preempt()->set_job_id(job);
  message.mutable_preempt()->set_reason(reason);
  return message;
}

// An ok TaskResult of a rank that stopped for a preemption.
v1::WorkerMessage PreemptedResult(const std::string& job, int64_t generation,
                                  int rank) {
  v1::WorkerMessage message;
  v1::TaskResult* result = message.mutable_result();
  result->set_job_id(job);
  result->set_generation(generation);
  result->set_rank(rank);
  result->set_ok(true);
  result->set_steps(120);
  result->set_stopped(true);
  result->set_preempted(true);
  return message;
}

// The commands of one kind a sink received.
std::vector<v1::CoordinatorCommand> CommandsOf(
    const FakeSink& sink, v1::CoordinatorCommand::KindCase kind) {
  std::vector<v1::CoordinatorCommand> out;
  for (const v1::CoordinatorCommand& command : sink.commands) {
    if (command.kind_case() == kind) out.push_back(command);
  }
  return out;
}

std::vector<v1::JobEvent> EventsOf(const v1::JobStatus& status,
                                   const std::string& kind) {
  std::vector<v1::JobEvent> out;
  for (const v1::JobEvent& event : status.events()) {
    if (event.kind() == kind) out.push_back(event);
  }
  return out;
}

TEST_F(CoordinatorTest, ChiefCommitsOnceEveryRankPrepared) {
  Make();
  FakeSink a, b;
  std::string id_a = Connect(1, &a);
  std::string id_b = Connect(2, &b);
  std::string job = *coordinator_->SubmitJob(Spec(2));
  ASSERT_EQ(a.commands.size(), 1u);

  ASSERT_TRUE(
      coordinator_->HandleWorkerMessage(id_b, Prepared(job, 1, 1, 20)).ok());
  EXPECT_EQ(a.commands.size(), 1u);  // rank 0 has not prepared yet
  ASSERT_TRUE(
      coordinator_->HandleWorkerMessage(id_a, Prepared(job, 1, 0, 20)).ok());
  ASSERT_EQ(a.commands.size(), 2u);
  ASSERT_TRUE(a.commands[1].has_commit());
  const v1::CommitCheckpoint& commit = a.commands[1].commit();
  EXPECT_EQ(commit.job_id(), job);
  EXPECT_EQ(commit.generation(), 1);
  EXPECT_EQ(commit.step(), 20);
  EXPECT_EQ(commit.abandoned(), "");
  ASSERT_EQ(commit.ranks_size(), 2);
  EXPECT_EQ(commit.ranks(0).rank(), 0);
  EXPECT_EQ(commit.ranks(0).dir(), ".tmp/worker-00000/ckpt-000000020");
  EXPECT_EQ(commit.ranks(0).files(0).name(), "rank-00000.state");
  EXPECT_EQ(commit.ranks(1).rank(), 1);
  EXPECT_EQ(commit.ranks(1).dir(), ".tmp/worker-00001/ckpt-000000020");
  EXPECT_EQ(commit.ranks(1).files(0).name(), "rank-00001.state");
  EXPECT_EQ(commit.ranks(1).files(0).size(), 101);
  EXPECT_TRUE(CommandsOf(b, v1::CoordinatorCommand::kCommit).empty());

  // Only the chief's report of the commit counts.
  ASSERT_TRUE(
      coordinator_->HandleWorkerMessage(id_b, Committed(job, 1, 20)).ok());
  EXPECT_EQ(Status(job).checkpoints_size(), 0);
  ASSERT_TRUE(
      coordinator_->HandleWorkerMessage(id_a, Committed(job, 1, 20)).ok());
  v1::JobStatus status = Status(job);
  ASSERT_EQ(status.checkpoints_size(), 1);
  EXPECT_EQ(status.checkpoints(0).name(), "ckpt-000000020");
  EXPECT_EQ(status.checkpoints(0).step(), 20);
  EXPECT_EQ(status.checkpoints(0).generation(), 1);
  EXPECT_EQ(status.checkpoints(0).bytes(), 4096);
  std::vector<v1::JobEvent> events = EventsOf(status, "checkpoint_committed");
  ASSERT_EQ(events.size(), 1u);
  EXPECT_THAT(events[0].message(), HasSubstr("ckpt-000000020"));
  EXPECT_EQ(events[0].worker_id(), id_a);
  EXPECT_EQ(status.state(), v1::JOB_STATE_RUNNING);
}

TEST_F(CoordinatorTest, FailedCommitIsAnEventNotACheckpoint) {
  Make();
  FakeSink a;
  std::string id_a = Connect(1, &a);
  std::string job = *coordinator_->SubmitJob(Spec(1));
  ASSERT_TRUE(
      coordinator_->HandleWorkerMessage(id_a, Committed(job, 1, 20, false))
          .ok());
  v1::JobStatus status = Status(job);
  EXPECT_EQ(status.checkpoints_size(), 0);
  std::vector<v1::JobEvent> events = EventsOf(status, "checkpoint_failed");
  ASSERT_EQ(events.size(), 1u);
  EXPECT_THAT(events[0].message(),
              AllOf(HasSubstr("step 20"), HasSubstr("rename failed")));
  EXPECT_EQ(status.state(), v1::JOB_STATE_RUNNING);
}

TEST_F(CoordinatorTest, FailedPrepareAbandonsTheStep) {
  Make();
  FakeSink a, b;
  std::string id_a = Connect(1, &a);
  std::string id_b = Connect(2, &b);
  std::string job = *coordinator_->SubmitJob(Spec(2));

  ASSERT_TRUE(coordinator_
                  ->HandleWorkerMessage(
                      id_b, Prepared(job, 1, 1, 20, false, "disk full"))
                  .ok());
  ASSERT_EQ(a.commands.size(), 2u);
  ASSERT_TRUE(a.commands[1].has_commit());
  const v1::CommitCheckpoint& abandoned = a.commands[1].commit();
  EXPECT_EQ(abandoned.step(), 20);
  EXPECT_EQ(abandoned.generation(), 1);
  EXPECT_THAT(abandoned.abandoned(), HasSubstr("disk full"));
  EXPECT_EQ(abandoned.ranks_size(), 0);
  std::vector<v1::JobEvent> events = EventsOf(Status(job), "checkpoint_failed");
  ASSERT_EQ(events.size(), 1u);
  EXPECT_THAT(events[0].message(),
              AllOf(HasSubstr("step 20"), HasSubstr("disk full")));
  EXPECT_EQ(events[0].rank(), 1);
  EXPECT_EQ(events[0].worker_id(), id_b);

  // The abandoned step is never committed, whoever prepares it later.
  ASSERT_TRUE(
      coordinator_->HandleWorkerMessage(id_a, Prepared(job, 1, 0, 20)).ok());
  ASSERT_TRUE(
      coordinator_->HandleWorkerMessage(id_b, Prepared(job, 1, 1, 20)).ok());
  EXPECT_EQ(a.commands.size(), 2u);

  // The next step commits as usual.
  ASSERT_TRUE(
      coordinator_->HandleWorkerMessage(id_a, Prepared(job, 1, 0, 30)).ok());
  ASSERT_TRUE(
      coordinator_->HandleWorkerMessage(id_b, Prepared(job, 1, 1, 30)).ok());
  ASSERT_EQ(a.commands.size(), 3u);
  EXPECT_EQ(a.commands[2].commit().step(), 30);
  EXPECT_EQ(a.commands[2].commit().ranks_size(), 2);
  EXPECT_EQ(a.commands[2].commit().abandoned(), "");
  EXPECT_TRUE(CommandsOf(b, v1::CoordinatorCommand::kCommit).empty());
}

TEST_F(CoordinatorTest, PreparedFromAWrongRankOrAnOlderGenerationIsIgnored) {
  Make();
  FakeSink a, b;
  std::string id_a = Connect(1, &a);
  std::string id_b = Connect(2, &b);
  std::string job = *coordinator_->SubmitJob(Spec(2));

  // Rank 0 claiming to be rank 1 does not complete the step.
  v1::WorkerMessage wrong_rank = Prepared(job, 1, 1, 20);
  wrong_rank.mutable_prepared()->mutable_files(0)->set_name("bogus");
  ASSERT_TRUE(coordinator_->HandleWorkerMessage(id_a, wrong_rank).ok());
  ASSERT_TRUE(
      coordinator_->HandleWorkerMessage(id_a, Prepared(job, 1, 0, 20)).ok());
  EXPECT_EQ(a.commands.size(), 1u);
  ASSERT_TRUE(
      coordinator_->HandleWorkerMessage(id_b, Prepared(job, 1, 1, 20)).ok());
  ASSERT_EQ(a.commands.size(), 2u);
  ASSERT_EQ(a.commands[1].commit().ranks_size(), 2);
  EXPECT_EQ(a.commands[1].commit().ranks(1).files(0).name(),
            "rank-00001.state");

  // Generation 2: a survivor (rank 0) and a replacement (rank 1).
  coordinator_->CloseSession(id_b, 2, &b, absl::UnavailableError("reset"));
  FakeSink c;
  std::string id_c = Connect(3, &c);
  ASSERT_EQ(Status(job).generation(), 2);
  size_t before = a.commands.size();
  ASSERT_TRUE(
      coordinator_->HandleWorkerMessage(id_a, Prepared(job, 1, 0, 40)).ok());
  ASSERT_TRUE(
      coordinator_->HandleWorkerMessage(id_c, Prepared(job, 2, 1, 40)).ok());
  // The old worker, no longer in the job, cannot stand in for a rank.
  ASSERT_TRUE(
      coordinator_->HandleWorkerMessage(id_b, Prepared(job, 2, 0, 40)).ok());
  EXPECT_EQ(a.commands.size(), before);
  ASSERT_TRUE(
      coordinator_->HandleWorkerMessage(id_a, Prepared(job, 2, 0, 40)).ok());
  ASSERT_EQ(a.commands.size(), before + 1);
  EXPECT_EQ(a.commands.back().commit().generation(), 2);
  EXPECT_EQ(a.commands.back().commit().step(), 40);
  EXPECT_TRUE(CommandsOf(c, v1::CoordinatorCommand::kCommit).empty());

  // A commit report of the old generation is not recorded either.
  ASSERT_TRUE(
      coordinator_->HandleWorkerMessage(id_a, Committed(job, 1, 20)).ok());
  EXPECT_EQ(Status(job).checkpoints_size(), 0);
}

TEST_F(CoordinatorTest, PreemptionStopsEveryRankAndReformsWithoutTheWorker) {
  Make();
  v1::JobSpec spec = Spec(2);
  spec.set_max_restarts(0);  // a preemption is not a restart
  FakeSink a, b;
  std::string id_a = Connect(1, &a);
  std::string id_b = Connect(2, &b);
  std::string job = *coordinator_->SubmitJob(spec);

  ASSERT_TRUE(
      coordinator_->HandleWorkerMessage(id_b, Preempt(job, "SIGTERM")).ok());
  for (FakeSink* sink : {&a, &b}) {
    std::vector<v1::CoordinatorCommand> stops =
        CommandsOf(*sink, v1::CoordinatorCommand::kStop);
    ASSERT_EQ(stops.size(), 1u);
    EXPECT_EQ(stops[0].stop().job_id(), job);
    EXPECT_TRUE(stops[0].stop().preempt());
    EXPECT_EQ(stops[0].stop().reason(), "SIGTERM");
  }
  // A second request (the other rank's SIGTERM) sends no second stop.
  ASSERT_TRUE(
      coordinator_->HandleWorkerMessage(id_b, Preempt(job, "SIGTERM")).ok());
  EXPECT_EQ(CommandsOf(a, v1::CoordinatorCommand::kStop).size(), 1u);

  ASSERT_TRUE(
      coordinator_->HandleWorkerMessage(id_a, PreemptedResult(job, 1, 0)).ok());
  EXPECT_EQ(Status(job).state(), v1::JOB_STATE_RUNNING);
  ASSERT_TRUE(
      coordinator_->HandleWorkerMessage(id_b, PreemptedResult(job, 1, 1)).ok());
  v1::JobStatus status = Status(job);
  EXPECT_EQ(status.state(), v1::JOB_STATE_RECOVERING);
  EXPECT_EQ(status.preemptions(), 1);
  EXPECT_EQ(status.generation(), 1);
  EXPECT_EQ(status.step(), 120);
  std::vector<v1::JobEvent> events = EventsOf(status, "preempted");
  ASSERT_EQ(events.size(), 1u);
  EXPECT_THAT(events[0].message(),
              AllOf(HasSubstr("preemption"), HasSubstr("SIGTERM")));
  // Both workers are still connected, but the preempted one is leaving.
  EXPECT_EQ(CommandsOf(a, v1::CoordinatorCommand::kAssignment).size(), 1u);
  EXPECT_TRUE(CommandsOf(a, v1::CoordinatorCommand::kAbort).empty());

  // A new process joins: generation 2 with the survivor at rank 0.
  FakeSink c;
  std::string id_c = Connect(3, &c);
  status = Status(job);
  EXPECT_EQ(status.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(status.generation(), 2);
  EXPECT_EQ(status.preemptions(), 1);
  ASSERT_EQ(status.ranks_size(), 2);
  EXPECT_EQ(status.ranks(0).worker_id(), id_a);
  EXPECT_EQ(status.ranks(1).worker_id(), id_c);
  ASSERT_EQ(c.commands.size(), 1u);
  EXPECT_EQ(c.commands[0].assignment().generation(), 2);
  EXPECT_EQ(c.commands[0].assignment().rank(), 1);
  EXPECT_EQ(CommandsOf(b, v1::CoordinatorCommand::kAssignment).size(), 1u);
}

TEST_F(CoordinatorTest, PreemptedStaticWorkerRejoinsAsANewProcess) {
  auto config = ParseTfConfig(R"({"cluster": {"worker": ["a:1", "b:1"]}})");
  Make(config->cluster);
  FakeSink a, b;
  ConnectTask(0, 10, &a);
  ConnectTask(1, 11, &b);
  std::string job = *coordinator_->SubmitJob(Spec(0));
  ASSERT_TRUE(
      coordinator_->HandleWorkerMessage("worker:1", Preempt(job, "eviction"))
          .ok());
  ASSERT_TRUE(
      coordinator_->HandleWorkerMessage("worker:0", PreemptedResult(job, 1, 0))
          .ok());
  ASSERT_TRUE(
      coordinator_->HandleWorkerMessage("worker:1", PreemptedResult(job, 1, 1))
          .ok());
  EXPECT_EQ(Status(job).state(), v1::JOB_STATE_RECOVERING);
  // The old process exits; its session break does not fail anything.
  coordinator_->CloseSession("worker:1", 11, &b,
                             absl::UnavailableError("exited"));
  EXPECT_EQ(Status(job).state(), v1::JOB_STATE_RECOVERING);

  v1::RegisterWorkerRequest again = Free(99);
  again.mutable_task()->set_type("worker");
  again.mutable_task()->set_index(1);
  ASSERT_TRUE(coordinator_->RegisterWorker(again).ok());
  FakeSink b2;
  ASSERT_TRUE(coordinator_->OpenSession("worker:1", 99, &b2).ok());
  v1::JobStatus status = Status(job);
  EXPECT_EQ(status.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(status.generation(), 2);
  EXPECT_EQ(status.preemptions(), 1);
  ASSERT_EQ(b2.commands.size(), 1u);
  EXPECT_EQ(b2.commands[0].assignment().rank(), 1);
  EXPECT_EQ(b2.commands[0].assignment().generation(), 2);
}

TEST_F(CoordinatorTest, PreemptionDoesNotCountAgainstMaxRestarts) {
  Make();
  v1::JobSpec spec = Spec(2);
  spec.set_max_restarts(1);
  FakeSink a, b;
  std::string id_a = Connect(1, &a);
  std::string id_b = Connect(2, &b);
  std::string job = *coordinator_->SubmitJob(spec);
  ASSERT_TRUE(
      coordinator_->HandleWorkerMessage(id_b, Preempt(job, "SIGTERM")).ok());
  ASSERT_TRUE(
      coordinator_->HandleWorkerMessage(id_a, PreemptedResult(job, 1, 0)).ok());
  ASSERT_TRUE(
      coordinator_->HandleWorkerMessage(id_b, PreemptedResult(job, 1, 1)).ok());
  FakeSink c;
  std::string id_c = Connect(3, &c);
  ASSERT_EQ(Status(job).generation(), 2);

  // The first failure uses the one restart allowed...
  coordinator_->CloseSession(id_c, 3, &c, absl::UnavailableError("gone"));
  EXPECT_EQ(Status(job).state(), v1::JOB_STATE_RECOVERING);
  FakeSink d;
  std::string id_d = Connect(4, &d);
  ASSERT_EQ(Status(job).generation(), 3);
  // ...and the second one ends the job.
  coordinator_->CloseSession(id_d, 4, &d, absl::UnavailableError("gone again"));
  v1::JobStatus status = Status(job);
  EXPECT_EQ(status.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(status.error(), HasSubstr("max_restarts 1"));
  EXPECT_EQ(status.preemptions(), 1);
}

TEST_F(CoordinatorTest, StopDuringAPreemptionStopsTheJob) {
  Make();
  FakeSink a, b;
  std::string id_a = Connect(1, &a);
  std::string id_b = Connect(2, &b);
  std::string job = *coordinator_->SubmitJob(Spec(2));
  ASSERT_TRUE(
      coordinator_->HandleWorkerMessage(id_b, Preempt(job, "SIGTERM")).ok());
  ASSERT_TRUE(coordinator_->StopJob(job).ok());
  ASSERT_TRUE(
      coordinator_->HandleWorkerMessage(id_a, PreemptedResult(job, 1, 0)).ok());
  ASSERT_TRUE(
      coordinator_->HandleWorkerMessage(id_b, PreemptedResult(job, 1, 1)).ok());
  v1::JobStatus status = Status(job);
  EXPECT_EQ(status.state(), v1::JOB_STATE_STOPPED);
  EXPECT_EQ(status.preemptions(), 0);
}

}  // namespace
}  // namespace lockstep::coordinator
