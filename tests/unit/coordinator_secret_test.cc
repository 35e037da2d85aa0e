// Coordinator tests: the data-plane keys (docs/DESIGN.md, "Data-plane
// transport"). Each generation's ranks get fresh pair keys in their
// Assignment, the key of a pair the same on its two ranks, and a token of
// their own; the job's status, its events, the workers' list and the job
// store never hold them.
#include <dirent.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <fstream>
#include <sstream>

#include "absl/strings/escaping.h"
#include "common/proto_json.h"
#include "coordinator/coordinator.h"
#include "tests/unit/coordinator_fixture.h"

namespace lockstep::coordinator {
namespace {

// The last assignment `sink` got.
v1::Assignment LastAssignment(const FakeSink& sink) {
  auto assignments = CommandsOf(sink, v1::CoordinatorCommand::kAssignment);
  return assignments.empty() ? v1::Assignment()
                             : assignments.back().assignment();
}

// The key `sink`'s rank shares with rank `peer`.
std::string PairKeyOf(const FakeSink& sink, int peer) {
  const v1::Assignment a = LastAssignment(sink);
  return peer < a.data_plane_pair_keys_size() ? a.data_plane_pair_keys(peer)
                                              : "";
}

// Every byte of every file in `dir` (the SQLite database and its journal).
std::string FilesIn(const std::string& dir) {
  std::string all;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return all;
  while (const dirent* entry = readdir(d)) {
    std::ifstream in(dir + "/" + entry->d_name, std::ios::binary);
    std::stringstream bytes;
    bytes << in.rdbuf();
    all += bytes.str();
  }
  closedir(d);
  return all;
}

void ExpectNowhere(const std::string& secret, const std::string& where,
                   const std::string& what) {
  EXPECT_EQ(where.find(secret), std::string::npos) << what;
  EXPECT_EQ(where.find(absl::Base64Escape(secret)), std::string::npos) << what;
  EXPECT_EQ(where.find(absl::BytesToHexString(secret)), std::string::npos)
      << what;
}

TEST_F(CoordinatorTest, EachGenerationHandsItsRanksFreshKeysShownNowhere) {
  std::string tmpl = ::testing::TempDir() + "coordinator_test_XXXXXX";
  std::string dir = mkdtemp(tmpl.data());
  Make(std::nullopt, *JobStore::Open(dir));
  FakeSink a, b;
  std::string id_a = Connect(1, &a);
  Connect(2, &b);
  std::string job = *coordinator_->SubmitJob(Spec(2));
  const int rank_a = LastAssignment(a).rank();
  const std::string first = PairKeyOf(a, 1 - rank_a);
  EXPECT_EQ(first.size(), 32u);
  EXPECT_EQ(PairKeyOf(b, rank_a), first);  // both ranks of the pair
  EXPECT_TRUE(PairKeyOf(a, rank_a).empty());
  // The CPU data plane's ranks never see the generation's secret.
  EXPECT_TRUE(LastAssignment(a).data_plane_secret().empty());
  const std::string token_a = LastAssignment(a).rank_token();
  EXPECT_EQ(token_a.size(), 32u);
  EXPECT_NE(LastAssignment(b).rank_token(), token_a);

  // A rank's retryable error ends generation 1; the job re-forms.
  v1::WorkerMessage failed;
  failed.mutable_result()->set_job_id(job);
  failed.mutable_result()->set_generation(1);
  failed.mutable_result()->set_ok(false);
  failed.mutable_result()->set_code(
      static_cast<int>(absl::StatusCode::kUnavailable));
  failed.mutable_result()->set_error("a stranger on rank 0's Gloo port");
  ASSERT_TRUE(coordinator_->HandleWorkerMessage(id_a, failed).ok());
  clock_.Advance(absl::Seconds(1));
  coordinator_->Sweep();
  ASSERT_EQ(Status(job).generation(), 2);
  const int second_rank_a = LastAssignment(a).rank();
  const std::string second = PairKeyOf(a, 1 - second_rank_a);
  EXPECT_EQ(second.size(), 32u);
  EXPECT_EQ(PairKeyOf(b, second_rank_a), second);
  EXPECT_NE(second, first);
  EXPECT_NE(LastAssignment(a).rank_token(), token_a);

  v1::JobStatus status = Status(job);
  std::string workers;
  for (const v1::WorkerInfo& info : ListWorkers()) {
    workers += info.SerializeAsString() + ToJson(info, JsonStyle::kCompact);
  }
  coordinator_.reset();  // the store is written and closed
  for (const std::string& secret :
       {first, second, token_a, LastAssignment(a).rank_token()}) {
    ExpectNowhere(secret, status.SerializeAsString(), "the job's status");
    ExpectNowhere(secret, ToJson(status, JsonStyle::kCompact),
                  "the job's status as the CLI prints it");
    ExpectNowhere(secret, workers, "the workers' list");
    ExpectNowhere(secret, FilesIn(dir), "the job store");
  }
}

}  // namespace
}  // namespace lockstep::coordinator
