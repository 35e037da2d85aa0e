// The Prometheus text format (common/metrics.h), the /metrics endpoint on
// libmicrohttpd over real HTTP on 127.0.0.1 (common/metrics_http.h), and
// what a worker counts (worker/worker_metrics.h) through the counting
// communicator.
#include "common/metrics.h"

#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "common/metrics_http.h"
#include "tests/unit/loopback_http.h"
#include "tests/unit/metrics_text.h"
#include "worker/collective/counting_communicator.h"
#include "worker/worker_metrics.h"

namespace lockstep::metrics {
namespace {

using ::lockstep::testing::SampleValue;
using ::testing::ContainsRegex;
using ::testing::HasSubstr;
using ::testing::Not;

// The status line of an HTTP/1.x response, whichever minor version.
::testing::Matcher<const std::string&> Status(int code) {
  return ContainsRegex("^HTTP/1\\.[01] " + std::to_string(code) + " ");
}

TEST(ExpositionTest, WritesHelpTypeAndSamples) {
  Exposition out;
  ASSERT_TRUE(out.Family("lockstep_jobs", kGauge, "Jobs by state."));
  out.Sample("lockstep_jobs", {{"state", "running"}}, 1);
  out.Sample("lockstep_jobs", {{"state", "queued"}}, 0);
  ASSERT_TRUE(out.Family("lockstep_bytes_total", kCounter, "Bytes."));
  out.Sample("lockstep_bytes_total", {}, 12345678901.0);
  EXPECT_EQ(out.Take(),
            "# HELP lockstep_jobs Jobs by state.\n"
            "# TYPE lockstep_jobs gauge\n"
            "lockstep_jobs{state=\"running\"} 1\n"
            "lockstep_jobs{state=\"queued\"} 0\n"
            "# HELP lockstep_bytes_total Bytes.\n"
            "# TYPE lockstep_bytes_total counter\n"
            "lockstep_bytes_total 12345678901\n");
  EXPECT_EQ(out.Take(), "");
}

TEST(ExpositionTest, RefusesAFamilyTwiceAndBadNames) {
  Exposition out;
  EXPECT_TRUE(out.Family("a_total", kCounter, "x"));
  EXPECT_FALSE(out.Family("a_total", kCounter, "x"));
  EXPECT_FALSE(out.Family("9bad", kGauge, "x"));
  EXPECT_FALSE(out.Family("has space", kGauge, "x"));
  out.Sample("bad-name", {}, 1);
  out.Sample("good", {{"bad-label", "v"}, {"ok", "w"}}, 2);
  const std::string page = out.Take();
  EXPECT_THAT(page, Not(HasSubstr("bad")));
  EXPECT_THAT(page, HasSubstr("good{ok=\"w\"} 2\n"));
}

TEST(ExpositionTest, EscapesLabelValuesAndHelp) {
  EXPECT_EQ(EscapeLabelValue("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
  Exposition out;
  out.Family("m", kGauge, "line one\nback\\slash");
  out.Sample("m", {{"job", "x\"} 1\nfake 2"}}, 3);
  const std::string page = out.Take();
  EXPECT_THAT(page, HasSubstr("# HELP m line one\\nback\\\\slash\n"));
  EXPECT_THAT(page, HasSubstr("m{job=\"x\\\"} 1\\nfake 2\"} 3\n"));
  EXPECT_EQ(SampleValue(page, "fake"), std::nullopt);
}

TEST(ExpositionTest, FormatsValuesAsPrometheusReadsThem) {
  EXPECT_EQ(FormatValue(0), "0");
  EXPECT_EQ(FormatValue(-3), "-3");
  EXPECT_EQ(FormatValue(0.25), "0.25");
  EXPECT_EQ(FormatValue(0.1), "0.1");
  EXPECT_EQ(FormatValue(1e300), "1e+300");
  EXPECT_EQ(FormatValue(0.1 + 0.2), "0.30000000000000004");
  EXPECT_EQ(FormatValue(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(FormatValue(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(FormatValue(std::nan("")), "NaN");
}

TEST(HistogramTest, CountsCumulativeBucketsSumAndCount) {
  Histogram histogram({1, 0.1, 1});  // sorted, duplicates dropped
  ASSERT_EQ(histogram.bounds(), (std::vector<double>{0.1, 1}));
  for (double v : {0.05, 0.1, 0.5, 7.0}) histogram.Observe(v);
  histogram.Observe(std::nan(""));  // ignored
  Exposition out;
  out.Family("lat_seconds", kHistogram, "Latency.");
  out.Observations("lat_seconds", {{"op", "x"}}, histogram);
  EXPECT_EQ(out.Take(),
            "# HELP lat_seconds Latency.\n"
            "# TYPE lat_seconds histogram\n"
            "lat_seconds_bucket{op=\"x\",le=\"0.1\"} 2\n"
            "lat_seconds_bucket{op=\"x\",le=\"1\"} 3\n"
            "lat_seconds_bucket{op=\"x\",le=\"+Inf\"} 4\n"
            "lat_seconds_sum{op=\"x\"} 7.65\n"
            "lat_seconds_count{op=\"x\"} 4\n");
}

// One HTTP/1.0 request to 127.0.0.1:port; the whole response.
std::string Fetch(int port, const std::string& request) {
  return ::lockstep::testing::FetchHttp(port, request);
}

TEST(HttpServerTest, ServesMetricsOnlyAtGetMetrics) {
  std::atomic<int> renders{0};
  auto server = HttpServer::Start("127.0.0.1:0", [&renders] {
    ++renders;
    return std::string("up 1\n");
  });
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  ASSERT_GT(port, 0);
  EXPECT_EQ((*server)->address(), "127.0.0.1:" + std::to_string(port));

  const std::string ok = Fetch(port, "GET /metrics HTTP/1.0\r\n\r\n");
  EXPECT_THAT(ok, Status(200));
  EXPECT_THAT(ok, HasSubstr("text/plain; version=0.0.4"));
  EXPECT_THAT(ok, HasSubstr("\r\n\r\nup 1\n"));
  EXPECT_EQ(renders.load(), 1);

  EXPECT_THAT(Fetch(port, "GET / HTTP/1.0\r\n\r\n"), Status(404));
  const std::string post =
      Fetch(port, "POST /metrics HTTP/1.0\r\nContent-Length: 3\r\n\r\nabc");
  EXPECT_THAT(post, Status(405));
  EXPECT_THAT(post, HasSubstr("Allow: GET, HEAD"));
  EXPECT_THAT(Fetch(port, "garbage\r\n\r\n"), Not(HasSubstr("up 1")));
  EXPECT_EQ(renders.load(), 1);
}

// A connection to 127.0.0.1:port from the local address `source` (any
// 127.x.y.z), optionally sending `first_bytes`; -1 when it fails.
int ConnectFrom(const char* source, int port, const std::string& first_bytes) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in local{};
  local.sin_family = AF_INET;
  inet_pton(AF_INET, source, &local.sin_addr);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_port = htons(static_cast<uint16_t>(port));
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (bind(fd, reinterpret_cast<sockaddr*>(&local), sizeof(local)) != 0 ||
      connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)) !=
          0) {
    close(fd);
    return -1;
  }
  if (!first_bytes.empty()) {
    (void)!write(fd, first_bytes.data(), first_bytes.size());
  }
  return fd;
}

// Issue 27 #9: 300 idle connections took /metrics down, and a client
// trickling its requests on 16 sockets delayed every scrape. One address
// now holds at most a few connections; the rest are closed as they come,
// and the scraper is served meanwhile and right after they go.
TEST(HttpServerTest, IdleAndTricklingClientsDoNotBlockAScrape) {
  auto server =
      HttpServer::Start("127.0.0.1:0", [] { return std::string("up 1\n"); });
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  std::vector<int> held;
  for (int i = 0; i < 300; ++i) {
    const int fd = ConnectFrom("127.0.0.2", port, "");
    if (fd >= 0) held.push_back(fd);
  }
  for (int i = 0; i < 16; ++i) {
    const int fd = ConnectFrom("127.0.0.3", port, "GET /metr");
    if (fd >= 0) held.push_back(fd);
  }
  EXPECT_THAT(Fetch(port, "GET /metrics HTTP/1.0\r\n\r\n"), Status(200));
  for (int fd : held) close(fd);
  EXPECT_THAT(Fetch(port, "GET /metrics HTTP/1.0\r\n\r\n"), Status(200));
}

TEST(HttpServerTest, RefusesBadAddressesAndATakenPort) {
  auto render = [] { return std::string(); };
  for (const char* bad :
       {"", "127.0.0.1", "127.0.0.1:x", "127.0.0.1:70000", "127.0.0.1:-1"}) {
    auto server = HttpServer::Start(bad, render);
    EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument)
        << bad;
  }
  auto first = HttpServer::Start("127.0.0.1:0", render);
  ASSERT_TRUE(first.ok()) << first.status();
  auto second = HttpServer::Start(
      "127.0.0.1:" + std::to_string((*first)->port()), render);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(second.status().message()), HasSubstr("metrics"));
}

}  // namespace
}  // namespace lockstep::metrics

namespace lockstep::worker {
namespace {

using ::lockstep::testing::SampleValue;
using ::testing::Optional;

TEST(WorkerMetricsTest, CountsPhasesCollectivesAndCheckpoints) {
  WorkerMetrics metrics("cpu", "worker:1");
  metrics.SetAssignment("mnist-1", 1, "gloo");
  metrics.SetCompute("OpenBLAS 0.3.21", "SkylakeX", "lockstep", "AVX2");
  metrics.AddPhase(WorkerMetrics::kForward, absl::Milliseconds(1500));
  metrics.AddPhase(WorkerMetrics::kExposedComm, absl::Milliseconds(250));
  metrics.StepDone();
  metrics.CheckpointWritten(absl::Seconds(2));
  metrics.SaveStalled(absl::Milliseconds(500));

  SingleRankCommunicator inner;
  std::atomic<int64_t> seq{0};
  CountingCommunicator comm(&inner, &seq, &metrics);
  float data[4] = {1, 2, 3, 4};
  ASSERT_TRUE(comm.AllReduceSum(data, 4).ok());
  ASSERT_TRUE(comm.AllReduceSum(data, 2).ok());
  ASSERT_TRUE(comm.Barrier().ok());
  EXPECT_EQ(seq.load(), 3);

  metrics::Exposition out;
  metrics.Collect(out);
  const std::string page = out.Take();
  EXPECT_THAT(SampleValue(page,
                          "lockstep_worker_info{device=\"cpu\",task=\"worker:"
                          "1\",job=\"mnist-1\",rank=\"1\",backend=\"gloo\"}"),
              Optional(std::string("1")));
  EXPECT_THAT(
      SampleValue(page,
                  "lockstep_worker_compute_info{blas=\"OpenBLAS 0.3.21\","
                  "blas_kernel=\"SkylakeX\",blas_kernel_source=\"lockstep\","
                  "aten_cpu_capability=\"AVX2\"}"),
      Optional(std::string("1")));
  EXPECT_THAT(SampleValue(page, "lockstep_worker_steps_total"),
              Optional(std::string("1")));
  EXPECT_THAT(SampleValue(page,
                          "lockstep_worker_step_phase_seconds_total{"
                          "phase=\"forward\"}"),
              Optional(std::string("1.5")));
  EXPECT_THAT(SampleValue(page,
                          "lockstep_worker_step_phase_seconds_total{"
                          "phase=\"exposed_communication\"}"),
              Optional(std::string("0.25")));
  EXPECT_THAT(SampleValue(page,
                          "lockstep_worker_collective_calls_total{op="
                          "\"allreduce\"}"),
              Optional(std::string("2")));
  EXPECT_THAT(SampleValue(page,
                          "lockstep_worker_collective_bytes_total{op="
                          "\"allreduce\"}"),
              Optional(std::string("24")));
  EXPECT_THAT(SampleValue(page,
                          "lockstep_worker_collective_calls_total{op="
                          "\"barrier\"}"),
              Optional(std::string("1")));
  EXPECT_THAT(SampleValue(page, "lockstep_worker_checkpoint_writes_total"),
              Optional(std::string("1")));
  EXPECT_THAT(
      SampleValue(page, "lockstep_worker_checkpoint_write_seconds_total"),
      Optional(std::string("2")));
  EXPECT_THAT(
      SampleValue(page, "lockstep_worker_checkpoint_stall_seconds_total"),
      Optional(std::string("0.5")));
  if (lockstep::testing::HavePromtool()) {
    EXPECT_EQ(lockstep::testing::PromtoolProblems(page), "");
  }
}

}  // namespace
}  // namespace lockstep::worker
