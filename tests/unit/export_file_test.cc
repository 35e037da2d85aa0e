// The exported model: a new path is written, a previous lockstep export is
// replaced, and a file lockstep did not export there is never touched.
#include "common/export_file.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <string>

#include "common/files.h"

namespace lockstep {
namespace {

using ::testing::HasSubstr;

class ExportFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "export_file_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    path_ = tmpl + "/model.pt";
  }
  std::string path_;
};

TEST_F(ExportFileTest, WritesANewExportAndReplacesItsOwn) {
  ASSERT_TRUE(WriteExport(path_, "first model").ok());
  EXPECT_EQ(*ReadFileToString(path_), "first model");
  ASSERT_TRUE(WriteExport(path_, "second model").ok());
  EXPECT_EQ(*ReadFileToString(path_), "second model");
}

TEST_F(ExportFileTest, RefusesToReplaceAForeignFile) {
  ASSERT_TRUE(WriteFileAtomically(path_, "root:x:0:0").ok());
  absl::Status status = WriteExport(path_, "model");
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("is not a lockstep export"));
  EXPECT_THAT(status.message(), HasSubstr(path_));
  EXPECT_EQ(*ReadFileToString(path_), "root:x:0:0");
  EXPECT_FALSE(PathExists(ExportMarkerPath(path_)));
}

TEST_F(ExportFileTest, RefusesAnExportTheUserReplacedSince) {
  ASSERT_TRUE(WriteExport(path_, "model").ok());
  ASSERT_TRUE(WriteFileAtomically(path_, "MODEL").ok());  // the same size
  absl::Status status = WriteExport(path_, "model 2");
  EXPECT_THAT(status.message(), HasSubstr("bytes changed"));
  EXPECT_EQ(*ReadFileToString(path_), "MODEL");
}

// A file of another size than the marker records is refused on its size,
// without being read (here it cannot be: no read permission).
TEST_F(ExportFileTest, AnExportOfAnotherSizeIsRefusedBeforeItIsHashed) {
  ASSERT_TRUE(WriteExport(path_, "model").ok());
  ASSERT_TRUE(WriteFileAtomically(path_, "the user's own file").ok());
  ASSERT_EQ(chmod(path_.c_str(), 0), 0);
  absl::Status status = CheckExportTarget(path_);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(),
              HasSubstr("it has 19 bytes, not the size its marker records"));
  ASSERT_EQ(chmod(path_.c_str(), 0644), 0);
  EXPECT_EQ(*ReadFileToString(path_), "the user's own file");
}

TEST_F(ExportFileTest, RefusesALinkAndAForeignMarker) {
  const std::string target = path_ + ".target";
  ASSERT_TRUE(WriteFileAtomically(target, "elsewhere").ok());
  ASSERT_EQ(symlink(target.c_str(), path_.c_str()), 0);
  EXPECT_THAT(WriteExport(path_, "model").message(),
              HasSubstr("symbolic link"));
  EXPECT_EQ(*ReadFileToString(target), "elsewhere");
  unlink(path_.c_str());

  ASSERT_TRUE(WriteFileAtomically(ExportMarkerPath(path_), "my notes").ok());
  EXPECT_FALSE(WriteExport(path_, "model").ok());
  EXPECT_EQ(*ReadFileToString(ExportMarkerPath(path_)), "my notes");
}

}  // namespace
}  // namespace lockstep
