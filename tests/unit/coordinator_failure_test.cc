// Coordinator tests: how a worker failure is detected (a missed heartbeat
// timeout, a rank that never joins its generation, a restarted process).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/tf_config.h"
#include "coordinator/coordinator.h"
#include "tests/unit/coordinator_fixture.h"

namespace lockstep::coordinator {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

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

// A rank that keeps heartbeating but never names the new generation (its
// previous task cannot unwind) is named once the heartbeat timeout has
// passed since its assignment, instead of timing out its peers' rendezvous.
TEST_F(CoordinatorTest, ARankThatNeverJoinsItsGenerationIsNamed) {
  Make();
  FakeSink a, b;
  std::string id_a = Connect(1, &a);
  std::string id_b = Connect(2, &b);
  std::string job = *coordinator_->SubmitJob(Spec(2));
  v1::WorkerMessage idle;
  idle.mutable_heartbeat();  // alive, but in no generation
  clock_.Advance(absl::Seconds(10));
  Beat(id_a, job, 0);
  ASSERT_TRUE(coordinator_->HandleWorkerMessage(id_b, idle).ok());
  coordinator_->Sweep();  // exactly the timeout: not yet
  EXPECT_EQ(Status(job).state(), v1::JOB_STATE_RUNNING);
  clock_.Advance(absl::Milliseconds(1));
  coordinator_->Sweep();
  v1::JobStatus status = Status(job);
  EXPECT_EQ(status.state(), v1::JOB_STATE_RECOVERING);
  EXPECT_THAT(status.error(), AllOf(HasSubstr(id_b), HasSubstr("rank 1"),
                                    HasSubstr("did not join generation 1")));
  ASSERT_EQ(EventsOf(status, "worker_failed").size(), 1u);
  EXPECT_TRUE(b.closed);
  EXPECT_FALSE(a.closed);
}

TEST_F(CoordinatorTest, NewIncarnationWaitsForTheLiveSessionToEnd) {
  auto config = ParseTfConfig(R"({"cluster": {"worker": ["a:1", "b:1"]}})");
  Make(config->cluster);
  FakeSink a, b;
  ConnectTask(0, 10, &a);
  ConnectTask(1, 11, &b);
  std::string job = *coordinator_->SubmitJob(Spec(0));
  EXPECT_EQ(Status(job).generation(), 1);

  // A new process of worker:1 while the old one's session is live: refused
  // (the live session is not taken over), to be retried.
  v1::RegisterWorkerRequest again = Free(99);
  again.mutable_task()->set_type("worker");
  again.mutable_task()->set_index(1);
  auto refused = coordinator_->RegisterWorker(Anyone(), again);
  EXPECT_TRUE(absl::IsUnavailable(refused.status())) << refused.status();
  EXPECT_THAT(refused.status().message(),
              AllOf(HasSubstr("worker:1"), HasSubstr("live session")));
  EXPECT_EQ(Status(job).state(), v1::JOB_STATE_RUNNING);
  EXPECT_FALSE(b.closed);

  // The old stream breaks (the process was killed): the retry gets in.
  coordinator_->CloseSession("worker:1", 11, &b,
                             absl::UnavailableError("stream broke"));
  v1::JobStatus status = Status(job);
  EXPECT_EQ(status.state(), v1::JOB_STATE_RECOVERING);
  EXPECT_THAT(status.error(), HasSubstr("worker:1"));
  ASSERT_TRUE(coordinator_->RegisterWorker(Anyone(), again).ok());
  FakeSink b2;
  ASSERT_TRUE(coordinator_->OpenSession(Anyone(), "worker:1", 99, &b2).ok());
  status = Status(job);
  EXPECT_EQ(status.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(status.generation(), 2);
  EXPECT_EQ(b2.commands[0].assignment().rank(), 1);  // static rank kept
}

TEST_F(CoordinatorTest, NewIncarnationGetsInAtTheHeartbeatTimeout) {
  auto config = ParseTfConfig(R"({"cluster": {"worker": ["a:1", "b:1"]}})");
  Make(config->cluster);
  FakeSink a, b;
  ConnectTask(0, 10, &a);
  ConnectTask(1, 11, &b);
  std::string job = *coordinator_->SubmitJob(Spec(0));

  // worker:1's host vanished: its stream never breaks, its heartbeats stop.
  // Its new process retries until the old session times out.
  v1::RegisterWorkerRequest again = Free(99);
  again.mutable_task()->set_type("worker");
  again.mutable_task()->set_index(1);
  clock_.Advance(absl::Seconds(5));
  Beat("worker:0", job, 0);
  EXPECT_TRUE(absl::IsUnavailable(
      coordinator_->RegisterWorker(Anyone(), again).status()));
  clock_.Advance(absl::Seconds(5) + absl::Milliseconds(1));
  coordinator_->Sweep();
  EXPECT_TRUE(b.closed);
  ASSERT_TRUE(coordinator_->RegisterWorker(Anyone(), again).ok());
}

TEST_F(CoordinatorTest, RegisteredWithoutSessionNewIncarnationIsARestart) {
  auto config = ParseTfConfig(R"({"cluster": {"worker": ["a:1", "b:1"]}})");
  Make(config->cluster);
  v1::RegisterWorkerRequest first = Free(11);
  first.mutable_task()->set_type("worker");
  first.mutable_task()->set_index(1);
  ASSERT_TRUE(coordinator_->RegisterWorker(Anyone(), first).ok());
  v1::RegisterWorkerRequest again = first;
  again.set_incarnation(99);
  ASSERT_TRUE(coordinator_->RegisterWorker(Anyone(), again).ok());
  // The old incarnation's session is stale now.
  FakeSink stale;
  EXPECT_TRUE(absl::IsAborted(
      coordinator_->OpenSession(Anyone(), "worker:1", 11, &stale)));
}

}  // namespace
}  // namespace lockstep::coordinator
