// A backup_dir that someone else put things in: links to devices, files that
// changed after their prepare, a prepare naming another folder, and foreign
// files named like lockstep's. Each is refused or left alone, promptly.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

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
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

std::set<std::string> NamesIn(const std::string& dir) {
  std::set<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) {
    names.insert(entry.path().filename().string());
  }
  return names;
}

// ---- reading ----------------------------------------------------------------

TEST_F(CheckpointStoreTest, ModelLinkedToDevZeroIsCorruptNotHashedForever) {
  ASSERT_TRUE(Save(10).ok());
  ASSERT_TRUE(Save(20).ok());
  const std::string model = CheckpointDir(20) + "/model.pt";
  fs::remove(model);
  ASSERT_EQ(symlink("/dev/zero", model.c_str()), 0);

  auto verified = Verify(CheckpointDir(20));
  EXPECT_EQ(verified.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(verified.status().message(),
              AllOf(HasSubstr("model.pt"), HasSubstr("symbolic link")));
  // The restore falls back to the checkpoint before it, and says why.
  Skipped skipped;
  auto found = FindNewest(dir_, skipped.Callback());
  ASSERT_TRUE(found.ok()) << found.status();
  EXPECT_EQ(found->manifest.step(), 10);
  EXPECT_THAT(skipped.Names(),
              UnorderedElementsAre(kLatestName, "ckpt-000000020"));
  // `lockstep checkpoints` lists it as corrupt.
  auto listed = List(dir_);
  ASSERT_TRUE(listed.ok());
  ASSERT_EQ(listed->size(), 2u);
  EXPECT_EQ((*listed)[0].verified.code(), absl::StatusCode::kDataLoss);
}

// Verify checks only what the manifest lists; the restore reads model.pt
// whatever it lists. A manifest that omits model.pt must not let a link to
// /dev/zero be read until memory runs out.
TEST_F(CheckpointStoreTest, ARestoreReadsOnlyFilesTheManifestLists) {
  ASSERT_TRUE(Save(10).ok());
  const std::string dir = CheckpointDir(10);
  auto manifest = Verify(dir);
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  v1::Manifest without_model = *manifest;
  without_model.clear_files();
  for (const v1::CheckpointFile& file : manifest->files()) {
    if (file.name() != "model.pt") *without_model.add_files() = file;
  }
  WriteAll(dir + "/" + kManifestName, ToJson(without_model));
  fs::remove(dir + "/model.pt");
  ASSERT_EQ(symlink("/dev/zero", (dir + "/model.pt").c_str()), 0);

  Skipped skipped;
  auto found = FindNewest(dir_, skipped.Callback());
  ASSERT_TRUE(found.ok()) << found.status();  // what it lists verifies
  auto model = ReadCheckpointFile(*found, "model.pt");
  EXPECT_EQ(model.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(model.status().message(),
              AllOf(HasSubstr("checkpoint " + dir + " is corrupt"),
                    HasSubstr("does not list model.pt")));
  auto trainer = ReadCheckpointFile(*found, "trainer.state");
  EXPECT_TRUE(trainer.ok()) << trainer.status();
}

// A listed file swapped after Verify: for a link, for a file longer than
// the manifest says (never read past that size), for the same size with
// other bytes.
TEST_F(CheckpointStoreTest, ARestoreChecksTheBytesItLoads) {
  ASSERT_TRUE(Save(10).ok());
  Skipped skipped;
  auto found = FindNewest(dir_, skipped.Callback());
  ASSERT_TRUE(found.ok()) << found.status();
  const std::string model = CheckpointDir(10) + "/model.pt";
  const std::string original = ReadAll(model);
  fs::remove(model);
  ASSERT_EQ(symlink("/dev/zero", model.c_str()), 0);
  EXPECT_EQ(ReadCheckpointFile(*found, "model.pt").status().code(),
            absl::StatusCode::kDataLoss);
  fs::remove(model);
  WriteAll(model, original + "x");
  EXPECT_THAT(ReadCheckpointFile(*found, "model.pt").status().message(),
              HasSubstr("at most"));
  std::string flipped = original;
  flipped[0] ^= 1;
  WriteAll(model, flipped);
  EXPECT_THAT(ReadCheckpointFile(*found, "model.pt").status().message(),
              HasSubstr("SHA-256"));
  WriteAll(model, original);
  auto bytes = ReadCheckpointFile(*found, "model.pt");
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  EXPECT_EQ(*bytes, original);
}

TEST_F(CheckpointStoreTest, ManifestLinkedToDevZeroIsCorrupt) {
  ASSERT_TRUE(Save(10).ok());
  const std::string manifest = CheckpointDir(10) + "/" + kManifestName;
  fs::remove(manifest);
  ASSERT_EQ(symlink("/dev/zero", manifest.c_str()), 0);
  EXPECT_EQ(Verify(CheckpointDir(10)).status().code(),
            absl::StatusCode::kDataLoss);
}

TEST_F(CheckpointStoreTest, FifoInPlaceOfAFileIsRefusedWithoutBlocking) {
  ASSERT_TRUE(Save(10).ok());
  const std::string model = CheckpointDir(10) + "/model.pt";
  fs::remove(model);
  ASSERT_EQ(mkfifo(model.c_str(), 0600), 0);
  auto verified = Verify(CheckpointDir(10));
  EXPECT_EQ(verified.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(verified.status().message(), HasSubstr("not a regular file"));
}

TEST_F(CheckpointStoreTest, CheckpointFolderThatIsALinkIsNotListed) {
  ASSERT_TRUE(Save(10).ok());
  fs::rename(CheckpointDir(10), dir_ + "/elsewhere");
  fs::create_directory_symlink(dir_ + "/elsewhere", CheckpointDir(10));
  auto listed = List(dir_);
  ASSERT_TRUE(listed.ok());
  EXPECT_TRUE(listed->empty());
  EXPECT_EQ(NewestStep(dir_), 0);
}

// ---- committing -------------------------------------------------------------

TEST_F(CheckpointStoreTest, CommitRefusesAPrepareNamingAFolderOutsideItsOwn) {
  ASSERT_TRUE(Save(10).ok());
  // A file outside the backup folder, named like a prepared file.
  const std::string victim_dir = dir_ + "-victim";
  fs::create_directories(victim_dir);
  WriteAll(victim_dir + "/model.pt", "not yours");
  std::vector<PreparedPart> parts = PrepareBoth(20);
  ASSERT_EQ(parts.size(), 2u);
  for (const std::string& dir :
       {std::string("../") + fs::path(victim_dir).filename().string(),
        victim_dir, PrepareDir(1, 20) + "/../../worker-00000/ckpt-000000020",
        PrepareDir(0, 19), std::string(".tmp/worker-1/ckpt-000000020")}) {
    std::vector<PreparedPart> evil = parts;
    evil[1].dir = dir;
    auto committed = Commit(dir_, ManifestOf(20, 0), evil);
    EXPECT_EQ(committed.status().code(), absl::StatusCode::kInvalidArgument)
        << dir;
    EXPECT_THAT(committed.status().message(),
                AllOf(HasSubstr(dir), HasSubstr("staging folder")));
  }
  EXPECT_EQ(ReadAll(victim_dir + "/model.pt"), "not yours");
  EXPECT_EQ(*ReadLatest(dir_), "ckpt-000000010");
  EXPECT_FALSE(fs::exists(CheckpointDir(20)));
  fs::remove_all(victim_dir);
}

TEST_F(CheckpointStoreTest, CommitRefusesTheSameRankTwice) {
  std::vector<PreparedPart> parts = PrepareBoth(20);
  ASSERT_EQ(parts.size(), 2u);
  parts[1].dir = parts[0].dir;
  auto committed = Commit(dir_, ManifestOf(20, 0), parts);
  EXPECT_EQ(committed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(committed.status().message(), HasSubstr("listed twice"));
}

TEST_F(CheckpointStoreTest, CommitRefusesAStagingFolderThatIsALink) {
  std::vector<PreparedPart> parts = PrepareBoth(20);
  ASSERT_EQ(parts.size(), 2u);
  const std::string rank1 = dir_ + "/" + PrepareDir(1, 20);
  fs::rename(rank1, dir_ + "/moved");
  fs::create_directory_symlink(dir_ + "/moved", rank1);
  auto committed = Commit(dir_, ManifestOf(20, 0), parts);
  EXPECT_EQ(committed.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(committed.status().message(), HasSubstr("not followed"));
}

TEST_F(CheckpointStoreTest, CommitHashesWhatItCommitsInsteadOfTheReport) {
  ASSERT_TRUE(Save(10).ok());
  std::vector<PreparedPart> parts = PrepareBoth(20);
  ASSERT_EQ(parts.size(), 2u);
  // Same size, other bytes: only the chief's own hash can tell.
  const std::string state =
      dir_ + "/" + PrepareDir(1, 20) + "/" + RankStateName(1);
  std::string contents = ReadAll(state);
  contents[0] ^= 1;
  WriteAll(state, contents);
  auto committed = Commit(dir_, ManifestOf(20, 0), parts);
  EXPECT_EQ(committed.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(committed.status().message(),
              AllOf(HasSubstr(RankStateName(1)),
                    HasSubstr("does not hold what its rank reported")));
  EXPECT_EQ(*ReadLatest(dir_), "ckpt-000000010");
  EXPECT_FALSE(fs::exists(CheckpointDir(20)));
}

TEST_F(CheckpointStoreTest, CommitRefusesAPreparedFileThatIsALink) {
  std::vector<PreparedPart> parts = PrepareBoth(20);
  ASSERT_EQ(parts.size(), 2u);
  const std::string model = dir_ + "/" + PrepareDir(0, 20) + "/model.pt";
  fs::remove(model);
  ASSERT_EQ(symlink("/dev/zero", model.c_str()), 0);
  auto committed = Commit(dir_, ManifestOf(20, 0), parts);
  EXPECT_EQ(committed.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(committed.status().message(),
              AllOf(HasSubstr("model.pt"), HasSubstr("no regular file")));
}

// ---- cleaning up ------------------------------------------------------------

TEST_F(CheckpointStoreTest, RemoveAllLeavesForeignLookalikesAlone) {
  ASSERT_TRUE(Save(10).ok());
  ASSERT_TRUE(Prepare(dir_, 1, 30, FilesOfRank(1, 30)).ok());
  // Named like lockstep's, but not lockstep's.
  fs::create_directories(dir_ + "/ckpt-7");
  WriteAll(dir_ + "/ckpt-7/data", "a");
  fs::create_directories(dir_ + "/ckpt-000000008");  // no manifest
  WriteAll(dir_ + "/ckpt-000000008/data", "b");
  fs::create_directories(dir_ + "/ckpt-000000009");
  WriteAll(dir_ + "/ckpt-000000009/" + kManifestName, "{\"step\": 3}");
  fs::create_directories(dir_ + "/.tmp/notes");
  WriteAll(dir_ + "/.tmp/notes/n", "c");
  WriteAll(dir_ + "/.tmp/worker-00001/keep.txt", "d");
  // A link named like a checkpoint, to a real checkpoint elsewhere.
  const std::string outside = dir_ + "-outside";
  fs::create_directories(outside);
  fs::rename(CheckpointDir(10), outside + "/ckpt-000000010");
  fs::create_directory_symlink(outside + "/ckpt-000000010", CheckpointDir(5));
  ASSERT_TRUE(Save(11).ok());
  WriteAll(dir_ + "/unrelated.txt", "e");

  ASSERT_TRUE(RemoveAll(dir_).ok());
  EXPECT_THAT(NamesIn(dir_),
              UnorderedElementsAre("ckpt-7", "ckpt-000000008", "ckpt-000000009",
                                   "ckpt-000000005", ".tmp", "unrelated.txt"));
  EXPECT_THAT(NamesIn(dir_ + "/.tmp"),
              UnorderedElementsAre("notes", "worker-00001"));
  EXPECT_THAT(NamesIn(dir_ + "/.tmp/worker-00001"),
              UnorderedElementsAre("keep.txt"));
  EXPECT_TRUE(Verify(outside + "/ckpt-000000010").ok());
  fs::remove_all(outside);
}

TEST_F(CheckpointStoreTest, RemoveAllLeavesAForeignLatest) {
  ASSERT_TRUE(Save(10).ok());
  WriteAll(dir_ + "/" + kLatestName, "my own notes\n");
  ASSERT_TRUE(RemoveAll(dir_).ok());
  EXPECT_THAT(NamesIn(dir_), UnorderedElementsAre(kLatestName));
  EXPECT_EQ(ReadAll(dir_ + "/" + kLatestName), "my own notes\n");
}

TEST_F(CheckpointStoreTest, PruneLeavesForeignLookalikesAlone) {
  fs::create_directories(dir_ + "/ckpt-000000001");
  WriteAll(dir_ + "/ckpt-000000001/data", "foreign");
  ASSERT_TRUE(Save(10).ok());
  ASSERT_TRUE(Save(20).ok());
  ASSERT_TRUE(Save(30).ok());
  ASSERT_TRUE(Prune(dir_, 1, 30).ok());
  EXPECT_THAT(CheckpointFolders(),
              UnorderedElementsAre("ckpt-000000001", "ckpt-000000030"));
}

// A person's file inside a checkpoint lockstep committed: clean-up removes
// the files the manifest lists and MANIFEST.json, and leaves the folder with
// the person's file in it.
TEST_F(CheckpointStoreTest, PruneAndRemoveAllLeaveForeignFilesInACheckpoint) {
  ASSERT_TRUE(Save(10).ok());
  ASSERT_TRUE(Save(20).ok());
  ASSERT_TRUE(Save(30).ok());
  WriteAll(CheckpointDir(10) + "/notes.txt", "mine");
  ASSERT_TRUE(Prune(dir_, 2, 30).ok());
  EXPECT_THAT(NamesIn(CheckpointDir(10)), UnorderedElementsAre("notes.txt"));
  EXPECT_EQ(ReadAll(CheckpointDir(10) + "/notes.txt"), "mine");
  EXPECT_TRUE(Verify(CheckpointDir(20)).ok());

  WriteAll(CheckpointDir(30) + "/results.csv", "also mine");
  ASSERT_TRUE(RemoveAll(dir_).ok());
  EXPECT_THAT(CheckpointFolders(),
              UnorderedElementsAre("ckpt-000000010", "ckpt-000000030"));
  EXPECT_THAT(NamesIn(CheckpointDir(30)), UnorderedElementsAre("results.csv"));
}

// A manifest naming a file outside its folder is not lockstep's: nothing it
// names is removed.
TEST_F(CheckpointStoreTest, CleanUpNeverFollowsAManifestOutOfItsFolder) {
  ASSERT_TRUE(Save(10).ok());
  ASSERT_TRUE(Save(20).ok());
  WriteAll(dir_ + "/precious", "x");
  auto manifest = Verify(CheckpointDir(10));
  ASSERT_TRUE(manifest.ok());
  manifest->mutable_files(0)->set_name("../precious");
  WriteAll(CheckpointDir(10) + "/" + kManifestName, ToJson(*manifest));
  ASSERT_TRUE(Prune(dir_, 1, 20).ok());
  ASSERT_TRUE(RemoveAll(dir_).ok());
  EXPECT_EQ(ReadAll(dir_ + "/precious"), "x");
  EXPECT_TRUE(fs::exists(CheckpointDir(10) + "/" + kManifestName));
}

// A folder named ckpt-<step> that lockstep did not commit is not replaced
// by a commit of that step.
TEST_F(CheckpointStoreTest, CommitRefusesToReplaceAForeignFolder) {
  fs::create_directories(CheckpointDir(20));
  WriteAll(CheckpointDir(20) + "/data", "someone's");
  auto committed = Save(20);
  EXPECT_EQ(committed.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(committed.status().message(),
              AllOf(HasSubstr(CheckpointDir(20)),
                    HasSubstr("not a checkpoint lockstep committed")));
  EXPECT_EQ(ReadAll(CheckpointDir(20) + "/data"), "someone's");
  EXPECT_FALSE(ReadLatest(dir_).ok());
  // Nor a link named like one.
  fs::remove_all(CheckpointDir(20));
  const std::string outside = dir_ + "-elsewhere";
  fs::create_directories(outside);
  fs::create_directory_symlink(outside, CheckpointDir(20));
  EXPECT_EQ(Save(20).status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(fs::is_symlink(CheckpointDir(20)));
  fs::remove_all(outside);
}

// Links planted inside backup_dir: Prepare neither writes through them nor
// removes what they point at.
TEST_F(CheckpointStoreTest, PrepareFollowsNoLinkInsideBackupDir) {
  const std::string outside = dir_ + "-other";
  fs::create_directories(outside + "/worker-00001/ckpt-000000020");
  WriteAll(outside + "/worker-00001/ckpt-000000020/keep", "k");
  WriteAll(outside + "/keep", "k");
  fs::create_directory_symlink(outside, dir_ + "/.tmp");
  auto prepared = Prepare(dir_, 1, 20, FilesOfRank(1, 20));
  EXPECT_EQ(prepared.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(prepared.status().message(),
              AllOf(HasSubstr(dir_ + "/.tmp"), HasSubstr("symbolic link")));
  EXPECT_EQ(ReadAll(outside + "/worker-00001/ckpt-000000020/keep"), "k");

  fs::remove(dir_ + "/.tmp");
  fs::create_directories(dir_ + "/.tmp");
  fs::create_directory_symlink(outside + "/worker-00001",
                               dir_ + "/.tmp/worker-00001");
  prepared = Prepare(dir_, 1, 20, FilesOfRank(1, 20));
  EXPECT_EQ(prepared.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(prepared.status().message(), HasSubstr("worker-00001"));
  EXPECT_EQ(ReadAll(outside + "/worker-00001/ckpt-000000020/keep"), "k");

  // The step's own folder as a link: the link goes, its target stays.
  fs::remove(dir_ + "/.tmp/worker-00001");
  fs::create_directories(dir_ + "/.tmp/worker-00001");
  fs::create_directory_symlink(outside + "/worker-00001/ckpt-000000020",
                               dir_ + "/" + PrepareDir(1, 20));
  prepared = Prepare(dir_, 1, 20, FilesOfRank(1, 20));
  ASSERT_TRUE(prepared.ok()) << prepared.status();
  EXPECT_FALSE(fs::is_symlink(dir_ + "/" + PrepareDir(1, 20)));
  EXPECT_THAT(NamesIn(outside + "/worker-00001/ckpt-000000020"),
              UnorderedElementsAre("keep"));
  // A file where a folder belongs is refused too.
  fs::remove_all(dir_ + "/.tmp");
  WriteAll(dir_ + "/.tmp", "not a folder");
  EXPECT_EQ(Prepare(dir_, 1, 20, FilesOfRank(1, 20)).status().code(),
            absl::StatusCode::kFailedPrecondition);
  fs::remove_all(outside);
}

}  // namespace
}  // namespace lockstep::checkpoint
