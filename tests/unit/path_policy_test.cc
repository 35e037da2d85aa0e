// The worker's path policy: resolving a job's paths (".." and symbolic links
// included) and refusing those outside the roots, with errors that name the
// field, the path, the roots and the flag.
#include "common/path_policy.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <string>

#include "common/files.h"

namespace lockstep {
namespace {

using ::testing::HasSubstr;

class PathPolicyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "path_policy_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl.data()), nullptr);
    char real[PATH_MAX];
    ASSERT_NE(realpath(tmpl.c_str(), real), nullptr);
    dir_ = real;
    root_ = dir_ + "/root";
    outside_ = dir_ + "/outside";
    ASSERT_TRUE(MakeDirectories(root_ + "/data").ok());
    ASSERT_TRUE(MakeDirectories(outside_).ok());
  }

  absl::Status Check(const std::string& path,
                     const std::string& cwd = "/nonexistent") {
    return CheckUnderRoots("checkpoint.backup_dir", path, {root_},
                           "--backup-root", cwd)
        .status();
  }

  std::string dir_, root_, outside_;
};

TEST_F(PathPolicyTest, PathsUnderARootAreAccepted) {
  EXPECT_TRUE(Check(root_).ok());
  EXPECT_TRUE(Check(root_ + "/data").ok());
  EXPECT_TRUE(Check(root_ + "/not/yet/created").ok());
  EXPECT_TRUE(Check(root_ + "/./data/../data//x").ok());
  EXPECT_TRUE(Check("data/x", root_).ok());  // relative to the working folder
}

TEST_F(PathPolicyTest, DotDotCannotEscapeARoot) {
  absl::Status status = Check(root_ + "/data/../../outside");
  EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(status.message(), HasSubstr("resolved: " + outside_));
  EXPECT_FALSE(Check(root_ + "/missing/../../outside").ok());
  EXPECT_FALSE(Check("../outside", root_).ok());
  // A root's name as a prefix is not the root.
  EXPECT_FALSE(Check(root_ + "-sibling").ok());
}

TEST_F(PathPolicyTest, AbsolutePathOutsideIsRefusedNamingEverything) {
  absl::Status status = Check("/etc");
  EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(status.message(), HasSubstr("checkpoint.backup_dir \"/etc\""));
  EXPECT_THAT(status.message(), HasSubstr(root_));
  EXPECT_THAT(status.message(), HasSubstr("--backup-root"));
}

TEST_F(PathPolicyTest, SymbolicLinkOutOfARootIsFollowedAndRefused) {
  ASSERT_EQ(symlink(outside_.c_str(), (root_ + "/escape").c_str()), 0);
  EXPECT_EQ(Check(root_ + "/escape").code(),
            absl::StatusCode::kPermissionDenied);
  EXPECT_FALSE(Check(root_ + "/escape/ckpt").ok());
  // ".." after a link goes to the link target's parent, as the kernel does.
  ASSERT_TRUE(MakeDirectories(outside_ + "/deep").ok());
  ASSERT_EQ(symlink((outside_ + "/deep").c_str(), (root_ + "/deep").c_str()),
            0);
  EXPECT_FALSE(Check(root_ + "/deep/..").ok());
}

TEST_F(PathPolicyTest, SymbolicLinkInsideARootIsAccepted) {
  ASSERT_EQ(symlink((root_ + "/data").c_str(), (dir_ + "/alias").c_str()), 0);
  EXPECT_TRUE(Check(dir_ + "/alias/x").ok());
}

TEST_F(PathPolicyTest, DanglingLinkIsRefused) {
  ASSERT_EQ(symlink((outside_ + "/new").c_str(), (root_ + "/model.pt").c_str()),
            0);
  absl::Status status = Check(root_ + "/model.pt");
  EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(status.message(), HasSubstr("symbolic link"));
}

// A NUL ends the path every system call sees, but not the walk: without
// the check "<root>/..\0/../<root>/x" would pass and then act on "<root>/..".
TEST_F(PathPolicyTest, NulAndOtherControlCharactersAreRefusedNamingTheField) {
  const std::string escape = std::string("/etc\0/../", 9) + root_ + "/x";
  absl::Status status = Check(escape);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              HasSubstr("checkpoint.backup_dir \"/etc\\x00/"));
  EXPECT_THAT(status.message(),
              HasSubstr("control character (byte 0x00 at offset 4)"));
  EXPECT_EQ(Check(root_ + "/a\nb").code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ResolvePath(escape, "/").status().code(),
            absl::StatusCode::kInvalidArgument);
  v1::JobSpec spec;
  spec.mutable_data()->set_dir(root_);
  spec.mutable_checkpoint()->set_backup_dir(escape);
  PathRoots roots{{root_}, {root_}, {root_}};
  EXPECT_THAT(CheckJobPaths(spec, roots, "/", {"job-1", ""}).message(),
              HasSubstr("checkpoint.backup_dir"));
}

TEST_F(PathPolicyTest, TheResolvedPathIsReturned) {
  ASSERT_EQ(symlink(root_.c_str(), (dir_ + "/root-link").c_str()), 0);
  auto resolved =
      CheckUnderRoots("checkpoint.backup_dir", dir_ + "/root-link/./data/../b",
                      {root_}, "--backup-root", "/");
  ASSERT_TRUE(resolved.ok()) << resolved.status();
  EXPECT_EQ(*resolved, root_ + "/b");
}

TEST_F(PathPolicyTest, AnExportMustLieStrictlyBelowARoot) {
  PathRoots roots{{root_}, {root_}, {root_}};
  v1::JobSpec spec;
  spec.mutable_data()->set_dir(root_);
  spec.set_export_path(root_ + "/./");
  absl::Status status = CheckJobPaths(spec, roots, "/", {"job-1", ""});
  EXPECT_EQ(status.code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(status.message(), HasSubstr("export \"" + root_ + "/./\""));
  EXPECT_THAT(status.message(), HasSubstr("not a path below one"));
  spec.set_export_path(root_ + "/model.pt");
  EXPECT_TRUE(CheckJobPaths(spec, roots, "/", {"job-1", ""}).ok());
  // A backup folder may still be a root itself.
  EXPECT_TRUE(Check(root_).ok());
}

TEST_F(PathPolicyTest, AnUnresolvablePathNamesTheRootsAndTheFlag) {
  ASSERT_EQ(symlink((outside_ + "/new").c_str(), (root_ + "/model.pt").c_str()),
            0);
  absl::Status status = Check(root_ + "/model.pt");
  EXPECT_THAT(status.message(), HasSubstr("symbolic link"));
  EXPECT_THAT(status.message(), HasSubstr(root_ + ", set with --backup-root"));
}

TEST_F(PathPolicyTest, RootGivenThroughALinkIsResolvedToo) {
  ASSERT_EQ(symlink(root_.c_str(), (dir_ + "/root-link").c_str()), 0);
  EXPECT_TRUE(CheckUnderRoots("export", root_ + "/m.pt", {dir_ + "/root-link"},
                              "--export-root", "/")
                  .ok());
}

TEST_F(PathPolicyTest, EveryPathOfAJobIsChecked) {
  PathRoots roots;
  roots.data = {root_};
  roots.backup = {root_};
  roots.exports = {root_};
  v1::JobSpec spec;
  spec.mutable_data()->set_dir(root_ + "/data");
  EXPECT_TRUE(CheckJobPaths(spec, roots, "/", {"job-1", ""}).ok());
  // The default data folder is checked too.
  v1::JobSpec defaults;
  EXPECT_THAT(CheckJobPaths(defaults, roots, "/", {"job-1", ""}).message(),
              HasSubstr("data.dir"));

  v1::JobSpec bad = spec;
  bad.mutable_model()->set_torchscript("/etc/model.pt");
  EXPECT_THAT(CheckJobPaths(bad, roots, "/", {"job-1", ""}).message(),
              HasSubstr("model.torchscript"));
  bad = spec;
  bad.mutable_checkpoint()->set_backup_dir("/etc");
  EXPECT_THAT(CheckJobPaths(bad, roots, "/", {"job-1", ""}).message(),
              HasSubstr("--backup-root"));
  bad = spec;
  bad.set_export_path("/etc/passwd");
  EXPECT_THAT(CheckJobPaths(bad, roots, "/", {"job-1", ""}).message(),
              HasSubstr("--export-root"));
}

TEST(ParseRootsTest, ColonListsAndRepeatsAreJoinedRelativeRefused) {
  auto roots = ParseRoots({"/a:/b", "/c", ""}, "--data-root");
  ASSERT_TRUE(roots.ok());
  EXPECT_THAT(*roots, ::testing::ElementsAre("/a", "/b", "/c"));
  auto relative = ParseRoots({"/a:data"}, "--data-root");
  EXPECT_EQ(relative.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(relative.status().message(), HasSubstr("--data-root data"));
}

TEST(DefaultPathRootsTest, CoverDebiansDataSetAndTheTemporaryFolder) {
  PathRoots roots = DefaultPathRoots();
  EXPECT_TRUE(CheckJobPaths(v1::JobSpec(), roots, "/", {"job-1", ""}).ok());
  EXPECT_FALSE(CheckUnderRoots("checkpoint.backup_dir", "/etc", roots.backup,
                               "--backup-root", "/")
                   .ok());
}

}  // namespace
}  // namespace lockstep
