// Coordinator tests: the records of a job's data its ranks skipped
// (data.skip_corrupt) are counted once each, whoever reports them and
// however often, each named in an event; past the spec's limit the job
// fails; a job that skips nothing takes no such report.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "coordinator/coordinator.h"
#include "coordinator/message_checks.h"
#include "tests/unit/coordinator_fixture.h"

namespace lockstep::coordinator {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

v1::JobSpec SkippingSpec(int workers, int skip) {
  v1::JobSpec spec = Spec(workers);
  v1::DataSpec& data = *spec.mutable_data();
  data.set_format("tfrecord");
  data.set_train("train-*");
  data.set_test("test-*");
  v1::ColumnSpec& x = (*data.mutable_features())["x"];
  x.set_dtype("float32");
  x.add_shape(1);
  data.set_skip_corrupt(skip);
  return spec;
}

v1::WorkerMessage Skipped(
    const std::string& job, int64_t generation,
    const std::vector<std::pair<std::string, int64_t>>& files_and_offsets) {
  v1::WorkerMessage message;
  v1::RecordsSkipped* skipped = message.mutable_skipped();
  skipped->set_job_id(job);
  skipped->set_generation(generation);
  for (const auto& [file, offset] : files_and_offsets) {
    v1::SkippedRecord* record = skipped->add_records();
    record->set_file(file);
    record->set_record(offset / 100);
    record->set_offset(offset);
    record->set_reason("corrupt JPEG: premature end of data");
    record->set_split("train");
  }
  return message;
}

TEST_F(CoordinatorTest, SkippedRecordsCountOnceAndPastTheLimitFailTheJob) {
  Make();
  FakeSink a, b;
  std::string id_a = Connect(1, &a);
  std::string id_b = Connect(2, &b);
  auto job = coordinator_->SubmitJob(SkippingSpec(2, 3));
  ASSERT_TRUE(job.ok()) << job.status();
  // Both ranks find the same record; rank 1 sends it twice.
  for (const std::string& id : {id_a, id_b, id_b}) {
    ASSERT_TRUE(
        coordinator_
            ->HandleWorkerMessage(id, Skipped(*job, 1, {{"train-00001", 300}}))
            .ok());
  }
  v1::JobStatus status = Status(*job);
  EXPECT_EQ(status.records_skipped(), 1);
  auto events = EventsOf(status, "record_skipped");
  ASSERT_EQ(events.size(), 1u);
  EXPECT_THAT(events[0].message(),
              AllOf(HasSubstr("rank 0"),
                    HasSubstr("train data train-00001 record 3 at byte 300"),
                    HasSubstr("corrupt JPEG"), HasSubstr("1 of 3 allowed")));
  // The same offset in another file is another record.
  ASSERT_TRUE(coordinator_
                  ->HandleWorkerMessage(
                      id_b, Skipped(*job, 1,
                                    {{"train-00002", 300}, {"train-00003", 0}}))
                  .ok());
  status = Status(*job);
  EXPECT_EQ(status.records_skipped(), 3);
  EXPECT_EQ(status.state(), v1::JOB_STATE_RUNNING);
  // A report from a generation that is not the job's live one counts
  // nothing.
  ASSERT_TRUE(
      coordinator_
          ->HandleWorkerMessage(id_a, Skipped(*job, 7, {{"train-00004", 0}}))
          .ok());
  EXPECT_EQ(Status(*job).records_skipped(), 3);
  // The fourth fails the job, naming it and the limit.
  ASSERT_TRUE(
      coordinator_
          ->HandleWorkerMessage(id_a, Skipped(*job, 1, {{"train-00004", 1200}}))
          .ok());
  status = Status(*job);
  EXPECT_EQ(status.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(
      status.error(),
      AllOf(HasSubstr("more than 3 records"), HasSubstr("data.skip_corrupt: 3"),
            HasSubstr("train-00004 record 12 at byte 1200")));
  // Listings carry the count, not the keys.
  auto listed = coordinator_->GetJobStatus(v1::GetJobStatusRequest());
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->jobs_size(), 1);
  EXPECT_EQ(listed->jobs(0).records_skipped(), 4);
  EXPECT_EQ(listed->jobs(0).skipped_record_keys_size(), 0);
}

TEST_F(CoordinatorTest, AStrictJobTakesNoSkippedRecordsAndBadOnesAreRefused) {
  Make();
  FakeSink a;
  std::string id_a = Connect(1, &a);
  auto job = coordinator_->SubmitJob(SkippingSpec(1, 0));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(
      coordinator_
          ->HandleWorkerMessage(id_a, Skipped(*job, 1, {{"train-00001", 300}}))
          .ok());
  v1::JobStatus status = Status(*job);
  EXPECT_EQ(status.records_skipped(), 0);
  EXPECT_EQ(status.state(), v1::JOB_STATE_RUNNING);

  v1::WorkerMessage bad = Skipped(*job, 1, {{"train-00001", 300}});
  bad.mutable_skipped()->mutable_records(0)->set_split("validation");
  EXPECT_TRUE(
      absl::IsInvalidArgument(coordinator_->HandleWorkerMessage(id_a, bad)));
  bad = Skipped(*job, 1, {});
  for (int i = 0; i <= kMaxSkippedRecordsPerMessage; ++i) {
    *bad.mutable_skipped()->add_records() =
        Skipped(*job, 1, {{"f", i}}).skipped().records(0);
  }
  EXPECT_TRUE(
      absl::IsInvalidArgument(coordinator_->HandleWorkerMessage(id_a, bad)));
  bad = Skipped(*job, 1, {{"f", -2}});
  EXPECT_TRUE(
      absl::IsInvalidArgument(coordinator_->HandleWorkerMessage(id_a, bad)));
}

}  // namespace
}  // namespace lockstep::coordinator
