// Live recovery end to end (docs/DESIGN.md §3): a killed worker, a killed and
// restarted coordinator, a hung worker, and `lockstep local` restarting a
// worker process; the job ends with the model of a run that never failed.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "common/files.h"
#include "tests/integration/harness.h"

namespace lockstep::integration {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// docs/DESIGN.md §3: a dead worker is named at once, the survivors keep their
// processes and state, a replacement joins, and the job ends with the same
// model as a run that never failed.
TEST_F(ClusterTest, KilledWorkerIsReplacedAndNothingIsRolledBack) {
  StartCluster(3);
  const std::vector<std::string> sets = {"max_steps=60", "global_batch_size=96",
                                         "log_every_steps=1"};
  std::string reference = UninterruptedDigest(sets);

  std::string job = SubmitAndTrainTo(sets, 15);
  ASSERT_FALSE(job.empty());
  absl::Time killed = absl::Now();
  ASSERT_EQ(kill(worker_pids_[2], SIGKILL), 0);
  v1::JobStatus recovering = WatchUntil(job, [](const v1::JobStatus& s) {
    return s.state() != v1::JOB_STATE_RUNNING;
  });
  absl::Duration detection = absl::Now() - killed;
  EXPECT_EQ(recovering.state(), v1::JOB_STATE_RECOVERING);
  EXPECT_THAT(recovering.error(),
              AllOf(HasSubstr("worker:2"), HasSubstr("rank 2"),
                    HasSubstr("lost its session")));
  EXPECT_LT(detection, absl::Seconds(2));
  EXPECT_TRUE(Alive(worker_pids_[0]));
  EXPECT_TRUE(Alive(worker_pids_[1]));

  StartWorker(2);
  v1::JobStatus done = WatchUntil(job, Ended);
  ASSERT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << done.error();
  EXPECT_EQ(done.generations(), 2);
  EXPECT_EQ(done.step(), 60);
  ExpectAllRanks(done, reference);
  const v1::JobEvent* resumed = FindEvent(done, "resumed");
  ASSERT_NE(resumed, nullptr);
  EXPECT_THAT(resumed->message(), HasSubstr("0 steps repeated"));
  EXPECT_TRUE(Alive(worker_pids_[0]));
  EXPECT_TRUE(Alive(worker_pids_[1]));
}

// Issue 13, defect 1: the chief killed within milliseconds of a generation's
// start, over and over. A survivor may then be anywhere in the rendezvous
// (the key-value store, a Gloo pair waiting for the dead chief, the barrier
// after it); the abort must release it at once, so every next generation
// forms with all ranks: exactly one generation per kill, no rank that fails
// to join (which would cost another generation), no rendezvous timeout.
TEST_F(ClusterTest, ChiefKilledAsGenerationsStartNeverStallsTheNext) {
  StartCluster(3);
  const std::vector<std::string> sets = {
      "max_steps=300", "global_batch_size=96", "log_every_steps=1",
      "max_restarts=50"};
  std::string reference = UninterruptedDigest(sets);

  constexpr int kKills = 8;
  std::string job = Submit(sets);
  int64_t generation = 0;
  for (int kill_count = 0; kill_count < kKills; ++kill_count) {
    absl::Time waiting = absl::Now();
    v1::JobStatus started =
        WatchUntil(job, [generation](const v1::JobStatus& s) {
          return Ended(s) || (s.state() == v1::JOB_STATE_RUNNING &&
                              s.generation() > generation);
        });
    ASSERT_EQ(started.state(), v1::JOB_STATE_RUNNING)
        << "after " << kill_count << " kills: " << started.error();
    ASSERT_EQ(started.generation(), generation + 1)
        << "a generation failed on its own:\n"
        << History(job);
    // From the previous kill (and the chief's restart) to this generation:
    // a rendezvous stuck for its timeout (60 s) or a rank named after the
    // join timeout (10 s) would show here.
    EXPECT_LT(absl::Now() - waiting, absl::Seconds(8))
        << "generation " << started.generation();
    generation = started.generation();
    ASSERT_EQ(kill(worker_pids_[0], SIGKILL), 0);
    worker_pids_[0] = StartWorker(0);
  }
  v1::JobStatus done = WatchUntil(job, Ended);
  ASSERT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << done.error();
  EXPECT_EQ(done.generations(), kKills + 1);
  ExpectAllRanks(done, reference);
  for (const v1::JobEvent& event : done.events()) {
    EXPECT_THAT(event.message(),
                ::testing::Not(::testing::AnyOf(HasSubstr("did not join"),
                                                HasSubstr("was not set"))))
        << event.kind();
  }
}

TEST_F(ClusterTest, JobSurvivesAKilledAndRestartedCoordinator) {
  StartCluster(2);
  const std::vector<std::string> sets = {"max_steps=80", "global_batch_size=64",
                                         "log_every_steps=1"};
  std::string reference = UninterruptedDigest(sets);

  std::string job = SubmitAndTrainTo(sets, 10);
  ASSERT_FALSE(job.empty());
  ASSERT_EQ(kill(coordinator_pid_, SIGKILL), 0);
  StartCoordinator(address_);

  v1::JobStatus done = WatchUntil(job, Ended);
  ASSERT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << done.error();
  EXPECT_GE(done.generations(), 2);
  ExpectAllRanks(done, reference);
  EXPECT_NE(FindEvent(done, "coordinator_restarted"), nullptr);
  EXPECT_TRUE(Alive(worker_pids_[0]));
  EXPECT_TRUE(Alive(worker_pids_[1]));
}

TEST_F(ClusterTest, HungWorkerIsCaughtByTheHeartbeatTimeout) {
  StartCluster(2, {"--heartbeat-timeout", "2"});
  const std::vector<std::string> sets = {"max_steps=80", "global_batch_size=64",
                                         "log_every_steps=1"};
  std::string reference = UninterruptedDigest(sets);

  std::string job = SubmitAndTrainTo(sets, 10);
  ASSERT_FALSE(job.empty());
  ASSERT_EQ(kill(worker_pids_[1], SIGSTOP), 0);
  v1::JobStatus recovering = WatchUntil(job, [](const v1::JobStatus& s) {
    return s.state() != v1::JOB_STATE_RUNNING;
  });
  kill(worker_pids_[1], SIGCONT);
  EXPECT_EQ(recovering.state(), v1::JOB_STATE_RECOVERING);
  EXPECT_THAT(recovering.error(),
              AllOf(HasSubstr("worker:1"), HasSubstr("missed heartbeats")));

  // The same process wakes up, reconnects and the job finishes.
  v1::JobStatus done = WatchUntil(job, Ended);
  ASSERT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << done.error();
  ExpectAllRanks(done, reference);
}

// `lockstep local` restarts a worker process that dies, as Kubernetes would.
TEST(LocalTest, SurvivesKillOfAWorker) {
  const std::vector<std::string> run = LocalMlpRun();
  Result reference = RunCommand(run);
  ASSERT_EQ(reference.code, 0) << reference.err;

  Result killed = RunAndKillAWorker(run);
  ASSERT_EQ(killed.code, 0) << killed.err;
  const std::string& err = killed.err;
  EXPECT_THAT(err, HasSubstr("restarting it"));
  const auto summary = LastJsonLine(killed.out).fields();
  EXPECT_EQ(summary.at("state").string_value(), "succeeded");
  EXPECT_GE(summary.at("generations").number_value(), 2);
  EXPECT_EQ(
      summary.at("model_digest").string_value(),
      LastJsonLine(reference.out).fields().at("model_digest").string_value());
}

}  // namespace
}  // namespace lockstep::integration
