// Coordinator tests: time limits (JobSpec.time_limit_seconds, issue 52). A
// job that has held workers for its limit stops at an agreed step and saves,
// time in the queue does not count, a recovering job past its limit ends,
// and the queue shows the reservation the scheduler makes from the limits.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "coordinator/coordinator.h"
#include "coordinator/job_record.h"
#include "tests/unit/coordinator_fixture.h"

namespace lockstep::coordinator {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;

v1::JobSpec WithTimeLimit(v1::JobSpec spec, int64_t seconds) {
  spec.set_time_limit_seconds(seconds);
  return spec;
}

TEST(JobRecordTest, ATimeLimitCountsOnlyTheTimeOnWorkers) {
  JobRecord job;
  job.status.mutable_spec()->set_time_limit_seconds(3600);
  const absl::Time t0 = absl::FromUnixSeconds(1'000'000);
  job.Queued(t0);
  EXPECT_EQ(job.TimeLimitLeft(), absl::Hours(1));
  EXPECT_EQ(job.TimeLimitEnds(), absl::InfiniteFuture());  // not placed
  job.Placed(t0 + absl::Hours(5));
  EXPECT_EQ(job.TimeLimitEnds(), t0 + absl::Hours(6));
  // Preempted after half an hour, queued for four.
  job.Queued(t0 + absl::Hours(5.5));
  EXPECT_EQ(job.TimeLimitLeft(), absl::Minutes(30));
  job.Placed(t0 + absl::Hours(9.5));
  EXPECT_EQ(job.TimeLimitEnds(), t0 + absl::Hours(10));

  JobRecord unlimited;
  unlimited.Placed(t0);
  EXPECT_EQ(unlimited.TimeLimitLeft(), absl::InfiniteDuration());
  EXPECT_EQ(unlimited.TimeLimitEnds(), absl::InfiniteFuture());
}

class TimeLimitTest : public CoordinatorTest {
 protected:
  void SetUp() override {
    Make();
    id_a_ = Connect(1, &a_);
    id_b_ = Connect(2, &b_);
  }
  // Time passes; the workers keep beating and training.
  void Pass(absl::Duration d) {
    clock_.Advance(d);
    seq_ += 10;
    for (const std::string& id : {id_a_, id_b_}) Beat(id, job_, seq_);
    coordinator_->Sweep();
  }
  void Send(const std::string& id, const v1::WorkerMessage& message) {
    ASSERT_TRUE(coordinator_->HandleWorkerMessage(id, message).ok());
  }

  FakeSink a_, b_;
  std::string id_a_, id_b_, job_;
  int64_t seq_ = 0;
};

TEST_F(TimeLimitTest, AJobAtItsTimeLimitStopsWithASave) {
  job_ = *coordinator_->SubmitJob(WithTimeLimit(SavingSpec(2), 3600));
  ASSERT_EQ(Status(job_).state(), v1::JOB_STATE_RUNNING);
  Pass(absl::Minutes(59));
  EXPECT_THAT(CommandsOf(a_, v1::CoordinatorCommand::kStop), IsEmpty());
  Pass(absl::Minutes(1));
  for (const FakeSink* sink : {&a_, &b_}) {
    auto stops = CommandsOf(*sink, v1::CoordinatorCommand::kStop);
    ASSERT_EQ(stops.size(), 1u);
    EXPECT_EQ(stops[0].stop().reason(), "stopped at its time limit of 1h");
    EXPECT_FALSE(stops[0].stop().preempt());
  }
  ASSERT_EQ(EventsOf(Status(job_), "time_limit_reached").size(), 1u);
  Pass(absl::Minutes(1));  // asked once only
  EXPECT_EQ(CommandsOf(a_, v1::CoordinatorCommand::kStop).size(), 1u);

  Send(id_a_, Prepared(job_, 1, 0, 120));
  Send(id_b_, Prepared(job_, 1, 1, 120));
  Send(id_a_, Committed(job_, 1, 120));
  Send(id_b_, StoppedResult(job_, 1));
  Send(id_a_, StoppedResult(job_, 0));
  v1::JobStatus status = Status(job_);
  EXPECT_EQ(status.state(), v1::JOB_STATE_STOPPED);
  EXPECT_EQ(status.error(),
            "stopped at its time limit of 1h after step 120; saved as "
            "ckpt-000000120");
}

TEST_F(TimeLimitTest, ARecoveringJobPastItsTimeLimitEnds) {
  job_ = *coordinator_->SubmitJob(WithTimeLimit(SavingSpec(2), 600));
  coordinator_->CloseSession(id_b_, 2, &b_, absl::UnavailableError("gone"));
  ASSERT_EQ(Status(job_).state(), v1::JOB_STATE_RECOVERING);
  clock_.Advance(absl::Minutes(10));
  Beat(id_a_, job_, 1);
  coordinator_->Sweep();
  v1::JobStatus status = Status(job_);
  EXPECT_EQ(status.state(), v1::JOB_STATE_STOPPED);
  EXPECT_THAT(status.error(),
              HasSubstr("reached its time limit of 10m (time_limit_seconds) "
                        "while recovering"));
}

TEST_F(TimeLimitTest, AJobWithoutALimitRunsOn) {
  job_ = *coordinator_->SubmitJob(SavingSpec(2));
  Pass(absl::Hours(24 * 366));
  EXPECT_THAT(CommandsOf(a_, v1::CoordinatorCommand::kStop), IsEmpty());
  EXPECT_EQ(Status(job_).state(), v1::JOB_STATE_RUNNING);
}

// A job whose limit runs out while it stops for a preemption ends with
// its save: placed again, it would only be stopped at once.
TEST_F(TimeLimitTest, AJobWhoseLimitRunsOutWhileItYieldsEnds) {
  job_ = *coordinator_->SubmitJob(WithTimeLimit(SavingSpec(2), 3600));
  Pass(absl::Minutes(59) + absl::Seconds(59));
  const std::string urgent = *coordinator_->SubmitJob(Urgent(2));
  ASSERT_EQ(Status(urgent).queue().reason(), "preempting");
  clock_.Advance(absl::Seconds(2));  // its ranks stop within the next Sweep
  Send(id_a_, PreemptedResult(job_, 1, 0));
  Send(id_b_, PreemptedResult(job_, 1, 1));
  const v1::JobStatus status = Status(job_);
  EXPECT_EQ(status.state(), v1::JOB_STATE_STOPPED);
  EXPECT_THAT(status.error(),
              HasSubstr("used up its time limit of 1h (time_limit_seconds) "
                        "before it could be placed again"));
  EXPECT_EQ(Status(urgent).state(), v1::JOB_STATE_RUNNING);
}

TEST_F(TimeLimitTest, TheQueueShowsTheReservationTheLimitsMake) {
  // One worker runs a job of an hour; a job of both waits for it, and the
  // free worker is held for it but for a job that ends first.
  job_ = *coordinator_->SubmitJob(WithTimeLimit(SavingSpec(1), 3600));
  const std::string big = *coordinator_->SubmitJob(SavingSpec(2));
  v1::JobStatus status = Status(big);
  EXPECT_EQ(status.queue().reason(), "no_fit");
  EXPECT_THAT(status.queue().message(),
              HasSubstr("it holds the reservation: it starts by 1970-01-01 "
                        "01:00:00 UTC at the latest"));
  const std::string open = *coordinator_->SubmitJob(SavingSpec(1));
  EXPECT_EQ(Status(open).queue().reason(), "reserved");
  EXPECT_THAT(Status(open).queue().message(), HasSubstr("reserved for " + big));
  const std::string quick =
      *coordinator_->SubmitJob(WithTimeLimit(SavingSpec(1), 600));
  EXPECT_EQ(Status(quick).state(), v1::JOB_STATE_RUNNING);
}

}  // namespace
}  // namespace lockstep::coordinator
