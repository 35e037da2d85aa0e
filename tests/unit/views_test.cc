// The progress view prints every new event and evaluation once, also after
// the coordinator dropped older ones from the job's status (it keeps the
// newest 1,000 events and thins its evaluations).
#include "client/views.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"

namespace lockstep::client {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

void AddEvent(v1::JobStatus& status, int n) {
  v1::JobEvent* event = status.add_events();
  event->set_kind("note");
  event->set_message(absl::StrCat("event-", n, "."));
}

TEST(ProgressViewTest, NewEventsPrintOnceAfterOlderOnesWereDropped) {
  std::ostringstream out;
  ProgressView view(out, /*tty=*/false);
  v1::JobStatus status;
  status.set_state(v1::JOB_STATE_RUNNING);
  for (int n = 0; n < 3; ++n) AddEvent(status, n);
  view.Update(status);
  // The coordinator dropped the two oldest and added two new ones.
  status.mutable_events()->DeleteSubrange(0, 2);
  status.set_dropped_events(2);
  AddEvent(status, 3);
  AddEvent(status, 4);
  view.Update(status);
  view.Update(status);
  const std::string text = out.str();
  for (int n = 0; n < 5; ++n) {
    const std::string line = absl::StrCat("event-", n, ".");
    ASSERT_THAT(text, HasSubstr(line));
    EXPECT_EQ(text.find(line), text.rfind(line)) << line << " twice";
  }
}

TEST(ProgressViewTest, NewEvaluationsPrintOnceAfterThinning) {
  std::ostringstream out;
  ProgressView view(out, /*tty=*/false);
  v1::JobStatus status;
  status.set_state(v1::JOB_STATE_RUNNING);
  for (int step : {100, 200, 300}) status.add_evals()->set_step(step);
  view.Update(status);
  // Thinned to the first and last, then one more.
  status.mutable_evals()->DeleteSubrange(1, 1);
  status.set_dropped_evals(1);
  status.add_evals()->set_step(400);
  view.Update(status);
  const std::string text = out.str();
  for (int step : {100, 200, 300, 400}) {
    const std::string step_text = absl::StrCat("step ", step, ":");
    ASSERT_THAT(text, HasSubstr(step_text)) << text;
    EXPECT_EQ(text.find(step_text), text.rfind(step_text)) << text;
  }
  EXPECT_THAT(text, Not(HasSubstr("step 500:")));
}

// Issue 33: a queued job's line says where it stands and why it waits, and
// a new reason is printed at once.
TEST(ProgressViewTest, AQueuedJobSaysWhyItWaits) {
  std::ostringstream out;
  ProgressView view(out, /*tty=*/false);
  v1::JobStatus status;
  status.set_job_id("cnn-7");
  status.set_state(v1::JOB_STATE_QUEUED);
  status.mutable_queue()->set_position(2);
  status.mutable_queue()->set_reason("quota");
  status.mutable_queue()->set_message(
      "needs 2 workers; its owner holds 4 of a quota of 4");
  view.Update(status);
  status.mutable_queue()->set_position(1);
  status.mutable_queue()->set_reason("preempting");
  status.mutable_queue()->set_message("needs 2 workers; waiting for mlp-3");
  view.Update(status);
  EXPECT_THAT(out.str(),
              HasSubstr("cnn-7  queued #2 (quota): needs 2 workers; its owner "
                        "holds 4 of a quota of 4\n"));
  EXPECT_THAT(out.str(), HasSubstr("cnn-7  queued #1 (preempting)"));
}

}  // namespace
}  // namespace lockstep::client
