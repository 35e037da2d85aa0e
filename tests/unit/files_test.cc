#include "common/files.h"

#include <gtest/gtest.h>
#include <stdlib.h>

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

}  // namespace
}  // namespace lockstep
