// Coordinator tests for hot spares (docs/DESIGN.md §3): a spare stands by
// for the running job without a rank, takes a failed rank at once (no wait
// for the failed worker) in a free, an elastic and a static job, and a
// failed task that comes back stands by in its turn.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include "absl/strings/str_cat.h"
#include "common/tf_config.h"
#include "coordinator/coordinator.h"
#include "tests/unit/coordinator_fixture.h"

namespace lockstep::coordinator {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

class SpareTest : public CoordinatorTest {
 protected:
  // Registers a worker with --spare (free registration) and opens its session.
  std::string ConnectSpare(uint64_t incarnation, FakeSink* sink) {
    v1::RegisterWorkerRequest request = Free(incarnation);
    request.set_spare(true);
    return RegisterAndOpen(request, sink);
  }

  // Registers task `type`:`index` of a static cluster and opens its session.
  std::string ConnectAs(const std::string& type, int index,
                        uint64_t incarnation, FakeSink* sink) {
    v1::RegisterWorkerRequest request = Free(incarnation);
    request.mutable_task()->set_type(type);
    request.mutable_task()->set_index(index);
    return RegisterAndOpen(request, sink);
  }

  std::string RegisterAndOpen(const v1::RegisterWorkerRequest& request,
                              FakeSink* sink) {
    auto registered = coordinator_->RegisterWorker(Anyone(), request);
    EXPECT_TRUE(registered.ok()) << registered.status();
    if (!registered.ok()) return "";
    EXPECT_TRUE(coordinator_
                    ->OpenSession(Anyone(), registered->worker_id(),
                                  request.incarnation(), sink)
                    .ok());
    return registered->worker_id();
  }

  v1::WorkerInfo Info(const std::string& id) {
    for (const v1::WorkerInfo& info : ListWorkers()) {
      if (info.worker_id() == id) return info;
    }
    ADD_FAILURE() << "no worker " << id;
    return {};
  }

  static v1::JobSpec Elastic(int min, int max) {
    v1::JobSpec spec = Spec(0);
    spec.clear_global_batch_size();
    spec.set_per_replica_batch_size(16);
    spec.set_min_workers(min);
    spec.set_max_workers(max);
    return spec;
  }
};

TEST_F(SpareTest, SpareStandsByWithoutARank) {
  Make();
  FakeSink a, b, s;
  Connect(1, &a);
  std::string spare = ConnectSpare(3, &s);
  std::string job = *coordinator_->SubmitJob(Spec(2));
  // The spare does not complete the group: the job waits for its own worker.
  EXPECT_EQ(Status(job).state(), v1::JOB_STATE_QUEUED);
  EXPECT_TRUE(s.commands.empty());
  Connect(2, &b);
  v1::JobStatus status = Status(job);
  EXPECT_EQ(status.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(status.world_size(), 2);
  EXPECT_TRUE(CommandsOf(s, v1::CoordinatorCommand::kAssignment).empty());
  auto standby = CommandsOf(s, v1::CoordinatorCommand::kStandby);
  ASSERT_EQ(standby.size(), 1u);
  EXPECT_EQ(standby[0].standby().job_id(), job);
  EXPECT_EQ(standby[0].standby().spec().global_batch_size(), 64);

  v1::WorkerInfo info = Info(spare);
  EXPECT_TRUE(info.spare());
  EXPECT_EQ(info.state(), "standby");
  EXPECT_EQ(info.standby_job_id(), job);
  EXPECT_EQ(info.rank(), -1);
  EXPECT_FALSE(Info("free:0").spare());
  EXPECT_EQ(Info("free:0").state(), "training");
}

TEST_F(SpareTest, FailedRankGoesToTheSpareAtOnce) {
  Make();
  FakeSink a, b, s;
  std::string id_a = Connect(1, &a);
  std::string id_b = Connect(2, &b);
  std::string spare = ConnectSpare(3, &s);
  std::string job = *coordinator_->SubmitJob(Spec(2));
  coordinator_->CloseSession(id_a, 1, &a, absl::UnavailableError("killed"));

  // No clock advance, no re-registration: generation 2 is already running,
  // the spare at the failed rank 0 (the new chief), the survivor at rank 1.
  v1::JobStatus status = Status(job);
  EXPECT_EQ(status.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(status.generation(), 2);
  EXPECT_EQ(status.ranks(0).worker_id(), spare);
  EXPECT_EQ(status.ranks(1).worker_id(), id_b);
  auto assigned = CommandsOf(s, v1::CoordinatorCommand::kAssignment);
  ASSERT_EQ(assigned.size(), 1u);
  EXPECT_EQ(assigned[0].assignment().rank(), 0);
  EXPECT_EQ(assigned[0].assignment().generation(), 2);
  auto survivor = CommandsOf(b, v1::CoordinatorCommand::kAssignment);
  ASSERT_EQ(survivor.size(), 2u);
  EXPECT_EQ(survivor[1].assignment().rank(), 1);
  // The survivor had the data already: it was never sent a standby.
  EXPECT_TRUE(CommandsOf(b, v1::CoordinatorCommand::kStandby).empty());

  auto events = EventsOf(status, "rank_replaced");
  ASSERT_EQ(events.size(), 1u);
  EXPECT_EQ(events[0].worker_id(), spare);
  EXPECT_THAT(events[0].message(),
              AllOf(HasSubstr(absl::StrCat("spare ", spare)),
                    HasSubstr("took rank 0 of job " + job),
                    HasSubstr("after " + id_a + " failed")));
  EXPECT_EQ(Info(spare).state(), "training");
}

TEST_F(SpareTest, SilentRankGoesToTheSpareWhenTheSweepFindsIt) {
  Make();
  FakeSink a, b, s;
  std::string id_a = Connect(1, &a);
  std::string id_b = Connect(2, &b);
  std::string spare = ConnectSpare(3, &s);
  std::string job = *coordinator_->SubmitJob(Spec(2));
  clock_.Advance(absl::Seconds(6));
  Beat(id_a, job, 5);
  v1::WorkerMessage beat;
  beat.mutable_heartbeat();
  ASSERT_TRUE(coordinator_->HandleWorkerMessage(spare, beat).ok());
  clock_.Advance(absl::Seconds(6));
  coordinator_->Sweep();  // b is silent for 12 s
  v1::JobStatus status = Status(job);
  EXPECT_EQ(status.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(status.generation(), 2);
  EXPECT_EQ(status.ranks(0).worker_id(), id_a);
  EXPECT_EQ(status.ranks(1).worker_id(), spare);
  EXPECT_TRUE(b.closed);
}

TEST_F(SpareTest, ReturningWorkerStandsByUntilTheNextFailure) {
  Make();
  FakeSink a, b, s, b2;
  std::string id_a = Connect(1, &a);
  std::string id_b = Connect(2, &b);
  std::string spare = ConnectSpare(3, &s);
  std::string job = *coordinator_->SubmitJob(Spec(2));
  coordinator_->CloseSession(id_b, 2, &b, absl::UnavailableError("killed"));
  ASSERT_EQ(Status(job).ranks(1).worker_id(), spare);

  // The failed process restarts: it gets no rank, it stands by.
  std::string back = Connect(22, &b2);
  EXPECT_EQ(Status(job).generation(), 2);
  EXPECT_TRUE(CommandsOf(b2, v1::CoordinatorCommand::kAssignment).empty());
  ASSERT_EQ(CommandsOf(b2, v1::CoordinatorCommand::kStandby).size(), 1u);
  EXPECT_EQ(Info(back).state(), "standby");

  // The next failure gives its rank to the returned worker.
  coordinator_->CloseSession(id_a, 1, &a, absl::UnavailableError("killed"));
  v1::JobStatus status = Status(job);
  EXPECT_EQ(status.generation(), 3);
  EXPECT_EQ(status.ranks(0).worker_id(), back);
  EXPECT_EQ(status.ranks(1).worker_id(), spare);
}

TEST_F(SpareTest, WithoutASpareTheJobStillWaitsForItsWorker) {
  Make();
  FakeSink a, b;
  Connect(1, &a);
  std::string id_b = Connect(2, &b);
  std::string job = *coordinator_->SubmitJob(Spec(2));
  coordinator_->CloseSession(id_b, 2, &b, absl::UnavailableError("killed"));
  EXPECT_EQ(Status(job).state(), v1::JOB_STATE_RECOVERING);
  EXPECT_TRUE(EventsOf(Status(job), "rank_replaced").empty());
}

TEST_F(SpareTest, ElasticJobKeepsItsSizeWithASpareAndDoesNotGrowIntoIt) {
  Make();
  FakeSink a, b, s;
  std::string id_a = Connect(1, &a);
  std::string id_b = Connect(2, &b);
  std::string spare = ConnectSpare(3, &s);
  std::string job = *coordinator_->SubmitJob(Elastic(1, 3));
  // It could run on three, but a spare is held back for failures.
  EXPECT_EQ(Status(job).world_size(), 2);
  ASSERT_EQ(CommandsOf(s, v1::CoordinatorCommand::kStandby).size(), 1u);

  coordinator_->CloseSession(id_b, 2, &b, absl::UnavailableError("killed"));
  v1::JobStatus status = Status(job);
  EXPECT_EQ(status.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(status.generation(), 2);
  EXPECT_EQ(status.world_size(), 2);  // kept, not shrunk to min_workers
  EXPECT_EQ(status.ranks(0).worker_id(), id_a);
  EXPECT_EQ(status.ranks(1).worker_id(), spare);
  EXPECT_EQ(EventsOf(status, "rank_replaced").size(), 1u);
}

TEST_F(SpareTest, StaticClusterGivesAFailedRankToASpareTask) {
  auto config = ParseTfConfig(
      R"({"cluster": {"chief": ["c:1"], "worker": ["w:1"], "spare": ["s:1"]},
          "task": {"type": "spare", "index": 0}})");
  ASSERT_TRUE(config.ok()) << config.status();
  Make(config->cluster);
  FakeSink c, w, s, c2;
  ConnectAs("chief", 0, 10, &c);
  std::string spare = ConnectAs("spare", 0, 30, &s);
  EXPECT_EQ(spare, "spare:0");
  std::string job = *coordinator_->SubmitJob(Spec(0));
  EXPECT_EQ(Status(job).state(), v1::JOB_STATE_QUEUED);  // waits for w
  ConnectAs("worker", 0, 20, &w);
  v1::JobStatus status = Status(job);
  ASSERT_EQ(status.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(status.world_size(), 2);  // the spare task is not a rank
  EXPECT_EQ(Info(spare).state(), "standby");

  // The chief dies: the spare becomes rank 0, the job's chief, at once.
  coordinator_->CloseSession("chief:0", 10, &c, absl::UnavailableError("oom"));
  status = Status(job);
  EXPECT_EQ(status.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(status.generation(), 2);
  EXPECT_EQ(status.ranks(0).worker_id(), spare);
  EXPECT_EQ(status.ranks(1).worker_id(), "worker:0");

  // The chief's task comes back (its identity kept): it stands by, and its
  // rank stays with the spare.
  ConnectAs("chief", 0, 11, &c2);
  EXPECT_EQ(Status(job).generation(), 2);
  EXPECT_EQ(Info("chief:0").state(), "standby");
  EXPECT_TRUE(CommandsOf(c2, v1::CoordinatorCommand::kAssignment).empty());
}

TEST_F(SpareTest, StaticClusterTakesASpareByFlagAndRefusesOtherFreeWorkers) {
  auto config = ParseTfConfig(R"({"cluster": {"worker": ["a:1", "b:1"]}})");
  Make(config->cluster);
  FakeSink a, b, s;
  ConnectTask(0, 10, &a);
  ConnectTask(1, 11, &b);
  std::string spare = ConnectSpare(30, &s);
  EXPECT_EQ(spare, "free:2");
  auto refused = coordinator_->RegisterWorker(Anyone(), Free(40));
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.status().message(), HasSubstr("--spare"));

  std::string job = *coordinator_->SubmitJob(Spec(0));
  coordinator_->CloseSession("worker:1", 11, &b, absl::UnavailableError("x"));
  v1::JobStatus status = Status(job);
  EXPECT_EQ(status.generation(), 2);
  EXPECT_EQ(status.ranks(0).worker_id(), "worker:0");
  EXPECT_EQ(status.ranks(1).worker_id(), spare);
}

// A coordinator restart after a spare took a rank: the job re-forms with the
// spare in that rank, without waiting for the task that failed.
TEST_F(SpareTest, SpareKeepsItsRankAcrossACoordinatorRestart) {
  auto config = ParseTfConfig(
      R"({"cluster": {"worker": ["a:1", "b:1"], "spare": ["s:1"]}})");
  std::string tmpl = ::testing::TempDir() + "coordinator_spare_XXXXXX";
  std::string dir = mkdtemp(tmpl.data());
  Make(config->cluster, *JobStore::Open(dir));
  FakeSink a, b, s;
  ConnectAs("worker", 0, 10, &a);
  ConnectAs("worker", 1, 11, &b);
  ConnectAs("spare", 0, 30, &s);
  std::string job = *coordinator_->SubmitJob(Spec(0));
  coordinator_->CloseSession("worker:1", 11, &b, absl::UnavailableError("x"));
  ASSERT_EQ(Status(job).ranks(1).worker_id(), "spare:0");
  coordinator_.reset();

  Make(config->cluster, *JobStore::Open(dir));
  FakeSink a2, s2;
  ConnectAs("worker", 0, 10, &a2);
  EXPECT_EQ(Status(job).state(), v1::JOB_STATE_RECOVERING);
  ConnectAs("spare", 0, 30, &s2);
  v1::JobStatus status = Status(job);
  EXPECT_EQ(status.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(status.generation(), 3);
  EXPECT_EQ(status.ranks(0).worker_id(), "worker:0");
  EXPECT_EQ(status.ranks(1).worker_id(), "spare:0");
}

TEST_F(SpareTest, StandbysAreForgottenWhenTheJobEnds) {
  Make();
  FakeSink a, s;
  std::string id_a = Connect(1, &a);
  std::string spare = ConnectSpare(3, &s);
  std::string job = *coordinator_->SubmitJob(Spec(1));
  EXPECT_EQ(Info(spare).state(), "standby");
  v1::WorkerMessage done;
  done.mutable_result()->set_job_id(job);
  done.mutable_result()->set_generation(1);
  done.mutable_result()->set_rank(0);
  done.mutable_result()->set_ok(true);
  ASSERT_TRUE(coordinator_->HandleWorkerMessage(id_a, done).ok());
  ASSERT_EQ(Status(job).state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(Info(spare).state(), "idle");
  EXPECT_EQ(Info(spare).standby_job_id(), "");
}

}  // namespace
}  // namespace lockstep::coordinator
