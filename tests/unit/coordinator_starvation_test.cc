// Coordinator tests: the starvation bound (--starvation-bound, issue 52). A
// job that has waited the bound in all, over its waits before preemptions
// too, is promoted to the highest class's priority for the rest of its
// life: the jobs of that class no longer pass it nor preempt it, and the
// promotion survives a coordinator restart.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <optional>
#include <string>

#include "coordinator/coordinator.h"
#include "coordinator/job_record.h"
#include "coordinator/job_store.h"
#include "tests/unit/coordinator_fixture.h"

namespace lockstep::coordinator {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;

TEST(JobRecordTest, WaitsInTheQueueAddUpAcrossRuns) {
  JobRecord job;
  job.status.set_state(v1::JOB_STATE_QUEUED);
  const absl::Time t0 = absl::FromUnixSeconds(1'000'000);
  job.Queued(t0);
  EXPECT_EQ(job.Waited(t0 + absl::Hours(2)), absl::Hours(2));
  job.Placed(t0 + absl::Hours(5));
  job.status.set_state(v1::JOB_STATE_RUNNING);
  EXPECT_EQ(job.Waited(t0 + absl::Hours(7)), absl::Hours(5));  // running
  // Preempted after an hour; three more hours in the queue.
  job.Queued(t0 + absl::Hours(6));
  job.status.set_state(v1::JOB_STATE_QUEUED);
  EXPECT_EQ(job.Waited(t0 + absl::Hours(9)), absl::Hours(8));

  job.status.set_priority(-10);
  job.Promote(100);
  EXPECT_TRUE(job.promoted());
  EXPECT_EQ(job.status.priority(), 100);
  EXPECT_EQ(job.status.promoted_from(), -10);
}

// Two workers; an urgent class (100) and the default priority (0).
class StarvationTest : public CoordinatorTest {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "starvation_test_XXXXXX";
    dir_ = mkdtemp(tmpl.data());
    configure_ = [this](Coordinator::Options& options) {
      options.priority_classes["urgent"] = 100;
      options.scheduling.starvation_bound = bound_;
      options.starvation_priority = starvation_priority_;
    };
    Make(std::nullopt, *JobStore::Open(dir_));
    id_a_ = Connect(1, &a_);
    id_b_ = Connect(2, &b_);
  }
  // Time passes; the workers keep beating for the job they run.
  void Pass(absl::Duration d) {
    clock_.Advance(d);
    for (const auto& [id, sink] : {std::pair(id_a_, &a_), {id_b_, &b_}}) {
      const std::string job = AssignedJob(*sink);
      if (job.empty()) continue;
      v1::WorkerMessage message;
      message.mutable_heartbeat()->set_job_id(job);
      message.mutable_heartbeat()->set_generation(Status(job).generation());
      message.mutable_heartbeat()->set_collective_seq(++seq_);
      ASSERT_TRUE(coordinator_->HandleWorkerMessage(id, message).ok());
    }
    coordinator_->Sweep();
  }
  static v1::JobSpec UrgentSpec(int workers) {
    v1::JobSpec spec = SavingSpec(workers);
    spec.set_name("urgent");
    spec.set_priority_class("urgent");
    return spec;
  }

  absl::Duration bound_ = absl::Hours(12);
  std::optional<int> starvation_priority_;
  std::string dir_;
  FakeSink a_, b_;
  std::string id_a_, id_b_;
  int64_t seq_ = 0;
};

TEST_F(StarvationTest, AJobThatWaitedTheBoundGoesBeforeTheClassThatPassedIt) {
  const std::string first = *coordinator_->SubmitJob(UrgentSpec(2));
  const std::string batch = *coordinator_->SubmitJob(SavingSpec(2));
  ASSERT_EQ(Status(first).state(), v1::JOB_STATE_RUNNING);
  Pass(absl::Hours(11));
  EXPECT_EQ(Status(batch).priority(), 0);
  EXPECT_THAT(EventsOf(Status(batch), "promoted"), IsEmpty());
  Pass(absl::Hours(1));
  v1::JobStatus status = Status(batch);
  EXPECT_EQ(status.priority(), 100);
  EXPECT_EQ(status.promoted_from(), 0);
  auto promoted = EventsOf(status, "promoted");
  ASSERT_EQ(promoted.size(), 1u);
  EXPECT_THAT(promoted[0].message(),
              HasSubstr("it has waited 12h in the queue in all, the "
                        "coordinator's --starvation-bound: it is scheduled at "
                        "priority 100 instead of 0 until it ends, so that no "
                        "job of priority 100 or below passes it or preempts "
                        "it"));

  // A later urgent job waits behind it, and does not preempt it once it
  // runs.
  const std::string later = *coordinator_->SubmitJob(UrgentSpec(2));
  Succeed(*coordinator_, Status(first), 10);
  EXPECT_EQ(Status(first).state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(Status(batch).state(), v1::JOB_STATE_RUNNING);
  Pass(absl::Hours(1));
  EXPECT_EQ(Status(later).state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(Status(later).queue().reason(), "priority");  // batch went first
  EXPECT_THAT(EventsOf(Status(batch), "preempted"), IsEmpty());
  EXPECT_EQ(Status(batch).priority(), 100);  // for the rest of its life
}

TEST_F(StarvationTest, WaitsBeforeAPreemptionCount) {
  // The batch job runs an hour, is preempted by an urgent job and waits
  // 8 h; placed again, it is preempted again: 4 more hours make 12.
  const std::string batch = *coordinator_->SubmitJob(SavingSpec(2));
  for (int round = 0; round < 2; ++round) {
    Pass(absl::Hours(1));
    const std::string urgent = *coordinator_->SubmitJob(UrgentSpec(2));
    ASSERT_EQ(Status(urgent).queue().reason(), "preempting");
    const v1::JobStatus running = Status(batch);
    for (const v1::RankResult& rank : running.ranks()) {
      ASSERT_TRUE(
          coordinator_
              ->HandleWorkerMessage(
                  rank.worker_id(),
                  PreemptedResult(batch, running.generation(), rank.rank()))
              .ok());
    }
    ASSERT_EQ(Status(batch).state(), v1::JOB_STATE_QUEUED);
    ASSERT_EQ(Status(urgent).state(), v1::JOB_STATE_RUNNING);
    if (round == 1) break;
    Pass(absl::Hours(8));
    EXPECT_FALSE(Status(batch).has_promoted_from());
    Succeed(*coordinator_, Status(urgent), 10);
    ASSERT_EQ(Status(batch).state(), v1::JOB_STATE_RUNNING);
    EXPECT_EQ(Status(batch).queued_seconds(), 8 * 3600);
  }
  Pass(absl::Hours(4) - absl::Seconds(1));
  EXPECT_FALSE(Status(batch).has_promoted_from());
  Pass(absl::Seconds(1));
  EXPECT_EQ(Status(batch).promoted_from(), 0);
  EXPECT_THAT(EventsOf(Status(batch), "promoted")[0].message(),
              HasSubstr("it has waited 12h in the queue"));
}

TEST_F(StarvationTest, APromotionSurvivesARestart) {
  const std::string first = *coordinator_->SubmitJob(UrgentSpec(2));
  const std::string batch = *coordinator_->SubmitJob(SavingSpec(2));
  Pass(absl::Hours(12));
  ASSERT_EQ(Status(batch).priority(), 100);
  coordinator_.reset();
  Make(std::nullopt, *JobStore::Open(dir_));
  v1::JobStatus status = Status(batch);
  EXPECT_EQ(status.state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(status.priority(), 100);
  EXPECT_EQ(status.promoted_from(), 0);
  EXPECT_EQ(EventsOf(status, "promoted").size(), 1u);
  EXPECT_EQ(Status(first).priority(), 100);
}

class NoStarvationBoundTest : public StarvationTest {
 protected:
  NoStarvationBoundTest() { bound_ = absl::InfiniteDuration(); }
};

TEST_F(NoStarvationBoundTest, WithoutABoundAJobKeepsItsPriority) {
  const std::string first = *coordinator_->SubmitJob(UrgentSpec(2));
  const std::string batch = *coordinator_->SubmitJob(SavingSpec(2));
  Pass(absl::Hours(24 * 30));
  EXPECT_EQ(Status(batch).priority(), 0);
  EXPECT_FALSE(Status(batch).has_promoted_from());
  EXPECT_EQ(Status(first).state(), v1::JOB_STATE_RUNNING);
}

class StarvationBelowTheTopTest : public StarvationTest {
 protected:
  StarvationBelowTheTopTest() { starvation_priority_ = 99; }
};

TEST_F(StarvationBelowTheTopTest, TheTopClassStaysAheadOfAPromotedJob) {
  const std::string first = *coordinator_->SubmitJob(UrgentSpec(2));
  const std::string batch = *coordinator_->SubmitJob(SavingSpec(2));
  Pass(absl::Hours(12));
  EXPECT_EQ(Status(batch).priority(), 99);
  auto queue = coordinator_->ListQueue(v1::ListQueueRequest());
  ASSERT_TRUE(queue.ok()) << queue.status();
  EXPECT_EQ(queue->starvation_bound_seconds(), 12 * 3600);
  EXPECT_EQ(queue->starvation_priority(), 99);
  // A later urgent job goes first when the workers come free.
  const std::string later = *coordinator_->SubmitJob(UrgentSpec(2));
  Succeed(*coordinator_, Status(first), 10);
  EXPECT_EQ(Status(later).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Status(batch).state(), v1::JOB_STATE_QUEUED);
}

}  // namespace
}  // namespace lockstep::coordinator
