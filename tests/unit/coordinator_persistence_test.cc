// Coordinator tests: what the job store keeps across a coordinator restart
// (jobs on every state change, a running job's progress at most once per
// interval).
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sqlite3.h>
#include <stdlib.h>

#include <fstream>
#include <sstream>
#include <string>

#include "common/job_spec.h"
#include "coordinator/coordinator.h"
#include "coordinator/job_status.h"
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

// Issue 52: a coordinator restart re-forms every running job, and that
// generation is not the job's failure: it charges no restart. A job
// allowed one still has it for a real failure afterwards.
TEST_F(CoordinatorTest, ACoordinatorRestartChargesTheRunningJobNoRestart) {
  std::string tmpl = ::testing::TempDir() + "coordinator_test_XXXXXX";
  std::string dir = mkdtemp(tmpl.data());
  Make(std::nullopt, *JobStore::Open(dir));
  FakeSink a;
  const std::string worker = Connect(1, &a);
  v1::JobSpec spec = Spec(1);
  spec.set_max_restarts(1);
  const std::string job = *coordinator_->SubmitJob(spec);
  ASSERT_EQ(Status(job).state(), v1::JOB_STATE_RUNNING);
  coordinator_.reset();

  Make(std::nullopt, *JobStore::Open(dir));
  FakeSink again;
  ASSERT_EQ(Connect(1, &again), worker);
  ASSERT_EQ(Status(job).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Status(job).generation(), 2);
  EXPECT_EQ(Status(job).coordinator_restarts(), 1);
  EXPECT_EQ(RestartsUsed(Status(job)), 0);
  // A real failure now uses the one restart the job has, and it re-forms.
  coordinator_->CloseSession(worker, 1, &again, absl::UnavailableError("gone"));
  EXPECT_EQ(Status(job).state(), v1::JOB_STATE_RECOVERING);
  FakeSink third;
  ASSERT_EQ(Connect(1, &third), worker);
  EXPECT_EQ(Status(job).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(RestartsUsed(Status(job)), 1);
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

// Every job that was running when the coordinator stopped comes back and
// re-forms on its own workers; a queued one stays queued.
TEST_F(CoordinatorTest, EveryRunningJobComesBackAfterARestart) {
  std::string tmpl = ::testing::TempDir() + "coordinator_test_XXXXXX";
  std::string dir = mkdtemp(tmpl.data());
  Make(std::nullopt, *JobStore::Open(dir));
  FakeSink a, b;
  const std::string id_a = Connect(1, &a);
  const std::string id_b = Connect(2, &b);
  const std::string first = *coordinator_->SubmitJob(Spec(1));
  const std::string second = *coordinator_->SubmitJob(Spec(1));
  const std::string queued = *coordinator_->SubmitJob(Spec(1));
  ASSERT_EQ(Status(first).state(), v1::JOB_STATE_RUNNING);
  ASSERT_EQ(Status(second).state(), v1::JOB_STATE_RUNNING);
  ASSERT_EQ(Status(queued).state(), v1::JOB_STATE_QUEUED);
  coordinator_.reset();

  clock_.Advance(absl::Hours(1));
  Make(std::nullopt, *JobStore::Open(dir));
  for (const std::string& job : {first, second}) {
    const v1::JobStatus status = Status(job);
    EXPECT_EQ(status.state(), v1::JOB_STATE_RECOVERING) << job;
    EXPECT_EQ(EventsOf(status, "coordinator_restarted").size(), 1u) << job;
    EXPECT_EQ(status.end_time(), 0) << job;
  }
  EXPECT_EQ(Status(queued).state(), v1::JOB_STATE_QUEUED);
  // The same processes reconnect, in the other order: each gets its id back
  // (the store keeps them) and each job re-forms on its own worker.
  FakeSink again_a, again_b;
  EXPECT_EQ(Connect(2, &again_b), id_b);
  EXPECT_EQ(Connect(1, &again_a), id_a);
  // A new process gets a new id, never one of theirs.
  FakeSink new_worker;
  const std::string id_new = Connect(3, &new_worker);
  EXPECT_NE(id_new, id_a);
  EXPECT_NE(id_new, id_b);
  for (const std::string& job : {first, second}) {
    EXPECT_EQ(Status(job).state(), v1::JOB_STATE_RUNNING) << job;
    EXPECT_EQ(Status(job).generation(), 2) << job;
  }
  EXPECT_EQ(Status(first).ranks(0).worker_id(), id_a);
  EXPECT_EQ(Status(second).ranks(0).worker_id(), id_b);
  // The queued job starts on the new worker.
  EXPECT_EQ(Status(queued).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Status(queued).ranks(0).worker_id(), id_new);
}

// Issue 52: a coordinator restarted while a job yields for an urgent one
// finishes the preemption (the job is queued, charged a preemption and no
// restart; the urgent job gets the workers when they are back), and a
// queued job keeps its age.
TEST_F(CoordinatorTest, ACoordinatorRestartedMidPreemptionFinishesIt) {
  std::string tmpl = ::testing::TempDir() + "coordinator_test_XXXXXX";
  std::string dir = mkdtemp(tmpl.data());
  configure_ = [](Coordinator::Options& options) {
    options.scheduling.min_run_time = absl::ZeroDuration();
  };
  clock_.Advance(absl::Hours(1));  // a queued_time of 0 means none
  Make(std::nullopt, *JobStore::Open(dir));
  FakeSink a, b;
  const std::string id_a = Connect(1, &a);
  const std::string id_b = Connect(2, &b);
  v1::JobSpec low_spec = SavingSpec(2);
  low_spec.set_max_restarts(0);
  const std::string low = *coordinator_->SubmitJob(low_spec);
  const std::string waiting = *coordinator_->SubmitJob(Spec(1));
  const double waiting_since = Status(waiting).queued_time();
  EXPECT_GT(waiting_since, 0);
  clock_.Advance(absl::Minutes(30));
  v1::JobSpec urgent_spec = Spec(2);
  urgent_spec.set_priority(10);
  const std::string urgent = *coordinator_->SubmitJob(urgent_spec);
  ASSERT_EQ(Status(urgent).queue().reason(), "preempting");
  ASSERT_EQ(Status(low).preemption().for_job(), urgent);
  coordinator_.reset();

  clock_.Advance(absl::Minutes(1));
  Make(std::nullopt, *JobStore::Open(dir));
  const v1::JobStatus queued = Status(low);
  EXPECT_EQ(queued.state(), v1::JOB_STATE_QUEUED);
  EXPECT_FALSE(queued.has_preemption());
  EXPECT_EQ(queued.yields(), 1);
  EXPECT_EQ(RestartsUsed(queued), 0);
  EXPECT_TRUE(EventsOf(queued, "coordinator_restarted").empty());
  ASSERT_EQ(EventsOf(queued, "preempted").size(), 1u);
  EXPECT_THAT(EventsOf(queued, "preempted")[0].message(),
              ::testing::HasSubstr("the coordinator restarted while "
                                   "generation 1 stopped for job " +
                                   urgent));
  EXPECT_EQ(Status(waiting).queued_time(), waiting_since);
  EXPECT_EQ(Status(urgent).state(), v1::JOB_STATE_QUEUED);
  // The workers come back: the first waits for the second, promised to the
  // urgent job (the job that fits one worker does not take it); then the
  // urgent job takes both.
  FakeSink again_a, again_b;
  EXPECT_EQ(Connect(1, &again_a), id_a);
  EXPECT_EQ(Status(waiting).state(), v1::JOB_STATE_QUEUED);
  for (const v1::WorkerInfo& worker : WorkersOn(*coordinator_)) {
    if (worker.worker_id() != id_a) continue;
    EXPECT_EQ(worker.promised_to(), urgent);
    EXPECT_GT(worker.promised_until(), 0);
  }
  EXPECT_EQ(Connect(2, &again_b), id_b);
  EXPECT_EQ(Status(urgent).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Status(low).state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(Status(waiting).state(), v1::JOB_STATE_QUEUED);
  // The queue shows the older job's age, not the restart's.
  v1::ListQueueRequest request;
  const auto listed = coordinator_->ListQueue(request);
  ASSERT_TRUE(listed.ok()) << listed.status();
  for (const v1::JobStatus& job : listed->jobs()) {
    if (job.job_id() == waiting) EXPECT_EQ(job.queued_time(), waiting_since);
  }
  // A job that leaves the queue has no queue time.
  ASSERT_TRUE(coordinator_->StopJob(waiting).ok());
  EXPECT_EQ(Status(waiting).queued_time(), 0);
  EXPECT_EQ(Status(urgent).queued_time(), 0);
}

// ---- the state database's schema version ----------------------------------

// Runs `sql` on the database at `path` through a connection of its own.
void RawSql(const std::string& path, const std::string& sql) {
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  char* error = nullptr;
  EXPECT_EQ(sqlite3_exec(db, sql.c_str(), nullptr, nullptr, &error), SQLITE_OK)
      << (error ? error : "");
  sqlite3_free(error);
  sqlite3_close(db);
}

int RawUserVersion(const std::string& path) {
  sqlite3* db = nullptr;
  EXPECT_EQ(sqlite3_open(path.c_str(), &db), SQLITE_OK);
  sqlite3_stmt* stmt = nullptr;
  sqlite3_prepare_v2(db, "PRAGMA user_version", -1, &stmt, nullptr);
  int version =
      sqlite3_step(stmt) == SQLITE_ROW ? sqlite3_column_int(stmt, 0) : -1;
  sqlite3_finalize(stmt);
  sqlite3_close(db);
  return version;
}

std::string FileBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

// A state dir of a coordinator from before the version was kept (the jobs
// table, user_version 0, as every release up to this one wrote it) is
// migrated, and its jobs come back as they were.
TEST_F(CoordinatorTest, AStateDirOfAnOlderSchemaIsMigratedAndItsJobsResume) {
  std::string tmpl = ::testing::TempDir() + "coordinator_test_XXXXXX";
  const std::string dir = mkdtemp(tmpl.data());
  const std::string db = dir + "/coordinator.db";
  RawSql(db,
         "PRAGMA journal_mode=WAL; CREATE TABLE jobs ("
         "  job_id TEXT PRIMARY KEY, status BLOB NOT NULL)");
  {
    sqlite3* raw = nullptr;
    ASSERT_EQ(sqlite3_open(db.c_str(), &raw), SQLITE_OK);
    for (auto [id, state] : {std::pair{"old-1", v1::JOB_STATE_RUNNING},
                             std::pair{"old-2", v1::JOB_STATE_QUEUED}}) {
      v1::JobStatus status;
      status.set_job_id(id);
      status.set_state(state);
      status.set_generation(state == v1::JOB_STATE_RUNNING ? 1 : 0);
      *status.mutable_spec() = Spec(1);
      ApplyDefaults(status.mutable_spec());
      const std::string blob = status.SerializeAsString();
      sqlite3_stmt* insert = nullptr;
      sqlite3_prepare_v2(raw, "INSERT INTO jobs VALUES (?1, ?2)", -1, &insert,
                         nullptr);
      sqlite3_bind_text(insert, 1, id, -1, SQLITE_TRANSIENT);
      sqlite3_bind_blob(insert, 2, blob.data(), static_cast<int>(blob.size()),
                        SQLITE_TRANSIENT);
      EXPECT_EQ(sqlite3_step(insert), SQLITE_DONE);
      sqlite3_finalize(insert);
    }
    sqlite3_close(raw);
  }
  ASSERT_EQ(RawUserVersion(db), 0);

  auto store = JobStore::Open(dir);
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_EQ(RawUserVersion(db), 2);
  Make(std::nullopt, *std::move(store));
  EXPECT_EQ(Status("old-1").state(), v1::JOB_STATE_RECOVERING);
  EXPECT_EQ(Status("old-2").state(), v1::JOB_STATE_QUEUED);
  FakeSink a;
  Connect(1, &a);
  EXPECT_EQ(Status("old-1").state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Status("old-1").generation(), 2);
  // Opened again: already current, nothing to migrate.
  coordinator_.reset();
  auto again = JobStore::Open(dir);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ((*again)->LoadAll()->size(), 2u);
}

// A state dir a newer lockstep wrote is refused with what to do, and left
// exactly as it was.
TEST_F(CoordinatorTest, AStateDirOfANewerSchemaIsRefusedUntouched) {
  std::string tmpl = ::testing::TempDir() + "coordinator_test_XXXXXX";
  const std::string dir = mkdtemp(tmpl.data());
  const std::string db = dir + "/coordinator.db";
  {
    auto store = JobStore::Open(dir);
    ASSERT_TRUE(store.ok()) << store.status();
    v1::JobStatus status;
    status.set_job_id("kept-1");
    status.set_state(v1::JOB_STATE_QUEUED);
    ASSERT_TRUE((*store)->Save(status).ok());
  }
  RawSql(db, "PRAGMA user_version=7");
  const std::string before = FileBytes(db);
  ASSERT_FALSE(before.empty());

  auto refused = JobStore::Open(dir);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(),
              ::testing::AllOf(::testing::HasSubstr(db),
                               ::testing::HasSubstr("schema version 7"),
                               ::testing::HasSubstr("newer than this"),
                               ::testing::HasSubstr("left untouched")));
  EXPECT_EQ(FileBytes(db), before);
  EXPECT_EQ(RawUserVersion(db), 7);
}

}  // namespace
}  // namespace lockstep::coordinator
