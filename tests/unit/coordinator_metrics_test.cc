// Coordinator tests: its /metrics page (CollectMetrics) follows the jobs,
// the workers, the failures and the checkpoint commits, on the injected
// clock, and promtool finds nothing wrong with it.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "coordinator/coordinator.h"
#include "tests/unit/coordinator_fixture.h"
#include "tests/unit/metrics_text.h"

namespace lockstep::coordinator {
namespace {

using ::lockstep::testing::SampleValue;
using ::testing::Optional;

class CoordinatorMetricsTest : public CoordinatorTest {
 protected:
  std::string Page() {
    metrics::Exposition out;
    coordinator_->CollectMetrics(out);
    return out.Take();
  }
};

TEST_F(CoordinatorMetricsTest, AnIdleCoordinatorShowsZerosForEveryState) {
  Make();
  const std::string page = Page();
  for (const char* state :
       {"queued", "running", "recovering", "succeeded", "failed", "stopped"}) {
    EXPECT_THAT(SampleValue(page, std::string("lockstep_jobs{state=\"") +
                                      state + "\"}"),
                Optional(std::string("0")))
        << state;
  }
  EXPECT_THAT(SampleValue(page, "lockstep_workers{state=\"idle\"}"),
              Optional(std::string("0")));
  EXPECT_THAT(SampleValue(page,
                          "lockstep_failures_total{cause=\"worker_"
                          "failed\"}"),
              Optional(std::string("0")));
  EXPECT_THAT(SampleValue(page, "lockstep_checkpoint_commits_total"),
              Optional(std::string("0")));
  EXPECT_EQ(SampleValue(page, "lockstep_job_step"), std::nullopt);
}

TEST_F(CoordinatorMetricsTest, FollowsTheRunningJobAndItsWorkers) {
  Make();
  FakeSink a, b;
  v1::Device fixed;
  fixed.set_name("cpu");
  fixed.set_blas_kernel("SkylakeX");
  fixed.set_blas_kernel_source("lockstep");
  const std::string id_a = Connect(1, &a, fixed);
  Connect(2, &b);
  const std::string job = *coordinator_->SubmitJob(Spec(2));
  v1::WorkerMessage progress;
  progress.mutable_progress()->set_job_id(job);
  progress.mutable_progress()->set_generation(1);
  progress.mutable_progress()->set_step(7);
  progress.mutable_progress()->set_first_step(6);  // the loss of step 7
  progress.mutable_progress()->add_step_losses(0.5f);
  // An evaluation: its loss and the task's metrics.
  progress.mutable_progress()->set_test_loss(2.25);
  (*progress.mutable_progress()->mutable_test_metrics())["test_perplexity"] =
      9.5;
  ASSERT_TRUE(coordinator_->HandleWorkerMessage(id_a, progress).ok());
  clock_.Advance(absl::Seconds(3));

  const std::string page = Page();
  const std::string of_job = "{job=\"" + job + "\"}";
  EXPECT_THAT(SampleValue(page, "lockstep_jobs{state=\"running\"}"),
              Optional(std::string("1")));
  EXPECT_THAT(SampleValue(page, "lockstep_job_step" + of_job),
              Optional(std::string("7")));
  EXPECT_THAT(SampleValue(page, "lockstep_job_loss" + of_job),
              Optional(std::string("0.5")));
  EXPECT_THAT(SampleValue(page, "lockstep_job_generation" + of_job),
              Optional(std::string("1")));
  EXPECT_THAT(SampleValue(page, "lockstep_job_restarts_total" + of_job),
              Optional(std::string("0")));
  EXPECT_THAT(SampleValue(page, "lockstep_job_test_loss" + of_job),
              Optional(std::string("2.25")));
  EXPECT_THAT(SampleValue(page, "lockstep_job_test_metric{job=\"" + job +
                                    "\",metric=\"test_perplexity\"}"),
              Optional(std::string("9.5")));
  EXPECT_THAT(SampleValue(page, "lockstep_workers{state=\"training\"}"),
              Optional(std::string("2")));
  EXPECT_THAT(SampleValue(page, "lockstep_worker_last_heard_seconds{worker=\"" +
                                    id_a + "\"}"),
              Optional(std::string("3")));
  // Which kernel each worker runs, so a mixed pool shows in one scrape.
  EXPECT_THAT(SampleValue(page, "lockstep_worker_blas_info{worker=\"" + id_a +
                                    "\",blas_kernel=\"SkylakeX\","
                                    "blas_kernel_source=\"lockstep\"}"),
              Optional(std::string("1")));
}

TEST_F(CoordinatorMetricsTest, CountsFailuresByCauseAndRestarts) {
  Make();
  FakeSink a, b, c;
  Connect(1, &a);
  const std::string id_b = Connect(2, &b);
  const std::string job = *coordinator_->SubmitJob(Spec(2));
  coordinator_->CloseSession(id_b, 2, &b, absl::UnavailableError("gone"));
  Connect(3, &c);  // the group is whole again: generation 2

  const std::string page = Page();
  EXPECT_THAT(SampleValue(page,
                          "lockstep_failures_total{cause=\"worker_"
                          "failed\"}"),
              Optional(std::string("1")));
  EXPECT_THAT(
      SampleValue(page, "lockstep_job_restarts_total{job=\"" + job + "\"}"),
      Optional(std::string("1")));
  EXPECT_THAT(SampleValue(page, "lockstep_job_generation{job=\"" + job + "\"}"),
              Optional(std::string("2")));
}

TEST_F(CoordinatorMetricsTest, TimesACommitFromTheFirstPrepare) {
  Make();
  FakeSink a, b;
  const std::string id_a = Connect(1, &a);
  const std::string id_b = Connect(2, &b);
  const std::string job = *coordinator_->SubmitJob(SavingSpec(2));
  ASSERT_TRUE(
      coordinator_->HandleWorkerMessage(id_b, Prepared(job, 1, 1, 20)).ok());
  clock_.Advance(absl::Seconds(2));
  ASSERT_TRUE(
      coordinator_->HandleWorkerMessage(id_a, Prepared(job, 1, 0, 20)).ok());
  clock_.Advance(absl::Milliseconds(500));
  ASSERT_TRUE(
      coordinator_->HandleWorkerMessage(id_a, Committed(job, 1, 20)).ok());
  // A failed commit is a failure, not a commit.
  ASSERT_TRUE(
      coordinator_->HandleWorkerMessage(id_a, Committed(job, 1, 40, false))
          .ok());

  const std::string page = Page();
  EXPECT_THAT(SampleValue(page, "lockstep_checkpoint_commits_total"),
              Optional(std::string("1")));
  EXPECT_THAT(SampleValue(page, "lockstep_checkpoint_commit_seconds_sum"),
              Optional(std::string("2.5")));
  EXPECT_THAT(
      SampleValue(page, "lockstep_checkpoint_commit_seconds_bucket{le=\"1\"}"),
      Optional(std::string("0")));
  EXPECT_THAT(
      SampleValue(page,
                  "lockstep_checkpoint_commit_seconds_bucket{le=\"2.5\"}"),
      Optional(std::string("1")));
  EXPECT_THAT(
      SampleValue(page,
                  "lockstep_checkpoint_commit_seconds_bucket{le=\"+Inf\"}"),
      Optional(std::string("1")));
  EXPECT_THAT(SampleValue(page,
                          "lockstep_failures_total{cause=\"checkpoint_"
                          "failed\"}"),
              Optional(std::string("1")));
}

TEST_F(CoordinatorMetricsTest, PromtoolFindsNothingWrong) {
  if (!lockstep::testing::HavePromtool()) {
    GTEST_SKIP() << "promtool (Debian's prometheus package) is not installed";
  }
  Make();
  FakeSink a, b;
  const std::string id_a = Connect(1, &a);
  Connect(2, &b);
  const std::string job = *coordinator_->SubmitJob(Spec(2));
  ASSERT_TRUE(
      coordinator_->HandleWorkerMessage(id_a, Committed(job, 1, 20)).ok());
  EXPECT_EQ(lockstep::testing::PromtoolProblems(Page()), "");
}

// Two jobs at once: one family each, a series per job, and promtool
// (duplicate families are an error there) finds nothing wrong.
TEST_F(CoordinatorMetricsTest, EveryActiveJobHasItsSeriesInOneFamily) {
  Make();
  FakeSink a, b;
  const std::string id_a = Connect(1, &a);
  const std::string id_b = Connect(2, &b);
  const std::string first = *coordinator_->SubmitJob(Spec(1));
  const std::string second = *coordinator_->SubmitJob(Spec(1));
  ASSERT_TRUE(
      coordinator_->HandleWorkerMessage(id_a, Progress(first, 1, 3, 100)).ok());
  ASSERT_TRUE(
      coordinator_->HandleWorkerMessage(id_b, Progress(second, 1, 5, 100))
          .ok());
  const std::string page = Page();
  EXPECT_THAT(SampleValue(page, "lockstep_job_step{job=\"" + first + "\"}"),
              Optional(std::string("3")));
  EXPECT_THAT(SampleValue(page, "lockstep_job_step{job=\"" + second + "\"}"),
              Optional(std::string("5")));
  size_t families = 0;
  for (size_t at = page.find("# TYPE lockstep_job_step gauge");
       at != std::string::npos;
       at = page.find("# TYPE lockstep_job_step gauge", at + 1)) {
    ++families;
  }
  EXPECT_EQ(families, 1u);
  if (lockstep::testing::HavePromtool()) {
    EXPECT_EQ(lockstep::testing::PromtoolProblems(page), "");
  }
}

// The scheduler's gauges: by owner and by priority, running, workers held,
// queued and the longest wait on the injected clock; promtool agrees.
TEST_F(CoordinatorMetricsTest, ShowsTheQueueByOwnerAndPriority) {
  configure_ = [](Coordinator::Options& options) {
    options.admins.insert("operator:bob");  // may give priority 10
    options.scheduling.quotas["operator:alice"] = 3;
    options.scheduling.quotas["operator:carol"] = 2;
  };
  Make();
  FakeSink a;
  Connect(1, &a);
  const std::string alice = "spiffe://lockstep/operator/alice";
  ASSERT_TRUE(coordinator_->SubmitJob(Spec(1), alice).ok());
  v1::JobSpec urgent = Spec(1);
  urgent.set_priority(10);
  ASSERT_TRUE(coordinator_->SubmitJob(Spec(1), alice).ok());
  clock_.Advance(absl::Seconds(30));
  ASSERT_TRUE(
      coordinator_->SubmitJob(urgent, "spiffe://lockstep/operator/bob").ok());
  clock_.Advance(absl::Seconds(12));
  const std::string page = Page();
  EXPECT_THAT(
      SampleValue(page,
                  "lockstep_owner_running_jobs{owner=\"operator:alice\"}"),
      Optional(std::string("1")));
  EXPECT_THAT(
      SampleValue(page, "lockstep_owner_workers{owner=\"operator:alice\"}"),
      Optional(std::string("1")));
  EXPECT_THAT(
      SampleValue(page, "lockstep_owner_queued_jobs{owner=\"operator:bob\"}"),
      Optional(std::string("1")));
  EXPECT_THAT(SampleValue(page,
                          "lockstep_owner_oldest_wait_seconds{owner=\"operator:"
                          "alice\"}"),
              Optional(std::string("42")));
  EXPECT_THAT(
      SampleValue(page, "lockstep_priority_queued_jobs{priority=\"10\"}"),
      Optional(std::string("1")));
  EXPECT_THAT(SampleValue(page,
                          "lockstep_priority_oldest_wait_seconds{priority="
                          "\"10\"}"),
              Optional(std::string("12")));
  EXPECT_THAT(SampleValue(page, "lockstep_preemptions_total"),
              Optional(std::string("0")));
  EXPECT_THAT(SampleValue(page, "lockstep_preemptions_called_off_total"),
              Optional(std::string("0")));
  EXPECT_THAT(SampleValue(
                  page, "lockstep_owner_quota_workers{owner=\"operator:alice\"}"),
              Optional(std::string("3")));
  EXPECT_THAT(
      SampleValue(page,
                  "lockstep_owner_charged_workers{owner=\"operator:alice\"}"),
      Optional(std::string("1")));
  EXPECT_THAT(
      SampleValue(page,
                  "lockstep_owner_charged_workers{owner=\"operator:carol\"}"),
      Optional(std::string("0")));
  if (lockstep::testing::HavePromtool()) {
    EXPECT_EQ(lockstep::testing::PromtoolProblems(page), "");
  }
}

}  // namespace
}  // namespace lockstep::coordinator
