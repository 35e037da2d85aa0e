// Unit tests of the pieces the Coordinator calls under its lock: one
// generation (fence, key-value store, reports), the checkpoint
// commit tally, and the account of a final save in the job status.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "coordinator/checkpoint_tally.h"
#include "coordinator/generation.h"
#include "coordinator/job_status.h"

namespace lockstep::coordinator {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

Generation Two(int64_t number = 4) {
  return Generation("job-1", number, {"worker:0", "worker:1"});
}

TEST(GenerationTest, AdmitsOnlyItsOwnNumberWhileLive) {
  Generation generation = Two();
  EXPECT_EQ(generation.world_size(), 2);
  EXPECT_TRUE(generation.Admits(4));
  EXPECT_FALSE(generation.Admits(3));
  EXPECT_FALSE(generation.Admits(5));
  generation.End();
  EXPECT_TRUE(generation.ended());
  EXPECT_FALSE(generation.Admits(4));
  EXPECT_THAT(generation.rank_workers(), ElementsAre("worker:0", "worker:1"));
}

TEST(GenerationTest, KeyValueStore) {
  Generation generation = Two();
  EXPECT_EQ(generation.Get("k"), nullptr);
  ASSERT_TRUE(generation.Set("k", "v1").ok());
  ASSERT_TRUE(generation.Set("k", "v2").ok());
  ASSERT_NE(generation.Get("k"), nullptr);
  EXPECT_EQ(*generation.Get("k"), "v2");
}

TEST(GenerationTest, AnEndedGenerationDropsWhatNoOneMayRead) {
  Generation generation = Two();
  ASSERT_TRUE(generation.Set("k", "v").ok());
  generation.End();
  EXPECT_EQ(generation.Get("k"), nullptr);
  EXPECT_EQ(generation.kv_entries(), 0);
  EXPECT_EQ(generation.kv_bytes(), 0);
}

TEST(GenerationTest, ResultsCountToTheWorldSizeOncePerRank) {
  Generation generation = Two();
  EXPECT_FALSE(generation.AddOkResult(1, "d", 40));
  EXPECT_FALSE(generation.AddOkResult(1, "d", 40));  // twice counts once
  EXPECT_TRUE(generation.AddOkResult(0, "d", 40));
  EXPECT_EQ(generation.Disagreement(), "");
}

// One rank with a forged digest, or at another step, is named with where
// every rank ended.
TEST(GenerationTest, ADisagreementNamesTheRanks) {
  Generation generation = Two();
  generation.AddOkResult(0, "real-digest", 40);
  generation.AddOkResult(1, "forged-digest-0000", 999999);
  EXPECT_EQ(generation.Disagreement(),
            "rank 0: step 40, digest real-digest; rank 1: step 999999, digest "
            "forged-digest-0000");
}

TEST(GenerationTest, OnlyTheFirstSuspectCountsAndIsDueAtItsDeadline) {
  Generation generation = Two();
  absl::Time t0 = absl::UnixEpoch();
  EXPECT_FALSE(generation.SuspectDue(absl::InfiniteFuture()));
  generation.Suspect("rank 0 failed: reset", t0 + absl::Seconds(1));
  generation.Suspect("rank 1 failed: reset", t0 + absl::Seconds(9));
  EXPECT_EQ(generation.suspect(), "rank 0 failed: reset");
  EXPECT_FALSE(generation.SuspectDue(t0 + absl::Milliseconds(999)));
  EXPECT_TRUE(generation.SuspectDue(t0 + absl::Seconds(1)));
}

TEST(GenerationTest, OnePreemptionAtATime) {
  Generation generation = Two();
  EXPECT_FALSE(generation.preempting());
  EXPECT_TRUE(generation.StartPreemption("SIGTERM"));
  EXPECT_FALSE(generation.StartPreemption("again"));
  EXPECT_TRUE(generation.preempting());
  EXPECT_EQ(generation.preempt_reason(), "SIGTERM");
}

// ---- the checkpoint tally ---------------------------------------------------

v1::CheckpointPrepared Prepare(int rank, int64_t step, bool ok = true) {
  v1::CheckpointPrepared p;
  p.set_job_id("job-1");
  p.set_generation(4);
  p.set_rank(rank);
  p.set_step(step);
  p.set_ok(ok);
  if (!ok) p.set_error("disk full");
  p.set_dir(absl::StrCat("rank-", rank));
  return p;
}

TEST(CheckpointTallyTest, CommitsOnceEveryRankPreparedInRankOrder) {
  CheckpointTally tally(3);
  EXPECT_FALSE(tally.Prepare(Prepare(2, 10)).has_value());
  EXPECT_FALSE(tally.Prepare(Prepare(0, 10)).has_value());
  EXPECT_FALSE(tally.Prepare(Prepare(0, 10)).has_value());  // a repeat
  auto commit = tally.Prepare(Prepare(1, 10));
  ASSERT_TRUE(commit.has_value());
  EXPECT_EQ(commit->job_id(), "job-1");
  EXPECT_EQ(commit->generation(), 4);
  EXPECT_EQ(commit->step(), 10);
  EXPECT_EQ(commit->abandoned(), "");
  ASSERT_EQ(commit->ranks_size(), 3);
  EXPECT_EQ(commit->ranks(0).dir(), "rank-0");
  EXPECT_EQ(commit->ranks(2).dir(), "rank-2");
  EXPECT_EQ(tally.FailureOf(10), "");
}

TEST(CheckpointTallyTest, AFailedPrepareAbandonsTheStepForGood) {
  CheckpointTally tally(2);
  EXPECT_FALSE(tally.Prepare(Prepare(0, 10)).has_value());
  auto abandoned = tally.Prepare(Prepare(1, 10, /*ok=*/false));
  ASSERT_TRUE(abandoned.has_value());
  EXPECT_EQ(abandoned->abandoned(), "disk full");
  EXPECT_EQ(abandoned->ranks_size(), 0);
  EXPECT_FALSE(tally.Prepare(Prepare(0, 10)).has_value());
  EXPECT_FALSE(tally.Prepare(Prepare(1, 10)).has_value());
  EXPECT_FALSE(tally.Prepare(Prepare(1, 10, /*ok=*/false)).has_value());
  EXPECT_EQ(tally.FailureOf(10), "rank 1 could not prepare it: disk full");
  EXPECT_EQ(tally.FailureOf(20), "");
}

TEST(CheckpointTallyTest, ACompleteStepDropsOlderIncompleteOnes) {
  CheckpointTally tally(2);
  EXPECT_FALSE(tally.Prepare(Prepare(0, 10)).has_value());
  EXPECT_FALSE(tally.Prepare(Prepare(0, 20)).has_value());
  EXPECT_TRUE(tally.Prepare(Prepare(1, 20)).has_value());
  // Rank 0's prepare of step 10 was dropped with the commit of step 20.
  EXPECT_FALSE(tally.Prepare(Prepare(1, 10)).has_value());
}

// The commit latency the metrics observe runs from the step's first
// prepare in this generation to the chief's commit.
TEST(CheckpointTallyTest, ACommitsLatencyRunsFromItsFirstPrepare) {
  const absl::Time t0 = absl::FromUnixSeconds(1000);
  CheckpointTally tally(2);
  EXPECT_FALSE(tally.Prepare(Prepare(1, 10), t0).has_value());
  EXPECT_TRUE(tally.Prepare(Prepare(0, 10), t0 + absl::Seconds(1)).has_value());
  v1::CheckpointCommitted committed;
  committed.set_step(10);
  committed.set_ok(true);
  EXPECT_EQ(tally.Committed(committed, t0 + absl::Seconds(3)),
            absl::Seconds(3));
  // Counted once; a step never prepared here, or abandoned, has none.
  EXPECT_EQ(tally.Committed(committed, t0 + absl::Seconds(4)), std::nullopt);
  EXPECT_FALSE(tally.Prepare(Prepare(0, 20), t0).has_value());
  EXPECT_TRUE(tally.Prepare(Prepare(1, 20, /*ok=*/false), t0).has_value());
  committed.set_step(20);
  EXPECT_EQ(tally.Committed(committed, t0 + absl::Seconds(5)), std::nullopt);
  // A failed commit has no latency.
  EXPECT_FALSE(tally.Prepare(Prepare(0, 30), t0).has_value());
  EXPECT_TRUE(tally.Prepare(Prepare(1, 30), t0).has_value());
  committed.set_step(30);
  committed.set_ok(false);
  EXPECT_EQ(tally.Committed(committed, t0 + absl::Seconds(6)), std::nullopt);
}

TEST(CheckpointTallyTest, AFailedCommitIsTheLatestFailure) {
  CheckpointTally tally(1);
  v1::CheckpointCommitted committed;
  committed.set_step(30);
  committed.set_ok(false);
  committed.set_error("rename failed");
  tally.Committed(committed);
  EXPECT_EQ(tally.FailureOf(30),
            "the chief could not commit it: rename failed");
  committed.set_step(40);
  committed.set_ok(true);
  tally.Committed(committed);
  EXPECT_EQ(tally.FailureOf(30),
            "the chief could not commit it: rename failed");
  EXPECT_EQ(tally.FailureOf(40), "");
}

TEST(CheckpointTallyTest, AStopSaveFailureFromAResultNamesTheRank) {
  CheckpointTally tally(2);
  tally.StopSaveFailed(50, "rank 1: no space left on device");
  EXPECT_EQ(tally.FailureOf(50), "rank 1: no space left on device");
  // A prepare failure of the same step, reported first, is kept.
  CheckpointTally precise(2);
  ASSERT_TRUE(precise.Prepare(Prepare(1, 60, /*ok=*/false)).has_value());
  precise.StopSaveFailed(60, "rank 1: disk full");
  EXPECT_EQ(precise.FailureOf(60), "rank 1 could not prepare it: disk full");
}

// ---- the account of a final save ------------------------------------------

v1::JobStatus WithCheckpoints(std::initializer_list<int64_t> steps) {
  v1::JobStatus status;
  status.mutable_spec()->mutable_checkpoint()->set_backup_dir("/shared");
  status.set_total_steps(1000);
  for (int64_t step : steps) {
    v1::CheckpointInfo* info = status.add_checkpoints();
    info->set_step(step);
    info->set_name(absl::StrCat("ckpt-", step));
  }
  return status;
}

TEST(FinalSaveTest, NothingToSayWithoutCheckpoints) {
  EXPECT_EQ(FinalSave(v1::JobStatus(), 120, ""), "");
}

TEST(FinalSaveTest, NamesTheCheckpointOfTheStep) {
  EXPECT_EQ(FinalSave(WithCheckpoints({100, 120}), 120, ""),
            "saved as ckpt-120");
}

TEST(FinalSaveTest, AFailedSaveNamesTheNewestCheckpointInstead) {
  EXPECT_EQ(FinalSave(WithCheckpoints({100, 60}), 120, "rank 1: disk full"),
            "its final save at step 120 failed (rank 1: disk full); the "
            "newest checkpoint is ckpt-100 (step 100)");
  EXPECT_THAT(FinalSave(WithCheckpoints({}), 120, ""),
              AllOf(HasSubstr("no checkpoint of that step was committed"),
                    HasSubstr("no checkpoint of this job was committed")));
}

TEST(FinalSaveTest, TheLastStepIsNotSaved) {
  EXPECT_EQ(FinalSave(WithCheckpoints({900}), 1000, ""),
            "step 1000 is the last one and is not saved");
}

}  // namespace
}  // namespace lockstep::coordinator
