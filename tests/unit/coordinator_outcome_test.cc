// Coordinator tests: what it checks of the ranks' reports against what it
// knows itself, so that no single rank decides a job's outcome (final
// digests and steps, max_steps, commits never asked for, live state while a
// generation runs).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "coordinator/coordinator.h"
#include "tests/unit/coordinator_fixture.h"

namespace lockstep::coordinator {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// Two ranks end with different digests: one rank's word does not make the
// job succeed; the job fails naming where each rank ended.
TEST_F(CoordinatorTest, RanksThatDisagreeFailTheJobNamingThem) {
  Make();
  FakeSink a, b;
  std::string id_a = Connect(1, &a);
  std::string id_b = Connect(2, &b);
  std::string job = *coordinator_->SubmitJob(Spec(2));
  ASSERT_TRUE(
      coordinator_->HandleWorkerMessage(id_a, OkResult(job, 1, 0, 5, "real"))
          .ok());
  ASSERT_TRUE(coordinator_
                  ->HandleWorkerMessage(
                      id_b, OkResult(job, 1, 1, 5, "forged-digest-0000"))
                  .ok());
  v1::JobStatus status = Status(job);
  EXPECT_EQ(status.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(status.error(),
              AllOf(HasSubstr("rank 0: step 5, digest real"),
                    HasSubstr("rank 1: step 5, digest forged-digest-0000")));
  EXPECT_EQ(EventsOf(status, "ranks_disagree").size(), 1u);
}

// A result past the job's max_steps (step 999,999 of 5) fails the job and
// names the rank; a chief's progress past it is not applied.
TEST_F(CoordinatorTest, StepsPastMaxStepsAreNotBelieved) {
  Make();
  FakeSink a, b;
  std::string id_a = Connect(1, &a);
  std::string id_b = Connect(2, &b);
  v1::JobSpec spec = Spec(2);
  spec.set_max_steps(1000);
  std::string job = *coordinator_->SubmitJob(spec);
  ASSERT_TRUE(
      coordinator_->HandleWorkerMessage(id_a, Progress(job, 1, 1048576, 1000))
          .ok());
  EXPECT_EQ(Status(job).step(), 0);
  ASSERT_TRUE(
      coordinator_
          ->HandleWorkerMessage(id_b, OkResult(job, 1, 1, 999999, "forged"))
          .ok());
  v1::JobStatus status = Status(job);
  EXPECT_EQ(status.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(status.error(),
              AllOf(HasSubstr("rank 1"), HasSubstr("step 999999"),
                    HasSubstr("max_steps 1000")));
  // Nor is the forged step taken as where the job got to.
  EXPECT_EQ(status.applied_step(), 0);
}

// Every rank agreeing on a step short of the plan's end is not success.
TEST_F(CoordinatorTest, SuccessShortOfThePlansEndFails) {
  Make();
  FakeSink a, b;
  std::string id_a = Connect(1, &a);
  std::string id_b = Connect(2, &b);
  std::string job = *coordinator_->SubmitJob(Spec(2));
  ASSERT_TRUE(
      coordinator_->HandleWorkerMessage(id_a, Progress(job, 1, 3, 100)).ok());
  for (auto [id, rank] : {std::pair{id_a, 0}, std::pair{id_b, 1}}) {
    ASSERT_TRUE(
        coordinator_->HandleWorkerMessage(id, OkResult(job, 1, rank, 3, "d"))
            .ok());
  }
  v1::JobStatus status = Status(job);
  EXPECT_EQ(status.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(status.error(), HasSubstr("the plan ends at step 100"));
}

// Issue 35: the outcome came from the last rank to report (its `stopped`)
// and the plan's end from the chief's progress alone, so a chief could turn
// an early stop into success. Now one rank's stop makes the job stopped,
// and a chief whose plan ends elsewhere than the others' fails the job.
TEST_F(CoordinatorTest, AChiefCannotTurnAnEarlyStopIntoSuccess) {
  Make();
  FakeSink a, b;
  std::string id_a = Connect(1, &a);
  std::string id_b = Connect(2, &b);
  std::string job = *coordinator_->SubmitJob(Spec(2));
  // Rank 1 stopped at step 3 (and says so); the chief reports last, claims
  // no stop and a plan that ends at 3.
  ASSERT_TRUE(
      coordinator_->HandleWorkerMessage(id_a, Progress(job, 1, 3, 3)).ok());
  v1::WorkerMessage stopped = OkResult(job, 1, 1, 3, "d");
  stopped.mutable_result()->set_stopped(true);
  stopped.mutable_result()->set_total_steps(100);
  ASSERT_TRUE(coordinator_->HandleWorkerMessage(id_b, stopped).ok());
  v1::WorkerMessage chief = OkResult(job, 1, 0, 3, "d");
  chief.mutable_result()->set_total_steps(3);
  ASSERT_TRUE(coordinator_->HandleWorkerMessage(id_a, chief).ok());
  v1::JobStatus status = Status(job);
  EXPECT_EQ(status.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(status.error(),
              AllOf(HasSubstr("different models"), HasSubstr("rank 0: step 3"),
                    HasSubstr("plan ends at step 3"),
                    HasSubstr("plan ends at step 100")));
}

// The same plan on both ranks, but only rank 1 says it stopped, and the
// chief, reporting last, does not: the job is stopped, not succeeded.
TEST_F(CoordinatorTest, OneRankThatStoppedMakesTheJobStopped) {
  Make();
  FakeSink a, b;
  std::string id_a = Connect(1, &a);
  std::string id_b = Connect(2, &b);
  std::string job = *coordinator_->SubmitJob(Spec(2));
  ASSERT_TRUE(
      coordinator_->HandleWorkerMessage(id_a, Progress(job, 1, 3, 100)).ok());
  v1::WorkerMessage stopped = OkResult(job, 1, 1, 3, "d");
  stopped.mutable_result()->set_stopped(true);
  stopped.mutable_result()->set_total_steps(100);
  ASSERT_TRUE(coordinator_->HandleWorkerMessage(id_b, stopped).ok());
  v1::WorkerMessage chief = OkResult(job, 1, 0, 3, "d");
  chief.mutable_result()->set_total_steps(100);
  ASSERT_TRUE(coordinator_->HandleWorkerMessage(id_a, chief).ok());
  EXPECT_EQ(Status(job).state(), v1::JOB_STATE_STOPPED);
}

// The chief reports a commit no rank prepared, or one for a job that saves
// no checkpoints: neither becomes a checkpoint.
TEST_F(CoordinatorTest, ACommitThatWasNeverAskedForIsRefused) {
  Make();
  FakeSink a, b;
  std::string id_a = Connect(1, &a);
  std::string id_b = Connect(2, &b);
  std::string job = *coordinator_->SubmitJob(SavingSpec(2));
  ASSERT_TRUE(
      coordinator_->HandleWorkerMessage(id_a, Committed(job, 1, 40)).ok());
  EXPECT_EQ(Status(job).checkpoints_size(), 0);
  // Prepared by one rank only: still not asked for.
  ASSERT_TRUE(
      coordinator_->HandleWorkerMessage(id_b, Prepared(job, 1, 1, 40)).ok());
  ASSERT_TRUE(
      coordinator_->HandleWorkerMessage(id_a, Committed(job, 1, 40)).ok());
  EXPECT_EQ(Status(job).checkpoints_size(), 0);
  ASSERT_TRUE(
      coordinator_->HandleWorkerMessage(id_a, Prepared(job, 1, 0, 40)).ok());
  ASSERT_TRUE(
      coordinator_->HandleWorkerMessage(id_a, Committed(job, 1, 40)).ok());
  EXPECT_EQ(Status(job).checkpoints_size(), 1);

  Make();
  FakeSink c, d;
  std::string id_c = Connect(1, &c);
  std::string id_d = Connect(2, &d);
  job = *coordinator_->SubmitJob(Spec(2));  // no backup_dir
  ASSERT_TRUE(
      coordinator_->HandleWorkerMessage(id_c, Prepared(job, 1, 0, 20)).ok());
  ASSERT_TRUE(
      coordinator_->HandleWorkerMessage(id_d, Prepared(job, 1, 1, 20)).ok());
  ASSERT_TRUE(
      coordinator_->HandleWorkerMessage(id_c, Committed(job, 1, 20)).ok());
  EXPECT_EQ(Status(job).checkpoints_size(), 0);
}

// "live_state_saved ... ckpt-999999999" while the generation runs: no
// worker saves its live state then, so it is refused.
TEST_F(CoordinatorTest, LiveStateWhileTheGenerationRunsIsRefused) {
  Make();
  FakeSink a, b;
  std::string id_a = Connect(1, &a);
  Connect(2, &b);
  std::string job = *coordinator_->SubmitJob(SavingSpec(2));
  ASSERT_EQ(Status(job).state(), v1::JOB_STATE_RUNNING);
  ASSERT_TRUE(coordinator_
                  ->HandleWorkerMessage(
                      id_a, LiveState(job, 999999999, "ckpt-999999999", ""))
                  .ok());
  v1::JobStatus status = Status(job);
  EXPECT_EQ(status.checkpoints_size(), 0);
  EXPECT_TRUE(EventsOf(status, "live_state_saved").empty());
}

}  // namespace
}  // namespace lockstep::coordinator
