// The artifacts kept under --artifact-dir (coordinator/artifact_store.h):
// an upload checked against its header, kept only when whole, the bounds,
// what a restart finds, and deletion with the job.
#include "coordinator/artifact_store.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "common/files.h"
#include "common/sha256.h"

namespace lockstep::coordinator {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;

std::vector<std::string> FilesIn(const std::string& folder) {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(folder)) {
    names.push_back(entry.path().filename());
  }
  return names;
}

v1::ArtifactInfo InfoOf(const std::string& bytes) {
  v1::ArtifactInfo info;
  info.set_name("model");
  info.set_file_name("model.pt");
  info.set_format("torchscript");
  info.set_bytes(static_cast<int64_t>(bytes.size()));
  info.set_sha256(*Sha256Hex(bytes));
  info.set_step(30);
  info.set_rank(0);
  return info;
}

class ArtifactStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "artifact_store_test_XXXXXX";
    dir_ = mkdtemp(tmpl.data());
    Reopen();
  }
  void TearDown() override { ASSERT_TRUE(RemoveRecursively(dir_).ok()); }
  void Reopen() {
    store_.reset();
    auto store = ArtifactStore::Open(dir_ + "/artifacts", limits_);
    ASSERT_TRUE(store.ok()) << store.status();
    store_ = *std::move(store);
  }
  // Uploads `bytes` in chunks of 3 as `info` declares.
  absl::StatusOr<v1::ArtifactInfo> Put(const std::string& job,
                                       const std::string& owner,
                                       const std::string& bytes,
                                       v1::ArtifactInfo info) {
    auto upload = store_->Begin(job, owner, std::move(info));
    if (!upload.ok()) return upload.status();
    for (size_t i = 0; i < bytes.size(); i += 3) {
      if (absl::Status s = (*upload)->Append(bytes.substr(i, 3)); !s.ok()) {
        return s;
      }
    }
    return (*upload)->Finish();
  }
  std::string ReadBack(const std::string& job) {
    auto opened = store_->Read(job, "model");
    EXPECT_TRUE(opened.ok()) << opened.status();
    if (!opened.ok()) return "";
    std::string out(opened->second.bytes(), '\0');
    EXPECT_EQ(read(opened->first, out.data(), out.size()),
              static_cast<ssize_t>(out.size()));
    close(opened->first);
    return out;
  }

  std::string dir_;
  ArtifactStore::Limits limits_{.artifact_bytes = 100, .owner_bytes = 150};
  std::unique_ptr<ArtifactStore> store_;
};

TEST_F(ArtifactStoreTest, AWholeUploadIsKeptAndReadBack) {
  const std::string bytes = "a trained model, 33 bytes of it..";
  auto kept = Put("mnist-1", "operator:alice", bytes, InfoOf(bytes));
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(kept->owner(), "operator:alice");
  EXPECT_EQ(ReadBack("mnist-1"), bytes);
  ASSERT_EQ(store_->List("mnist-1").size(), 1u);
  EXPECT_EQ(store_->List("mnist-1")[0].sha256(), *Sha256Hex(bytes));
  EXPECT_EQ(store_->OwnerBytes("operator:alice"), 33);
  // A restart finds it, and counts it against its owner.
  Reopen();
  EXPECT_EQ(ReadBack("mnist-1"), bytes);
  EXPECT_EQ(store_->OwnerBytes("operator:alice"), 33);
  // It leaves with its job.
  ASSERT_TRUE(store_->Delete("mnist-1").ok());
  EXPECT_THAT(store_->List("mnist-1"), IsEmpty());
  EXPECT_EQ(store_->Read("mnist-1", "model").status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(store_->OwnerBytes("operator:alice"), 0);
}

TEST_F(ArtifactStoreTest, ATruncatedOrCorruptUploadIsRefusedAndLeavesNothing) {
  const std::string bytes = "twelve bytes";
  v1::ArtifactInfo longer = InfoOf(bytes);
  longer.set_bytes(20);
  auto cut = Put("mnist-1", "operator:alice", bytes, longer);
  EXPECT_EQ(cut.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(cut.status().message(),
              HasSubstr("job mnist-1 rank 0: 12 of the 20 bytes its header "
                        "declared came; the upload was cut short"));
  auto corrupt =
      Put("mnist-1", "operator:alice", "twelve bytez", InfoOf(bytes));
  EXPECT_EQ(corrupt.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(corrupt.status().message(), HasSubstr("were corrupted"));
  v1::ArtifactInfo shorter = InfoOf(bytes);
  shorter.set_bytes(5);
  auto more = Put("mnist-1", "operator:alice", bytes, shorter);
  EXPECT_EQ(more.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(store_->List("mnist-1"), IsEmpty());
  EXPECT_EQ(store_->OwnerBytes("operator:alice"), 0);
  EXPECT_THAT(FilesIn(dir_ + "/artifacts/mnist-1"), IsEmpty());  // no temp
}

TEST_F(ArtifactStoreTest, BoundsPerArtifactAndPerOwner) {
  const std::string big(101, 'x');
  auto over = store_->Begin("mnist-1", "operator:alice", InfoOf(big));
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(over.status().message(), HasSubstr("--max-artifact-bytes"));
  const std::string eighty(80, 'y');
  ASSERT_TRUE(Put("mnist-1", "operator:alice", eighty, InfoOf(eighty)).ok());
  // In flight, a second upload's bytes count too.
  auto second = store_->Begin("mnist-2", "operator:alice", InfoOf(eighty));
  EXPECT_EQ(second.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(second.status().message(),
              HasSubstr("--max-owner-artifact-bytes"));
  // Another owner has its own bound; a replaced artifact frees its bytes.
  EXPECT_TRUE(Put("mnist-3", "operator:bob", eighty, InfoOf(eighty)).ok());
  ASSERT_TRUE(Put("mnist-1", "operator:alice", eighty, InfoOf(eighty)).ok());
  EXPECT_EQ(store_->OwnerBytes("operator:alice"), 80);
}

TEST_F(ArtifactStoreTest, NamesAndDigestsAreChecked) {
  v1::ArtifactInfo info = InfoOf("x");
  info.set_name("../../etc/passwd");
  EXPECT_EQ(store_->Begin("mnist-1", "o", info).status().code(),
            absl::StatusCode::kInvalidArgument);
  info = InfoOf("x");
  info.set_file_name("../model.pt");
  EXPECT_EQ(store_->Begin("mnist-1", "o", info).status().code(),
            absl::StatusCode::kInvalidArgument);
  info = InfoOf("x");
  info.set_sha256("abc");
  EXPECT_EQ(store_->Begin("mnist-1", "o", info).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->Begin("..", "o", InfoOf("x")).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(store_->Read("..", "model").status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(ArtifactStoreTest, AnUploadLeftByACrashIsRemovedAtOpen) {
  // What a coordinator killed mid-upload leaves: a temporary file.
  const std::string folder = dir_ + "/artifacts/mnist-1";
  ASSERT_TRUE(MakeDirectories(folder).ok());
  ASSERT_TRUE(
      WriteFileAtomically(folder + "/.upload-model-0123456789abcdef", "ab")
          .ok());
  Reopen();
  EXPECT_THAT(store_->List("mnist-1"), IsEmpty());
  EXPECT_EQ(store_->OwnerBytes("operator:alice"), 0);
  EXPECT_THAT(FilesIn(folder), IsEmpty());
}

}  // namespace
}  // namespace lockstep::coordinator
