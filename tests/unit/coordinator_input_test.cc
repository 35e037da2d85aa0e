// Coordinator tests: what workers send is untrusted. Out-of-range messages
// and registrations are refused and change nothing (issue 14), and what a
// job keeps of them is bounded.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <vector>

#include "coordinator/coordinator.h"
#include "coordinator/job_status.h"
#include "tests/unit/coordinator_fixture.h"

namespace lockstep::coordinator {
namespace {

// Issue 14: a progress report with first_step = 2^32 - 1 crashed the
// coordinator (the loss history was resized to it). Out-of-range numbers in
// any worker message are refused and change nothing.
TEST_F(CoordinatorTest, OutOfRangeWorkerMessagesAreRefusedAndChangeNothing) {
  Make();
  FakeSink a, b;
  std::string id_a = Connect(1, &a);
  std::string id_b = Connect(2, &b);
  std::string job = *coordinator_->SubmitJob(Spec(2));
  const int64_t version = Status(job).version();

  std::vector<v1::WorkerMessage> forged(5);
  v1::ProgressReport* progress = forged[0].mutable_progress();
  progress->set_job_id(job);
  progress->set_generation(1);
  progress->set_step(4294967295);
  progress->set_first_step(4294967295 - 1);
  progress->add_step_losses(0.5f);
  progress->add_step_losses(0.5f);  // two losses for one step
  v1::ProgressReport* negative = forged[1].mutable_progress();
  negative->set_job_id(job);
  negative->set_generation(1);
  negative->set_step(-5);
  v1::TaskResult* result = forged[2].mutable_result();
  result->set_job_id(job);
  result->set_generation(1);
  result->set_rank(1);
  result->set_ok(true);
  result->set_steps(int64_t{1} << 50);
  forged[3].mutable_heartbeat()->set_collective_seq(-1);
  v1::CheckpointCommitted* committed = forged[4].mutable_committed();
  committed->set_job_id(job);
  committed->set_generation(1);
  committed->set_step(10);
  committed->set_ok(true);
  committed->set_name("../../elsewhere");
  for (const v1::WorkerMessage& message : forged) {
    absl::Status refused = coordinator_->HandleWorkerMessage(id_a, message);
    EXPECT_TRUE(absl::IsInvalidArgument(refused)) << refused;
  }
  v1::JobStatus status = Status(job);
  EXPECT_EQ(status.version(), version);
  EXPECT_EQ(status.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(status.step(), 0);
  EXPECT_EQ(status.step_losses_size(), 0);
  EXPECT_EQ(status.checkpoints_size(), 0);
  // A well-formed report is still taken.
  v1::WorkerMessage good;
  good.mutable_progress()->set_job_id(job);
  good.mutable_progress()->set_generation(1);
  good.mutable_progress()->set_step(2);
  good.mutable_progress()->add_step_losses(2.0f);
  good.mutable_progress()->add_step_losses(1.5f);
  ASSERT_TRUE(coordinator_->HandleWorkerMessage(id_a, good).ok());
  EXPECT_EQ(Status(job).step(), 2);
  EXPECT_FALSE(a.closed || b.closed);
}

// A step far beyond the loss history's bound thins the history instead of
// growing it: it never holds more than kMaxLossHistory losses.
TEST_F(CoordinatorTest, TheLossHistoryIsBounded) {
  Make();
  FakeSink a;
  std::string id_a = Connect(1, &a);
  std::string job = *coordinator_->SubmitJob(Spec(1));
  v1::WorkerMessage far;
  far.mutable_progress()->set_job_id(job);
  far.mutable_progress()->set_generation(1);
  far.mutable_progress()->set_first_step(int64_t{1} << 35);
  far.mutable_progress()->set_step((int64_t{1} << 35) + 1);
  far.mutable_progress()->add_step_losses(0.25f);
  ASSERT_TRUE(coordinator_->HandleWorkerMessage(id_a, far).ok());
  v1::JobStatus status = Status(job);
  EXPECT_LE(status.step_losses_size(), kMaxLossHistory);
  EXPECT_EQ(status.loss_stride(), int64_t{1} << 16);
  EXPECT_EQ(status.step_losses(status.step_losses_size() - 1), 0.25f);
  EXPECT_EQ(status.loss(), 0.25f);
  EXPECT_EQ(status.step(), (int64_t{1} << 35) + 1);
}

// Issue 14: a host name carrying terminal escape codes was printed raw by
// `lockstep workers`; it is refused at registration, as are other
// unprintable or oversized names.
TEST_F(CoordinatorTest, UnprintableOrHugeRegistrationNamesAreRefused) {
  Make();
  for (const std::string& host :
       {std::string("evil\x1b]0;pwned\x07"), std::string(300, 'h'),
        std::string("two words")}) {
    v1::RegisterWorkerRequest request = Free(7);
    request.set_host(host);
    auto refused = coordinator_->RegisterWorker(Anyone(), request);
    EXPECT_TRUE(absl::IsInvalidArgument(refused.status())) << host;
  }
  v1::RegisterWorkerRequest gpu = Free(8);
  gpu.mutable_device()->set_name("cuda:0");
  gpu.mutable_device()->set_gpu_name("NVIDIA H200");
  EXPECT_TRUE(coordinator_->RegisterWorker(Anyone(), gpu).ok());
  EXPECT_EQ(ListWorkers().size(), 1u);
}

}  // namespace
}  // namespace lockstep::coordinator
