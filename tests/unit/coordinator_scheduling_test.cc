// Coordinator tests: several jobs on one pool of free workers (gang
// scheduling on disjoint workers, a recovering job's workers kept for it,
// failures confined to their job), and the scheduler's rules carried out:
// quotas and owners, priority classes, placement labels, the queue
// listing. Preemption is coordinator_preemption_test.cc's.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "common/tf_config.h"
#include "coordinator/coordinator.h"
#include "coordinator/job_status.h"
#include "tests/unit/coordinator_fixture.h"

namespace lockstep::coordinator {
namespace {

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

// Keys belong to their job: a rank of one job cannot read another's,
// whatever the generation numbers.
TEST_F(CoordinatorTest, TwoJobsKeysNeverMeet) {
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
  ASSERT_TRUE(coordinator_->KvSet(Anyone(), Signed(set)).ok());
  set.set_job_id(second);
  set.set_value("second's");
  ASSERT_TRUE(coordinator_->KvSet(Anyone(), Signed(set)).ok());
  for (const auto& [job, value] :
       {std::pair{first, "first's"}, std::pair{second, "second's"}}) {
    v1::KvGetRequest get;
    get.set_job_id(job);
    get.set_generation(1);
    get.set_key("addr/0");
    get.set_timeout_ms(1);
    EXPECT_EQ(KvGet(Anyone(), get).value_or(""), value);
  }
  // The first ends: its generation is fenced, the second's is not.
  Succeed(*coordinator_, Status(first), 0);
  v1::KvSetRequest late = set;
  late.set_job_id(first);
  EXPECT_EQ(coordinator_->KvSet(Anyone(), Signed(late)).code(),
            absl::StatusCode::kAborted);
  EXPECT_TRUE(coordinator_->KvSet(Anyone(), Signed(set)).ok());
}

TEST_F(CoordinatorTest, QuotasCapAnOwnersWorkersAndOwnersStopOnlyTheirJobs) {
  configure_ = [](Coordinator::Options& options) {
    options.scheduling.quotas["operator:alice"] = 2;
    options.admins.insert("operator:carol");
  };
  Make();
  FakeSink sinks[4];
  for (int i = 0; i < 4; ++i) Connect(i + 1, &sinks[i]);
  const std::string alice = "spiffe://lockstep/operator/alice";
  const std::string bob = "spiffe://lockstep/operator/bob";
  const std::string first = *coordinator_->SubmitJob(Spec(2), alice);
  const std::string second = *coordinator_->SubmitJob(Spec(2), alice);
  const std::string bobs = *coordinator_->SubmitJob(Spec(2), bob);
  EXPECT_EQ(Status(first).owner(), "operator:alice");
  EXPECT_EQ(Status(first).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Status(bobs).state(), v1::JOB_STATE_RUNNING);
  v1::JobStatus waits = Status(second);
  EXPECT_EQ(waits.queue().reason(), "quota");
  EXPECT_EQ(waits.queue().message(),
            "needs 2 workers; its owner holds 2 of a quota of 2");
  // The queue's account of each owner (the console's queue page).
  auto queue = coordinator_->ListQueue(v1::ListQueueRequest());
  ASSERT_TRUE(queue.ok()) << queue.status();
  ASSERT_EQ(queue->owners_size(), 2);
  EXPECT_EQ(queue->owners(0).owner(), "operator:alice");
  EXPECT_EQ(queue->owners(0).workers(), 2);
  EXPECT_EQ(queue->owners(0).quota(), 2);
  EXPECT_EQ(queue->owners(0).active_jobs(), 1);
  EXPECT_EQ(queue->owners(0).queued_jobs(), 1);
  EXPECT_EQ(queue->owners(1).owner(), "operator:bob");
  EXPECT_EQ(queue->owners(1).workers(), 2);
  EXPECT_FALSE(queue->owners(1).has_quota());

  absl::Status refused = coordinator_->StopJob(first, bob);
  EXPECT_EQ(refused.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(refused.message(),
              ::testing::HasSubstr("belongs to operator:alice"));
  EXPECT_EQ(Status(first).state(), v1::JOB_STATE_RUNNING);
  EXPECT_TRUE(coordinator_->StopJob(second, alice).ok());
  EXPECT_TRUE(
      coordinator_->StopJob(bobs, "spiffe://lockstep/operator/carol").ok());
  EXPECT_EQ(coordinator_->DeleteJob(second, bob).code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_TRUE(coordinator_->DeleteJob(second, alice).ok());
}

// Issue 52 (found by the simulation, seed 27): an elastic job that loses a
// worker re-forms within its owner's quota, not up to max_workers.
TEST_F(CoordinatorTest, ARecoveringElasticJobDoesNotGrowPastItsOwnersQuota) {
  configure_ = [](Coordinator::Options& options) {
    options.scheduling.quotas["operator:alice"] = 3;
  };
  Make();
  FakeSink sinks[5];
  std::string ids[5];
  for (int i = 0; i < 5; ++i) ids[i] = Connect(i + 1, &sinks[i]);
  const std::string alice = "spiffe://lockstep/operator/alice";
  const std::string one = *coordinator_->SubmitJob(Spec(1), alice);
  v1::JobSpec spec = Spec(0);
  spec.set_min_workers(1);
  spec.set_max_workers(4);
  const std::string elastic = *coordinator_->SubmitJob(spec, alice);
  const v1::JobStatus started = Status(elastic);
  ASSERT_EQ(started.world_size(), 2);
  const std::string lost = started.ranks(1).worker_id();
  for (int i = 0; i < 5; ++i) {
    if (ids[i] != lost) continue;
    coordinator_->CloseSession(ids[i], i + 1, &sinks[i],
                               absl::UnavailableError("reset"));
  }
  const v1::JobStatus reformed = Status(elastic);
  EXPECT_EQ(reformed.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(reformed.generation(), 2);
  EXPECT_EQ(reformed.world_size(), 2);  // 3 free workers, 2 left of the quota
  EXPECT_EQ(Status(one).world_size() + reformed.world_size(), 3);
}

TEST_F(CoordinatorTest, PriorityClassesNameTheCoordinatorsPriorities) {
  configure_ = [](Coordinator::Options& options) {
    options.priority_classes["urgent"] = 100;
  };
  Make();
  v1::JobSpec spec = Spec(2);
  spec.set_priority_class("urgent");
  auto id = coordinator_->SubmitJob(spec);
  ASSERT_TRUE(id.ok()) << id.status();
  EXPECT_EQ(Status(*id).priority(), 100);
  spec.set_priority_class("batch");
  auto unknown = coordinator_->SubmitJob(spec);
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(unknown.status().message(), ::testing::HasSubstr("urgent=100"));
  spec.set_priority_class("urgent");
  spec.set_priority(3);
  EXPECT_EQ(coordinator_->SubmitJob(spec).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Issue 52: a priority above the default is a permission.
TEST_F(CoordinatorTest, APriorityAboveTheDefaultIsGrantedNotTaken) {
  configure_ = [](Coordinator::Options& options) {
    options.priority_classes = {{"urgent", 100}, {"batch", -10}, {"high", 50}};
    options.priority_grants["urgent"] = {"operator:alice"};
    options.priority_grants["high"] = {"*"};
    options.admins.insert("operator:root");
  };
  Make();
  const std::string alice = "spiffe://lockstep/operator/alice";
  const std::string carol = "spiffe://lockstep/operator/carol";
  v1::JobSpec urgent = Spec(1);
  urgent.set_priority_class("urgent");
  EXPECT_TRUE(coordinator_->SubmitJob(urgent, alice).ok());
  auto refused = coordinator_->SubmitJob(urgent, carol);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(refused.status().message(),
              ::testing::AllOf(::testing::HasSubstr("operator:carol"),
                               ::testing::HasSubstr("\"urgent\""),
                               ::testing::HasSubstr("operator:alice")));

  v1::JobSpec raw = Spec(1);
  raw.set_priority(1000000);
  auto taken = coordinator_->SubmitJob(raw, alice);
  EXPECT_EQ(taken.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(taken.status().message(),
              ::testing::HasSubstr("operator:alice may not give a job "
                                   "priority 1000000"));
  EXPECT_TRUE(
      coordinator_->SubmitJob(raw, "spiffe://lockstep/operator/root").ok());

  // Lower is anyone's, and so is a class granted to everyone.
  v1::JobSpec lower = Spec(1);
  lower.set_priority(-5);
  EXPECT_TRUE(coordinator_->SubmitJob(lower, carol).ok());
  lower.set_priority(0);
  lower.set_priority_class("batch");
  EXPECT_TRUE(coordinator_->SubmitJob(lower, carol).ok());
  v1::JobSpec high = Spec(1);
  high.set_priority_class("high");
  EXPECT_TRUE(coordinator_->SubmitJob(high, carol).ok());

  // The queue shows who may use what.
  auto queue = coordinator_->ListQueue(v1::ListQueueRequest());
  ASSERT_TRUE(queue.ok()) << queue.status();
  ASSERT_EQ(queue->priority_classes_size(), 3);
  const v1::PriorityClass& named = queue->priority_classes(2);  // by name
  EXPECT_EQ(named.name(), "urgent");
  EXPECT_EQ(named.priority(), 100);
  EXPECT_THAT(named.granted_to(), ::testing::ElementsAre("operator:alice"));
  EXPECT_THAT(queue->admins(), ::testing::ElementsAre("operator:root"));
}

TEST_F(CoordinatorTest, AJobRunsOnlyOnWorkersWithItsLabels) {
  Make();
  FakeSink sinks[3];
  std::vector<std::string> ids;
  for (int i = 0; i < 3; ++i) {
    v1::RegisterWorkerRequest request = Free(i + 1);
    if (i > 0) (*request.mutable_labels())["zone"] = "a";
    ids.push_back(Connect(request, &sinks[i]));
  }
  v1::JobSpec zone_b = Spec(1);
  (*zone_b.mutable_placement()->mutable_labels())["zone"] = "b";
  const std::string nowhere = *coordinator_->SubmitJob(zone_b);
  v1::JobSpec zone_a = Spec(2);
  (*zone_a.mutable_placement()->mutable_labels())["zone"] = "a";
  const std::string placed = *coordinator_->SubmitJob(zone_a);
  v1::JobStatus status = Status(placed);
  ASSERT_EQ(status.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(status.ranks(0).worker_id(), ids[1]);
  EXPECT_EQ(status.ranks(1).worker_id(), ids[2]);
  EXPECT_EQ(Status(nowhere).queue().reason(), "no_fit");

  // A bad label is refused at the door.
  (*zone_a.mutable_placement()->mutable_labels())["zone"] = "a b";
  EXPECT_EQ(coordinator_->SubmitJob(zone_a).status().code(),
            absl::StatusCode::kInvalidArgument);
  v1::RegisterWorkerRequest bad = Free(9);
  (*bad.mutable_labels())["zone\n"] = "a";
  EXPECT_EQ(coordinator_->RegisterWorker(Anyone(), bad).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(CoordinatorTest, TheQueueListsWaitingJobsInTheSchedulersOrder) {
  Make();
  FakeSink sink;
  Connect(1, &sink);
  const std::string running = *coordinator_->SubmitJob(Spec(1));
  const std::string later = *coordinator_->SubmitJob(Spec(1));
  const std::string first = *coordinator_->SubmitJob(Urgent(1));
  auto queue = coordinator_->ListQueue({});
  ASSERT_TRUE(queue.ok()) << queue.status();
  EXPECT_EQ(queue->queued(), 2);
  ASSERT_EQ(queue->jobs_size(), 2);
  EXPECT_EQ(queue->jobs(0).job_id(), first);
  EXPECT_EQ(queue->jobs(0).queue().position(), 1);
  EXPECT_EQ(queue->jobs(1).job_id(), later);
  EXPECT_EQ(queue->jobs(1).queue().position(), 2);
  EXPECT_TRUE(queue->jobs(0).events().empty());
  v1::ListQueueRequest request;
  request.set_page_size(-1);
  EXPECT_EQ(coordinator_->ListQueue(request).status().code(),
            absl::StatusCode::kInvalidArgument);
  (void)running;
}

TEST_F(CoordinatorTest, OnAStaticClusterJobsQueueForItsTasksInOrder) {
  auto config = ParseTfConfig(R"({"cluster": {"worker": ["a:1", "b:1"]}})");
  ASSERT_TRUE(config.ok()) << config.status();
  Make(config->cluster);
  FakeSink a, b;
  ConnectTask(0, 10, &a);
  ConnectTask(1, 11, &b);
  const std::string first = *coordinator_->SubmitJob(Spec(0));
  v1::JobSpec urgent = Spec(0);
  urgent.set_priority(10);  // a static cluster runs its jobs in order
  const std::string second = *coordinator_->SubmitJob(Spec(0));
  const std::string third = *coordinator_->SubmitJob(urgent);
  EXPECT_EQ(Status(first).state(), v1::JOB_STATE_RUNNING);
  v1::JobStatus next = Status(second);
  EXPECT_EQ(next.queue().position(), 1);
  EXPECT_EQ(next.queue().reason(), "no_fit");
  EXPECT_EQ(next.queue().message(),
            "needs 2 workers; 0 free workers match its placement");
  EXPECT_EQ(Status(third).queue().position(), 2);
  Succeed(*coordinator_, Status(first), 0);
  EXPECT_EQ(Status(second).state(), v1::JOB_STATE_RUNNING);
  EXPECT_FALSE(Status(second).has_queue());
  EXPECT_EQ(Status(third).queue().position(), 1);
}

TEST_F(CoordinatorTest, ASpareGoesToTheHighestPriorityJobThatLostARank) {
  Make();
  FakeSink sinks[2], spare_sinks[2];
  const std::string first = Connect(1, &sinks[0]);
  const std::string second = Connect(2, &sinks[1]);
  const std::string low = *coordinator_->SubmitJob(Spec(1));
  v1::JobSpec high_spec = Spec(1);
  high_spec.set_priority(5);
  const std::string high = *coordinator_->SubmitJob(high_spec);
  auto connect_spare = [&](uint64_t incarnation, FakeSink* sink) {
    v1::RegisterWorkerRequest spare = Free(incarnation);
    spare.set_spare(true);
    return Connect(spare, sink);
  };
  // A spare stands by for the job of the higher priority, the younger one.
  const std::string early = connect_spare(3, &spare_sinks[0]);
  auto standbys = CommandsOf(spare_sinks[0], v1::CoordinatorCommand::kStandby);
  ASSERT_FALSE(standbys.empty());
  EXPECT_EQ(standbys.back().standby().job_id(), high);
  coordinator_->CloseSession(early, 3, &spare_sinks[0],
                             absl::UnavailableError("gone"));
  // Both jobs lose their worker; then a spare comes: it goes to the job of
  // the higher priority, though the other is older.
  coordinator_->CloseSession(first, 1, &sinks[0], absl::UnavailableError("x"));
  coordinator_->CloseSession(second, 2, &sinks[1], absl::UnavailableError("x"));
  ASSERT_EQ(Status(high).state(), v1::JOB_STATE_RECOVERING);
  ASSERT_EQ(Status(low).state(), v1::JOB_STATE_RECOVERING);
  const std::string spare = connect_spare(4, &spare_sinks[1]);
  EXPECT_EQ(Status(high).state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(Status(high).ranks(0).worker_id(), spare);
  EXPECT_EQ(Status(low).state(), v1::JOB_STATE_RECOVERING);
}

}  // namespace
}  // namespace lockstep::coordinator
