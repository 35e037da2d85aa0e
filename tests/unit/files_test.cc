// The file helpers: atomic writes, missing files, creating and recursively
// removing directories.
#include "common/files.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <filesystem>
#include <string>

namespace lockstep {
namespace {

std::string TempDir() {
  std::string tmpl = ::testing::TempDir() + "files_test_XXXXXX";
  return mkdtemp(tmpl.data());
}

TEST(FilesTest, AtomicWriteReplacesTheFile) {
  std::string dir = TempDir();
  std::string path = dir + "/LATEST";
  ASSERT_TRUE(WriteFileAtomically(path, "one").ok());
  ASSERT_TRUE(WriteFileAtomically(path, "two").ok());
  EXPECT_EQ(*ReadFileToString(path), "two");
}

// The temporary file's name was "<path>.tmp.<pid>", opened with O_TRUNC and
// no O_EXCL: in /tmp another user could make it first and keep writing to
// it between the write and the rename, or plant a link there.
TEST(FilesTest, AtomicWriteNeverUsesATemporaryFileItDidNotCreate) {
  std::string dir = TempDir();
  std::string path = dir + "/model.pt";
  const std::string planted = path + ".tmp." + std::to_string(getpid());
  ASSERT_TRUE(WriteFileDurably(planted, "planted").ok());
  const std::string victim = dir + "/victim";
  ASSERT_TRUE(WriteFileDurably(victim, "victim").ok());
  const std::string linked = path + ".tmp.link";
  ASSERT_EQ(symlink(victim.c_str(), linked.c_str()), 0);

  ASSERT_TRUE(WriteFileAtomically(path, "mine").ok());
  EXPECT_EQ(*ReadFileToString(path), "mine");
  EXPECT_EQ(*ReadFileToString(planted), "planted");
  EXPECT_EQ(*ReadFileToString(victim), "victim");
  struct stat st;
  ASSERT_EQ(lstat(path.c_str(), &st), 0);
  EXPECT_TRUE(S_ISREG(st.st_mode));
  // Nothing of its own is left behind.
  int entries = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    (void)entry;
    ++entries;
  }
  EXPECT_EQ(entries, 4);  // model.pt, the planted file, victim, the link
}

TEST(FilesTest, MissingFileIsNotFound) {
  auto contents = ReadFileToString("/nonexistent/lockstep/file");
  EXPECT_EQ(contents.status().code(), absl::StatusCode::kNotFound);
}

TEST(FilesTest, MakeDirectoriesIsIdempotent) {
  std::string dir = TempDir() + "/a/b/c";
  ASSERT_TRUE(MakeDirectories(dir).ok());
  ASSERT_TRUE(MakeDirectories(dir).ok());
  EXPECT_TRUE(PathExists(dir));
  ASSERT_TRUE(WriteFileAtomically(dir + "/f", "x").ok());
  EXPECT_FALSE(MakeDirectories(dir + "/f").ok());
}

TEST(FilesTest, RemoveRecursivelyRemovesATree) {
  std::string dir = TempDir() + "/run";
  ASSERT_TRUE(MakeDirectories(dir + "/a/b").ok());
  ASSERT_TRUE(WriteFileAtomically(dir + "/a/b/f", "x").ok());
  ASSERT_TRUE(WriteFileAtomically(dir + "/g", "y").ok());
  ASSERT_TRUE(RemoveRecursively(dir).ok());
  EXPECT_FALSE(PathExists(dir));
  EXPECT_TRUE(RemoveRecursively(dir).ok());  // already gone: rm -rf
}

TEST(FilesTest, RemoveRecursivelyDoesNotFollowLinks) {
  std::string outside = TempDir();
  ASSERT_TRUE(WriteFileAtomically(outside + "/keep", "x").ok());
  std::string dir = TempDir() + "/run";
  ASSERT_TRUE(MakeDirectories(dir).ok());
  ASSERT_EQ(symlink(outside.c_str(), (dir + "/link").c_str()), 0);
  ASSERT_TRUE(RemoveRecursively(dir).ok());
  EXPECT_FALSE(PathExists(dir));
  EXPECT_EQ(*ReadFileToString(outside + "/keep"), "x");
}

TEST(FilesTest, RemoveRecursivelyNamesWhatItCannotRemove) {
  if (geteuid() == 0) GTEST_SKIP() << "root may remove anything";
  std::string dir = TempDir() + "/run";
  ASSERT_TRUE(MakeDirectories(dir + "/locked").ok());
  ASSERT_TRUE(WriteFileAtomically(dir + "/locked/f", "x").ok());
  ASSERT_EQ(chmod((dir + "/locked").c_str(), 0555), 0);
  absl::Status status = RemoveRecursively(dir);
  chmod((dir + "/locked").c_str(), 0755);
  EXPECT_FALSE(status.ok());
  EXPECT_NE(status.message().find(dir + "/locked/f"), absl::string_view::npos)
      << status;
}

TEST(FilesTest, ReadRegularFileRefusesLinksDevicesAndLargeFiles) {
  std::string dir = TempDir();
  ASSERT_TRUE(WriteFileAtomically(dir + "/small", "abc").ok());
  EXPECT_EQ(*ReadRegularFile(dir + "/small", 3), "abc");
  EXPECT_EQ(ReadRegularFile(dir + "/small", 2).status().code(),
            absl::StatusCode::kDataLoss);
  ASSERT_EQ(symlink((dir + "/small").c_str(), (dir + "/link").c_str()), 0);
  EXPECT_EQ(ReadRegularFile(dir + "/link", 100).status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(ReadRegularFile("/dev/zero", 100).status().code(),
            absl::StatusCode::kDataLoss);
  ASSERT_EQ(mkfifo((dir + "/fifo").c_str(), 0600), 0);
  EXPECT_EQ(ReadRegularFile(dir + "/fifo", 100).status().code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(ReadRegularFile(dir + "/missing", 100).status().code(),
            absl::StatusCode::kNotFound);
}

}  // namespace
}  // namespace lockstep
