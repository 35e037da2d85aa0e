// Coordinator tests: worker registration and sessions, failure detection,
// the job queue and state machine, and the key-value store
// fenced by generation.
#include "coordinator/coordinator.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <optional>

#include "absl/strings/str_cat.h"
#include "common/tf_config.h"
#include "tests/unit/coordinator_fixture.h"

namespace lockstep::coordinator {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

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

// A resume counts the steps it repeats from where the ranks stopped, which
// their results say when a generation ends, not from the chief's last
// progress report (about once a second).
TEST_F(CoordinatorTest, AResumeCountsRepeatedStepsFromWhereTheRanksStopped) {
  Make();
  FakeSink a, b;
  std::string id_a = Connect(1, &a);
  std::string id_b = Connect(2, &b);
  std::string job = *coordinator_->SubmitJob(Spec(2));
  v1::WorkerMessage progress;
  v1::ProgressReport* report = progress.mutable_progress();
  report->set_job_id(job);
  report->set_generation(1);
  report->set_step(10);
  report->set_first_step(0);
  for (int i = 0; i < 10; ++i) report->add_step_losses(1.0f);
  ASSERT_TRUE(coordinator_->HandleWorkerMessage(id_a, progress).ok());

  coordinator_->CloseSession(id_b, 2, &b, absl::UnavailableError("reset"));
  // The survivor's aborted generation 1 ended after step 42.
  v1::WorkerMessage aborted;
  v1::TaskResult* result = aborted.mutable_result();
  result->set_job_id(job);
  result->set_generation(1);
  result->set_rank(0);
  result->set_ok(false);
  result->set_code(static_cast<int>(absl::StatusCode::kAborted));
  result->set_steps(42);
  ASSERT_TRUE(coordinator_->HandleWorkerMessage(id_a, aborted).ok());
  // A result naming a generation that never was counts for nothing.
  result->set_generation(9);
  result->set_steps(500);
  ASSERT_TRUE(coordinator_->HandleWorkerMessage(id_a, aborted).ok());
  EXPECT_EQ(Status(job).applied_step(), 42);

  FakeSink c;
  Connect(3, &c);
  ASSERT_EQ(Status(job).generation(), 2);
  v1::WorkerMessage resumed;
  report = resumed.mutable_progress();
  report->set_job_id(job);
  report->set_generation(2);
  report->set_step(41);
  report->set_first_step(40);
  report->add_step_losses(1.0f);
  report->set_resumed_at_step(40);
  report->set_state_source_rank(-1);
  report->set_restored_checkpoint("ckpt-000000040");
  ASSERT_TRUE(coordinator_->HandleWorkerMessage(id_a, resumed).ok());
  std::vector<v1::JobEvent> events = EventsOf(Status(job), "resumed");
  ASSERT_EQ(events.size(), 1u);
  EXPECT_THAT(events[0].message(),
              AllOf(HasSubstr("from checkpoint ckpt-000000040"),
                    HasSubstr("; 2 steps repeated")));
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
  absl::Status fenced = coordinator_->KvSet(Anyone(), Signed(old));
  EXPECT_EQ(fenced.code(), absl::StatusCode::kAborted);
  EXPECT_THAT(fenced.message(), HasSubstr("generation 1 is over"));
  old.set_generation(2);
  EXPECT_TRUE(coordinator_->KvSet(Anyone(), Signed(old)).ok());
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
  // Survivor b keeps rank 1; c takes a's rank 0 and d joins up to
  // max_workers.
  v1::JobStatus status = Status(job);
  EXPECT_EQ(status.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(status.generation(), 2);
  EXPECT_EQ(status.world_size(), 3);
  EXPECT_EQ(status.ranks(0).worker_id(), "free:2");
  EXPECT_EQ(status.ranks(1).worker_id(), "free:1");
  EXPECT_EQ(status.ranks(2).worker_id(), "free:3");
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
      "rank 1 (" + id_b + " on 127.0.0.1) stalled at collective #812 for 14 s");
}

// Issue 35: one host's link capped to a tenth of the others'. Every rank
// reports its throughput with each peer; the rank every other rank finds
// slow is named (its own view, slow with everyone, does not blame the
// others). Two ranks cannot tell which end is slow, and rates within 3x of
// each other name nobody.
TEST_F(CoordinatorTest, StatusNamesTheRankWithTheSlowLink) {
  Make();
  FakeSink sinks[3];
  std::string ids[3];
  for (int i = 0; i < 3; ++i) ids[i] = Connect(1 + i, &sinks[i]);
  v1::JobSpec spec = Spec(3);
  spec.set_global_batch_size(96);
  std::string job = *coordinator_->SubmitJob(spec);
  std::map<std::string, int> rank_of;
  const v1::JobStatus started = Status(job);
  for (const v1::RankResult& rank : started.ranks()) {
    rank_of[rank.worker_id()] = rank.rank();
  }
  // The slow one is whichever worker holds rank 2.
  auto report = [&](const std::vector<std::vector<double>>& by_rank) {
    for (const std::string& id : ids) {
      v1::WorkerMessage message;
      v1::Heartbeat* beat = message.mutable_heartbeat();
      beat->set_job_id(job);
      beat->set_generation(1);
      beat->set_collective_seq(10);
      for (double rate : by_rank[rank_of[id]]) beat->add_link_mbps(rate);
      ASSERT_TRUE(coordinator_->HandleWorkerMessage(id, message).ok());
    }
  };
  report({{0, 110, 11}, {112, 0, 12}, {10, 11, 0}});
  std::string holder;
  for (const auto& [id, rank] : rank_of) {
    if (rank == 2) holder = id;
  }
  EXPECT_EQ(Status(job).stall(),
            "rank 2 (" + holder +
                " on 127.0.0.1) has the slowest data-plane link: its data "
                "reaches its peers at 12 MB/s, the others' at 110 MB/s");
  report({{0, 110, 60}, {112, 0, 50}, {55, 58, 0}});  // within 3x
  EXPECT_EQ(Status(job).stall(), "");
  report({{0, 110, 11}, {112, 0, 0}, {10, 11, 0}});  // not measured by all
  EXPECT_EQ(Status(job).stall(), "");
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
  ASSERT_TRUE(coordinator_->KvSet(Anyone(), Signed(set)).ok());
  v1::KvGetRequest get;
  get.set_job_id(job);
  get.set_generation(1);
  get.set_key("k");
  EXPECT_EQ(*KvGet(Anyone(), get), "v");
  get.set_generation(0);
  EXPECT_EQ(KvGet(Anyone(), get).status().code(), absl::StatusCode::kAborted);
  get.set_generation(1);
  get.set_key("missing");
  get.set_timeout_ms(1);
  auto missing = KvGet(Anyone(), get);
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
  std::optional<absl::StatusOr<std::string>> got;
  coordinator_->KvGetAsync(
      Anyone(), get,
      [&](absl::StatusOr<std::string> value) { got = std::move(value); });
  EXPECT_FALSE(got.has_value());
  v1::KvSetRequest set;
  set.set_job_id(job);
  set.set_generation(1);
  set.set_key("late");
  set.set_value("here");
  ASSERT_TRUE(coordinator_->KvSet(Anyone(), Signed(set)).ok());
  ASSERT_TRUE(got.has_value());
  EXPECT_EQ(**got, "here");
}

TEST_F(CoordinatorTest, KvGetRefusesANegativeRank) {
  Make();
  FakeSink a;
  Connect(1, &a);
  std::string job = *coordinator_->SubmitJob(Spec(1));
  v1::KvGetRequest request;
  request.set_job_id(job);
  request.set_generation(1);
  request.set_key("start");
  request.set_rank(-1);
  request.set_timeout_ms(1);
  absl::Status negative = KvGet(Anyone(), request).status();
  EXPECT_EQ(negative.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(negative.message(), HasSubstr("rank is -1"));
}

TEST_F(CoordinatorTest, StopQueuedJob) {
  Make();
  std::string job = *coordinator_->SubmitJob(Spec(2));
  clock_.Advance(absl::Seconds(5));
  ASSERT_TRUE(coordinator_->StopJob(job).ok());
  const v1::JobStatus stopped = Status(job);
  EXPECT_EQ(stopped.state(), v1::JOB_STATE_STOPPED);
  // Recorded as every other end is: the event, the reason and the time.
  ASSERT_EQ(EventsOf(stopped, "job_stopped").size(), 1u);
  EXPECT_EQ(EventsOf(stopped, "job_stopped")[0].message(),
            "stopped on request before it started");
  EXPECT_EQ(stopped.error(), "stopped on request before it started");
  EXPECT_EQ(stopped.end_time(), stopped.submit_time() + 5);
  EXPECT_EQ(coordinator_->StopJob(job).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(coordinator_->StopJob("nope").code(), absl::StatusCode::kNotFound);
}

// A stop the running generation got, then a worker failure before its
// ranks stopped: the job stops there. It used to re-form and train to the
// end without the stop, and only then report STOPPED.
TEST_F(CoordinatorTest, AStopThatCrossesAWorkerFailureStopsTheJob) {
  Make();
  FakeSink a, b;
  Connect(1, &a);
  const std::string id_b = Connect(2, &b);
  const std::string job = *coordinator_->SubmitJob(Spec(2));
  ASSERT_EQ(Status(job).state(), v1::JOB_STATE_RUNNING);
  ASSERT_TRUE(coordinator_->StopJob(job).ok());
  ASSERT_EQ(CommandsOf(a, v1::CoordinatorCommand::kStop).size(), 1u);
  coordinator_->CloseSession(id_b, 2, &b, absl::UnavailableError("reset"));

  const v1::JobStatus status = Status(job);
  EXPECT_EQ(status.state(), v1::JOB_STATE_STOPPED);
  EXPECT_THAT(status.error(),
              AllOf(HasSubstr("stopped on request"),
                    HasSubstr("generation 1 failed"), HasSubstr(id_b)));
  ASSERT_EQ(EventsOf(status, "worker_failed").size(), 1u);
  EXPECT_EQ(EventsOf(status, "worker_failed")[0].rank(), 1);
  EXPECT_EQ(EventsOf(status, "job_stopped").size(), 1u);
  // No second generation, however many workers come.
  FakeSink c;
  Connect(3, &c);
  EXPECT_EQ(Status(job).generations(), 1);
  EXPECT_TRUE(CommandsOf(c, v1::CoordinatorCommand::kAssignment).empty());
}

TEST_F(CoordinatorTest, StaticClusterRefusesStrangersAndDisagreeingViews) {
  auto config = ParseTfConfig(R"({"cluster": {"worker": ["a:1", "b:1"]}})");
  ASSERT_TRUE(config.ok());
  Make(config->cluster);
  v1::RegisterWorkerRequest request = Free(1);
  auto no_identity = coordinator_->RegisterWorker(Anyone(), request);
  EXPECT_EQ(no_identity.status().code(), absl::StatusCode::kInvalidArgument);

  request.mutable_task()->set_type("worker");
  request.mutable_task()->set_index(5);
  EXPECT_THAT(
      coordinator_->RegisterWorker(Anyone(), request).status().message(),
      HasSubstr("worker:5"));

  request.mutable_task()->set_index(1);
  auto other = ParseTfConfig(R"({"cluster": {"worker": ["a:1", "c:1"]}})");
  *request.mutable_cluster() = other->cluster;
  auto disagree = coordinator_->RegisterWorker(Anyone(), request);
  EXPECT_EQ(disagree.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(
      disagree.status().message(),
      AllOf(HasSubstr("worker:[a:1,c:1]"), HasSubstr("worker:[a:1,b:1]")));

  *request.mutable_cluster() = config->cluster;
  auto ok = coordinator_->RegisterWorker(Anyone(), request);
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->worker_id(), "worker:1");
}

TEST_F(CoordinatorTest, StaleIncarnationCannotOpenASession) {
  Make();
  FakeSink a;
  auto registered = coordinator_->RegisterWorker(Anyone(), Free(1));
  EXPECT_EQ(coordinator_->OpenSession(Anyone(), registered->worker_id(), 99, &a)
                .code(),
            absl::StatusCode::kAborted);
}

// ---- generations are replaced whole ----------------------------------------

// Fails generation 1 (b's session breaks) and starts generation 2 on a and a
// newcomer.
void ReplaceGeneration(Coordinator& coordinator, const std::string& id_b,
                       FakeSink* b, FakeSink* c) {
  coordinator.CloseSession(id_b, 2, b, absl::UnavailableError("reset"));
  auto registered = coordinator.RegisterWorker(Anyone(), Free(3));
  ASSERT_TRUE(registered.ok());
  ASSERT_TRUE(
      coordinator.OpenSession(Anyone(), registered->worker_id(), 3, c).ok());
}

TEST_F(CoordinatorTest, KeysOfAnOlderGenerationDoNotCarryOver) {
  Make();
  FakeSink a, b, c;
  Connect(1, &a);
  std::string id_b = Connect(2, &b);
  std::string job = *coordinator_->SubmitJob(Spec(2));
  v1::KvSetRequest set;
  set.set_job_id(job);
  set.set_generation(1);
  set.set_key("rank_0");
  set.set_value("10.0.0.1:4000");
  ASSERT_TRUE(coordinator_->KvSet(Anyone(), Signed(set)).ok());

  ReplaceGeneration(*coordinator_, id_b, &b, &c);
  ASSERT_EQ(Status(job).generation(), 2);
  v1::KvGetRequest get;
  get.set_job_id(job);
  get.set_generation(2);
  get.set_key("rank_0");
  get.set_timeout_ms(1);
  EXPECT_EQ(KvGet(Anyone(), get).status().code(),
            absl::StatusCode::kDeadlineExceeded);
}

TEST_F(CoordinatorTest, WaitsOnAReplacedGenerationAreAborted) {
  Make();
  FakeSink a, b, c;
  Connect(1, &a);
  std::string id_b = Connect(2, &b);
  std::string job = *coordinator_->SubmitJob(Spec(2));
  std::optional<absl::StatusOr<std::string>> got;
  v1::KvGetRequest get;
  get.set_job_id(job);
  get.set_generation(1);
  get.set_key("never");
  get.set_timeout_ms(60000);
  coordinator_->KvGetAsync(
      Anyone(), get,
      [&](absl::StatusOr<std::string> value) { got = std::move(value); });
  ASSERT_FALSE(got.has_value());
  ReplaceGeneration(*coordinator_, id_b, &b, &c);
  ASSERT_TRUE(got.has_value());
  ASSERT_EQ(Status(job).generation(), 2);
  EXPECT_EQ(got->status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(got->status().message(), HasSubstr("generation 1 is over"));
}

TEST_F(CoordinatorTest, ReportsOfAnEndedGenerationAreIgnored) {
  Make();
  FakeSink a, b;
  std::string id_a = Connect(1, &a);
  std::string id_b = Connect(2, &b);
  std::string job = *coordinator_->SubmitJob(Spec(2));
  coordinator_->CloseSession(id_b, 2, &b, absl::UnavailableError("reset"));
  ASSERT_EQ(Status(job).state(), v1::JOB_STATE_RECOVERING);
  int64_t version = Status(job).version();
  v1::WorkerMessage progress;
  progress.mutable_progress()->set_job_id(job);
  progress.mutable_progress()->set_generation(1);
  progress.mutable_progress()->set_step(7);
  ASSERT_TRUE(coordinator_->HandleWorkerMessage(id_a, progress).ok());
  v1::KvSetRequest set;
  set.set_job_id(job);
  set.set_generation(1);
  set.set_key("k");
  EXPECT_EQ(coordinator_->KvSet(Anyone(), Signed(set)).code(),
            absl::StatusCode::kAborted);
  EXPECT_EQ(Status(job).step(), 0);
  EXPECT_EQ(Status(job).version(), version);
}

}  // namespace
}  // namespace lockstep::coordinator
