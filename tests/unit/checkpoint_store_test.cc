#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/sha256.h"
#include "worker/checkpoint/store.h"

namespace lockstep::checkpoint {
namespace {

namespace fs = std::filesystem;

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Pair;
using ::testing::UnorderedElementsAre;

constexpr int kWorldSize = 2;

// What the ranks of `step` write; `variant` makes a second save of the same
// step differ from the first.
std::vector<NamedFile> FilesOfRank(int rank, int64_t step, int variant = 0) {
  v1::RankState rank_state;
  rank_state.set_rank(rank);
  rank_state.set_world_size(kWorldSize);
  rank_state.set_step(step);
  rank_state.set_epoch_position(step * 32 + variant);
  std::vector<NamedFile> files;
  if (rank == 0) {
    v1::TrainerState trainer;
    trainer.set_step(step);
    trainer.set_global_batch_size(64);
    trainer.set_samples_seen(step * 64);
    trainer.set_model("mlp");
    files.emplace_back("model.pt",
                       absl::StrCat("model weights of step ", step, " variant ",
                                    variant, std::string(1000, 'm')));
    files.emplace_back("optimizer.pt",
                       absl::StrCat("optimizer of step ", step, " variant ",
                                    variant, std::string(500, 'o')));
    files.emplace_back("trainer.state", ToJson(trainer));
  }
  files.emplace_back(RankStateName(rank), ToJson(rank_state));
  return files;
}

v1::Manifest ManifestOf(int64_t step, int epoch) {
  v1::Manifest manifest;
  manifest.set_job_id("test-1");
  manifest.set_job_name("test");
  manifest.set_step(step);
  manifest.set_epoch(epoch);
  manifest.set_generation(1);
  manifest.set_world_size(kWorldSize);
  manifest.set_global_batch_size(64);
  manifest.set_model("mlp");
  manifest.set_seed(42);
  manifest.set_time(1700000000.0);
  return manifest;
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

void WriteAll(const std::string& path, const std::string& contents) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << contents;
  ASSERT_TRUE(out.good()) << path;
}

void AppendByte(const std::string& path) {
  std::ofstream out(path, std::ios::binary | std::ios::app);
  out << 'x';
  ASSERT_TRUE(out.good()) << path;
}

class CheckpointStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const char* tmpdir = getenv("TMPDIR");
    std::string base = tmpdir != nullptr && *tmpdir != '\0' ? tmpdir : "/tmp";
    std::string tmpl = base + "/checkpoint_store_test_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr) << tmpl;
    dir_ = tmpl;
  }
  void TearDown() override {
    std::error_code error;
    fs::remove_all(dir_, error);
  }

  std::string CheckpointDir(int64_t step) const {
    return dir_ + "/" + CheckpointName(step);
  }

  // Runs the prepare phase of both ranks for `step`.
  std::vector<PreparedPart> PrepareBoth(int64_t step, int variant = 0) {
    std::vector<PreparedPart> parts;
    for (int rank = 0; rank < kWorldSize; ++rank) {
      auto files = Prepare(dir_, rank, step, FilesOfRank(rank, step, variant));
      EXPECT_TRUE(files.ok()) << files.status();
      if (!files.ok()) return {};
      parts.push_back(PreparedPart{PrepareDir(rank, step), *std::move(files)});
    }
    return parts;
  }

  // Prepares and commits `step`.
  absl::StatusOr<int64_t> Save(int64_t step, int epoch = 0, int variant = 0) {
    return Commit(dir_, ManifestOf(step, epoch), PrepareBoth(step, variant));
  }

  // The names of the ckpt-* folders of dir_.
  std::set<std::string> CheckpointFolders() const {
    std::set<std::string> names;
    for (const auto& entry : fs::directory_iterator(dir_)) {
      std::string name = entry.path().filename().string();
      if (name.rfind("ckpt-", 0) == 0) names.insert(name);
    }
    return names;
  }

  std::string dir_;
};

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
    EXPECT_EQ(file.sha256(), Sha256Hex(contents)) << name;
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

// Collects what FindNewest skipped.
struct Skipped {
  std::function<void(const std::string&, const absl::Status&)> Callback() {
    return [this](const std::string& name, const absl::Status& why) {
      entries.emplace_back(name, why);
    };
  }
  std::vector<std::string> Names() const {
    std::vector<std::string> names;
    for (const auto& [name, why] : entries) names.push_back(name);
    return names;
  }
  std::vector<std::pair<std::string, absl::Status>> entries;
};

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
// still be able to replace the step. KNOWN BUG (reported): Commit renames the
// existing folder onto .tmp/ckpt-<step>.replaced without removing an earlier
// one first, and rename(2) of a folder onto a non-empty folder fails
// (ENOTEMPTY), so the commit fails with FailedPrecondition.
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
