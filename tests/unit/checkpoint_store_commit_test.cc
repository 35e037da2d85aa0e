// Writing checkpoints: names, the prepare and commit phases, the commits that
// must be refused or replace a step, and the JSON of the state files.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <vector>

#include "checkpoint/store.h"
#include "common/sha256.h"
#include "tests/unit/checkpoint_store_fixture.h"

namespace lockstep::checkpoint {
namespace {

namespace fs = std::filesystem;

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

TEST(CheckpointNamesTest, NamesArePaddedAndRelative) {
  EXPECT_EQ(CheckpointName(1200), "ckpt-000001200");
  EXPECT_EQ(PrepareDir(1, 1200), ".tmp/worker-00001/ckpt-000001200");
  EXPECT_EQ(RankStateName(3), "rank-00003.state");
}

TEST_F(CheckpointStoreTest, PrepareAndCommitMakeAVerifiedCheckpoint) {
  auto bytes = Save(20, /*epoch=*/1);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  const std::string ckpt = CheckpointDir(20);
  EXPECT_TRUE(fs::exists(ckpt + "/" + kManifestName));
  auto latest = ReadLatest(dir_);
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(*latest, "ckpt-000000020");

  auto manifest = Verify(ckpt);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_EQ(manifest->format_version(), kFormatVersion);
  EXPECT_EQ(manifest->step(), 20);
  EXPECT_EQ(manifest->epoch(), 1);
  EXPECT_EQ(manifest->world_size(), kWorldSize);
  EXPECT_EQ(manifest->job_id(), "test-1");

  std::vector<NamedFile> expected = FilesOfRank(0, 20);
  for (const NamedFile& file : FilesOfRank(1, 20)) expected.push_back(file);
  ASSERT_EQ(manifest->files_size(), static_cast<int>(expected.size()));
  int64_t total = 0;
  for (int i = 0; i < manifest->files_size(); ++i) {
    const v1::CheckpointFile& file = manifest->files(i);
    const auto& [name, contents] = expected[i];
    EXPECT_EQ(file.name(), name);
    EXPECT_EQ(file.size(), static_cast<int64_t>(contents.size())) << name;
    EXPECT_EQ(file.sha256(), Sha256Hex(contents).value()) << name;
    EXPECT_EQ(ReadAll(ckpt + "/" + name), contents) << name;
    total += file.size();
  }
  // The bytes committed: the files and the manifest.
  EXPECT_EQ(*bytes, total + static_cast<int64_t>(
                                fs::file_size(ckpt + "/" + kManifestName)));

  // The prepared files moved out of the temporary folders.
  for (int rank = 0; rank < kWorldSize; ++rank) {
    const std::string prepared = dir_ + "/" + PrepareDir(rank, 20);
    for (const NamedFile& file : FilesOfRank(rank, 20)) {
      EXPECT_FALSE(fs::exists(prepared + "/" + file.first)) << file.first;
    }
  }

  auto listed = List(dir_);
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].name, "ckpt-000000020");
  EXPECT_EQ((*listed)[0].step, 20);
  EXPECT_TRUE((*listed)[0].verified.ok()) << (*listed)[0].verified;
}

TEST_F(CheckpointStoreTest, PrepareReplacesAnEarlierAttempt) {
  ASSERT_TRUE(Prepare(dir_, 0, 20, {{"stale.pt", "old"}}).ok());
  auto files = Prepare(dir_, 0, 20, FilesOfRank(0, 20));
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_FALSE(fs::exists(dir_ + "/" + PrepareDir(0, 20) + "/stale.pt"));
  EXPECT_EQ(files->size(), 4u);
}

// ---- Commit -----------------------------------------------------------------

TEST_F(CheckpointStoreTest, CommitOfAnExistingStepReplacesIt) {
  ASSERT_TRUE(Save(20, /*epoch=*/0, /*variant=*/0).ok());
  auto again = Save(20, /*epoch=*/3, /*variant=*/1);
  ASSERT_TRUE(again.ok()) << again.status();
  auto manifest = Verify(CheckpointDir(20));
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_EQ(manifest->epoch(), 3);
  EXPECT_EQ(ReadAll(CheckpointDir(20) + "/model.pt"),
            FilesOfRank(0, 20, 1)[0].second);
  EXPECT_EQ(*ReadLatest(dir_), "ckpt-000000020");
  EXPECT_THAT(CheckpointFolders(), ElementsAre("ckpt-000000020"));
}

// A commit cut short after replacing an existing step (e.g. killed before
// LATEST) leaves .tmp/ckpt-<step>.replaced behind; the replayed commit must
// still be able to replace the step: Commit removes an earlier .replaced
// folder first, since rename(2) of a folder onto a non-empty one fails.
TEST_F(CheckpointStoreTest, CommitReplacesAStepASecondTime) {
  ASSERT_TRUE(Save(20, /*epoch=*/0, /*variant=*/0).ok());
  ASSERT_TRUE(Save(20, /*epoch=*/1, /*variant=*/1).ok());
  auto third = Save(20, /*epoch=*/2, /*variant=*/2);
  EXPECT_TRUE(third.ok()) << third.status();
  auto manifest = Verify(CheckpointDir(20));
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_EQ(manifest->epoch(), 2);
}

TEST_F(CheckpointStoreTest, CommitRefusesADuplicateFileName) {
  ASSERT_TRUE(Save(10).ok());
  std::vector<PreparedPart> parts;
  auto rank0 = Prepare(dir_, 0, 20, FilesOfRank(0, 20));
  auto rank1 = Prepare(dir_, 1, 20, {{"model.pt", "another model"}});
  ASSERT_TRUE(rank0.ok() && rank1.ok());
  parts.push_back(PreparedPart{PrepareDir(0, 20), *rank0});
  parts.push_back(PreparedPart{PrepareDir(1, 20), *rank1});
  auto committed = Commit(dir_, ManifestOf(20, 0), parts);
  EXPECT_EQ(committed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(committed.status().message(),
              AllOf(HasSubstr("\"model.pt\""), HasSubstr(PrepareDir(1, 20))));
  EXPECT_EQ(*ReadLatest(dir_), "ckpt-000000010");
  EXPECT_FALSE(fs::exists(CheckpointDir(20)));
  EXPECT_TRUE(Verify(CheckpointDir(10)).ok());
}

TEST_F(CheckpointStoreTest, CommitRefusesANameWithASlash) {
  ASSERT_TRUE(Save(10).ok());
  std::vector<PreparedPart> parts = PrepareBoth(20);
  ASSERT_EQ(parts.size(), 2u);
  v1::CheckpointFile evil = parts[1].files[0];
  evil.set_name("../escape.state");
  parts[1].files.insert(parts[1].files.begin(), evil);
  auto committed = Commit(dir_, ManifestOf(20, 0), parts);
  EXPECT_EQ(committed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(committed.status().message(), HasSubstr("../escape.state"));
  EXPECT_EQ(*ReadLatest(dir_), "ckpt-000000010");
  EXPECT_FALSE(fs::exists(CheckpointDir(20)));
}

TEST_F(CheckpointStoreTest, CommitRefusesAFileNamedLikeTheManifest) {
  std::vector<PreparedPart> parts = PrepareBoth(20);
  ASSERT_EQ(parts.size(), 2u);
  parts[0].files[0].set_name(kManifestName);
  auto committed = Commit(dir_, ManifestOf(20, 0), parts);
  EXPECT_EQ(committed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(fs::exists(CheckpointDir(20)));
}

TEST_F(CheckpointStoreTest, CommitRefusesAFileThatChangedSizeAfterPrepare) {
  ASSERT_TRUE(Save(10).ok());
  std::vector<PreparedPart> parts = PrepareBoth(20);
  ASSERT_EQ(parts.size(), 2u);
  AppendByte(dir_ + "/" + PrepareDir(1, 20) + "/" + RankStateName(1));
  auto committed = Commit(dir_, ManifestOf(20, 0), parts);
  EXPECT_EQ(committed.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(committed.status().message(),
              AllOf(HasSubstr(RankStateName(1)), HasSubstr("were prepared")));
  EXPECT_EQ(*ReadLatest(dir_), "ckpt-000000010");
  EXPECT_FALSE(fs::exists(CheckpointDir(20)));
  EXPECT_TRUE(Verify(CheckpointDir(10)).ok());
  Skipped skipped;
  auto found = FindNewest(dir_, skipped.Callback());
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->manifest.step(), 10);
  EXPECT_THAT(skipped.entries, IsEmpty());
}

TEST_F(CheckpointStoreTest, CommitOfAMissingPreparedFileFails) {
  ASSERT_TRUE(Save(10).ok());
  std::vector<PreparedPart> parts = PrepareBoth(20);
  ASSERT_EQ(parts.size(), 2u);
  fs::remove(dir_ + "/" + PrepareDir(0, 20) + "/optimizer.pt");
  auto committed = Commit(dir_, ManifestOf(20, 0), parts);
  EXPECT_FALSE(committed.ok());
  EXPECT_THAT(committed.status().message(), HasSubstr("optimizer.pt"));
  EXPECT_EQ(*ReadLatest(dir_), "ckpt-000000010");
  EXPECT_FALSE(fs::exists(CheckpointDir(20)));
}

// ---- JSON -------------------------------------------------------------------

TEST(CheckpointJsonTest, TrainerStateRoundTrips) {
  v1::TrainerState state;
  state.set_step(1200);
  state.set_epoch(3);
  state.set_global_batch_size(64);
  state.set_samples_seen(76800);
  state.set_next_lr(0.0125);
  state.set_loss_scale(1.0);
  state.set_model("mlp");
  state.set_seed(18446744073709551615ull);
  std::string json = ToJson(state);
  EXPECT_THAT(json, HasSubstr("\"samples_seen\""));  // proto field names
  v1::TrainerState back;
  ASSERT_TRUE(FromJson(json, "trainer.state", &back).ok());
  EXPECT_EQ(back.SerializeAsString(), state.SerializeAsString());
}

TEST(CheckpointJsonTest, DefaultFieldsArePrintedAndRoundTrip) {
  v1::RankState state;  // all zero
  std::string json = ToJson(state);
  EXPECT_THAT(json, HasSubstr("\"epoch_position\""));
  v1::RankState back;
  ASSERT_TRUE(FromJson(json, "rank-00000.state", &back).ok());
  EXPECT_EQ(back.SerializeAsString(), state.SerializeAsString());
}

TEST(CheckpointJsonTest, GarbageIsDataLossNamingTheOrigin) {
  v1::TrainerState state;
  absl::Status status =
      FromJson("{\"step\": 12", "ckpt-1/trainer.state", &state);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(), HasSubstr("ckpt-1/trainer.state"));
  status = FromJson("not json at all", "rank-00001.state", &state);
  EXPECT_EQ(status.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(status.message(), HasSubstr("rank-00001.state"));
}

TEST(CheckpointJsonTest, UnknownFieldsAreIgnored) {
  v1::TrainerState state;
  ASSERT_TRUE(FromJson(R"({"step": "5", "written_by": "a newer lockstep"})",
                       "x", &state)
                  .ok());
  EXPECT_EQ(state.step(), 5);
}

}  // namespace
}  // namespace lockstep::checkpoint
