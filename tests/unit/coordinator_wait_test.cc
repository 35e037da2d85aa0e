// The Coordinator's non-blocking waits on the fake clock: KvGetAsync
// completes on set, on the fence, at the deadline
// (Sweep), on cancel and on shutdown, exactly once; job watchers see each
// change until they are removed.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "coordinator/coordinator.h"
#include "tests/unit/coordinator_fixture.h"

namespace lockstep::coordinator {
namespace {

using ::testing::HasSubstr;

v1::KvGetRequest Get(const std::string& job, const std::string& key,
                     int64_t timeout_ms) {
  v1::KvGetRequest get;
  get.set_job_id(job);
  get.set_generation(1);
  get.set_key(key);
  get.set_timeout_ms(timeout_ms);
  return get;
}

v1::KvSetRequest Set(const std::string& job, const std::string& key,
                     const std::string& value) {
  v1::KvSetRequest set;
  set.set_job_id(job);
  set.set_generation(1);
  set.set_key(key);
  set.set_value(value);
  return set;
}

// Records each completion of a KvGetAsync.
struct KvResults {
  Coordinator::KvGetDone Callback() {
    return [this](absl::StatusOr<std::string> value) {
      results.push_back(std::move(value));
    };
  }
  std::vector<absl::StatusOr<std::string>> results;
};

class CoordinatorWaitTest : public CoordinatorTest {
 protected:
  // Two workers connected and a two-rank job in generation 1.
  void StartJob() {
    Make();
    Connect(1, &a_);
    id_b_ = Connect(2, &b_);
    job_ = *coordinator_->SubmitJob(Spec(2));
  }

  FakeSink a_, b_;
  std::string id_b_;
  std::string job_;
};

// timeout_ms 0 is a poll: answered at once, as the blocking form does, not
// at the next Sweep.
TEST_F(CoordinatorWaitTest, AZeroTimeoutIsAnsweredAtOnceWithoutASweep) {
  StartJob();
  KvResults got;
  EXPECT_EQ(coordinator_->KvGetAsync(Anyone(), Get(job_, "missing", 0),
                                     got.Callback()),
            0);
  ASSERT_EQ(got.results.size(), 1u);
  EXPECT_EQ(got.results[0].status().code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(got.results[0].status().message(), HasSubstr("key 'missing'"));
}

TEST_F(CoordinatorWaitTest, KvGetAsyncAnswersAtOnceWhenTheKeyIsSet) {
  StartJob();
  ASSERT_TRUE(coordinator_->KvSet(Anyone(), Signed(Set(job_, "k", "v"))).ok());
  KvResults got;
  coordinator_->KvGetAsync(Anyone(), Get(job_, "k", 1000), got.Callback());
  ASSERT_EQ(got.results.size(), 1u);
  EXPECT_EQ(*got.results[0], "v");
}

TEST_F(CoordinatorWaitTest, KvGetAsyncCompletesOnTheKvSetThatSetsIt) {
  StartJob();
  KvResults got, other;
  coordinator_->KvGetAsync(Anyone(), Get(job_, "late", 1000), got.Callback());
  coordinator_->KvGetAsync(Anyone(), Get(job_, "other", 1000),
                           other.Callback());
  EXPECT_TRUE(got.results.empty());
  ASSERT_TRUE(
      coordinator_->KvSet(Anyone(), Signed(Set(job_, "late", "here"))).ok());
  ASSERT_EQ(got.results.size(), 1u);
  EXPECT_EQ(*got.results[0], "here");
  EXPECT_TRUE(other.results.empty());
  // Set again: the completed wait is not called twice.
  ASSERT_TRUE(
      coordinator_->KvSet(Anyone(), Signed(Set(job_, "late", "again"))).ok());
  EXPECT_EQ(got.results.size(), 1u);
}

TEST_F(CoordinatorWaitTest, KvGetAsyncIsFencedWhenTheGenerationEnds) {
  StartJob();
  KvResults got;
  coordinator_->KvGetAsync(Anyone(), Get(job_, "k", 60000), got.Callback());
  coordinator_->CloseSession(id_b_, 2, &b_, absl::UnavailableError("gone"));
  ASSERT_EQ(got.results.size(), 1u);
  EXPECT_EQ(got.results[0].status().code(), absl::StatusCode::kAborted);
  EXPECT_THAT(got.results[0].status().message(), HasSubstr("is over"));
}

TEST_F(CoordinatorWaitTest, KvGetAsyncTimesOutAtTheFirstSweepPastItsDeadline) {
  StartJob();
  KvResults got;
  coordinator_->KvGetAsync(Anyone(), Get(job_, "missing", 500), got.Callback());
  clock_.Advance(absl::Milliseconds(499));
  coordinator_->Sweep();
  EXPECT_TRUE(got.results.empty());
  clock_.Advance(absl::Milliseconds(1));
  coordinator_->Sweep();
  ASSERT_EQ(got.results.size(), 1u);
  EXPECT_EQ(got.results[0].status().code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_THAT(got.results[0].status().message(),
              HasSubstr("key 'missing' of job " + job_));
}

TEST_F(CoordinatorWaitTest, CancelWaitEndsAPendingWaitOnlyOnce) {
  StartJob();
  KvResults got;
  Coordinator::WaitId id =
      coordinator_->KvGetAsync(Anyone(), Get(job_, "k", 60000), got.Callback());
  coordinator_->CancelWait(id);
  ASSERT_EQ(got.results.size(), 1u);
  EXPECT_EQ(got.results[0].status().code(), absl::StatusCode::kCancelled);
  coordinator_->CancelWait(id);
  ASSERT_TRUE(coordinator_->KvSet(Anyone(), Signed(Set(job_, "k", "v"))).ok());
  EXPECT_EQ(got.results.size(), 1u);
}

TEST_F(CoordinatorWaitTest, ShutdownCancelsWaitsAndWatches) {
  StartJob();
  KvResults got;
  coordinator_->KvGetAsync(Anyone(), Get(job_, "k", 60000), got.Callback());
  std::vector<absl::StatusCode> watched;
  ASSERT_TRUE(coordinator_
                  ->WatchJob(job_,
                             [&watched](auto status) {
                               watched.push_back(status.status().code());
                             })
                  .ok());
  coordinator_->Shutdown();
  ASSERT_EQ(got.results.size(), 1u);
  EXPECT_EQ(got.results[0].status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(watched.back(), absl::StatusCode::kCancelled);
  EXPECT_EQ(coordinator_->WatchJob(job_, [](auto) {}).status().code(),
            absl::StatusCode::kUnavailable);
}

TEST_F(CoordinatorWaitTest, WatcherSeesEachChangeUntilRemoved) {
  StartJob();
  std::vector<std::shared_ptr<const v1::JobStatus>> seen;
  auto id = coordinator_->WatchJob(job_, [&seen](auto status) {
    ASSERT_TRUE(status.ok()) << status.status();
    seen.push_back(*status);
  });
  ASSERT_TRUE(id.ok()) << id.status();
  ASSERT_EQ(seen.size(), 1u);  // the current status, before WatchJob returns
  EXPECT_EQ(seen[0]->state(), v1::JOB_STATE_RUNNING);
  coordinator_->CloseSession(id_b_, 2, &b_, absl::UnavailableError("gone"));
  ASSERT_GE(seen.size(), 2u);
  EXPECT_EQ(seen.back()->state(), v1::JOB_STATE_RECOVERING);
  EXPECT_GT(seen.back()->version(), seen[0]->version());
  size_t before = seen.size();
  coordinator_->Unwatch(*id);
  ASSERT_TRUE(coordinator_->StopJob(job_).ok());
  EXPECT_EQ(seen.size(), before);
}

TEST_F(CoordinatorWaitTest, DeletingAJobEndsItsWatchesWithNotFound) {
  StartJob();
  std::vector<absl::Status> seen;
  ASSERT_TRUE(
      coordinator_
          ->WatchJob(job_,
                     [&seen](auto status) { seen.push_back(status.status()); })
          .ok());
  coordinator_->CloseSession(id_b_, 2, &b_, absl::UnavailableError("gone"));
  ASSERT_TRUE(coordinator_->StopJob(job_).ok());  // RECOVERING: stops at once
  ASSERT_TRUE(coordinator_->DeleteJob(job_).ok());
  ASSERT_FALSE(seen.empty());
  EXPECT_EQ(seen.back().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(seen.back().message(), HasSubstr("was deleted"));
}

TEST_F(CoordinatorWaitTest, WatchingAnUnknownJobIsNotFound) {
  Make();
  bool called = false;
  auto id = coordinator_->WatchJob("nope", [&called](auto) { called = true; });
  EXPECT_EQ(id.status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(called);
}

}  // namespace
}  // namespace lockstep::coordinator
