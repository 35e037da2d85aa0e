// A worker process dying at each failure point of the save and commit path
// (LOCKSTEP_FAILPOINT) loses nothing: LATEST still names a complete
// checkpoint and the job ends with the model of a run that never failed.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "tests/integration/harness.h"

namespace lockstep::integration {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// A process dying at each point of the save and commit path leaves LATEST
// naming a complete checkpoint, and the job still ends with the model of a
// run that never failed.
class FailurePointTest
    : public CheckpointTest,
      public ::testing::WithParamInterface<std::pair<const char*, int>> {};

TEST_P(FailurePointTest, DyingInTheSavePathLosesNothing) {
  const auto [point, victim] = GetParam();
  // The failure point fires at the second save, after the first committed.
  // The reference run saves nothing, so it never reaches the point.
  StartCluster(2, {},
               {{victim, {absl::StrCat("LOCKSTEP_FAILPOINT=", point, ":2")}}});
  std::string reference = UninterruptedDigest(kCheckpointJob);
  std::string job = Submit(WithCheckpoints(kCheckpointJob, 10));
  int status = 0;
  ASSERT_EQ(waitpid(worker_pids_[victim], &status, 0), worker_pids_[victim]);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
      << "the failure point " << point << " was not reached";
  StartWorker(victim);
  v1::JobStatus done = WatchUntil(job, Ended);
  ASSERT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << done.error();
  EXPECT_GE(done.generations(), 2);
  ExpectAllRanks(done, reference);
  ExpectLatestVerifies(job);
  // Every save after the failure committed again.
  ASSERT_GT(done.checkpoints_size(), 0);
  EXPECT_EQ(done.checkpoints(done.checkpoints_size() - 1).step(), 50);
}

INSTANTIATE_TEST_SUITE_P(
    Points, FailurePointTest,
    ::testing::Values(std::pair{"checkpoint_before_prepare", 1},
                      std::pair{"checkpoint_after_first_file", 0},
                      std::pair{"checkpoint_before_commit", 0},
                      std::pair{"checkpoint_during_rename", 0},
                      std::pair{"checkpoint_before_latest", 0}),
    [](const auto& info) { return std::string(info.param.first); });

}  // namespace
}  // namespace lockstep::integration
