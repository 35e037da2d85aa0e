// Coordinator tests: what the job store keeps across a coordinator restart
// (jobs on every state change, a running job's progress at most once per
// interval).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include "common/job_spec.h"
#include "coordinator/coordinator.h"
#include "tests/unit/coordinator_fixture.h"

namespace lockstep::coordinator {
namespace {

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
  auto registered = coordinator_->RegisterWorker(Anyone(), Free(1));
  ASSERT_TRUE(
      coordinator_->OpenSession(Anyone(), registered->worker_id(), 1, &again)
          .ok());
  EXPECT_EQ(Status(running).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Status(running).generation(), 2);
  std::string next = *coordinator_->SubmitJob(Spec(1));
  EXPECT_NE(next, running);
  EXPECT_NE(next, queued);
}

// A coordinator that stops closes every session; the rpc layer then closes
// each one (CloseSession). That is not a worker failure: a job with no
// restarts left must come back RECOVERING, not FAILED.
TEST_F(CoordinatorTest, AStoppingCoordinatorSpendsNoRestartOfTheRunningJob) {
  std::string tmpl = ::testing::TempDir() + "coordinator_test_XXXXXX";
  std::string dir = mkdtemp(tmpl.data());
  Make(std::nullopt, *JobStore::Open(dir));
  FakeSink a;
  std::string worker = Connect(1, &a);
  v1::JobSpec spec = Spec(1);
  spec.set_max_restarts(0);
  std::string running = *coordinator_->SubmitJob(spec);
  ASSERT_EQ(Status(running).state(), v1::JOB_STATE_RUNNING);
  coordinator_->Shutdown();
  coordinator_->CloseSession(worker, 1, &a,
                             absl::UnavailableError("the server stopped"));
  EXPECT_EQ(Status(running).generations(), 1);
  coordinator_.reset();

  Make(std::nullopt, *JobStore::Open(dir));
  EXPECT_EQ(Status(running).state(), v1::JOB_STATE_RECOVERING);
}

// Issue 14: a queued job whose stored spec crashed the coordinator at every
// restart. One that no longer validates (a newer rule, a corrupted row)
// fails on load with the reason and is never started; the next one runs.
TEST_F(CoordinatorTest, StoredJobWhoseSpecNoLongerValidatesFailsOnLoad) {
  std::string tmpl = ::testing::TempDir() + "coordinator_test_XXXXXX";
  std::string dir = mkdtemp(tmpl.data());
  {
    auto store = JobStore::Open(dir);
    ASSERT_TRUE(store.ok()) << store.status();
    v1::JobStatus bad;
    bad.set_job_id("bad-1");
    bad.set_state(v1::JOB_STATE_QUEUED);
    *bad.mutable_spec() = Spec(1);
    ApplyDefaults(bad.mutable_spec());
    bad.mutable_spec()->set_accumulation_steps(1073741824);
    ASSERT_TRUE((*store)->Save(bad).ok());
    v1::JobStatus good = bad;
    good.set_job_id("good-2");
    good.mutable_spec()->set_accumulation_steps(1);
    ASSERT_TRUE((*store)->Save(good).ok());
  }
  Make(std::nullopt, *JobStore::Open(dir));
  v1::JobStatus failed = Status("bad-1");
  EXPECT_EQ(failed.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(failed.error(),
              ::testing::AllOf(
                  ::testing::HasSubstr("the stored spec no longer validates"),
                  ::testing::HasSubstr("accumulation_steps is 1073741824")));
  EXPECT_EQ(EventsOf(failed, "job_failed").size(), 1u);
  FakeSink a;
  Connect(1, &a);
  EXPECT_EQ(Status("bad-1").state(), v1::JOB_STATE_FAILED);
  EXPECT_EQ(Status("good-2").state(), v1::JOB_STATE_RUNNING);
  auto assignments = CommandsOf(a, v1::CoordinatorCommand::kAssignment);
  ASSERT_EQ(assignments.size(), 1u);
  EXPECT_EQ(assignments[0].assignment().job_id(), "good-2");
  // Persisted as failed: a second restart does not queue it again.
  coordinator_.reset();
  Make(std::nullopt, *JobStore::Open(dir));
  EXPECT_EQ(Status("bad-1").state(), v1::JOB_STATE_FAILED);
}

// ---- progress is persisted, at most once per interval ----------------------

// The job's record in the store at `dir`, read through a connection of its
// own, as a restarted coordinator would read it.
v1::JobStatus Persisted(const std::string& dir, const std::string& job) {
  auto store = JobStore::Open(dir);
  EXPECT_TRUE(store.ok()) << store.status();
  auto jobs = (*store)->LoadAll();
  EXPECT_TRUE(jobs.ok()) << jobs.status();
  for (const v1::JobStatus& status : *jobs) {
    if (status.job_id() == job) return status;
  }
  ADD_FAILURE() << "job " << job << " is not in the store";
  return {};
}

v1::WorkerMessage Progress(const std::string& job, int64_t first_step,
                           int losses) {
  v1::WorkerMessage message;
  v1::ProgressReport* report = message.mutable_progress();
  report->set_job_id(job);
  report->set_generation(1);
  report->set_first_step(first_step);
  report->set_step(first_step + losses);
  report->set_total_steps(1000);
  for (int i = 0; i < losses; ++i) report->add_step_losses(2.0f - 0.01f * i);
  return message;
}

TEST_F(CoordinatorTest, ProgressIsPersistedAtMostOncePerInterval) {
  std::string tmpl = ::testing::TempDir() + "coordinator_test_XXXXXX";
  std::string dir = mkdtemp(tmpl.data());
  Make(std::nullopt, *JobStore::Open(dir));
  FakeSink a;
  std::string id_a = Connect(1, &a);
  std::string job = *coordinator_->SubmitJob(Spec(1));  // persisted at start

  // Within the interval since the start: reported, not written.
  clock_.Advance(absl::Seconds(4));
  ASSERT_TRUE(
      coordinator_->HandleWorkerMessage(id_a, Progress(job, 0, 10)).ok());
  EXPECT_EQ(Status(job).step_losses_size(), 10);
  EXPECT_EQ(Persisted(dir, job).step_losses_size(), 0);

  // The interval has passed: this report is written, with the history.
  clock_.Advance(absl::Seconds(1));
  ASSERT_TRUE(
      coordinator_->HandleWorkerMessage(id_a, Progress(job, 10, 10)).ok());
  v1::JobStatus persisted = Persisted(dir, job);
  EXPECT_EQ(persisted.step(), 20);
  EXPECT_EQ(persisted.step_losses_size(), 20);

  // Reports every second after it are not written one by one.
  for (int i = 0; i < 4; ++i) {
    clock_.Advance(absl::Seconds(1));
    ASSERT_TRUE(
        coordinator_->HandleWorkerMessage(id_a, Progress(job, 20 + 10 * i, 10))
            .ok());
  }
  EXPECT_EQ(Persisted(dir, job).step(), 20);
  clock_.Advance(absl::Seconds(1));
  ASSERT_TRUE(
      coordinator_->HandleWorkerMessage(id_a, Progress(job, 60, 10)).ok());
  EXPECT_EQ(Persisted(dir, job).step_losses_size(), 70);

  // A restarted coordinator has the history up to the last write.
  coordinator_.reset();
  Make(std::nullopt, *JobStore::Open(dir));
  v1::JobStatus recovered = Status(job);
  EXPECT_EQ(recovered.state(), v1::JOB_STATE_RECOVERING);
  EXPECT_EQ(recovered.step(), 70);
  ASSERT_EQ(recovered.step_losses_size(), 70);
  EXPECT_FLOAT_EQ(recovered.step_losses(69), 2.0f - 0.09f);
}

}  // namespace
}  // namespace lockstep::coordinator
