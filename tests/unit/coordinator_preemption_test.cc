// Coordinator tests: the scheduler's preemptions carried out (issue 52):
// a job of a higher priority stops a running one at an agreed step and
// takes its workers, the workers promised to it meanwhile, a job that
// finishes while being preempted, elastic jobs that shrink instead, the
// minimum run time, and a preemption that a failure, a coordinator
// restart (coordinator_persistence_test.cc) or its job's going away
// crosses.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "coordinator/coordinator.h"
#include "coordinator/job_status.h"
#include "tests/unit/coordinator_fixture.h"

namespace lockstep::coordinator {
namespace {

// The rank results of a generation that stopped for a preemption.
void Yield(Coordinator& coordinator, const v1::JobStatus& status) {
  for (const v1::RankResult& rank : status.ranks()) {
    ASSERT_TRUE(coordinator
                    .HandleWorkerMessage(
                        rank.worker_id(),
                        PreemptedResult(status.job_id(), status.generation(),
                                        rank.rank()))
                    .ok());
  }
}

// The chief reports `step`, and every rank prepares a checkpoint of it,
// which the chief commits.
void Checkpointed(Coordinator& coordinator, const v1::JobStatus& status,
                  int64_t step) {
  const int64_t generation = status.generation();
  ASSERT_TRUE(coordinator
                  .HandleWorkerMessage(
                      status.ranks(0).worker_id(),
                      Progress(status.job_id(), generation, step, 1000))
                  .ok());
  for (const v1::RankResult& rank : status.ranks()) {
    ASSERT_TRUE(coordinator
                    .HandleWorkerMessage(rank.worker_id(),
                                         Prepared(status.job_id(), generation,
                                                  rank.rank(), step))
                    .ok());
  }
  ASSERT_TRUE(
      coordinator
          .HandleWorkerMessage(status.ranks(0).worker_id(),
                               Committed(status.job_id(), generation, step))
          .ok());
}

bool SentPreemptingStop(const FakeSink& sink, const std::string& job) {
  for (const auto& command : CommandsOf(sink, v1::CoordinatorCommand::kStop)) {
    if (command.stop().job_id() == job && command.stop().preempt()) return true;
  }
  return false;
}

TEST_F(CoordinatorTest, AHigherPriorityJobPreemptsOneThatGoesBackToTheQueue) {
  configure_ = [](Coordinator::Options& options) {
    options.scheduling.min_run_time = absl::ZeroDuration();
  };
  Make();
  FakeSink sinks[2];
  for (int i = 0; i < 2; ++i) Connect(i + 1, &sinks[i]);
  v1::JobSpec low_spec = SavingSpec(2);
  low_spec.set_max_restarts(0);  // a preemption is not a restart
  const std::string low = *coordinator_->SubmitJob(low_spec);
  ASSERT_EQ(Status(low).state(), v1::JOB_STATE_RUNNING);

  const std::string urgent = *coordinator_->SubmitJob(Urgent(2));
  v1::JobStatus waiting = Status(urgent);
  EXPECT_EQ(waiting.state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(waiting.priority(), 10);
  EXPECT_EQ(waiting.queue().position(), 1);
  EXPECT_EQ(waiting.queue().reason(), "preempting");
  EXPECT_THAT(waiting.queue().preempts(), ::testing::ElementsAre(low));
  EXPECT_TRUE(SentPreemptingStop(sinks[0], low));
  EXPECT_TRUE(SentPreemptingStop(sinks[1], low));
  ASSERT_EQ(EventsOf(Status(low), "preemption_requested").size(), 1u);

  // Every rank stopped at the agreed step and saved it: the low job waits
  // in the queue and the urgent one runs on its workers.
  Yield(*coordinator_, Status(low));
  v1::JobStatus yielded = Status(low);
  EXPECT_EQ(yielded.state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(yielded.yields(), 1);
  EXPECT_EQ(yielded.preemptions(), 1);
  EXPECT_EQ(EventsOf(yielded, "preempted").size(), 1u);
  EXPECT_EQ(Status(urgent).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(AssignedJob(sinks[0]), urgent);
  EXPECT_EQ(AssignedJob(sinks[1]), urgent);
  EXPECT_EQ(yielded.queue().position(), 1);

  // The urgent job ends: the preempted one is placed again, as its next
  // generation, with its restarts untouched.
  Succeed(*coordinator_, Status(urgent), 0);
  v1::JobStatus resumed = Status(low);
  EXPECT_EQ(resumed.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(resumed.generation(), 2);
  EXPECT_FALSE(resumed.has_queue());
  EXPECT_EQ(EventsOf(resumed, "resumed_after_preemption").size(), 1u);
  EXPECT_EQ(AssignedJob(sinks[0]), low);
  Succeed(*coordinator_, resumed, 0);
  EXPECT_EQ(Status(low).state(), v1::JOB_STATE_SUCCEEDED);
}

// Issue 52: a 2-worker job that saves checkpoints, being preempted by an
// urgent 2-worker job that waits for its workers.
class PreemptingTest : public CoordinatorTest {
 protected:
  void SetUp() override {
    CoordinatorTest::SetUp();
    configure_ = [](Coordinator::Options& options) {
      options.scheduling.min_run_time = absl::ZeroDuration();
    };
    Make();
    for (int i = 0; i < 2; ++i) Connect(i + 1, &sinks_[i]);
    low_ = *coordinator_->SubmitJob(SavingSpec(2));
    ASSERT_EQ(Status(low_).state(), v1::JOB_STATE_RUNNING);
    urgent_ = *coordinator_->SubmitJob(Urgent(2));
    ASSERT_EQ(Status(urgent_).queue().reason(), "preempting");
    ASSERT_TRUE(SentPreemptingStop(sinks_[0], low_));
  }

  // The low job succeeded, was never preempted, and the urgent job took
  // its workers.
  void ExpectSucceededAndHandedOver() {
    const v1::JobStatus done = Status(low_);
    EXPECT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << done.error();
    EXPECT_EQ(done.preemptions(), 0);
    EXPECT_TRUE(EventsOf(done, "preempted").empty());
    EXPECT_EQ(Status(urgent_).state(), v1::JOB_STATE_RUNNING);
    EXPECT_EQ(AssignedJob(sinks_[0]), urgent_);
    EXPECT_EQ(AssignedJob(sinks_[1]), urgent_);
  }

  FakeSink sinks_[2];
  std::string low_, urgent_;
};

// The ranks reach the plan's end before the agreed stop (none of them says
// it stopped): the job succeeded, and is neither put back in the queue nor
// trained again.
TEST_F(PreemptingTest, AJobThatFinishesWhileBeingPreemptedSucceeds) {
  Succeed(*coordinator_, Status(low_), 0);
  ExpectSucceededAndHandedOver();
}

// The same when the agreed stop falls on the plan's last step: every rank
// stopped there, and nothing is left to train.
TEST_F(PreemptingTest, AJobPreemptedAtItsLastStepSucceeds) {
  const v1::JobStatus running = Status(low_);
  for (const v1::RankResult& rank : running.ranks()) {
    v1::WorkerMessage result =
        PreemptedResult(low_, running.generation(), rank.rank());
    result.mutable_result()->set_total_steps(120);  // the plan's end
    ASSERT_TRUE(
        coordinator_->HandleWorkerMessage(rank.worker_id(), result).ok());
  }
  ExpectSucceededAndHandedOver();
}

// Issue 52 §3: a worker that moved on to the job that preempted the low one
// holds none of the low job's state: a live-state report it sends for that
// job adds no checkpoint.
TEST_F(PreemptingTest, ALiveStateReportFromAWorkerThatMovedOnIsRefused) {
  Yield(*coordinator_, Status(low_));
  ASSERT_EQ(Status(urgent_).state(), v1::JOB_STATE_RUNNING);
  const std::string moved = Status(urgent_).ranks(0).worker_id();
  ASSERT_TRUE(coordinator_
                  ->HandleWorkerMessage(
                      moved, LiveState(low_, 100, "ckpt-000000100", ""))
                  .ok());
  const v1::JobStatus low = Status(low_);
  EXPECT_EQ(low.checkpoints_size(), 0);
  EXPECT_TRUE(EventsOf(low, "live_state_saved").empty());
}

// Issue 52: a preemption is called off when the job it was for leaves the
// queue before the victim yields: its ranks get Resume and train on. Ranks
// that had already agreed to stop report it; the job then re-forms at once
// on the same workers, spending no restart and never queued.
TEST_F(PreemptingTest, APreemptionIsCalledOffWhenItsJobIsStopped) {
  ASSERT_TRUE(coordinator_->StopJob(urgent_).ok());
  const v1::JobStatus running = Status(low_);
  EXPECT_EQ(running.state(), v1::JOB_STATE_RUNNING);
  EXPECT_FALSE(running.has_preemption());
  ASSERT_EQ(EventsOf(running, "preemption_called_off").size(), 1u);
  EXPECT_THAT(EventsOf(running, "preemption_called_off")[0].message(),
              ::testing::HasSubstr(urgent_ + " ended stopped"));
  for (const FakeSink& sink : sinks_) {
    const auto resumes = CommandsOf(sink, v1::CoordinatorCommand::kResume);
    ASSERT_EQ(resumes.size(), 1u);
    EXPECT_EQ(resumes[0].resume().job_id(), low_);
    EXPECT_EQ(resumes[0].resume().generation(), 1);
  }
  // Too late: the ranks had voted to stop. A worker whose rank reported is
  // kept for the job's next generation: a job submitted meanwhile waits.
  ASSERT_TRUE(coordinator_
                  ->HandleWorkerMessage(
                      running.ranks(0).worker_id(),
                      PreemptedResult(low_, 1, running.ranks(0).rank()))
                  .ok());
  const std::string small = *coordinator_->SubmitJob(Spec(1));
  EXPECT_EQ(Status(small).state(), v1::JOB_STATE_QUEUED);
  ASSERT_TRUE(coordinator_
                  ->HandleWorkerMessage(
                      running.ranks(1).worker_id(),
                      PreemptedResult(low_, 1, running.ranks(1).rank()))
                  .ok());
  const v1::JobStatus reformed = Status(low_);
  EXPECT_EQ(reformed.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(reformed.generation(), 2);
  EXPECT_EQ(reformed.ranks(0).worker_id(), running.ranks(0).worker_id());
  EXPECT_EQ(reformed.ranks(1).worker_id(), running.ranks(1).worker_id());
  EXPECT_EQ(reformed.yields(), 0);
  EXPECT_EQ(RestartsUsed(reformed), 0);
  EXPECT_TRUE(EventsOf(reformed, "preempted").empty());
  EXPECT_EQ(EventsOf(reformed, "preemption_called_off").size(), 2u);
}

TEST_F(PreemptingTest, APreemptionIsCalledOffWhenItsJobStartsElsewhere) {
  FakeSink more[2];
  for (int i = 0; i < 2; ++i) Connect(10 + i, &more[i]);
  ASSERT_EQ(Status(urgent_).state(), v1::JOB_STATE_RUNNING);
  const v1::JobStatus running = Status(low_);
  EXPECT_EQ(running.state(), v1::JOB_STATE_RUNNING);
  EXPECT_FALSE(running.has_preemption());
  ASSERT_EQ(EventsOf(running, "preemption_called_off").size(), 1u);
  EXPECT_THAT(EventsOf(running, "preemption_called_off")[0].message(),
              ::testing::HasSubstr("started on other workers"));
  EXPECT_EQ(CommandsOf(sinks_[0], v1::CoordinatorCommand::kResume).size(), 1u);
  // The ranks trained on and finish: the job succeeds.
  Succeed(*coordinator_, running, 0);
  EXPECT_EQ(Status(low_).state(), v1::JOB_STATE_SUCCEEDED);
}

// Issue 52: a worker whose rank already reported is idle while its job
// still yields; it is promised to the urgent job, counted once, and no
// later job of a lower priority takes it.
TEST_F(CoordinatorTest, AWorkerReleasedByAYieldingJobIsKeptForTheUrgentOne) {
  configure_ = [](Coordinator::Options& options) {
    options.scheduling.min_run_time = absl::ZeroDuration();
  };
  Make();
  FakeSink sinks[4];
  for (int i = 0; i < 4; ++i) Connect(i + 1, &sinks[i]);
  const std::string low = *coordinator_->SubmitJob(SavingSpec(4));
  const std::string urgent = *coordinator_->SubmitJob(Urgent(4));
  ASSERT_EQ(Status(urgent).queue().reason(), "preempting");
  const v1::JobStatus yielding = Status(low);
  const v1::RankResult& first = yielding.ranks(0);
  ASSERT_TRUE(coordinator_
                  ->HandleWorkerMessage(
                      first.worker_id(),
                      PreemptedResult(low, yielding.generation(), first.rank()))
                  .ok());
  const std::string small = *coordinator_->SubmitJob(Spec(1));
  EXPECT_EQ(Status(small).state(), v1::JOB_STATE_QUEUED);
  for (const FakeSink& sink : sinks) EXPECT_NE(AssignedJob(sink), small);

  Yield(*coordinator_, Status(low));
  EXPECT_EQ(Status(urgent).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Status(urgent).world_size(), 4);
  EXPECT_EQ(Status(low).preemptions(), 1);
}

TEST_F(CoordinatorTest, APreemptedJobResumesOnOtherWorkersReplacingNobody) {
  configure_ = [](Coordinator::Options& options) {
    options.scheduling.min_run_time = absl::ZeroDuration();
  };
  Make();
  FakeSink sinks[4];
  for (int i = 0; i < 2; ++i) Connect(i + 1, &sinks[i]);
  const std::string low = *coordinator_->SubmitJob(SavingSpec(2));
  const std::string urgent = *coordinator_->SubmitJob(Urgent(2));
  Yield(*coordinator_, Status(low));
  ASSERT_EQ(Status(urgent).state(), v1::JOB_STATE_RUNNING);
  // Two more workers join: the preempted job is placed on them at once.
  for (int i = 2; i < 4; ++i) Connect(i + 1, &sinks[i]);
  const v1::JobStatus resumed = Status(low);
  ASSERT_EQ(resumed.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(AssignedJob(sinks[2]), low);
  EXPECT_EQ(AssignedJob(sinks[3]), low);
  // Its old workers were released, not lost: nobody replaced a rank.
  EXPECT_TRUE(EventsOf(resumed, "rank_replaced").empty());
  EXPECT_EQ(EventsOf(resumed, "resumed_after_preemption").size(), 1u);
}

// An elastic job (2 to 4 workers, no checkpoints: it cannot stop whole) on
// a pool of 4, and an urgent 2-worker job that asks it to shrink.
class ShrinkingTest : public CoordinatorTest {
 protected:
  void SetUp() override {
    CoordinatorTest::SetUp();
    configure_ = [](Coordinator::Options& options) {
      options.scheduling.min_run_time = absl::ZeroDuration();
    };
    Make();
    for (int i = 0; i < 4; ++i) ids_.push_back(Connect(i + 1, &sinks_[i]));
    v1::JobSpec elastic = Spec(0);
    elastic.set_min_workers(2);
    elastic.set_max_workers(4);
    low_ = *coordinator_->SubmitJob(elastic);
    ASSERT_EQ(Status(low_).world_size(), 4);
    urgent_ = *coordinator_->SubmitJob(Urgent(2));
    ASSERT_EQ(Status(urgent_).queue().reason(), "preempting");
    ASSERT_TRUE(SentPreemptingStop(sinks_[0], low_));
  }

  // The job went on with its first two ranks, spending no restart.
  void ExpectShrunkToTheFirstTwoRanks() {
    const v1::JobStatus shrunk = Status(low_);
    EXPECT_EQ(shrunk.state(), v1::JOB_STATE_RUNNING);
    ASSERT_EQ(shrunk.world_size(), 2);
    EXPECT_EQ(shrunk.ranks(0).worker_id(), ids_[0]);
    EXPECT_EQ(shrunk.ranks(1).worker_id(), ids_[1]);
    EXPECT_EQ(EventsOf(shrunk, "shrunk").size(), 1u);
    EXPECT_EQ(shrunk.yields(), 0);
    EXPECT_EQ(RestartsUsed(shrunk), 0);
  }

  FakeSink sinks_[4];
  std::vector<std::string> ids_;
  std::string low_, urgent_;
};

TEST_F(ShrinkingTest, AnElasticJobShrinksToMakeRoomAndKeepsItsFirstRanks) {
  // Every rank stops at the agreed step; the job re-forms at once on its
  // first two ranks, and the urgent job gets the other two.
  Yield(*coordinator_, Status(low_));
  ExpectShrunkToTheFirstTwoRanks();
  EXPECT_EQ(Status(low_).generation(), 2);
  ASSERT_EQ(Status(urgent_).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(AssignedJob(sinks_[2]), urgent_);
  EXPECT_EQ(AssignedJob(sinks_[3]), urgent_);
}

// A failure during the shrink: the job re-forms on its first ranks, and the
// rest still go to the urgent job.
TEST_F(ShrinkingTest, AWorkerFailureDuringAShrinkStillHandsTheRestOver) {
  coordinator_->CloseSession(ids_[3], 4, &sinks_[3],
                             absl::UnavailableError("gone"));
  ExpectShrunkToTheFirstTwoRanks();
  // The urgent job took the survivor of the released ranks and waits for
  // one more worker (the lost one, when it is back).
  FakeSink back;
  Connect(4, &back);
  ASSERT_EQ(Status(urgent_).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(AssignedJob(sinks_[2]), urgent_);
  EXPECT_EQ(Status(low_).world_size(), 2);
}

TEST_F(CoordinatorTest, AJobThatSavesNoCheckpointsIsNotPreempted) {
  configure_ = [](Coordinator::Options& options) {
    options.scheduling.min_run_time = absl::ZeroDuration();
  };
  Make();
  FakeSink sinks[2];
  for (int i = 0; i < 2; ++i) Connect(i + 1, &sinks[i]);
  const std::string low = *coordinator_->SubmitJob(Spec(2));
  const std::string urgent = *coordinator_->SubmitJob(Urgent(2));
  EXPECT_EQ(Status(urgent).queue().reason(), "no_fit");
  EXPECT_FALSE(SentPreemptingStop(sinks[0], low));
  EXPECT_EQ(Status(low).state(), v1::JOB_STATE_RUNNING);
}

TEST_F(CoordinatorTest, AJobIsPreemptedOnlyAfterTheMinimumRunTime) {
  configure_ = [](Coordinator::Options& options) {
    options.scheduling.min_run_time = absl::Seconds(8);
  };
  Make();
  FakeSink sinks[2];
  for (int i = 0; i < 2; ++i) Connect(i + 1, &sinks[i]);
  const std::string low = *coordinator_->SubmitJob(SavingSpec(2));
  const std::string urgent = *coordinator_->SubmitJob(Urgent(2));
  EXPECT_EQ(Status(urgent).queue().reason(), "min_run_time");
  EXPECT_FALSE(SentPreemptingStop(sinks[0], low));
  // Time alone changes nothing until the low job has run 8 s (its ranks
  // keep beating, within the heartbeat timeout).
  for (absl::Duration step : {absl::Seconds(7), absl::Seconds(1)}) {
    EXPECT_FALSE(SentPreemptingStop(sinks[0], low));
    clock_.Advance(step);
    for (int i = 0; i < 2; ++i) Beat(Status(low).ranks(i).worker_id(), low, 1);
    coordinator_->Sweep();
  }
  EXPECT_TRUE(SentPreemptingStop(sinks[0], low));
  EXPECT_EQ(Status(urgent).queue().reason(), "preempting");
}

// Issue 52: a worker that dies while its job yields cuts the stop short,
// but not the preemption: the urgent job gets the workers at once (it
// neither waits for the job to recover and run min_run_time again nor
// preempts another one), and the job waits in the queue, charged a
// preemption, not a restart.
TEST_F(CoordinatorTest,
       AWorkerFailureDuringAPreemptionStillHandsItsWorkersOver) {
  configure_ = [](Coordinator::Options& options) {
    options.scheduling.min_run_time = absl::Minutes(10);
  };
  Make();
  FakeSink sinks[3];
  for (int i = 0; i < 3; ++i) Connect(i + 1, &sinks[i]);
  v1::JobSpec low_spec = SavingSpec(2);
  low_spec.set_max_restarts(0);  // a restart charged would fail it
  const std::string low = *coordinator_->SubmitJob(low_spec);
  clock_.Advance(absl::Minutes(10));
  const v1::JobStatus running = Status(low);
  for (const v1::RankResult& rank : running.ranks()) {
    Beat(rank.worker_id(), low, 1);
  }
  Checkpointed(*coordinator_, Status(low), 40);
  ASSERT_TRUE(coordinator_
                  ->HandleWorkerMessage(Status(low).ranks(0).worker_id(),
                                        Progress(low, 1, 50, 1000))
                  .ok());
  // One worker is free: the urgent job needs one more and preempts "low".
  const std::string urgent = *coordinator_->SubmitJob(Urgent(2));
  ASSERT_EQ(Status(urgent).queue().reason(), "preempting");
  ASSERT_TRUE(SentPreemptingStop(sinks[0], low));
  const v1::JobStatus yielding = Status(low);
  ASSERT_TRUE(yielding.has_preemption());
  EXPECT_EQ(yielding.preemption().for_job(), urgent);
  const std::string kept = yielding.ranks(0).worker_id();
  const std::string lost = yielding.ranks(1).worker_id();
  coordinator_->CloseSession(lost, 2, &sinks[1],
                             absl::UnavailableError("gone"));

  const v1::JobStatus queued = Status(low);
  EXPECT_EQ(queued.state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(queued.yields(), 1);
  EXPECT_EQ(queued.preemptions(), 1);
  EXPECT_FALSE(queued.has_preemption());
  EXPECT_EQ(EventsOf(queued, "worker_failed").size(), 1u);
  ASSERT_EQ(EventsOf(queued, "preempted").size(), 1u);
  EXPECT_THAT(
      EventsOf(queued, "preempted")[0].message(),
      ::testing::HasSubstr("failed while it stopped for job " + urgent));
  EXPECT_THAT(
      EventsOf(queued, "preempted")[0].message(),
      ::testing::HasSubstr(
          "it resumes from ckpt-000000040 (step 40), its newest checkpoint"));
  const v1::JobStatus placed = Status(urgent);
  ASSERT_EQ(placed.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(placed.ranks(0).worker_id(), kept);
  EXPECT_EQ(AssignedJob(sinks[2]), urgent);
  // When a worker is free again, "low" resumes, its restarts untouched.
  Succeed(*coordinator_, placed, 0);
  const v1::JobStatus resumed = Status(low);
  EXPECT_EQ(resumed.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(RestartsUsed(resumed), 0);
  ASSERT_EQ(EventsOf(resumed, "resumed_after_preemption").size(), 1u);
  EXPECT_THAT(EventsOf(resumed, "resumed_after_preemption")[0].message(),
              ::testing::HasSubstr("it stopped at step 50, which was not "
                                   "saved: it resumes from ckpt-000000040"));
}

}  // namespace
}  // namespace lockstep::coordinator
