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

using ::testing::AllOf;
using ::testing::HasSubstr;

const ExportOwner kJob = {"alice-model-3", "spiffe://lockstep/operator/alice"};

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
  ASSERT_TRUE(WriteExport(path_, "first model", kJob).ok());
  EXPECT_EQ(*ReadFileToString(path_), "first model");
  ASSERT_TRUE(WriteExport(path_, "second model", kJob).ok());
  EXPECT_EQ(*ReadFileToString(path_), "second model");
}

// Issue 27 #10: any operator's job could overwrite another job's export.
TEST_F(ExportFileTest, OnlyAJobOfTheSameSubmitterReplacesTheExport) {
  ASSERT_TRUE(WriteExport(path_, "alice's model", kJob).ok());
  const ExportOwner mallory = {"model-4", "spiffe://lockstep/operator/mallory"};
  absl::Status status = WriteExport(path_, "mallory's model", mallory);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr(path_), HasSubstr("job alice-model-3"),
                    HasSubstr("submitted by spiffe://lockstep/operator/alice"),
                    HasSubstr("job model-4 was submitted by "
                              "spiffe://lockstep/operator/mallory")));
  EXPECT_EQ(*ReadFileToString(path_), "alice's model");
  // Nor a job without an identity (a coordinator under --insecure).
  EXPECT_FALSE(WriteExport(path_, "anyone's", {"model-5", ""}).ok());
  // Alice's next run of the job replaces it.
  const ExportOwner rerun = {"alice-model-9", kJob.submitted_by};
  ASSERT_TRUE(WriteExport(path_, "alice's new model", rerun).ok());
  EXPECT_EQ(*ReadFileToString(path_), "alice's new model");
  EXPECT_THAT(*ReadFileToString(ExportMarkerPath(path_)),
              HasSubstr("job alice-model-9\n"));
}

TEST_F(ExportFileTest, AnExportOfAnEarlierVersionNamesNoJobAndIsKept) {
  ASSERT_TRUE(WriteFileAtomically(path_, "model").ok());
  ASSERT_TRUE(WriteFileAtomically(
                  ExportMarkerPath(path_),
                  "lockstep export 1\nsize 5\nsha256 "
                  "1c3a3a8b4cfc5a2e1dfa5e8c15b5b0a6a5d6e0bde5a8e6b4b5b0f1c1e2d3"
                  "a4b5\n")
                  .ok());
  EXPECT_THAT(WriteExport(path_, "new", kJob).message(),
              HasSubstr("does not name the job"));
  EXPECT_EQ(*ReadFileToString(path_), "model");
}

TEST_F(ExportFileTest, RefusesToReplaceAForeignFile) {
  ASSERT_TRUE(WriteFileAtomically(path_, "root:x:0:0").ok());
  absl::Status status = WriteExport(path_, "model", kJob);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(status.message(), HasSubstr("is not a lockstep export"));
  EXPECT_THAT(status.message(), HasSubstr(path_));
  EXPECT_EQ(*ReadFileToString(path_), "root:x:0:0");
  EXPECT_FALSE(PathExists(ExportMarkerPath(path_)));
}

TEST_F(ExportFileTest, RefusesAnExportTheUserReplacedSince) {
  ASSERT_TRUE(WriteExport(path_, "model", kJob).ok());
  ASSERT_TRUE(WriteFileAtomically(path_, "MODEL").ok());  // the same size
  absl::Status status = WriteExport(path_, "model 2", kJob);
  EXPECT_THAT(status.message(), HasSubstr("bytes changed"));
  EXPECT_EQ(*ReadFileToString(path_), "MODEL");
}

// A file of another size than the marker records is refused on its size,
// without being read (here it cannot be: no read permission).
TEST_F(ExportFileTest, AnExportOfAnotherSizeIsRefusedBeforeItIsHashed) {
  ASSERT_TRUE(WriteExport(path_, "model", kJob).ok());
  ASSERT_TRUE(WriteFileAtomically(path_, "the user's own file").ok());
  ASSERT_EQ(chmod(path_.c_str(), 0), 0);
  absl::Status status = CheckExportTarget(path_, kJob);
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
  EXPECT_THAT(WriteExport(path_, "model", kJob).message(),
              HasSubstr("symbolic link"));
  EXPECT_EQ(*ReadFileToString(target), "elsewhere");
  unlink(path_.c_str());

  ASSERT_TRUE(WriteFileAtomically(ExportMarkerPath(path_), "my notes").ok());
  EXPECT_FALSE(WriteExport(path_, "model", kJob).ok());
  EXPECT_EQ(*ReadFileToString(ExportMarkerPath(path_)), "my notes");
}

}  // namespace
}  // namespace lockstep
