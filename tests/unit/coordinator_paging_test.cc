// Responses that stay bounded however long a job runs (issue 27, item 7):
// the loss history comes in pages, evaluations are thinned, the worker list
// is paged. Each page is checked to hold every item exactly once.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "coordinator/coordinator.h"
#include "coordinator/job_status.h"
#include "coordinator/message_checks.h"
#include "tests/unit/coordinator_fixture.h"

namespace lockstep::coordinator {
namespace {

class PagingTest : public CoordinatorTest {
 protected:
  // The chief reports `steps` losses (loss i at index i) in reports of
  // kMaxHistoryPage losses; `with_lrs`: each with learning rate -i.
  void ReportLosses(const std::string& worker, const std::string& job,
                    int64_t steps, bool with_lrs = false) {
    for (int64_t first = 0; first < steps; first += kMaxHistoryPage) {
      const int64_t last = std::min<int64_t>(steps, first + kMaxHistoryPage);
      v1::WorkerMessage message = Progress(job, 1, last, steps);
      message.mutable_progress()->set_first_step(first);
      for (int64_t i = first; i < last; ++i) {
        message.mutable_progress()->add_step_losses(static_cast<float>(i));
        if (with_lrs) {
          message.mutable_progress()->add_step_lrs(-static_cast<float>(i));
        }
      }
      ASSERT_TRUE(coordinator_->HandleWorkerMessage(worker, message).ok());
    }
  }

  absl::StatusOr<v1::GetJobStatusResponse> HistoryPage(const std::string& job,
                                                       int64_t offset,
                                                       int limit) {
    v1::GetJobStatusRequest request;
    request.set_job_id(job);
    request.set_include_history(true);
    request.set_history_offset(offset);
    request.set_history_limit(limit);
    return coordinator_->GetJobStatus(request);
  }
};

// A history of 2^20 + 5 losses (more than gRPC's 4 MiB in one message)
// comes back in pages of at most kMaxHistoryPage that hold every loss once.
TEST_F(PagingTest, TheLossHistoryComesInBoundedPages) {
  Make();
  FakeSink a;
  std::string worker = Connect(1, &a);
  std::string job = *coordinator_->SubmitJob(Spec(1));
  const int64_t steps = kMaxLossHistory;
  ReportLosses(worker, job, steps);

  int64_t offset = 0;
  int pages = 0;
  while (true) {
    auto page = HistoryPage(job, offset, 0);
    ASSERT_TRUE(page.ok()) << page.status();
    const v1::JobStatus& status = page->jobs(0);
    EXPECT_LT(page->ByteSizeLong(), size_t{2} << 20);
    EXPECT_EQ(status.history_offset(), offset);
    EXPECT_EQ(status.history_size(), steps);
    ASSERT_LE(status.step_losses_size(), kMaxHistoryPage);
    for (int i = 0; i < status.step_losses_size(); ++i) {
      ASSERT_EQ(status.step_losses(i), static_cast<float>(offset + i));
    }
    ++pages;
    offset += status.step_losses_size();
    if (status.step_losses_size() == 0 || offset >= status.history_size()) {
      break;
    }
  }
  EXPECT_EQ(offset, steps);
  EXPECT_EQ(pages, steps / kMaxHistoryPage);

  // A smaller page, and one past the end (empty, not an error).
  auto small = HistoryPage(job, 10, 3);
  ASSERT_TRUE(small.ok());
  EXPECT_THAT(small->jobs(0).step_losses(), ::testing::ElementsAre(10, 11, 12));
  auto past = HistoryPage(job, steps + 7, 0);
  ASSERT_TRUE(past.ok());
  EXPECT_EQ(past->jobs(0).step_losses_size(), 0);
  EXPECT_EQ(past->jobs(0).history_offset(), steps);
}

// Past 2^20 steps the history keeps every second loss, then every fourth:
// 3 x 2^20 + 5 steps leave the losses of steps 1, 5, 9, ..., the last one
// included, and a resume in the middle of a stride rewrites from there.
TEST_F(PagingTest, ALongerHistoryIsThinnedAndSpansTheJob) {
  Make();
  FakeSink a;
  std::string worker = Connect(1, &a);
  std::string job = *coordinator_->SubmitJob(Spec(1));
  const int64_t steps = 3 * int64_t{kMaxLossHistory} + 5;
  ReportLosses(worker, job, steps);
  auto page = HistoryPage(job, 0, 0);
  ASSERT_TRUE(page.ok()) << page.status();
  EXPECT_EQ(page->jobs(0).loss_stride(), 4);
  EXPECT_EQ(page->jobs(0).history_size(), (steps + 3) / 4);
  auto tail = HistoryPage(job, (steps + 3) / 4 - 2, 0);
  ASSERT_TRUE(tail.ok());
  // Loss i of the report is step i + 1's.
  EXPECT_THAT(tail->jobs(0).step_losses(),
              ::testing::ElementsAre(steps - 5, steps - 1));
  for (int i = 0; i < page->jobs(0).step_losses_size(); ++i) {
    ASSERT_EQ(page->jobs(0).step_losses(i), static_cast<float>(4 * i));
  }

  // The job resumes at step 2^21 + 2 (index 2^21 + 1, inside a stride):
  // the history is cut after step 2^21 + 1 and goes on from there.
  const int64_t resumed = (int64_t{2} << 20) + 1;
  v1::WorkerMessage message = Progress(job, 1, resumed + 8, steps);
  message.mutable_progress()->set_first_step(resumed);
  for (int64_t i = resumed; i < resumed + 8; ++i) {
    message.mutable_progress()->add_step_losses(-static_cast<float>(i));
  }
  ASSERT_TRUE(coordinator_->HandleWorkerMessage(worker, message).ok());
  auto resumed_page = HistoryPage(job, (int64_t{1} << 19) - 1, 0);
  ASSERT_TRUE(resumed_page.ok());
  EXPECT_EQ(resumed_page->jobs(0).history_size(), (int64_t{1} << 19) + 3);
  EXPECT_THAT(resumed_page->jobs(0).step_losses(),
              ::testing::ElementsAre(resumed - 5, resumed - 1, -(resumed + 3),
                                     -(resumed + 7)));
}

// The learning rates the workers report stay beside their losses: thinned
// with them, paged with them (in pages of half as many steps, so that a page
// holds no more floats), NaN for steps reported without one; a report whose
// counts differ is refused.
TEST_F(PagingTest, LearningRatesStayBesideTheirLosses) {
  Make();
  FakeSink a;
  std::string worker = Connect(1, &a);
  std::string job = *coordinator_->SubmitJob(Spec(1));
  const int64_t steps = int64_t{kMaxLossHistory} + 5;
  ReportLosses(worker, job, steps, /*with_lrs=*/true);
  int64_t offset = 0;
  while (true) {
    auto page = HistoryPage(job, offset, kMaxHistoryPage);
    ASSERT_TRUE(page.ok()) << page.status();
    const v1::JobStatus& status = page->jobs(0);
    EXPECT_EQ(status.loss_stride(), 2);
    ASSERT_LE(status.step_losses_size(), kMaxHistoryPage / 2);
    ASSERT_EQ(status.step_lrs_size(), status.step_losses_size());
    for (int i = 0; i < status.step_losses_size(); ++i) {
      ASSERT_EQ(status.step_lrs(i), -status.step_losses(i));
      ASSERT_EQ(status.step_losses(i), static_cast<float>(2 * (offset + i)));
    }
    offset += status.step_losses_size();
    if (status.step_losses_size() == 0 || offset >= status.history_size()) {
      break;
    }
  }
  EXPECT_EQ(offset, (steps + 1) / 2);

  // Two more steps from a worker that reports no learning rate.
  v1::WorkerMessage older = Progress(job, 1, steps + 2, steps + 2);
  older.mutable_progress()->set_first_step(steps);
  older.mutable_progress()->add_step_losses(1);
  older.mutable_progress()->add_step_losses(2);
  ASSERT_TRUE(coordinator_->HandleWorkerMessage(worker, older).ok());
  auto tail = HistoryPage(job, (steps + 1) / 2 - 1, 0);
  ASSERT_TRUE(tail.ok());
  ASSERT_EQ(tail->jobs(0).step_lrs_size(), 2);
  EXPECT_EQ(tail->jobs(0).step_lrs(0), -static_cast<float>(steps - 1));
  EXPECT_TRUE(std::isnan(tail->jobs(0).step_lrs(1)));

  v1::WorkerMessage uneven = Progress(job, 1, steps + 4, steps + 4);
  uneven.mutable_progress()->set_first_step(steps + 2);
  uneven.mutable_progress()->add_step_losses(1);
  uneven.mutable_progress()->add_step_losses(2);
  uneven.mutable_progress()->add_step_lrs(0.5);
  absl::Status refused = coordinator_->HandleWorkerMessage(worker, uneven);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(), ::testing::HasSubstr("step_lrs"));
}

// A history begun by workers that reported no learning rates gets NaN for
// those steps once one does.
TEST_F(PagingTest, LearningRatesStartedLateAreNaNBefore) {
  Make();
  FakeSink a;
  std::string worker = Connect(1, &a);
  std::string job = *coordinator_->SubmitJob(Spec(1));
  ReportLosses(worker, job, 3);
  v1::WorkerMessage newer = Progress(job, 1, 5, 5);
  newer.mutable_progress()->set_first_step(3);
  newer.mutable_progress()->add_step_losses(3);
  newer.mutable_progress()->add_step_losses(4);
  newer.mutable_progress()->add_step_lrs(0.25);
  newer.mutable_progress()->add_step_lrs(0.5);
  ASSERT_TRUE(coordinator_->HandleWorkerMessage(worker, newer).ok());
  auto page = HistoryPage(job, 0, 0);
  ASSERT_TRUE(page.ok());
  const v1::JobStatus& status = page->jobs(0);
  ASSERT_EQ(status.step_lrs_size(), 5);
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(std::isnan(status.step_lrs(i)));
  EXPECT_EQ(status.step_lrs(3), 0.25f);
  EXPECT_EQ(status.step_lrs(4), 0.5f);
  // A status without the history has neither.
  v1::GetJobStatusRequest plain;
  plain.set_job_id(job);
  auto summary = coordinator_->GetJobStatus(plain);
  ASSERT_TRUE(summary.ok());
  EXPECT_EQ(summary->jobs(0).step_lrs_size(), 0);
}

TEST_F(PagingTest, OutOfRangePagesAreRefused) {
  Make();
  std::string job = *coordinator_->SubmitJob(Spec(1));
  EXPECT_TRUE(absl::IsInvalidArgument(HistoryPage(job, -1, 0).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      HistoryPage(job, 0, kMaxHistoryPage + 1).status()));
  v1::ListWorkersRequest workers;
  workers.set_page_size(kMaxWorkerPage + 1);
  EXPECT_TRUE(
      absl::IsInvalidArgument(coordinator_->ListWorkers(workers).status()));
  workers.set_page_size(0);
  workers.set_page_token("has spaces");
  EXPECT_TRUE(
      absl::IsInvalidArgument(coordinator_->ListWorkers(workers).status()));
}

// 150,000 evaluations (the report flood of the issue) leave at most
// kMaxEvals, still spanning the job from its first to its newest, and the
// dropped ones are counted.
TEST_F(PagingTest, EvaluationsAreThinnedAndKeepTheirSpan) {
  Make();
  FakeSink a;
  std::string worker = Connect(1, &a);
  std::string job = *coordinator_->SubmitJob(Spec(1));
  const int64_t reports = 150000;
  for (int64_t step = 1; step <= reports; ++step) {
    v1::WorkerMessage message = Progress(job, 1, step, reports);
    message.mutable_progress()->set_test_accuracy(0.5);
    message.mutable_progress()->set_test_loss(1.0);
    ASSERT_TRUE(coordinator_->HandleWorkerMessage(worker, message).ok());
  }
  v1::JobStatus status = Status(job);
  ASSERT_GT(status.evals_size(), 0);
  EXPECT_LE(status.evals_size(), kMaxEvals);
  EXPECT_EQ(status.evals(0).step(), 1);
  EXPECT_EQ(status.evals(status.evals_size() - 1).step(), reports);
  EXPECT_EQ(status.evals_size() + status.dropped_evals(), reports);
  for (int i = 1; i < status.evals_size(); ++i) {
    ASSERT_LT(status.evals(i - 1).step(), status.evals(i).step());
  }
  EXPECT_LT(status.ByteSizeLong(), size_t{1} << 20);
}

// 2,500 free workers come back in pages of at most kMaxWorkerPage, each
// worker exactly once.
TEST_F(PagingTest, TheWorkerListIsPaged) {
  Make();
  std::vector<std::unique_ptr<FakeSink>> sinks;
  const int workers = 2500;
  for (int i = 0; i < workers; ++i) {
    sinks.push_back(std::make_unique<FakeSink>());
    Connect(i + 1, sinks.back().get());
  }
  std::set<std::string> seen;
  v1::ListWorkersRequest request;
  int pages = 0;
  while (true) {
    auto page = coordinator_->ListWorkers(request);
    ASSERT_TRUE(page.ok()) << page.status();
    ASSERT_LE(page->workers_size(), kMaxWorkerPage);
    for (const v1::WorkerInfo& info : page->workers()) {
      EXPECT_TRUE(seen.insert(info.worker_id()).second) << info.worker_id();
    }
    ++pages;
    if (page->next_page_token().empty()) break;
    request.set_page_token(page->next_page_token());
  }
  EXPECT_EQ(seen.size(), static_cast<size_t>(workers));
  EXPECT_EQ(pages, 3);
}

}  // namespace
}  // namespace lockstep::coordinator
