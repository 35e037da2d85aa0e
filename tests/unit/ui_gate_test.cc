// The web console's gate (client/ui_gate.h): the token, the Host and the
// Origin, the methods and the writes' content type; and the curve the API
// sends (client/ui_server.h): a 100,000-step history in at most 2000 means.
#include "client/ui_gate.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>

#include "client/ui_server.h"
#include "common/proto_json.h"

namespace lockstep::client {
namespace {

using ::testing::HasSubstr;

const std::string kToken(64, 'a');

UiRequest Api(const std::string& path) {
  UiRequest request;
  request.method = "GET";
  request.path = path;
  request.host = "127.0.0.1:8080";
  request.token = kToken;
  return request;
}

TEST(UiGateTest, OnlyTheConsolesOwnPageMayCallIt) {
  const UiGate gate(kToken, {"127.0.0.1:8080", "localhost:8080"});
  EXPECT_EQ(gate.Check(Api("/api/jobs")).status, 0);
  UiRequest r = Api("/api/jobs");
  r.host = "LOCALHOST:8080";
  EXPECT_EQ(gate.Check(r).status, 0);
  r.origin = "http://localhost:8080";
  EXPECT_EQ(gate.Check(r).status, 0);

  r = Api("/api/jobs");
  r.host = "attacker.example:8080";  // a DNS name rebound to 127.0.0.1
  EXPECT_EQ(gate.Check(r).status, 403);
  EXPECT_THAT(gate.Check(r).why, HasSubstr("not this console's address"));
  r = Api("/api/jobs");
  r.host = "127.0.0.1:8081";
  EXPECT_EQ(gate.Check(r).status, 403);
  r = Api("/api/jobs");
  r.origin = "http://attacker.example";
  EXPECT_EQ(gate.Check(r).status, 403);
  r.origin = "https://127.0.0.1:8080";
  EXPECT_EQ(gate.Check(r).status, 403);
  r.origin = "null";  // a sandboxed frame or a file:// page
  EXPECT_EQ(gate.Check(r).status, 403);

  r = Api("/api/jobs");
  r.token = "";
  EXPECT_EQ(gate.Check(r).status, 403);
  r.token = kToken.substr(1);
  EXPECT_EQ(gate.Check(r).status, 403);
  r.token = std::string(64, 'b');
  EXPECT_EQ(gate.Check(r).status, 403);
  r.token = "";
  r.query_token = kToken;  // the API takes the header only
  EXPECT_EQ(gate.Check(r).status, 403);
}

TEST(UiGateTest, ThePageNeedsTheTokenInItsUrlAndItsFilesDoNot) {
  const UiGate gate(kToken, {"127.0.0.1:8080"});
  UiRequest page = Api("/");
  page.token = "";
  EXPECT_EQ(gate.Check(page).status, 403);
  EXPECT_THAT(gate.Check(page).why, HasSubstr("open the URL"));
  page.query_token = kToken;
  EXPECT_EQ(gate.Check(page).status, 0);
  UiRequest script = Api("/app.js");
  script.token = "";
  EXPECT_EQ(gate.Check(script).status, 0);
  script.host = "attacker.example:8080";
  EXPECT_EQ(gate.Check(script).status, 403);
  EXPECT_EQ(gate.Check(Api("/secret")).status, 404);
}

TEST(UiGateTest, WritesArePostsOfJsonToTheJobActionsOnly) {
  const UiGate gate(kToken, {"127.0.0.1:8080"});
  UiRequest stop = Api("/api/jobs/j-1/stop");
  stop.method = "POST";
  stop.content_type = "application/json";
  EXPECT_EQ(gate.Check(stop).status, 0);
  stop.content_type = "application/x-www-form-urlencoded";  // a form
  EXPECT_EQ(gate.Check(stop).status, 415);
  stop.content_type = "text/plain";
  EXPECT_EQ(gate.Check(stop).status, 415);
  stop.content_type = "application/json";
  stop.token = "";
  EXPECT_EQ(gate.Check(stop).status, 403);
  UiRequest remove = stop;
  remove.path = "/api/jobs/j-1/delete";
  remove.token = kToken;
  EXPECT_EQ(gate.Check(remove).status, 0);
  UiRequest other = Api("/api/jobs");
  other.method = "POST";
  other.content_type = "application/json";
  EXPECT_EQ(gate.Check(other).status, 405);
  other.method = "DELETE";
  EXPECT_EQ(gate.Check(other).status, 405);
  UiRequest page = Api("/");
  page.method = "POST";
  page.query_token = kToken;
  EXPECT_EQ(gate.Check(page).status, 405);
}

TEST(UiGateTest, TokensAreRandomAndLong) {
  const std::string a = NewUiToken(), b = NewUiToken();
  EXPECT_EQ(a.size(), 64u);
  EXPECT_NE(a, b);
  EXPECT_EQ(a.find_first_not_of("0123456789abcdef"), std::string::npos);
}

// 100,000 steps become 2000 points, each the mean of 50 steps at the last
// of them; the learning rates likewise, NaN left out; the raw histories
// are not sent.
TEST(UiCurveTest, ALongHistoryIsSentAsAtMost2000Means) {
  v1::JobStatus status;
  status.set_job_id("j-1");
  for (int i = 0; i < 100000; ++i) {
    status.add_step_losses(static_cast<float>(i % 50));  // mean 24.5
    status.add_step_lrs(i % 2 == 0 ? 0.5f : std::nanf(""));
  }
  google::protobuf::Struct sent;
  ASSERT_TRUE(
      FromJson(JobWithCurve(status, kUiCurvePoints), &sent, "curve").ok());
  const auto& curve = sent.fields().at("curve").struct_value().fields();
  const auto& steps = curve.at("steps").list_value();
  ASSERT_EQ(steps.values_size(), 2000);
  EXPECT_EQ(steps.values(0).number_value(), 50);
  EXPECT_EQ(steps.values(1999).number_value(), 100000);
  EXPECT_DOUBLE_EQ(curve.at("loss").list_value().values(7).number_value(),
                   24.5);
  EXPECT_DOUBLE_EQ(curve.at("lr").list_value().values(7).number_value(), 0.5);
  const auto& job = sent.fields().at("status").struct_value().fields();
  EXPECT_EQ(job.count("step_losses"), 0u);
  EXPECT_EQ(job.count("step_lrs"), 0u);

  // A thinned history (every 4th step kept): steps follow the stride.
  v1::JobStatus thinned;
  thinned.set_loss_stride(4);
  for (int i = 0; i < 10; ++i) thinned.add_step_losses(1.0f);
  ASSERT_TRUE(FromJson(JobWithCurve(thinned, 5), &sent, "curve").ok());
  const auto& thin_steps = sent.fields()
                               .at("curve")
                               .struct_value()
                               .fields()
                               .at("steps")
                               .list_value();
  ASSERT_EQ(thin_steps.values_size(), 5);
  EXPECT_EQ(thin_steps.values(0).number_value(), 5);   // loss 1: step 4 + 1
  EXPECT_EQ(thin_steps.values(4).number_value(), 37);  // loss 9: step 36 + 1
}

// The jobs page's row: what the page shows, not the spec, plan or events
// of the job (a thousand of them are sent every second).
TEST(UiCurveTest, AJobsRowIsWhatTheJobsPageShows) {
  v1::JobStatus job;
  job.set_job_id("mlp-7");
  job.set_state(v1::JOB_STATE_RUNNING);
  job.set_owner("operator:ana");
  job.set_priority(5);
  job.set_step(12);
  job.set_total_steps(100);
  job.mutable_spec()->set_name("mlp");
  job.mutable_spec()->set_num_workers(2);
  job.mutable_spec()->mutable_model()->set_torchscript(std::string(10000, 'm'));
  job.set_error(std::string(5000, 'e'));
  job.add_events()->set_kind("generation_started");
  job.mutable_plan()->set_replicas(2);
  const v1::JobStatus row = JobRow(job);
  EXPECT_EQ(row.job_id(), "mlp-7");
  EXPECT_EQ(row.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(row.owner(), "operator:ana");
  EXPECT_EQ(row.priority(), 5);
  EXPECT_EQ(row.step(), 12);
  EXPECT_EQ(row.spec().num_workers(), 2);
  EXPECT_FALSE(row.spec().has_model());
  EXPECT_EQ(row.error().size(), kUiRowErrorBytes);
  EXPECT_EQ(row.events_size(), 0);
  EXPECT_FALSE(row.has_plan());
  EXPECT_LT(row.ByteSizeLong(), 400u);
}

}  // namespace
}  // namespace lockstep::client
