// A committed checkpoint as one tar (checkpoint/archive.h): GNU tar reads it
// back into a backup_dir whose checkpoint verifies and whose LATEST names it;
// a checkpoint damaged on disk is refused, not packed.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "absl/strings/str_cat.h"
#include "checkpoint/archive.h"
#include "checkpoint/store.h"
#include "tests/unit/checkpoint_store_fixture.h"

namespace lockstep::checkpoint {
namespace {

namespace fs = std::filesystem;

using ::testing::AllOf;
using ::testing::HasSubstr;

Found NewestOf(const std::string& dir) {
  auto found = FindNewest(dir, [](const std::string&, const absl::Status&) {});
  EXPECT_TRUE(found.ok()) << found.status();
  return found.ok() ? *found : Found{};
}

TEST_F(CheckpointStoreTest, AnArchiveExtractsToABackupDirThatVerifies) {
  ASSERT_TRUE(Save(10).ok());
  ASSERT_TRUE(Save(20).ok());
  const std::string tar = dir_ + "/" + ArchiveName(20);
  ASSERT_TRUE(WriteArchive(NewestOf(dir_), tar).ok());
  EXPECT_EQ(ArchiveName(20), "ckpt-000000020.tar");
  EXPECT_EQ(fs::file_size(tar) % 512, 0u);

  const std::string out = dir_ + "/extracted";
  fs::create_directory(out);
  ASSERT_EQ(
      std::system(absl::StrCat("tar -xf '", tar, "' -C '", out, "'").c_str()),
      0);
  auto latest = ReadLatest(out);
  ASSERT_TRUE(latest.ok()) << latest.status();
  EXPECT_EQ(*latest, "ckpt-000000020");
  auto manifest = Verify(out + "/ckpt-000000020");
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_EQ(manifest->step(), 20);
  EXPECT_EQ(ReadAll(out + "/ckpt-000000020/model.pt"),
            ReadAll(CheckpointDir(20) + "/model.pt"));
  // Only the newest checkpoint travels.
  EXPECT_FALSE(fs::exists(out + "/ckpt-000000010"));
}

TEST_F(CheckpointStoreTest, ADamagedCheckpointIsNotArchived) {
  ASSERT_TRUE(Save(20).ok());
  const Found found = NewestOf(dir_);
  AppendByte(CheckpointDir(20) + "/optimizer.pt");
  absl::Status written = WriteArchive(found, dir_ + "/out.tar");
  EXPECT_EQ(written.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(written.message(),
              AllOf(HasSubstr("ckpt-000000020"), HasSubstr("optimizer.pt")));
}

TEST_F(CheckpointStoreTest, AnArchiveThatCannotBeWrittenSaysWhere) {
  ASSERT_TRUE(Save(20).ok());
  absl::Status written =
      WriteArchive(NewestOf(dir_), dir_ + "/no-such-folder/out.tar");
  EXPECT_EQ(written.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(written.message(), HasSubstr("no-such-folder/out.tar"));
}

}  // namespace
}  // namespace lockstep::checkpoint
