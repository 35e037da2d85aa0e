// The operator's side end to end: the `lockstep` commands against a real
// coordinator (output, --json shapes, exit codes, compare), and the
// daemons' health service and clean exit on SIGTERM.
#include <gmock/gmock.h>
#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <set>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/files.h"
#include "grpcpp/grpcpp.h"
#include "tests/integration/harness.h"

namespace lockstep::integration {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

TEST_F(ClusterTest, TwoWorkersTrainFiftyStepsToTheSameModel) {
  StartCluster(2);
  Result submit =
      RunCommand({kBin + "/lockstep", "submit", kMlp, "--set", "max_steps=50",
                  "--set", "global_batch_size=64", "--watch"},
                 {"LOCKSTEP_COORDINATOR=" + address_});
  ASSERT_EQ(submit.code, 0) << submit.out << submit.err;
  std::string job = submit.out.substr(0, submit.out.find('\n'));

  Result status = RunCommand(
      {kBin + "/lockstep", "status", job, "--json", "--coordinator", address_});
  ASSERT_EQ(status.code, 0) << status.err;
  v1::JobStatus parsed;
  std::string object = status.out.substr(1, status.out.rfind(']') - 1);
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(object, &parsed).ok())
      << status.out;
  EXPECT_EQ(parsed.state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(parsed.step(), 50);
  EXPECT_EQ(parsed.world_size(), 2);
  ASSERT_EQ(parsed.ranks_size(), 2);
  EXPECT_EQ(parsed.ranks(0).worker_id(), "worker:0");
  EXPECT_EQ(parsed.ranks(0).model_digest().size(), 64u);
  EXPECT_EQ(parsed.ranks(0).model_digest(), parsed.ranks(1).model_digest());

  Result table =
      RunCommand({kBin + "/lockstep", "status", "--coordinator", address_});
  EXPECT_THAT(table.out, AllOf(HasSubstr(job), HasSubstr("succeeded"),
                               HasSubstr("priority classes: none; admins "
                                         "(any priority): none")));
  Result workers =
      RunCommand({kBin + "/lockstep", "workers", "--coordinator", address_});
  EXPECT_THAT(workers.out, AllOf(HasSubstr("worker:0"), HasSubstr("worker:1"),
                                 HasSubstr("idle")));
  Result events = RunCommand(
      {kBin + "/lockstep", "events", job, "--coordinator", address_});
  EXPECT_THAT(events.out, AllOf(HasSubstr("generation_started"),
                                HasSubstr("job_succeeded")));
}

TEST_F(ClusterTest, DaemonsServeGrpcHealthAndExitCleanlyOnSigterm) {
  StartCluster(1);
  EXPECT_EQ(Health(address_), grpc::health::v1::HealthCheckResponse::SERVING);
  std::string dir = TempDir("health");
  int out = -1;
  auto worker = processes_.Spawn(
      "health worker",
      WithTls({kBin + "/lockstep-worker", "--coordinator", "127.0.0.1:1",
               "--health-listen", "127.0.0.1:0", "--connect-timeout", "600"},
              "spiffe://lockstep/worker/pool-1"),
      {}, dir + "/worker.log", &out);
  ASSERT_TRUE(worker.ok());
  std::string line;
  char c;
  while (read(out, &c, 1) == 1 && c != '\n') line.push_back(c);
  close(out);
  std::string port = line.substr(line.rfind(':') + 1);
  ASSERT_THAT(line, HasSubstr("health service on 127.0.0.1:"));
  const std::string health = "127.0.0.1:" + port;
  EXPECT_EQ(Health(health), grpc::health::v1::HealthCheckResponse::SERVING);
  // `lockstep health`, the Kubernetes exec probe, on both daemons: any
  // certificate from the cluster's CA may ask.
  for (const std::string& address : {address_, health}) {
    Result probe = RunCommand(
        {kBin + "/lockstep", "health", address},
        TlsEnv(IssueTestCertificate("spiffe://lockstep/viewer/probe")));
    EXPECT_EQ(probe.code, 0) << probe.err;
    EXPECT_THAT(probe.out, HasSubstr("SERVING"));
    // A certificate from another CA fails the handshake: not serving.
    Result stranger = RunCommand(
        {kBin + "/lockstep", "health", address},
        TlsEnv(IssueTestCertificate("spiffe://lockstep/operator/x", true)));
    EXPECT_EQ(stranger.code, 1) << stranger.out;
  }
  // The worker's health service refuses a call without a certificate.
  auto stub = grpc::health::v1::Health::NewStub(
      grpc::CreateChannel(health, TestCredentials(nullptr)));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(20));
  grpc::health::v1::HealthCheckResponse response;
  grpc::Status anonymous =
      stub->Check(&context, grpc::health::v1::HealthCheckRequest(), &response);
  EXPECT_EQ(anonymous.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_THAT(anonymous.error_message(), HasSubstr("no client certificate"));
  ASSERT_EQ(kill(*worker, SIGTERM), 0);
  int status = 0;
  ASSERT_EQ(waitpid(*worker, &status, 0), *worker);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

// Issue 15: `lockstep local` runs with mutual TLS under a CA of its own: a
// certificate per process (keys 0600, for a spare too), the exports that
// point the CLI at the run, and no key material in any log.
TEST(LocalTest, RunsWithMutualTlsAndSaysHowToReachIt) {
  Result r =
      RunCommand({kBin + "/lockstep", "local", "--workers", "2", "--spares",
                  "1", "--keep-logs", "--set", "max_steps=5", kMlp});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_THAT(r.out, AllOf(HasSubstr("mutual TLS"),
                           HasSubstr("export LOCKSTEP_COORDINATOR=127.0.0.1:"),
                           HasSubstr("LOCKSTEP_TLS_CERT="),
                           HasSubstr("LOCKSTEP_TLS_KEY="),
                           HasSubstr("LOCKSTEP_TLS_CA=")));
  const size_t at = r.out.find("logs in ");
  ASSERT_NE(at, std::string::npos) << r.out;
  const std::string run = r.out.substr(at + 8, r.out.find('\n', at) - at - 8);
  for (const char* name : {"coordinator", "operator", "local-worker-0",
                           "local-worker-1", "local-spare-2"}) {
    struct stat st;
    const std::string key = absl::StrCat(run, "/tls/", name, ".key");
    ASSERT_EQ(stat(key.c_str(), &st), 0) << key;
    EXPECT_EQ(st.st_mode & 0777, 0600) << key;
  }
  for (const char* log : {"/coordinator.log", "/worker-0.log"}) {
    EXPECT_THAT(ReadFileToString(run + log).value_or(""),
                ::testing::Not(HasSubstr("PRIVATE KEY")));
  }
  EXPECT_THAT(ReadFileToString(run + "/coordinator.log").value_or(""),
              HasSubstr("mutual TLS"));
  EXPECT_TRUE(RemoveRecursively(run).ok());
}

// Issue 33: `lockstep local` given several jobs submits them at once to the
// same workers; the two 1-worker jobs run side by side on the 2 workers and
// each gets its own JSON line.
TEST(LocalTest, SeveralJobsShareTheWorkers) {
  Result r = RunCommand({kBin + "/lockstep", "local", "--workers", "2",
                         "--threads", "1", "--json", "--set", "num_workers=1",
                         "--set", "max_steps=20", kMlp, kMlp});
  ASSERT_EQ(r.code, 0) << r.err;
  std::vector<std::string> lines =
      absl::StrSplit(absl::StripTrailingAsciiWhitespace(r.out), '\n');
  ASSERT_GE(lines.size(), 2u) << r.out;
  std::set<std::string> jobs;
  for (size_t i = lines.size() - 2; i < lines.size(); ++i) {
    google::protobuf::Struct job = LastJsonLine(lines[i]);
    EXPECT_EQ(job.fields().at("state").string_value(), "succeeded");
    EXPECT_EQ(job.fields().at("workers").number_value(), 1);
    jobs.insert(job.fields().at("job_id").string_value());
  }
  EXPECT_EQ(jobs.size(), 2u);
  // Both ran at once: neither waited for the other's end.
  EXPECT_THAT(r.err, HasSubstr("following each in turn"));

  Result refused = RunCommand({kBin + "/lockstep", "local", "--workers", "2",
                               "--set", "num_workers=3", kMlp, kMlp});
  EXPECT_EQ(refused.code, 2) << refused.err;
  EXPECT_THAT(refused.err, HasSubstr("it could never start"));
}

// Issue 36: `lockstep local --serve` runs a pool without a job (Python's
// LocalCluster drives it: tests/python); it takes no JOB.json, and the root
// flags only with it.
TEST(LocalTest, ServeTakesNoJobAndRootsOnlyWithServe) {
  Result job = RunCommand({kBin + "/lockstep", "local", "--serve", kMlp});
  EXPECT_EQ(job.code, 2);
  EXPECT_THAT(job.err, HasSubstr("--serve takes no JOB.json"));
  Result roots =
      RunCommand({kBin + "/lockstep", "local", "--backup-root", "/tmp", kMlp});
  EXPECT_EQ(roots.code, 2);
  EXPECT_THAT(roots.err, HasSubstr("--backup-root is for --serve"));
  Result set =
      RunCommand({kBin + "/lockstep", "local", "--serve", "--set", "epochs=1"});
  EXPECT_EQ(set.code, 2);
  EXPECT_THAT(set.err, HasSubstr("--set are for JOB.json"));
  Result empty =
      RunCommand({kBin + "/lockstep", "local", "--serve", "--data-root", ""});
  EXPECT_EQ(empty.code, 2);
  EXPECT_THAT(empty.err, HasSubstr("wants a folder"));
}

// The operator's commands against a real coordinator: output, --json shape
// and exit codes.
TEST_F(ClusterTest, CliCommandsShowAJobTheirWay) {
  StartCluster(2);
  const std::vector<std::string> env = {"LOCKSTEP_COORDINATOR=" + address_};
  Result submit = RunCommand(
      {kBin + "/lockstep", "submit", kMlp, "--set", "max_steps=40", "--set",
       "global_batch_size=64", "--set", "log_every_steps=1", "--set",
       "lr_decay=cosine", "--set", "warmup_steps=0", "--json"},
      env);
  ASSERT_EQ(submit.code, 0) << submit.err;
  google::protobuf::Struct submitted = LastJsonLine(submit.out);
  const std::string job = submitted.fields().at("job_id").string_value();
  ASSERT_FALSE(job.empty());

  // Not a terminal: plain lines, an evaluation line and the summary.
  Result watch = RunCommand({kBin + "/lockstep", "watch", job}, env);
  EXPECT_EQ(watch.code, 0) << watch.err;
  EXPECT_THAT(watch.out, AllOf(HasSubstr("generation_started"),
                               HasSubstr("done at step 40: test accuracy"),
                               HasSubstr(job + " succeeded: 40 steps")));
  EXPECT_EQ(watch.out.find("\033["), std::string::npos);  // no redrawing
  // A finished job: --json prints its final status.
  Result watch_json =
      RunCommand({kBin + "/lockstep", "watch", job, "--json"}, env);
  EXPECT_EQ(watch_json.code, 0);
  v1::JobStatus final_status;
  std::vector<std::string> lines =
      absl::StrSplit(watch_json.out, '\n', absl::SkipEmpty());
  ASSERT_FALSE(lines.empty());
  ASSERT_TRUE(
      google::protobuf::util::JsonStringToMessage(lines.back(), &final_status)
          .ok())
      << lines.back();
  EXPECT_EQ(final_status.state(), v1::JOB_STATE_SUCCEEDED);
  EXPECT_EQ(final_status.plan().global_batch_size(), 64);
  EXPECT_EQ(final_status.plan().replicas(), 2);

  Result csv = RunCommand({kBin + "/lockstep", "metrics", job, "--csv"}, env);
  ASSERT_EQ(csv.code, 0) << csv.err;
  std::vector<std::string> rows =
      absl::StrSplit(csv.out, '\n', absl::SkipEmpty());
  ASSERT_EQ(rows.size(), 41u);
  EXPECT_EQ(rows[0], "step,samples_seen,loss,lr,test_accuracy,test_loss");
  EXPECT_THAT(rows[1], ::testing::StartsWith("1,64,"));
  std::vector<std::string> last = absl::StrSplit(rows[40], ',');
  ASSERT_EQ(last.size(), 6u);
  EXPECT_EQ(last[0], "40");
  EXPECT_EQ(last[1], "2560");
  // The learning rates the workers reported: the plan's scaled LR at step
  // 1, then down the cosine.
  auto lr_at = [&](int row) {
    std::vector<std::string> cells = absl::StrSplit(rows[row], ',');
    double lr = -1;
    EXPECT_TRUE(cells.size() > 3 && absl::SimpleAtod(cells[3], &lr))
        << rows[row];
    return lr;
  };
  const double scaled = final_status.plan().scaled_lr();
  EXPECT_NEAR(lr_at(1), scaled, 1e-6 * scaled);
  EXPECT_LT(lr_at(20), lr_at(1));
  EXPECT_LT(lr_at(40), lr_at(20));
  EXPECT_GT(lr_at(40), 0);
  EXPECT_FALSE(last[4].empty());  // evaluated at the end
  Result metrics =
      RunCommand({kBin + "/lockstep", "metrics", job, "--json"}, env);
  ASSERT_EQ(metrics.code, 0);
  google::protobuf::Struct parsed = LastJsonLine(metrics.out);
  EXPECT_EQ(parsed.fields().at("steps").list_value().values_size(), 40);
  EXPECT_EQ(parsed.fields().at("evals").list_value().values_size(), 1);

  Result events =
      RunCommand({kBin + "/lockstep", "events", job, "--json"}, env);
  ASSERT_EQ(events.code, 0);
  google::protobuf::ListValue event_list;
  EXPECT_TRUE(
      google::protobuf::util::JsonStringToMessage(events.out, &event_list)
          .ok());
  EXPECT_GE(event_list.values_size(), 2);

  // Its log as plain lines: the events, then where it stands.
  Result logs = RunCommand({kBin + "/lockstep", "logs", job}, env);
  ASSERT_EQ(logs.code, 0) << logs.err;
  EXPECT_THAT(logs.out, AllOf(HasSubstr("generation_started"),
                              HasSubstr("job_succeeded")));
  EXPECT_THAT(logs.out, ::testing::Not(HasSubstr("\r")));

  // On a terminal (a pty from script(1)) the progress bar is redrawn.
  std::string running = Submit({"max_steps=300", "global_batch_size=64"});
  Result tty = RunCommand({"/usr/bin/script", "-qec",
                           absl::StrCat(kBin, "/lockstep watch ", running,
                                        " --coordinator ", address_),
                           "/dev/null"});
  EXPECT_EQ(tty.code, 0) << tty.out;
  EXPECT_THAT(tty.out, AllOf(HasSubstr("\r\033[K"), HasSubstr("] "),
                             HasSubstr("samples/s  ETA"),
                             HasSubstr(running + " succeeded")));

  // A job that already ended cannot be stopped: exit 1, one line.
  Result stop = RunCommand({kBin + "/lockstep", "stop", job}, env);
  EXPECT_EQ(stop.code, 1);
  EXPECT_THAT(stop.err, HasSubstr("already ended"));
  // An unknown job is a usage error.
  Result unknown = RunCommand({kBin + "/lockstep", "watch", "nope-1"}, env);
  EXPECT_EQ(unknown.code, 2);
  EXPECT_THAT(unknown.err, HasSubstr("nope-1"));

  // Every command: --help with an example, exit 3 without a coordinator.
  for (const char* command :
       {"submit", "status", "watch", "logs", "stop", "delete", "workers",
        "events", "checkpoints", "metrics", "compare", "artifacts"}) {
    Result help = RunCommand({kBin + "/lockstep", command, "--help"});
    EXPECT_EQ(help.code, 0) << command;
    EXPECT_THAT(help.out, AllOf(HasSubstr("Usage: lockstep"),
                                HasSubstr("lockstep " + std::string(command))))
        << command;
    EXPECT_THAT(help.out, ::testing::ContainsRegex("Examples?:")) << command;
    std::vector<std::string> argv = {kBin + "/lockstep", command};
    if (std::string(command) == "submit") argv.push_back(kMlp);
    if (std::string(command) != "workers" && std::string(command) != "status" &&
        std::string(command) != "submit") {
      argv.push_back("job-1");
    }
    if (std::string(command) == "compare") argv.push_back("job-2");
    if (std::string(command) == "artifacts")
      argv.insert(argv.end() - 1, "list");
    argv.insert(argv.end(), {"--coordinator", "127.0.0.1:1"});
    Result unreachable = RunCommand(argv);
    EXPECT_EQ(unreachable.code, 3) << command << ": " << unreachable.err;
    EXPECT_THAT(unreachable.err, HasSubstr("cannot reach the coordinator"))
        << command;
  }
}

// `compare` on two real runs: the table, the warning that explains the
// curves, and a well-formed SVG.
TEST_F(ClusterTest, CompareTwoRunsGivesATableAVerdictAWarningAndAPlot) {
  StartCluster(2);
  std::string a = Submit({"max_steps=30", "global_batch_size=64"});
  ASSERT_EQ(WatchUntil(a, Ended).state(), v1::JOB_STATE_SUCCEEDED);
  std::string b = Submit({"max_steps=30", "global_batch_size=128"});
  ASSERT_EQ(WatchUntil(b, Ended).state(), v1::JOB_STATE_SUCCEEDED);
  // The job list in pages: the newest first, and a word when more are left.
  Result newest = RunCommand({kBin + "/lockstep", "status", "--limit", "1",
                              "--coordinator", address_});
  ASSERT_EQ(newest.code, 0) << newest.err;
  EXPECT_THAT(newest.out, HasSubstr(b));
  EXPECT_THAT(newest.out, ::testing::Not(HasSubstr(a)));
  EXPECT_THAT(newest.err,
              AllOf(HasSubstr("newest 1 jobs"), HasSubstr("--all")));
  Result every = RunCommand(
      {kBin + "/lockstep", "status", "--all", "--coordinator", address_});
  EXPECT_THAT(every.out, AllOf(HasSubstr(a), HasSubstr(b)));
  EXPECT_EQ(every.err, "");
  const std::string svg = TempDir("compare") + "/curves.svg";
  Result compare = RunCommand({kBin + "/lockstep", "compare", a, b, "--svg",
                               svg, "--coordinator", address_});
  ASSERT_EQ(compare.code, 0) << compare.err;
  EXPECT_THAT(compare.out, AllOf(HasSubstr("GLOBAL"), HasSubstr("SAMPLES/S"),
                                 HasSubstr(a), HasSubstr(b), HasSubstr(svg)));
  EXPECT_THAT(compare.err, HasSubstr("differ in global batch"));
  EXPECT_THAT(compare.out,
              HasSubstr("different functions: global batch (64 vs 128)"));
  // The same job again on the same world size: the same model, bit for bit.
  std::string c = Submit({"max_steps=30", "global_batch_size=64"});
  ASSERT_EQ(WatchUntil(c, Ended).state(), v1::JOB_STATE_SUCCEEDED);
  Result same = RunCommand({kBin + "/lockstep", "compare", a, c, "--svg", svg,
                            "--coordinator", address_});
  ASSERT_EQ(same.code, 0) << same.err;
  EXPECT_THAT(same.out, HasSubstr("same function, bit-identical"));

  Result xml = RunCommand(
      {"/usr/bin/python3", "-c",
       "import sys, xml.etree.ElementTree as ET\n"
       "root = ET.parse(sys.argv[1]).getroot()\n"
       "ns = '{http://www.w3.org/2000/svg}'\n"
       "print(root.tag == ns + 'svg', len(root.findall(ns + 'polyline')))",
       svg});
  EXPECT_EQ(xml.code, 0) << xml.err;
  // 2 runs x (by step, by samples, test loss at each evaluation)
  EXPECT_EQ(xml.out, "True 6\n");

  Result json = RunCommand({kBin + "/lockstep", "compare", a, b, "--svg", svg,
                            "--json", "--coordinator", address_});
  ASSERT_EQ(json.code, 0);
  google::protobuf::Struct parsed = LastJsonLine(json.out);
  const auto& jobs = parsed.fields().at("jobs").list_value();
  ASSERT_EQ(jobs.values_size(), 2);
  EXPECT_EQ(jobs.values(1)
                .struct_value()
                .fields()
                .at("global_batch_size")
                .number_value(),
            128);
  EXPECT_EQ(parsed.fields().at("warnings").list_value().values_size(), 1);
  const auto& verdicts = parsed.fields().at("verdicts").list_value();
  ASSERT_EQ(verdicts.values_size(), 1);
  EXPECT_FALSE(verdicts.values(0)
                   .struct_value()
                   .fields()
                   .at("same_function")
                   .bool_value());
}

}  // namespace
}  // namespace lockstep::integration
