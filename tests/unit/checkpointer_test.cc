// One rank's side of a save (Checkpointer) with the test as coordinator:
// the prepare it reports, the commit it waits for on the chief, the files
// it leaves in backup_dir, and how each failure ends. Messages go up a
// FakeSession; no process, no network.
#include "worker/checkpoint/checkpointer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/files.h"
#include "tests/fakes/fake_control_plane.h"
#include "checkpoint/store.h"

namespace lockstep::worker {
namespace {

using ::lockstep::fakes::FakeSession;
using ::testing::AllOf;
using ::testing::HasSubstr;

std::string TempDir() {
  std::string tmpl = ::testing::TempDir() + "checkpointer_XXXXXX";
  return mkdtemp(tmpl.data());
}

// The test plays the coordinator of a 2-rank generation: the rank under
// test is `rank`; the other rank's prepare is written with the store.
class CheckpointerTest : public ::testing::Test {
 protected:
  void SetUp() override { backup_ = TempDir() + "/backups"; }

  // The context of rank `rank` in generation 3 of job-1, whose messages
  // go up `session_`.
  std::unique_ptr<TaskContext> Task(int rank) {
    auto task = std::make_unique<TaskContext>();
    task->assignment.set_job_id("job-1");
    task->assignment.set_generation(3);
    task->assignment.set_rank(rank);
    task->assignment.set_world_size(2);
    task->host = "10.0.0.7";
    task->send = [session = session_](const v1::WorkerMessage& message) {
      session->Send(message);
    };
    return task;
  }

  static Snapshot SnapshotOf(int rank, int64_t step) {
    Snapshot snapshot;
    snapshot.step = step;
    snapshot.epoch = 2;
    snapshot.files.emplace_back(checkpoint::RankStateName(rank),
                                absl::StrCat("rank ", rank, " step ", step));
    if (rank == 0) {
      snapshot.files.emplace_back("model.pt", std::string(1000, 'm'));
      snapshot.manifest.set_job_id("job-1");
      snapshot.manifest.set_step(step);
      snapshot.manifest.set_epoch(2);
      snapshot.manifest.set_world_size(2);
    }
    return snapshot;
  }

  // Waits for the prepare of `step` that `rank` sent up.
  v1::CheckpointPrepared WaitForPrepared(int rank, int64_t step) {
    auto message = session_->WaitForMessage([&](const v1::WorkerMessage& m) {
      return m.has_prepared() && m.prepared().rank() == rank &&
             m.prepared().step() == step;
    });
    EXPECT_TRUE(message.has_value()) << "no prepare of step " << step;
    return message.has_value() ? message->prepared() : v1::CheckpointPrepared();
  }

  // Rank 1's part of `step`, prepared as that rank would.
  v1::CheckpointPrepared PrepareOtherRank(int64_t step) {
    Snapshot snapshot = SnapshotOf(1, step);
    auto files = checkpoint::Prepare(backup_, 1, step, snapshot.files);
    EXPECT_TRUE(files.ok()) << files.status();
    v1::CheckpointPrepared prepared;
    prepared.set_rank(1);
    prepared.set_step(step);
    prepared.set_ok(true);
    prepared.set_dir(checkpoint::PrepareDir(1, step));
    for (const v1::CheckpointFile& file :
         files.value_or(std::vector<v1::CheckpointFile>{})) {
      *prepared.add_files() = file;
    }
    return prepared;
  }

  // The coordinator's go-ahead: every rank prepared `step`.
  static v1::CommitCheckpoint Commit(
      int64_t step, const std::vector<v1::CheckpointPrepared>& ranks) {
    v1::CommitCheckpoint commit;
    commit.set_job_id("job-1");
    commit.set_generation(3);
    commit.set_step(step);
    for (const v1::CheckpointPrepared& rank : ranks) *commit.add_ranks() = rank;
    return commit;
  }

  // The commit reports sent up so far.
  int CountCommitted() const {
    int count = 0;
    for (const v1::WorkerMessage& message : session_->messages()) {
      count += message.has_committed();
    }
    return count;
  }

  std::string backup_;
  std::shared_ptr<FakeSession> session_ =
      std::make_shared<FakeSession>("worker:0", 1);
};

TEST_F(CheckpointerTest, RankPreparesItsFilesAndReportsThem) {
  auto task = Task(/*rank=*/1);
  Checkpointer checkpointer(*task, backup_, /*keep=*/2);
  checkpointer.SaveAsync(SnapshotOf(1, 10));
  ASSERT_TRUE(checkpointer.Wait().ok());

  v1::CheckpointPrepared prepared = WaitForPrepared(1, 10);
  EXPECT_TRUE(prepared.ok()) << prepared.error();
  EXPECT_EQ(prepared.job_id(), "job-1");
  EXPECT_EQ(prepared.generation(), 3);
  EXPECT_EQ(prepared.dir(), checkpoint::PrepareDir(1, 10));
  ASSERT_EQ(prepared.files_size(), 1);
  EXPECT_EQ(prepared.files(0).name(), "rank-00001.state");
  EXPECT_EQ(prepared.files(0).size(), 14);
  EXPECT_EQ(
      ReadFileToString(backup_ + "/" + prepared.dir() + "/rank-00001.state")
          .value_or(""),
      "rank 1 step 10");
  // Only the chief commits.
  EXPECT_EQ(CountCommitted(), 0);
  EXPECT_FALSE(PathExists(backup_ + "/LATEST"));
}

TEST_F(CheckpointerTest, ChiefCommitsOnTheCoordinatorsWord) {
  auto task = Task(/*rank=*/0);
  Checkpointer checkpointer(*task, backup_, /*keep=*/2);
  checkpointer.SaveAsync(SnapshotOf(0, 10));
  v1::CheckpointPrepared chief = WaitForPrepared(0, 10);
  ASSERT_TRUE(chief.ok()) << chief.error();
  EXPECT_EQ(CountCommitted(), 0);  // waits for the coordinator
  task->DeliverCommit(Commit(10, {chief, PrepareOtherRank(10)}));
  ASSERT_TRUE(checkpointer.Wait().ok());

  auto committed = session_->WaitForMessage(
      [](const v1::WorkerMessage& m) { return m.has_committed(); });
  ASSERT_TRUE(committed.has_value());
  EXPECT_TRUE(committed->committed().ok()) << committed->committed().error();
  EXPECT_EQ(committed->committed().name(), "ckpt-000000010");
  EXPECT_EQ(committed->committed().step(), 10);
  EXPECT_EQ(committed->committed().epoch(), 2);
  EXPECT_EQ(committed->committed().generation(), 3);
  EXPECT_GT(committed->committed().bytes(), 1000);

  EXPECT_EQ(checkpoint::ReadLatest(backup_).value_or(""), "ckpt-000000010");
  auto manifest = checkpoint::Verify(backup_ + "/ckpt-000000010");
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_EQ(manifest->step(), 10);
  EXPECT_GT(manifest->time(), 0);
  std::vector<std::string> names;
  for (const v1::CheckpointFile& file : manifest->files()) {
    names.push_back(file.name());
  }
  EXPECT_THAT(names, ::testing::UnorderedElementsAre(
                         "rank-00000.state", "model.pt", "rank-00001.state"));
}

TEST_F(CheckpointerTest, EachSaveWaitsForTheOneBeforeAndOldOnesArePruned) {
  auto task = Task(/*rank=*/0);
  Checkpointer checkpointer(*task, backup_, /*keep=*/1);
  for (int64_t step : {10, 20}) {
    checkpointer.SaveAsync(SnapshotOf(0, step));  // joins the save before
    v1::CheckpointPrepared chief = WaitForPrepared(0, step);
    task->DeliverCommit(Commit(step, {chief, PrepareOtherRank(step)}));
  }
  ASSERT_TRUE(checkpointer.Wait().ok());
  EXPECT_EQ(CountCommitted(), 2);
  auto listed = checkpoint::List(backup_);
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].name, "ckpt-000000020");
  EXPECT_TRUE((*listed)[0].verified.ok());
}

TEST_F(CheckpointerTest, RankThatCannotWriteReportsWhyAndGoesOn) {
  // The temporary folder cannot be created: a file is in its way.
  ASSERT_TRUE(MakeDirectories(backup_).ok());
  ASSERT_TRUE(WriteFileAtomically(backup_ + "/.tmp", "in the way").ok());
  auto task = Task(/*rank=*/1);
  Checkpointer checkpointer(*task, backup_, /*keep=*/2);
  checkpointer.SaveAsync(SnapshotOf(1, 10));
  absl::Status saved = checkpointer.Wait();
  EXPECT_FALSE(saved.ok());

  v1::CheckpointPrepared prepared = WaitForPrepared(1, 10);
  EXPECT_FALSE(prepared.ok());
  EXPECT_THAT(prepared.error(),
              AllOf(HasSubstr("rank 1 on 10.0.0.7"),
                    HasSubstr("could not write its part"), HasSubstr(".tmp")));
  EXPECT_EQ(prepared.files_size(), 0);
}

TEST_F(CheckpointerTest, ChiefThatCannotWriteDoesNotWaitForACommit) {
  ASSERT_TRUE(MakeDirectories(backup_).ok());
  ASSERT_TRUE(WriteFileAtomically(backup_ + "/.tmp", "in the way").ok());
  auto task = Task(/*rank=*/0);
  Checkpointer checkpointer(*task, backup_, /*keep=*/2);
  checkpointer.SaveAsync(SnapshotOf(0, 10));
  EXPECT_FALSE(checkpointer.Wait().ok());  // returns without a commit
  EXPECT_FALSE(WaitForPrepared(0, 10).ok());
  EXPECT_EQ(CountCommitted(), 0);
}

TEST_F(CheckpointerTest, AbandonedStepIsDroppedWithoutAReport) {
  auto task = Task(/*rank=*/0);
  Checkpointer checkpointer(*task, backup_, /*keep=*/2);
  checkpointer.SaveAsync(SnapshotOf(0, 10));
  WaitForPrepared(0, 10);
  v1::CommitCheckpoint commit = Commit(10, {});
  commit.set_abandoned("rank 1 on 10.0.0.8 could not write its part");
  task->DeliverCommit(commit);
  absl::Status saved = checkpointer.Wait();
  EXPECT_TRUE(absl::IsAborted(saved)) << saved;
  EXPECT_THAT(saved.message(), HasSubstr("rank 1 on 10.0.0.8"));
  // The rank that could not prepare reported it; the chief adds nothing.
  EXPECT_EQ(CountCommitted(), 0);
  EXPECT_FALSE(PathExists(backup_ + "/LATEST"));
}

TEST_F(CheckpointerTest, CommitThatFailsIsReportedAndLatestStays) {
  auto task = Task(/*rank=*/0);
  Checkpointer checkpointer(*task, backup_, /*keep=*/2);
  checkpointer.SaveAsync(SnapshotOf(0, 10));
  v1::CheckpointPrepared chief = WaitForPrepared(0, 10);
  // Rank 1 reports a file it never wrote.
  v1::CheckpointPrepared other = PrepareOtherRank(10);
  other.mutable_files(0)->set_name("missing.state");
  task->DeliverCommit(Commit(10, {chief, other}));
  EXPECT_FALSE(checkpointer.Wait().ok());

  auto committed = session_->WaitForMessage(
      [](const v1::WorkerMessage& m) { return m.has_committed(); });
  ASSERT_TRUE(committed.has_value());
  EXPECT_FALSE(committed->committed().ok());
  EXPECT_THAT(committed->committed().error(), HasSubstr("missing.state"));
  EXPECT_FALSE(PathExists(backup_ + "/LATEST"));
  EXPECT_FALSE(PathExists(backup_ + "/ckpt-000000010"));
}

TEST_F(CheckpointerTest, EndOfTheGenerationReleasesTheChief) {
  auto task = Task(/*rank=*/0);
  Checkpointer checkpointer(*task, backup_, /*keep=*/2);
  checkpointer.SaveAsync(SnapshotOf(0, 10));
  WaitForPrepared(0, 10);
  task->Abort();
  absl::Status saved = checkpointer.Wait();
  EXPECT_TRUE(absl::IsAborted(saved)) << saved;
  // No one is left to report to.
  EXPECT_EQ(CountCommitted(), 0);
  EXPECT_FALSE(PathExists(backup_ + "/LATEST"));
}

TEST_F(CheckpointerTest, DestroyingTheCheckpointerGivesUpTheCommitWait) {
  auto task = Task(/*rank=*/0);
  {
    Checkpointer checkpointer(*task, backup_, /*keep=*/2);
    checkpointer.SaveAsync(SnapshotOf(0, 10));
    WaitForPrepared(0, 10);
  }  // returns without a commit
  EXPECT_EQ(CountCommitted(), 0);
  EXPECT_FALSE(PathExists(backup_ + "/LATEST"));
  // A commit arriving after is for no one.
  EXPECT_TRUE(absl::IsCancelled(
      task->WaitForCommit(10, absl::ZeroDuration()).status()));
}

}  // namespace
}  // namespace lockstep::worker
