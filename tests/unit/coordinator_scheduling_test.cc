// Coordinator tests: several jobs on one pool of free workers (gang
// scheduling on disjoint workers, a recovering job's workers kept for it,
// failures confined to their job).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "coordinator/coordinator.h"
#include "tests/unit/coordinator_fixture.h"

namespace lockstep::coordinator {
namespace {

// The job each sink was last assigned to ("" if none).
std::string AssignedJob(const FakeSink& sink) {
  auto assignments = CommandsOf(sink, v1::CoordinatorCommand::kAssignment);
  return assignments.empty() ? "" : assignments.back().assignment().job_id();
}

// Every rank of generation `generation` of `job` reports success at `steps`.
void Succeed(Coordinator& coordinator, const v1::JobStatus& status,
             int64_t steps) {
  for (const v1::RankResult& rank : status.ranks()) {
    ASSERT_TRUE(
        coordinator
            .HandleWorkerMessage(rank.worker_id(),
                                 OkResult(status.job_id(), status.generation(),
                                          rank.rank(), steps, "digest"))
            .ok());
  }
}

TEST_F(CoordinatorTest, JobsThatFitRunAtOnceOnDisjointWorkers) {
  Make();
  FakeSink sinks[4];
  for (int i = 0; i < 4; ++i) Connect(i + 1, &sinks[i]);
  const std::string first = *coordinator_->SubmitJob(Spec(2));
  const std::string second = *coordinator_->SubmitJob(Spec(2));
  const std::string third = *coordinator_->SubmitJob(Spec(2));
  EXPECT_EQ(Status(first).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Status(second).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Status(third).state(), v1::JOB_STATE_QUEUED);
  // Each worker holds a rank of one job; each job has its whole group.
  std::set<std::string> holders;
  for (const std::string& job : {first, second}) {
    const v1::JobStatus status = Status(job);
    ASSERT_EQ(status.ranks_size(), 2) << job;
    EXPECT_EQ(status.world_size(), 2);
    for (const v1::RankResult& rank : status.ranks()) {
      EXPECT_TRUE(holders.insert(rank.worker_id()).second) << rank.worker_id();
    }
  }
  EXPECT_EQ(AssignedJob(sinks[0]), first);
  EXPECT_EQ(AssignedJob(sinks[1]), first);
  EXPECT_EQ(AssignedJob(sinks[2]), second);
  EXPECT_EQ(AssignedJob(sinks[3]), second);

  // The first ends: the third starts on its workers, the second runs on.
  Succeed(*coordinator_, Status(first), 0);
  EXPECT_EQ(Status(first).state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(Status(third).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(AssignedJob(sinks[0]), third);
  EXPECT_EQ(AssignedJob(sinks[1]), third);
  EXPECT_EQ(Status(second).generation(), 1);
  EXPECT_TRUE(CommandsOf(sinks[2], v1::CoordinatorCommand::kAbort).empty());
}

TEST_F(CoordinatorTest, AJobThatDoesNotFitWaitsWithoutHoldingBackOneThatDoes) {
  Make();
  FakeSink sinks[3];
  for (int i = 0; i < 3; ++i) Connect(i + 1, &sinks[i]);
  const std::string small = *coordinator_->SubmitJob(Spec(2));
  const std::string big = *coordinator_->SubmitJob(Spec(2));
  const std::string fits = *coordinator_->SubmitJob(Spec(1));
  EXPECT_EQ(Status(small).state(), v1::JOB_STATE_RUNNING);
  // Never part of its group: one worker is free, the job needs two.
  EXPECT_EQ(Status(big).state(), v1::JOB_STATE_QUEUED);
  EXPECT_TRUE(Status(big).ranks().empty());
  EXPECT_EQ(Status(fits).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(AssignedJob(sinks[2]), fits);
}

TEST_F(CoordinatorTest, AJobOfTheWholePoolWaitsUntilNoOtherJobIsActive) {
  Make();
  FakeSink sinks[4];
  for (int i = 0; i < 4; ++i) Connect(i + 1, &sinks[i]);
  const std::string one = *coordinator_->SubmitJob(Spec(1));
  const std::string pool = *coordinator_->SubmitJob(Spec(0));
  EXPECT_EQ(Status(one).state(), v1::JOB_STATE_RUNNING);
  // Three workers are free, but num_workers 0 means every worker there is.
  EXPECT_EQ(Status(pool).state(), v1::JOB_STATE_QUEUED);
  Succeed(*coordinator_, Status(one), 0);
  EXPECT_EQ(Status(pool).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Status(pool).world_size(), 4);
}

TEST_F(CoordinatorTest, AFailedWorkerAffectsOnlyItsJob) {
  Make();
  FakeSink sinks[4];
  std::string ids[4];
  for (int i = 0; i < 4; ++i) ids[i] = Connect(i + 1, &sinks[i]);
  const std::string first = *coordinator_->SubmitJob(Spec(2));
  const std::string second = *coordinator_->SubmitJob(Spec(2));
  coordinator_->CloseSession(ids[3], 4, &sinks[3],
                             absl::UnavailableError("reset"));
  EXPECT_EQ(Status(second).state(), v1::JOB_STATE_RECOVERING);
  EXPECT_EQ(CommandsOf(sinks[2], v1::CoordinatorCommand::kAbort).size(), 1u);
  const v1::JobStatus untouched = Status(first);
  EXPECT_EQ(untouched.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(untouched.generation(), 1);
  EXPECT_TRUE(EventsOf(untouched, "worker_failed").empty());
  EXPECT_TRUE(CommandsOf(sinks[0], v1::CoordinatorCommand::kAbort).empty());
  EXPECT_TRUE(CommandsOf(sinks[1], v1::CoordinatorCommand::kAbort).empty());
}

// A recovering job's surviving workers hold its live state: a queued job
// is not given them while the job waits for its group to be whole.
TEST_F(CoordinatorTest, ARecoveringJobKeepsItsWorkers) {
  Make();
  FakeSink a, b;
  const std::string id_a = Connect(1, &a);
  const std::string id_b = Connect(2, &b);
  const std::string job = *coordinator_->SubmitJob(Spec(2));
  coordinator_->CloseSession(id_b, 2, &b, absl::UnavailableError("reset"));
  ASSERT_EQ(Status(job).state(), v1::JOB_STATE_RECOVERING);
  const std::string waiting = *coordinator_->SubmitJob(Spec(1));
  EXPECT_EQ(Status(waiting).state(), v1::JOB_STATE_QUEUED);
  EXPECT_EQ(AssignedJob(a), job);
  // A new worker makes the group whole: the job re-forms on the survivor.
  FakeSink c;
  const std::string id_c = Connect(3, &c);
  EXPECT_EQ(Status(job).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Status(job).generation(), 2);
  EXPECT_EQ(Status(job).ranks(0).worker_id(), id_a);
  EXPECT_EQ(Status(job).ranks(1).worker_id(), id_c);
  EXPECT_EQ(Status(waiting).state(), v1::JOB_STATE_QUEUED);
}

// Keys and barriers belong to their job: a rank of one job cannot read or
// meet another's, whatever the generation numbers.
TEST_F(CoordinatorTest, TwoJobsKeysAndBarriersNeverMeet) {
  Make();
  FakeSink a, b;
  Connect(1, &a);
  Connect(2, &b);
  const std::string first = *coordinator_->SubmitJob(Spec(1));
  const std::string second = *coordinator_->SubmitJob(Spec(1));
  ASSERT_EQ(Status(second).state(), v1::JOB_STATE_RUNNING);
  v1::KvSetRequest set;
  set.set_job_id(first);
  set.set_generation(1);
  set.set_key("addr/0");
  set.set_value("first's");
  ASSERT_TRUE(coordinator_->KvSet(Anyone(), set).ok());
  set.set_job_id(second);
  set.set_value("second's");
  ASSERT_TRUE(coordinator_->KvSet(Anyone(), set).ok());
  for (const auto& [job, value] :
       {std::pair{first, "first's"}, std::pair{second, "second's"}}) {
    v1::KvGetRequest get;
    get.set_job_id(job);
    get.set_generation(1);
    get.set_key("addr/0");
    get.set_timeout_ms(1);
    EXPECT_EQ(coordinator_->KvGet(Anyone(), get).value_or(""), value);
  }
  // The first ends: its generation is fenced, the second's is not.
  Succeed(*coordinator_, Status(first), 0);
  v1::KvSetRequest late = set;
  late.set_job_id(first);
  EXPECT_EQ(coordinator_->KvSet(Anyone(), late).code(),
            absl::StatusCode::kAborted);
  EXPECT_TRUE(coordinator_->KvSet(Anyone(), set).ok());
}

}  // namespace
}  // namespace lockstep::coordinator
