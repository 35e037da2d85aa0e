// Reading back and cleaning up a backup_dir: List, Verify against every kind
// of corruption, FindNewest, Prune and RemoveAll.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <set>
#include <string>

#include "absl/strings/str_cat.h"
#include "tests/unit/checkpoint_store_fixture.h"
#include "checkpoint/store.h"

namespace lockstep::checkpoint {
namespace {

namespace fs = std::filesystem;

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::UnorderedElementsAre;

TEST_F(CheckpointStoreTest, ListIsNewestFirstWithEachVerification) {
  ASSERT_TRUE(Save(10).ok());
  ASSERT_TRUE(Save(30).ok());
  ASSERT_TRUE(Save(20).ok());
  fs::remove(CheckpointDir(20) + "/model.pt");
  auto listed = List(dir_);
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->size(), 3u);
  EXPECT_EQ((*listed)[0].step, 30);
  EXPECT_EQ((*listed)[1].step, 20);
  EXPECT_EQ((*listed)[2].step, 10);
  EXPECT_TRUE((*listed)[0].verified.ok());
  EXPECT_EQ((*listed)[1].verified.code(), absl::StatusCode::kDataLoss);
  EXPECT_TRUE((*listed)[2].verified.ok());
  EXPECT_GT((*listed)[0].bytes, 0);
}

// ---- corruption -------------------------------------------------------------

TEST_F(CheckpointStoreTest, VerifyFindsAMissingFile) {
  ASSERT_TRUE(Save(20).ok());
  fs::remove(CheckpointDir(20) + "/optimizer.pt");
  auto manifest = Verify(CheckpointDir(20));
  EXPECT_EQ(manifest.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(manifest.status().message(),
              AllOf(HasSubstr("optimizer.pt"), HasSubstr("missing")));
}

TEST_F(CheckpointStoreTest, VerifyFindsAWrongSize) {
  ASSERT_TRUE(Save(20).ok());
  AppendByte(CheckpointDir(20) + "/model.pt");
  auto manifest = Verify(CheckpointDir(20));
  EXPECT_EQ(manifest.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(manifest.status().message(),
              AllOf(HasSubstr("model.pt"), HasSubstr("bytes"),
                    HasSubstr("the manifest says")));
}

TEST_F(CheckpointStoreTest, VerifyFindsAFlippedByte) {
  ASSERT_TRUE(Save(20).ok());
  const std::string path = CheckpointDir(20) + "/" + RankStateName(1);
  std::string contents = ReadAll(path);
  ASSERT_FALSE(contents.empty());
  contents[contents.size() / 2] ^= 0x01;
  WriteAll(path, contents);
  auto manifest = Verify(CheckpointDir(20));
  EXPECT_EQ(manifest.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(manifest.status().message(),
              AllOf(HasSubstr("rank-00001.state"), HasSubstr("SHA-256")));
}

TEST_F(CheckpointStoreTest, VerifyFindsATruncatedManifest) {
  ASSERT_TRUE(Save(20).ok());
  const std::string path = CheckpointDir(20) + "/" + kManifestName;
  std::string json = ReadAll(path);
  WriteAll(path, json.substr(0, json.size() / 2));
  auto manifest = Verify(CheckpointDir(20));
  EXPECT_EQ(manifest.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(manifest.status().message(),
              AllOf(HasSubstr(kManifestName), HasSubstr("not valid")));
}

TEST_F(CheckpointStoreTest, VerifyFindsAMissingManifest) {
  ASSERT_TRUE(Save(20).ok());
  fs::remove(CheckpointDir(20) + "/" + kManifestName);
  auto manifest = Verify(CheckpointDir(20));
  EXPECT_EQ(manifest.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(manifest.status().message(),
              AllOf(HasSubstr(kManifestName), HasSubstr("missing")));
}

TEST_F(CheckpointStoreTest, VerifyRefusesANewerFormatVersion) {
  ASSERT_TRUE(Save(20).ok());
  const std::string path = CheckpointDir(20) + "/" + kManifestName;
  v1::Manifest manifest;
  ASSERT_TRUE(FromJson(ReadAll(path), path, &manifest).ok());
  manifest.set_format_version(kFormatVersion + 1);
  WriteAll(path, ToJson(manifest));
  auto verified = Verify(CheckpointDir(20));
  EXPECT_EQ(verified.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(verified.status().message(),
              HasSubstr(absl::StrCat("format version ", kFormatVersion + 1)));
}

TEST_F(CheckpointStoreTest, VerifyRefusesAManifestWithoutFiles) {
  ASSERT_TRUE(Save(20).ok());
  const std::string path = CheckpointDir(20) + "/" + kManifestName;
  v1::Manifest manifest;
  ASSERT_TRUE(FromJson(ReadAll(path), path, &manifest).ok());
  manifest.clear_files();
  WriteAll(path, ToJson(manifest));
  auto verified = Verify(CheckpointDir(20));
  EXPECT_EQ(verified.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(verified.status().message(), HasSubstr("lists no files"));
}

// ---- FindNewest -------------------------------------------------------------

TEST_F(CheckpointStoreTest, FindNewestReturnsTheNewestVerified) {
  ASSERT_TRUE(Save(10).ok());
  ASSERT_TRUE(Save(20).ok());
  Skipped skipped;
  auto found = FindNewest(dir_, skipped.Callback());
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->dir, CheckpointDir(20));
  EXPECT_EQ(found->manifest.step(), 20);
  EXPECT_THAT(skipped.entries, IsEmpty());
}

TEST_F(CheckpointStoreTest, FindNewestSkipsACorruptNewest) {
  ASSERT_TRUE(Save(10).ok());
  ASSERT_TRUE(Save(20).ok());
  AppendByte(CheckpointDir(20) + "/model.pt");
  Skipped skipped;
  auto found = FindNewest(dir_, skipped.Callback());
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->dir, CheckpointDir(10));
  EXPECT_EQ(found->manifest.step(), 10);
  // LATEST names the corrupt one, and the corrupt one itself is skipped.
  EXPECT_THAT(skipped.Names(),
              UnorderedElementsAre(kLatestName, "ckpt-000000020"));
  for (const auto& [name, why] : skipped.entries) {
    EXPECT_EQ(why.code(), absl::StatusCode::kDataLoss) << name;
    if (name == "ckpt-000000020") {
      EXPECT_THAT(why.message(), HasSubstr("model.pt"));
    } else {
      EXPECT_THAT(why.message(), AllOf(HasSubstr("ckpt-000000020"),
                                       HasSubstr("does not verify")));
    }
  }
}

TEST_F(CheckpointStoreTest, FindNewestReportsADanglingLatest) {
  ASSERT_TRUE(Save(10).ok());
  WriteAll(dir_ + "/" + kLatestName, "ckpt-000000099\n");
  Skipped skipped;
  auto found = FindNewest(dir_, skipped.Callback());
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->manifest.step(), 10);
  ASSERT_EQ(skipped.entries.size(), 1u);
  EXPECT_EQ(skipped.entries[0].first, kLatestName);
  EXPECT_EQ(skipped.entries[0].second.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(skipped.entries[0].second.message(),
              AllOf(HasSubstr("ckpt-000000099"), HasSubstr("does not exist")));
}

// A generation start with live state at step 20 looks only at newer
// checkpoints: older ones are not read at all.
TEST_F(CheckpointStoreTest, FindNewestAboveAStepVerifiesOnlyNewerOnes) {
  ASSERT_TRUE(Save(10).ok());
  ASSERT_TRUE(Save(20).ok());
  ASSERT_TRUE(Save(30).ok());
  AppendByte(CheckpointDir(10) + "/model.pt");
  EXPECT_EQ(NewestStep(dir_), 30);
  EXPECT_EQ(NewestStep(dir_ + "/absent"), 0);
  Skipped skipped;
  auto found = FindNewest(dir_, skipped.Callback(), 20);
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->manifest.step(), 30);
  auto none = FindNewest(dir_, skipped.Callback(), 30);
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(none.status().message(), HasSubstr("newer than step 30"));
  EXPECT_THAT(skipped.entries, IsEmpty());
}

TEST_F(CheckpointStoreTest, FindNewestWithNothingIsNotFound) {
  Skipped skipped;
  EXPECT_EQ(FindNewest(dir_, skipped.Callback()).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(FindNewest(dir_ + "/absent", skipped.Callback()).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_THAT(skipped.entries, IsEmpty());
}

TEST_F(CheckpointStoreTest, FindNewestWithOnlyCorruptCheckpointsIsNotFound) {
  ASSERT_TRUE(Save(10).ok());
  fs::remove(CheckpointDir(10) + "/" + kManifestName);
  Skipped skipped;
  auto found = FindNewest(dir_, skipped.Callback());
  EXPECT_EQ(found.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(skipped.Names(),
              UnorderedElementsAre(kLatestName, "ckpt-000000010"));
}

// ---- Prune ------------------------------------------------------------------

TEST_F(CheckpointStoreTest, PruneKeepsTheNewestN) {
  for (int64_t step : {10, 20, 30, 40}) ASSERT_TRUE(Save(step).ok()) << step;
  ASSERT_TRUE(Prune(dir_, 2, 40).ok());
  EXPECT_THAT(CheckpointFolders(),
              ElementsAre("ckpt-000000030", "ckpt-000000040"));
  EXPECT_TRUE(Verify(CheckpointDir(40)).ok());
  EXPECT_TRUE(Verify(CheckpointDir(30)).ok());
}

TEST_F(CheckpointStoreTest, PruneNeverRemovesTheCommittedCheckpoint) {
  for (int64_t step : {10, 20, 30}) ASSERT_TRUE(Save(step).ok()) << step;
  ASSERT_TRUE(Prune(dir_, 1, 30).ok());
  EXPECT_THAT(CheckpointFolders(), ElementsAre("ckpt-000000030"));
  ASSERT_TRUE(Save(40).ok());
  ASSERT_TRUE(Prune(dir_, 0, 40).ok());
  EXPECT_THAT(CheckpointFolders(), ElementsAre("ckpt-000000040"));
  EXPECT_EQ(*ReadLatest(dir_), "ckpt-000000040");
  EXPECT_TRUE(Verify(CheckpointDir(40)).ok());
}

TEST_F(CheckpointStoreTest, PruneLeavesNewerCheckpointsAlone) {
  for (int64_t step : {10, 20, 30}) ASSERT_TRUE(Save(step).ok()) << step;
  ASSERT_TRUE(Prune(dir_, 1, 20).ok());
  EXPECT_THAT(CheckpointFolders(),
              ElementsAre("ckpt-000000020", "ckpt-000000030"));
}

TEST_F(CheckpointStoreTest, PruneRemovesTemporaryFoldersUpToTheCommittedStep) {
  ASSERT_TRUE(Save(10).ok());
  ASSERT_TRUE(Save(20).ok());
  // Leftovers of an abandoned step 15, and a prepare of the next step 30.
  ASSERT_TRUE(Prepare(dir_, 1, 15, FilesOfRank(1, 15)).ok());
  fs::create_directories(dir_ + "/.tmp/ckpt-000000015.staging");
  WriteAll(dir_ + "/.tmp/ckpt-000000015.staging/model.pt", "half");
  ASSERT_TRUE(Prepare(dir_, 0, 30, FilesOfRank(0, 30)).ok());

  ASSERT_TRUE(Prune(dir_, 2, 20).ok());
  EXPECT_FALSE(fs::exists(dir_ + "/" + PrepareDir(0, 10)));
  EXPECT_FALSE(fs::exists(dir_ + "/" + PrepareDir(1, 10)));
  EXPECT_FALSE(fs::exists(dir_ + "/" + PrepareDir(0, 20)));
  EXPECT_FALSE(fs::exists(dir_ + "/" + PrepareDir(1, 20)));
  EXPECT_FALSE(fs::exists(dir_ + "/" + PrepareDir(1, 15)));
  EXPECT_FALSE(fs::exists(dir_ + "/.tmp/ckpt-000000015.staging"));
  const std::string later = dir_ + "/" + PrepareDir(0, 30);
  for (const NamedFile& file : FilesOfRank(0, 30)) {
    EXPECT_EQ(ReadAll(later + "/" + file.first), file.second) << file.first;
  }
  EXPECT_THAT(CheckpointFolders(),
              ElementsAre("ckpt-000000010", "ckpt-000000020"));
}

// ---- RemoveAll --------------------------------------------------------------

TEST_F(CheckpointStoreTest, RemoveAllLeavesUnrelatedFiles) {
  ASSERT_TRUE(Save(10).ok());
  ASSERT_TRUE(Save(20).ok());
  ASSERT_TRUE(Prepare(dir_, 0, 30, FilesOfRank(0, 30)).ok());
  WriteAll(dir_ + "/notes.txt", "keep me");
  fs::create_directories(dir_ + "/exported");
  WriteAll(dir_ + "/exported/model.pt", "final");

  ASSERT_TRUE(RemoveAll(dir_).ok());
  std::set<std::string> left;
  for (const auto& entry : fs::directory_iterator(dir_)) {
    left.insert(entry.path().filename().string());
  }
  EXPECT_THAT(left, ElementsAre("exported", "notes.txt"));
  EXPECT_EQ(ReadAll(dir_ + "/notes.txt"), "keep me");
  EXPECT_EQ(ReadAll(dir_ + "/exported/model.pt"), "final");
  EXPECT_EQ(ReadLatest(dir_).status().code(), absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace lockstep::checkpoint
