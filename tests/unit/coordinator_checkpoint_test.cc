// Coordinator tests: the two-phase checkpoint commit, preemption, and how a
// stopping generation's final save is reported.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/tf_config.h"
#include "coordinator/coordinator.h"
#include "tests/unit/coordinator_fixture.h"

namespace lockstep::coordinator {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

TEST_F(CoordinatorTest, ChiefCommitsOnceEveryRankPrepared) {
  Make();
  FakeSink a, b;
  std::string id_a = Connect(1, &a);
  std::string id_b = Connect(2, &b);
  std::string job = *coordinator_->SubmitJob(SavingSpec(2));
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
  ASSERT_TRUE(coordinator_->RegisterWorker(Anyone(), again).ok());
  FakeSink b2;
  ASSERT_TRUE(coordinator_->OpenSession(Anyone(), "worker:1", 99, &b2).ok());
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

// ---- a SIGTERM while the job is recovering (issue 13, defect 3) ----------

TEST_F(CoordinatorTest, ALeavingWorkersSavedLiveStateBecomesACheckpoint) {
  Make();
  FakeSink a, b;
  std::string id_a = Connect(1, &a);
  std::string id_b = Connect(2, &b);
  std::string job = *coordinator_->SubmitJob(SavingSpec(2));
  coordinator_->CloseSession(id_b, 2, &b, absl::UnavailableError("gone"));
  ASSERT_EQ(Status(job).state(), v1::JOB_STATE_RECOVERING);

  // First: leaving; nothing happens to the recovering job but that.
  ASSERT_TRUE(
      coordinator_
          ->HandleWorkerMessage(id_a, Preempt(job, "SIGTERM while recovering"))
          .ok());
  EXPECT_EQ(Status(job).state(), v1::JOB_STATE_RECOVERING);
  EXPECT_TRUE(CommandsOf(a, v1::CoordinatorCommand::kStop).empty());
  // Then what became of its state.
  ASSERT_TRUE(
      coordinator_
          ->HandleWorkerMessage(id_a, LiveState(job, 57, "ckpt-000000057", ""))
          .ok());
  v1::JobStatus status = Status(job);
  EXPECT_EQ(status.state(), v1::JOB_STATE_RECOVERING);
  ASSERT_EQ(status.checkpoints_size(), 1);
  EXPECT_EQ(status.checkpoints(0).name(), "ckpt-000000057");
  EXPECT_EQ(status.checkpoints(0).step(), 57);
  EXPECT_EQ(status.applied_step(), 57);
  auto events = EventsOf(status, "live_state_saved");
  ASSERT_EQ(events.size(), 1u);
  EXPECT_THAT(events[0].message(),
              AllOf(HasSubstr(id_a), HasSubstr("SIGTERM"),
                    HasSubstr("at step 57 as ckpt-000000057")));
}

TEST_F(CoordinatorTest, ALiveStateNotSavedIsAnEventAndAForgedNameIsIgnored) {
  Make();
  FakeSink a, b;
  std::string id_a = Connect(1, &a);
  std::string id_b = Connect(2, &b);
  std::string job = *coordinator_->SubmitJob(Spec(2));
  coordinator_->CloseSession(id_b, 2, &b, absl::UnavailableError("gone"));
  // A checkpoint name that is not the step's, a negative step: ignored.
  for (const v1::WorkerMessage& forged :
       {LiveState(job, 57, "../../etc", ""), LiveState(job, 57, "ckpt-1", ""),
        LiveState(job, -3, "", "x")}) {
    EXPECT_TRUE(absl::IsInvalidArgument(
        coordinator_->HandleWorkerMessage(id_a, forged)));
  }
  v1::JobStatus status = Status(job);
  EXPECT_EQ(status.checkpoints_size(), 0);
  EXPECT_TRUE(EventsOf(status, "live_state_saved").empty());
  EXPECT_TRUE(EventsOf(status, "live_state_not_saved").empty());

  ASSERT_TRUE(
      coordinator_
          ->HandleWorkerMessage(
              id_a, LiveState(job, 57, "", "the job saves no checkpoints"))
          .ok());
  status = Status(job);
  auto events = EventsOf(status, "live_state_not_saved");
  ASSERT_EQ(events.size(), 1u);
  EXPECT_THAT(events[0].message(),
              AllOf(HasSubstr(id_a), HasSubstr("no checkpoints")));
  EXPECT_EQ(status.applied_step(), 57);
}

// Issue 14: a prepare may name only the folder its rank prepares its step
// in; "../victim" would have moved a file from outside the backup folder
// into the checkpoint.
TEST_F(CoordinatorTest, APrepareNamingAnotherFolderIsRefused) {
  Make();
  FakeSink a, b;
  std::string id_a = Connect(1, &a);
  std::string id_b = Connect(2, &b);
  std::string job = *coordinator_->SubmitJob(Spec(2));
  ASSERT_TRUE(
      coordinator_->HandleWorkerMessage(id_a, Prepared(job, 1, 0, 10)).ok());
  v1::WorkerMessage forged = Prepared(job, 1, 1, 10);
  forged.mutable_prepared()->set_dir("../victim");
  absl::Status refused = coordinator_->HandleWorkerMessage(id_b, forged);
  EXPECT_TRUE(absl::IsInvalidArgument(refused));
  EXPECT_THAT(refused.message(), HasSubstr(".tmp/worker-00001/ckpt-000000010"));
  // Not counted: the chief is not told to commit.
  EXPECT_TRUE(CommandsOf(a, v1::CoordinatorCommand::kCommit).empty());
  // The rank's real prepare still completes the step.
  ASSERT_TRUE(
      coordinator_->HandleWorkerMessage(id_b, Prepared(job, 1, 1, 10)).ok());
  EXPECT_EQ(CommandsOf(a, v1::CoordinatorCommand::kCommit).size(), 1u);
}

// ---- what a stopping generation reports about its final save -------------

v1::JobSpec CheckpointedSpec(int workers) {
  v1::JobSpec spec = Spec(workers);
  spec.mutable_checkpoint()->set_backup_dir("/shared/ckpt");
  spec.mutable_checkpoint()->set_save_every_steps(100);
  return spec;
}

class CoordinatorFinalSaveTest : public CoordinatorTest {
 protected:
  // Two ranks of a checkpointed job, which committed step 100.
  void SetUp() override {
    Make();
    id_a_ = Connect(1, &a_);
    id_b_ = Connect(2, &b_);
    job_ = *coordinator_->SubmitJob(CheckpointedSpec(2));
    PrepareAndCommit(100);
  }

  void PrepareAndCommit(int64_t step) {
    Send(id_a_, Prepared(job_, 1, 0, step));
    Send(id_b_, Prepared(job_, 1, 1, step));
    Send(id_a_, Committed(job_, 1, step));
  }
  void Send(const std::string& id, const v1::WorkerMessage& message) {
    ASSERT_TRUE(coordinator_->HandleWorkerMessage(id, message).ok());
  }

  FakeSink a_, b_;
  std::string id_a_, id_b_, job_;
};

TEST_F(CoordinatorFinalSaveTest, StopNamesTheCheckpointItSaved) {
  ASSERT_TRUE(coordinator_->StopJob(job_).ok());
  PrepareAndCommit(120);
  Send(id_b_, StoppedResult(job_, 1));
  Send(id_a_, StoppedResult(job_, 0));
  v1::JobStatus status = Status(job_);
  EXPECT_EQ(status.state(), v1::JOB_STATE_STOPPED);
  EXPECT_EQ(status.error(),
            "stopped on request after step 120; saved as ckpt-000000120");
  std::vector<v1::JobEvent> events = EventsOf(status, "job_stopped");
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].message(), status.error());
}

TEST_F(CoordinatorFinalSaveTest, StopWhoseFinalPrepareFailedSaysSo) {
  ASSERT_TRUE(coordinator_->StopJob(job_).ok());
  Send(id_a_, Prepared(job_, 1, 0, 120));
  Send(id_b_, Prepared(job_, 1, 1, 120, false, "disk full"));
  Send(id_a_, StoppedResult(job_, 0));
  Send(id_b_, StoppedResult(job_, 1));
  v1::JobStatus status = Status(job_);
  EXPECT_EQ(status.state(), v1::JOB_STATE_STOPPED);
  EXPECT_THAT(status.error(),
              AllOf(HasSubstr("stopped on request after step 120"),
                    HasSubstr("final save at step 120 failed"),
                    HasSubstr("rank 1 could not prepare it: disk full"),
                    HasSubstr("newest checkpoint is ckpt-000000100")));
  EXPECT_THAT(status.error(), Not(HasSubstr("saved as")));
}

TEST_F(CoordinatorFinalSaveTest,
       StopWithoutAnyReportOfTheFinalSaveSaysItWasNotSaved) {
  ASSERT_TRUE(coordinator_->StopJob(job_).ok());
  // The ranks prepared nothing (their save never reached the coordinator).
  Send(id_a_, StoppedResult(job_, 0));
  Send(id_b_, StoppedResult(job_, 1));
  EXPECT_THAT(Status(job_).error(),
              AllOf(HasSubstr("final save at step 120 failed"),
                    HasSubstr("no checkpoint of that step was committed"),
                    HasSubstr("ckpt-000000100")));
}

TEST_F(CoordinatorFinalSaveTest, StopWhoseSaveFailedOnARankGivesItsReason) {
  ASSERT_TRUE(coordinator_->StopJob(job_).ok());
  // Rank 1 could not even report a prepare; its result says why.
  v1::WorkerMessage failed = StoppedResult(job_, 1);
  failed.mutable_result()->set_stop_save_error("cannot write .tmp: read-only");
  Send(id_a_, StoppedResult(job_, 0));
  Send(id_b_, failed);
  EXPECT_THAT(Status(job_).error(),
              AllOf(HasSubstr("final save at step 120 failed"),
                    HasSubstr("rank 1: cannot write .tmp: read-only"),
                    HasSubstr("ckpt-000000100")));
}

TEST_F(CoordinatorFinalSaveTest, PreemptionWhoseFinalCommitFailedSaysSo) {
  Send(id_b_, Preempt(job_, "SIGTERM"));
  Send(id_a_, Prepared(job_, 1, 0, 120));
  Send(id_b_, Prepared(job_, 1, 1, 120));
  Send(id_a_, Committed(job_, 1, 120, /*ok=*/false));
  Send(id_a_, PreemptedResult(job_, 1, 0));
  Send(id_b_, PreemptedResult(job_, 1, 1));
  v1::JobStatus status = Status(job_);
  EXPECT_EQ(status.state(), v1::JOB_STATE_RECOVERING);
  std::vector<v1::JobEvent> events = EventsOf(status, "preempted");
  ASSERT_EQ(events.size(), 1u);
  EXPECT_THAT(events[0].message(),
              AllOf(HasSubstr("SIGTERM"), HasSubstr("final save at step 120"),
                    HasSubstr("could not commit it: rename failed"),
                    HasSubstr("ckpt-000000100")));
  EXPECT_THAT(events[0].message(), Not(HasSubstr("saved as")));
  EXPECT_EQ(status.error(), events[0].message());
}

TEST_F(CoordinatorFinalSaveTest, PreemptionNamesTheCheckpointItSaved) {
  Send(id_b_, Preempt(job_, "SIGTERM"));
  PrepareAndCommit(120);
  Send(id_a_, PreemptedResult(job_, 1, 0));
  Send(id_b_, PreemptedResult(job_, 1, 1));
  std::vector<v1::JobEvent> events = EventsOf(Status(job_), "preempted");
  ASSERT_EQ(events.size(), 1u);
  EXPECT_THAT(events[0].message(), HasSubstr("); saved as ckpt-000000120;"));
}

TEST_F(CoordinatorTest, StopWithoutCheckpointsSaysNothingOfASave) {
  Make();
  FakeSink a;
  std::string id_a = Connect(1, &a);
  std::string job = *coordinator_->SubmitJob(Spec(1));
  ASSERT_TRUE(coordinator_->StopJob(job).ok());
  v1::WorkerMessage result = PreemptedResult(job, 1, 0);
  result.mutable_result()->set_preempted(false);
  ASSERT_TRUE(coordinator_->HandleWorkerMessage(id_a, result).ok());
  EXPECT_EQ(Status(job).error(), "stopped on request");
}

}  // namespace
}  // namespace lockstep::coordinator
