// Hot spares end to end (docs/DESIGN.md §3): a static cluster of two ranks
// and one spare task, and `lockstep local --spares 1`; a rank is SIGKILLed
// mid-training and the spare takes its rank at once, without the killed
// worker coming back, and the job ends with the model of a run that never
// failed.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <string>
#include <vector>

#include "tests/integration/harness.h"

namespace lockstep::integration {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

TEST_F(ClusterTest, SpareTakesTheRankOfAKilledWorker) {
  spares_ = 1;
  StartCluster(2);
  const std::vector<std::string> sets = {"max_steps=60", "global_batch_size=64",
                                         "log_every_steps=1"};
  std::string reference = UninterruptedDigest(sets);

  std::string job = SubmitAndTrainTo(sets, 15);
  ASSERT_FALSE(job.empty());
  ASSERT_EQ(kill(worker_pids_[1], SIGKILL), 0);
  // Nobody restarts worker 1: the spare must carry the job to its end.
  v1::JobStatus done = WatchUntil(job, Ended);
  ASSERT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << done.error();
  EXPECT_EQ(done.generations(), 2);
  EXPECT_EQ(done.step(), 60);
  ASSERT_EQ(done.ranks_size(), 2);
  EXPECT_EQ(done.ranks(0).worker_id(), "worker:0");
  EXPECT_EQ(done.ranks(1).worker_id(), "spare:0");
  ExpectAllRanks(done, reference);

  const v1::JobEvent* replaced = FindEvent(done, "rank_replaced");
  ASSERT_NE(replaced, nullptr);
  EXPECT_THAT(replaced->message(),
              AllOf(HasSubstr("spare spare:0"), HasSubstr("took rank 1"),
                    HasSubstr("after worker:1 failed")));
  const v1::JobEvent* resumed = FindEvent(done, "resumed");
  ASSERT_NE(resumed, nullptr);
  EXPECT_THAT(resumed->message(), HasSubstr("0 steps repeated"));
  EXPECT_TRUE(Alive(worker_pids_[0]));

  // `lockstep workers` shows each worker's role: the spare task is one,
  // whether or not it holds a rank.
  Result workers = RunCommand({kBin + "/lockstep", "workers"},
                              {"LOCKSTEP_COORDINATOR=" + address_});
  ASSERT_EQ(workers.code, 0) << workers.err;
  EXPECT_THAT(workers.out, AllOf(HasSubstr("ROLE"), HasSubstr("spare:0"),
                                 HasSubstr("spare ")));
}

// `lockstep local --spares 1`: a worker with a rank is killed; the spare
// takes its rank and the restarted worker stands by, so there is no third
// generation.
TEST(LocalSpareTest, SpareTakesTheRankOfAKilledWorker) {
  std::vector<std::string> run = LocalMlpRun();
  Result reference = RunCommand(run);
  ASSERT_EQ(reference.code, 0) << reference.err;

  run.insert(run.begin() + 4, {"--spares", "1"});
  Result killed = RunAndKillAWorker(run);
  ASSERT_EQ(killed.code, 0) << killed.err;
  EXPECT_THAT(killed.err, AllOf(HasSubstr("2 workers + 1 spare "),
                                HasSubstr("rank_replaced: spare free:"),
                                HasSubstr("restarting it")));
  const auto summary = LastJsonLine(killed.out).fields();
  EXPECT_EQ(summary.at("state").string_value(), "succeeded");
  EXPECT_EQ(summary.at("generations").number_value(), 2);
  EXPECT_EQ(
      summary.at("model_digest").string_value(),
      LastJsonLine(reference.out).fields().at("model_digest").string_value());
}

}  // namespace
}  // namespace lockstep::integration
