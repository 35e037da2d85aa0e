// The web console (`lockstep ui`, issue 55) against a real coordinator and
// workers with mutual TLS: its API lists a running job and its curve grows
// while it trains; the token, the Host and the Origin keep everyone but the
// console's own page out; an operator's console stops the job and a
// viewer's is refused with the coordinator's reason; it reconnects to a
// restarted coordinator by itself; and in Debian's Chromium, driven
// headless through the DevTools protocol, the real page lists the jobs,
// shows why one waits, draws a job's curve, stops it at an operator's
// click and shows a viewer's refusal, and compares a 1- and a 2-worker run.
#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/proto_json.h"
#include "tests/integration/harness.h"

namespace lockstep::integration {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

struct HttpReply {
  int status = 0;
  std::string body;
};

// One HTTP/1.1 request to 127.0.0.1:`port` with `headers` (each "Name:
// value"), read to the server's close.
HttpReply Http(int port, const std::string& method, const std::string& target,
               const std::vector<std::string>& headers,
               const std::string& body = "") {
  HttpReply reply;
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(static_cast<uint16_t>(port));
  inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
  if (connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)) != 0) {
    close(fd);
    return reply;
  }
  std::string request =
      absl::StrCat(method, " ", target, " HTTP/1.1\r\nConnection: close\r\n");
  for (const std::string& header : headers) {
    absl::StrAppend(&request, header, "\r\n");
  }
  absl::StrAppend(&request, "Content-Length: ", body.size(), "\r\n\r\n", body);
  (void)!write(fd, request.data(), request.size());
  std::string response;
  char buffer[65536];
  ssize_t n;
  while ((n = read(fd, buffer, sizeof(buffer))) > 0) response.append(buffer, n);
  close(fd);
  if (response.size() > 12) {
    (void)absl::SimpleAtoi(response.substr(9, 3), &reply.status);
  }
  const size_t blank = response.find("\r\n\r\n");
  if (blank != std::string::npos) reply.body = response.substr(blank + 4);
  return reply;
}

class UiTest : public ClusterTest {
 protected:
  // Starts `lockstep ui` with `tls`'s certificate; sets port_ and token_.
  void StartUi(const TlsOptions& tls) {
    int out = -1;
    auto pid = processes_.Spawn("ui",
                                {kBin + "/lockstep", "ui", "--listen",
                                 "127.0.0.1:0", "--coordinator", address_},
                                TlsEnv(tls), dir_ + "/ui.log", &out);
    ASSERT_TRUE(pid.ok()) << pid.status();
    std::string text;
    char c;
    while (read(out, &c, 1) == 1) {
      text.push_back(c);
      if (c == '\n' && text.find("?token=") != std::string::npos) break;
    }
    close(out);
    const size_t at = text.find("http://127.0.0.1:");
    ASSERT_NE(at, std::string::npos) << text;
    url_ = text.substr(at, text.find('\n', at) - at);
    const std::string rest = url_.substr(17);
    ASSERT_TRUE(absl::SimpleAtoi(rest.substr(0, rest.find('/')), &port_));
    token_ = url_.substr(url_.find("?token=") + 7);
    host_ = absl::StrCat("Host: 127.0.0.1:", port_);
  }
  HttpReply Get(const std::string& target) {
    return Http(port_, "GET", target, {host_, "X-Lockstep-Token: " + token_});
  }
  HttpReply Stop(const std::string& job) { return Act(job, "stop"); }
  HttpReply Act(const std::string& job, const std::string& action) {
    return Http(
        port_, "POST", "/api/jobs/" + job + "/" + action,
        {host_, "X-Lockstep-Token: " + token_, "Content-Type: application/json",
         absl::StrCat("Origin: http://127.0.0.1:", port_)},
        "{}");
  }
  // The points of the job's curve the API sends.
  int CurvePoints(const std::string& job) {
    HttpReply reply = Get("/api/jobs/" + job);
    google::protobuf::Struct parsed;
    if (reply.status != 200 || !FromJson(reply.body, &parsed, "curve").ok()) {
      return -1;
    }
    return parsed.fields()
        .at("curve")
        .struct_value()
        .fields()
        .at("steps")
        .list_value()
        .values_size();
  }

  std::string url_, token_, host_;
  int port_ = 0;
};

// A long job: stopped by the test.
const std::vector<std::string> kLongJob = {"max_steps=1000000", "epochs=50"};

TEST_F(UiTest, AnOperatorsConsoleListsAJobFollowsItAndStopsIt) {
  StartCluster(2);
  const std::string job = SubmitAndTrainTo(kLongJob, 3);
  ASSERT_FALSE(job.empty());
  StartUi(OperatorTls());

  HttpReply jobs = Get("/api/jobs");
  EXPECT_EQ(jobs.status, 200) << jobs.body;
  EXPECT_THAT(jobs.body, AllOf(HasSubstr(absl::StrCat("\"job_id\":\"", job)),
                               HasSubstr("JOB_STATE_RUNNING")));
  // The curve gains points while the job trains (waited for, not slept).
  const int first = CurvePoints(job);
  ASSERT_GT(first, 0);
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(60);
  int later = first;
  while (later <= first && std::chrono::steady_clock::now() < deadline) {
    later = CurvePoints(job);
  }
  EXPECT_GT(later, first);
  EXPECT_EQ(Get("/api/workers").status, 200);
  EXPECT_EQ(Get("/api/queue").status, 200);
  HttpReply page = Http(port_, "GET", "/?token=" + token_, {host_});
  EXPECT_EQ(page.status, 200);
  EXPECT_THAT(page.body, HasSubstr("<script src=\"/app.js\">"));

  // Nobody else: no token, a wrong one, another site's page, a DNS name
  // rebound to 127.0.0.1, a form's POST.
  EXPECT_EQ(Http(port_, "GET", "/", {host_}).status, 403);
  EXPECT_EQ(Http(port_, "GET", "/api/jobs", {host_}).status, 403);
  EXPECT_EQ(
      Http(port_, "GET", "/api/jobs", {host_, "X-Lockstep-Token: 00"}).status,
      403);
  EXPECT_EQ(Http(port_, "GET", "/api/jobs",
                 {host_, "X-Lockstep-Token: " + token_,
                  "Origin: http://evil.example"})
                .status,
            403);
  EXPECT_EQ(Http(port_, "GET", "/api/jobs",
                 {absl::StrCat("Host: evil.example:", port_),
                  "X-Lockstep-Token: " + token_})
                .status,
            403);
  EXPECT_EQ(Http(port_, "POST", "/api/jobs/" + job + "/stop",
                 {host_, "X-Lockstep-Token: " + token_,
                  "Content-Type: application/x-www-form-urlencoded"})
                .status,
            415);
  EXPECT_EQ(WatchUntil(job, [](const v1::JobStatus&) { return true; }).state(),
            v1::JOB_STATE_RUNNING)
      << "the refused requests changed the job";

  // A running job is not deleted: the coordinator's reason comes back.
  HttpReply early = Act(job, "delete");
  EXPECT_EQ(early.status, 400) << early.body;
  EXPECT_THAT(early.body, HasSubstr("stop it first"));

  HttpReply stop = Stop(job);
  EXPECT_EQ(stop.status, 200) << stop.body;
  const v1::JobStatus stopped = WatchUntil(job, Ended);
  EXPECT_EQ(stopped.state(), v1::JOB_STATE_STOPPED);

  // A page that has drawn the job's version gets no history until it
  // changes; another version gets the whole answer.
  const std::string since = absl::StrCat("/api/jobs/", job, "?since=");
  HttpReply same = Get(absl::StrCat(since, stopped.version()));
  EXPECT_EQ(same.status, 200);
  EXPECT_THAT(same.body, HasSubstr("\"unchanged\":true"));
  HttpReply changed = Get(absl::StrCat(since, stopped.version() - 1));
  EXPECT_THAT(changed.body, HasSubstr("\"curve\""));
  EXPECT_EQ(Get(since + "x").status, 400);

  HttpReply deleted = Act(job, "delete");
  EXPECT_EQ(deleted.status, 200) << deleted.body;
  EXPECT_EQ(Get("/api/jobs/" + job).status, 404);
}

TEST_F(UiTest, AViewersConsoleShowsTheJobButItsStopIsRefused) {
  StartCluster(1);
  const std::string job = SubmitAndTrainTo(kLongJob, 2);
  ASSERT_FALSE(job.empty());
  StartUi(IssueTestCertificate("spiffe://lockstep/viewer/ui"));
  EXPECT_THAT(Get("/api/jobs").body, HasSubstr(job));
  HttpReply stop = Stop(job);
  EXPECT_EQ(stop.status, 403);
  EXPECT_THAT(stop.body, HasSubstr("viewer"));
  EXPECT_EQ(WatchUntil(job, [](const v1::JobStatus&) { return true; }).state(),
            v1::JOB_STATE_RUNNING);
}

// The coordinator killed and restarted under an open console: the API says
// it cannot be reached (503, which the page shows as "reconnecting"), then
// answers again on its own once the coordinator is back.
TEST_F(UiTest, TheConsoleReconnectsToARestartedCoordinator) {
  StartCluster(1);
  const std::string job = SubmitAndTrainTo(kLongJob, 2);
  ASSERT_FALSE(job.empty());
  StartUi(OperatorTls());
  ASSERT_EQ(Get("/api/jobs/" + job).status, 200);
  ASSERT_EQ(kill(coordinator_pid_, SIGKILL), 0);
  // (SIGKILL is delivered at once, but the process ends a moment later.)
  HttpReply down = Get("/api/jobs/" + job);
  for (int i = 0; i < 1000 && down.status == 200; ++i) {
    down = Get("/api/jobs/" + job);
  }
  EXPECT_EQ(down.status, 503) << down.body;
  EXPECT_THAT(down.body, HasSubstr("\"error\""));
  StartCoordinator(address_);
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(90);
  HttpReply back = Get("/api/jobs/" + job);
  while (back.status != 200 && std::chrono::steady_clock::now() < deadline) {
    back = Get("/api/jobs/" + job);
  }
  EXPECT_EQ(back.status, 200) << back.body;
  EXPECT_THAT(back.body, HasSubstr("coordinator_restarted"));
}

// `lockstep local --serve --ui`: the local pool's console, as its operator.
TEST(LocalUiTest, ALocalPoolServesItsConsole) {
  const std::string dir = TempDir("local-ui");
  client::ProcessGroup processes;
  int out = -1;
  auto pid = processes.Spawn("local",
                             {kBin + "/lockstep", "local", "--serve",
                              "--workers", "1", "--ui", "--json"},
                             {}, dir + "/local.log", &out);
  ASSERT_TRUE(pid.ok()) << pid.status();
  std::string line;
  char c;
  while (read(out, &c, 1) == 1 && c != '\n') line.push_back(c);
  close(out);
  const google::protobuf::Struct ready = LastJsonLine(line);
  ASSERT_TRUE(ready.fields().contains("ui_url")) << line;
  const std::string url = ready.fields().at("ui_url").string_value();
  int port = 0;
  ASSERT_TRUE(absl::SimpleAtoi(url.substr(17, url.find('/', 17) - 17), &port))
      << url;
  const std::string token = url.substr(url.find("?token=") + 7);
  const std::string host = absl::StrCat("Host: 127.0.0.1:", port);
  EXPECT_EQ(Http(port, "GET", "/?token=" + token, {host}).status, 200);
  HttpReply workers =
      Http(port, "GET", "/api/workers", {host, "X-Lockstep-Token: " + token});
  EXPECT_EQ(workers.status, 200) << workers.body;
  EXPECT_THAT(workers.body, HasSubstr("\"worker_id\""));
  processes.TerminateAll(absl::Seconds(10));
}

// Drives Debian's Chromium through tests/scripts/browser.mjs (the DevTools
// protocol, from Node): opens `url`, then `steps` (--wait, --click,
// --expect, --screenshot). Skips the test where Chromium or Node is
// missing or Chromium cannot start; a failure's screenshot is kept as
// `name`-failure.png beside the logs.
class BrowserTest : public UiTest {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(kChromium)) {
      GTEST_SKIP() << "no " << kChromium
                   << " (scripts/install-deps installs it)";
    }
    if (RunCommand({"/usr/bin/env", "node", "--version"}).code != 0) {
      GTEST_SKIP() << "no node (scripts/install-deps installs it)";
    }
    // Node 22 has WebSocket; Node 20 behind a flag.
    const char* kHasWebSocket =
        "process.exit(typeof WebSocket === 'function' ? 0 : 1)";
    if (RunCommand({"/usr/bin/env", "node", "-e", kHasWebSocket}).code != 0) {
      node_flag_ = "--experimental-websocket";
      if (RunCommand({"/usr/bin/env", "node", node_flag_, "-e", kHasWebSocket})
              .code != 0) {
        GTEST_SKIP() << "this Node has no WebSocket (Node 20.10 or later "
                        "drives the browser)";
      }
    }
  }
  // True when every step held; false (with the failure) otherwise.
  bool Browse(const std::string& name, const std::string& url,
              const std::vector<std::string>& steps) {
    std::vector<std::string> argv = {"/usr/bin/env", "node"};
    if (!node_flag_.empty()) argv.push_back(node_flag_);
    argv.insert(argv.end(),
                {kSource + "/tests/scripts/browser.mjs", kChromium, url});
    argv.insert(argv.end(), steps.begin(), steps.end());
    const std::string failure = dir_ + "/" + name + "-failure.png";
    Result run = RunCommand(argv, {"BROWSER_FAILURE_PNG=" + failure});
    if (run.code == 77) skipped_ = run.out + run.err;
    EXPECT_TRUE(run.code == 0 || run.code == 77)
        << name << ": " << run.out << run.err << " (screenshot: " << failure
        << ")";
    return run.code == 0;
  }
  static constexpr char kChromium[] = "/usr/bin/chromium";
  std::string node_flag_;
  std::string skipped_;
};

// The jobs table lists the running job and the queued one; the queue page
// says why the second waits; the job's page draws its loss curve; the
// operator's click on Stop ends the job STOPPED, and Delete removes it.
TEST_F(BrowserTest, AnOperatorFollowsAJobAndStopsItWithAClick) {
  StartCluster(1);
  const std::string job = SubmitAndTrainTo(kLongJob, 3);
  ASSERT_FALSE(job.empty());
  const std::string waiting = Submit(kLongJob);
  StartUi(OperatorTls());
  const bool shown =
      Browse("jobs", url_ + "#/jobs",
             {"--expect", "tr[data-job=\"" + job + "\"]", "RUNNING", "--expect",
              "tr[data-job=\"" + waiting + "\"]", "QUEUED", "--screenshot",
              dir_ + "/jobs.png"});
  if (!skipped_.empty()) GTEST_SKIP() << skipped_;
  EXPECT_TRUE(shown);
  // The queue page says why it waits, as the coordinator does.
  google::protobuf::Struct queue;
  ASSERT_TRUE(FromJson(Get("/api/queue").body, &queue, "queue").ok());
  ASSERT_GT(queue.fields().at("jobs").list_value().values_size(), 0);
  const std::string reason = queue.fields()
                                 .at("jobs")
                                 .list_value()
                                 .values(0)
                                 .struct_value()
                                 .fields()
                                 .at("queue")
                                 .struct_value()
                                 .fields()
                                 .at("message")
                                 .string_value();
  ASSERT_FALSE(reason.empty());
  EXPECT_TRUE(Browse(
      "queue", url_ + "#/queue",
      {"--expect", "tr[data-job=\"" + waiting + "\"]", reason, "--expect",
       "#owners", "operator:harness", "--screenshot", dir_ + "/queue.png"}));
  EXPECT_TRUE(Browse("job", url_ + "#/jobs",
                     {"--click",
                      "a[href=\"#/job/" + job + "\"]",
                      "--wait",
                      "polyline[data-series=\"loss\"]",
                      "--expect",
                      "#events",
                      "generation_started",
                      "--wait",
                      "#ranks td",
                      "--screenshot",
                      dir_ + "/job.png",
                      "--click",
                      "#stop",
                      "--expect",
                      "#action-result",
                      "stop requested",
                      "--expect",
                      "#summary",
                      "STOPPED",
                      "--click",
                      "#delete",
                      "--wait",
                      "#nav-jobs.current"}));
  EXPECT_EQ(Get("/api/jobs/" + job).status, 404) << "Delete left the job";
}

// A viewer's console shows the job, and its click on Stop shows the
// coordinator's refusal; the job trains on.
TEST_F(BrowserTest, AViewersClickOnStopIsRefusedAndSaysWhy) {
  StartCluster(1);
  const std::string job = SubmitAndTrainTo(kLongJob, 2);
  ASSERT_FALSE(job.empty());
  StartUi(IssueTestCertificate("spiffe://lockstep/viewer/ui"));
  const bool clicked =
      Browse("viewer", url_ + "#/job/" + job,
             {"--wait", "polyline[data-series=\"loss\"]", "--click", "#stop",
              "--expect", "#action-result", "viewer"});
  if (!skipped_.empty()) GTEST_SKIP() << skipped_;
  EXPECT_TRUE(clicked);
  EXPECT_EQ(WatchUntil(job, [](const v1::JobStatus&) { return true; }).state(),
            v1::JOB_STATE_RUNNING);
}

// The coordinator killed and restarted while a job's page is open: the
// page's header says "reconnecting", then "connected" again, and the page
// goes on following the job.
TEST_F(BrowserTest, AnOpenPageReconnectsToARestartedCoordinator) {
  StartCluster(1);
  const std::string job = SubmitAndTrainTo(kLongJob, 2);
  ASSERT_FALSE(job.empty());
  StartUi(OperatorTls());
  const std::string loaded = dir_ + "/page-loaded";
  const std::string down = dir_ + "/page-saw-it-down";
  bool ok = false;
  std::thread browser([&] {
    ok = Browse("reconnect", url_ + "#/job/" + job,
                {"--expect", "#summary", "RUNNING", "--touch", loaded,
                 "--expect", "#connection", "reconnecting", "--touch", down,
                 "--expect", "#connection", "connected", "--expect", "#events",
                 "coordinator_restarted"});
  });
  // Each wait ends when the browser gets there, or gives up (its own
  // 60 s per step) and exits.
  auto reached = [&](const std::string& mark) {
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::seconds(90);
    while (!std::filesystem::exists(mark) &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    return std::filesystem::exists(mark);
  };
  if (reached(loaded)) {
    EXPECT_EQ(kill(coordinator_pid_, SIGKILL), 0);
    reached(down);
    StartCoordinator(address_);
  }
  browser.join();
  if (!skipped_.empty()) GTEST_SKIP() << skipped_;
  EXPECT_TRUE(ok);
}

// The compare page of a 1-worker and a 2-worker run of the same spec:
// both curves drawn, and the coordinator's verdict "same function".
class BrowserPoolTest : public BrowserTest {
 protected:
  BrowserPoolTest() { pool_ = true; }
};

TEST_F(BrowserPoolTest, TheComparePageOfOneAndTwoWorkersSaysSameFunction) {
  StartCluster(2);
  std::vector<std::string> ids;
  for (int workers : {1, 2}) {
    const std::string job =
        Submit({absl::StrCat("num_workers=", workers), "max_steps=30",
                "global_batch_size=64", "log_every_steps=1"});
    ASSERT_EQ(WatchUntil(job, Ended).state(), v1::JOB_STATE_SUCCEEDED);
    ids.push_back(job);
  }
  StartUi(OperatorTls());
  const std::string both = ids[0] + "," + ids[1];
  HttpReply compared = Get("/api/compare/" + both);
  EXPECT_EQ(compared.status, 200) << compared.body;
  EXPECT_THAT(compared.body, HasSubstr("\"same_function\":true"));
  const bool shown =
      Browse("compare", url_ + "#/compare/" + both,
             {"--expect", ".verdict.same", "same function", "--wait",
              "a.download[download=\"compare.csv\"]", "--downloads",
              dir_ + "/downloads", "--click", "#download-png", "--file",
              dir_ + "/downloads/compare.png", "--wait",
              "polyline[data-series=\"" + ids[0] + "\"]", "--wait",
              "polyline[data-series=\"" + ids[1] + "\"]", "--screenshot",
              dir_ + "/compare.png"});
  if (!skipped_.empty()) GTEST_SKIP() << skipped_;
  EXPECT_TRUE(shown);
  // The PNG download is a PNG: its signature, and its chart's width.
  std::ifstream png(dir_ + "/downloads/compare.png", std::ios::binary);
  std::string head(24, '\0');
  png.read(head.data(), head.size());
  EXPECT_EQ(head.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  EXPECT_EQ(static_cast<unsigned char>(head[18]) * 256 +
                static_cast<unsigned char>(head[19]),
            640);
}

}  // namespace
}  // namespace lockstep::integration
