// End-to-end tests: real lockstep-coordinator, lockstep-worker and lockstep
// processes talking gRPC and Gloo over 127.0.0.1, training on the real
// Fashion-MNIST files. Waits are on events (process exit, the WatchJob
// stream), never on fixed sleeps.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <google/protobuf/struct.pb.h>
#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "client/process.h"
#include "common/files.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "lockstep/v1/coordinator.grpc.pb.h"
#include "worker/data/idx.h"

namespace lockstep {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

const std::string kBin = LOCKSTEP_BIN_DIR;
const std::string kSource = LOCKSTEP_SOURCE_DIR;
const std::string kMlp = kSource + "/examples/fashion_mnist_mlp.json";

struct Result {
  int code = -1;
  std::string out;
  std::string err;
};

std::string TempDir(const std::string& name) {
  std::string tmpl = ::testing::TempDir() + name + "_XXXXXX";
  return mkdtemp(tmpl.data());
}

// Runs a command to completion; `env` entries are added to the environment.
Result RunCommand(const std::vector<std::string>& argv,
                  const std::vector<std::string>& env = {}) {
  std::string dir = TempDir("run");
  std::string out_path = dir + "/out", err_path = dir + "/err";
  pid_t pid = fork();
  if (pid == 0) {
    int out = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int err = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(out, 1);
    dup2(err, 2);
    for (const std::string& var : env) putenv(const_cast<char*>(var.c_str()));
    std::vector<char*> c_argv;
    for (const std::string& arg : argv)
      c_argv.push_back(const_cast<char*>(arg.c_str()));
    c_argv.push_back(nullptr);
    execv(c_argv[0], c_argv.data());
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  Result result;
  result.code =
      WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  result.out = ReadFileToString(out_path).value_or("");
  result.err = ReadFileToString(err_path).value_or("");
  return result;
}

// The JSON object on the last line of `text`.
google::protobuf::Struct LastJsonLine(const std::string& text) {
  std::vector<std::string> lines =
      absl::StrSplit(text, '\n', absl::SkipEmpty());
  google::protobuf::Struct out;
  EXPECT_FALSE(lines.empty());
  if (!lines.empty()) {
    EXPECT_TRUE(
        google::protobuf::util::JsonStringToMessage(lines.back(), &out).ok())
        << lines.back();
  }
  return out;
}

std::vector<double> ReadLosses(const std::string& csv_path) {
  std::vector<double> losses;
  std::ifstream in(csv_path);
  std::string line;
  std::getline(in, line);  // header
  while (std::getline(in, line)) {
    std::vector<std::string> cols = absl::StrSplit(line, ',');
    double loss = 0;
    EXPECT_TRUE(cols.size() == 2 && absl::SimpleAtod(cols[1], &loss)) << line;
    losses.push_back(loss);
  }
  return losses;
}

// A coordinator with a static cluster of N workers, all started and killed by
// pid.
class ClusterTest : public ::testing::Test {
 protected:
  // `worker_env` adds variables to the first process of some workers.
  void StartCluster(int workers,
                    std::vector<std::string> coordinator_flags = {},
                    std::map<int, std::vector<std::string>> worker_env = {}) {
    dir_ = TempDir("cluster");
    workers_ = workers;
    coordinator_flags_ = std::move(coordinator_flags);
    StartCoordinator("127.0.0.1:0");
    for (int i = 0; i < workers; ++i) {
      worker_pids_.push_back(StartWorker(i, worker_env[i]));
    }
  }

  void StartCoordinator(const std::string& listen) {
    int out = -1;
    std::vector<std::string> argv = {kBin + "/lockstep-coordinator",
                                     "--listen",
                                     listen,
                                     "--state-dir",
                                     dir_ + "/state",
                                     "--cluster",
                                     ClusterJson()};
    argv.insert(argv.end(), coordinator_flags_.begin(),
                coordinator_flags_.end());
    auto pid = processes_.Spawn(absl::StrCat("coordinator ", ++coordinators_),
                                argv, {}, dir_ + "/coordinator.log", &out);
    ASSERT_TRUE(pid.ok()) << pid.status();
    coordinator_pid_ = *pid;
    std::string line;
    char c;
    while (read(out, &c, 1) == 1 && c != '\n') line.push_back(c);
    close(out);
    address_ = line.substr(line.rfind(' ') + 1);
    ASSERT_THAT(address_, HasSubstr("127.0.0.1:")) << line;
    stub_ = v1::Coordinator::NewStub(
        grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
  }

  std::string ClusterJson() const {
    std::vector<std::string> addresses;
    for (int i = 0; i < workers_; ++i) addresses.push_back("\"127.0.0.1:1\"");
    return absl::StrCat(R"({"cluster": {"worker": [)",
                        absl::StrJoin(addresses, ", "), "]}}");
  }

  pid_t StartWorker(int index, std::vector<std::string> env = {}) {
    std::string tf_config = absl::StrCat(
        R"({"cluster": )", ClusterJson().substr(12, ClusterJson().size() - 13),
        R"(, "task": {"type": "worker", "index": )", index, "}}");
    auto pid = processes_.Spawn(
        absl::StrCat("worker ", index, " #", ++spawned_),
        {kBin + "/lockstep-worker", "--coordinator", address_, "--threads",
         "1"},
        [&] {
          env.insert(env.end(), {"TF_CONFIG=" + tf_config, "OMP_NUM_THREADS=1",
                                 "OPENBLAS_NUM_THREADS=1"});
          return env;
        }(),
        absl::StrCat(dir_, "/worker-", index, "-", spawned_, ".log"));
    EXPECT_TRUE(pid.ok()) << pid.status();
    return pid.value_or(-1);
  }

  std::string Submit(const std::vector<std::string>& sets) {
    std::vector<std::string> argv = {kBin + "/lockstep", "submit", kMlp};
    for (const std::string& set : sets) {
      argv.push_back("--set");
      argv.push_back(set);
    }
    Result submit = RunCommand(argv, {"LOCKSTEP_COORDINATOR=" + address_});
    EXPECT_EQ(submit.code, 0) << submit.err;
    return submit.out.substr(0, submit.out.find('\n'));
  }

  // Follows the job until `done` holds for a status; returns that status.
  v1::JobStatus WatchUntil(
      const std::string& job,
      const std::function<bool(const v1::JobStatus&)>& done) {
    v1::JobStatus status;
    // A restarting coordinator ends the stream; follow it again.
    for (int attempt = 0; attempt < 20; ++attempt) {
      grpc::ClientContext context;
      context.set_wait_for_ready(true);
      context.set_deadline(std::chrono::system_clock::now() +
                           std::chrono::minutes(3));
      v1::WatchJobRequest request;
      request.set_job_id(job);
      auto reader = stub_->WatchJob(&context, request);
      while (reader->Read(&status)) {
        if (done(status)) {
          context.TryCancel();
          reader->Finish();
          return status;
        }
      }
      grpc::Status finished = reader->Finish();
      if (finished.error_code() != grpc::StatusCode::UNAVAILABLE &&
          finished.error_code() != grpc::StatusCode::CANCELLED) {
        break;
      }
    }
    return status;
  }

  static bool Ended(const v1::JobStatus& s) {
    return s.state() == v1::JOB_STATE_SUCCEEDED ||
           s.state() == v1::JOB_STATE_FAILED ||
           s.state() == v1::JOB_STATE_STOPPED;
  }

  // Submits `sets` and returns the job id once it trained `step` steps, or
  // "" (with a test failure) if it ended before.
  std::string SubmitAndTrainTo(const std::vector<std::string>& sets,
                               int64_t step) {
    std::string job = Submit(sets);
    v1::JobStatus running = WatchUntil(job, [step](const v1::JobStatus& s) {
      return s.step() >= step || Ended(s);
    });
    EXPECT_EQ(running.state(), v1::JOB_STATE_RUNNING) << running.error();
    return running.state() == v1::JOB_STATE_RUNNING ? job : "";
  }

  // The model digest of `sets` trained without interruption.
  std::string UninterruptedDigest(const std::vector<std::string>& sets) {
    v1::JobStatus done = WatchUntil(Submit(sets), Ended);
    EXPECT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << done.error();
    EXPECT_EQ(done.generations(), 1);
    return done.ranks_size() ? done.ranks(0).model_digest() : "";
  }

  static void ExpectAllRanks(const v1::JobStatus& status,
                             const std::string& digest) {
    ASSERT_GT(status.ranks_size(), 0);
    for (const v1::RankResult& rank : status.ranks()) {
      EXPECT_EQ(rank.model_digest(), digest) << "rank " << rank.rank();
    }
  }

  // The last event of `kind`, or null.
  static const v1::JobEvent* FindEvent(const v1::JobStatus& status,
                                       const std::string& kind) {
    for (int i = status.events_size() - 1; i >= 0; --i) {
      if (status.events(i).kind() == kind) return &status.events(i);
    }
    return nullptr;
  }

  bool Alive(pid_t pid) { return kill(pid, 0) == 0; }

  void TearDown() override { processes_.TerminateAll(absl::Seconds(5)); }

  client::ProcessGroup processes_;
  std::string dir_;
  std::string address_;
  int workers_ = 0;
  int spawned_ = 0;
  int coordinators_ = 0;
  std::vector<std::string> coordinator_flags_;
  pid_t coordinator_pid_ = -1;
  std::vector<pid_t> worker_pids_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
};

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
  EXPECT_THAT(table.out, AllOf(HasSubstr(job), HasSubstr("succeeded")));
  Result workers =
      RunCommand({kBin + "/lockstep", "workers", "--coordinator", address_});
  EXPECT_THAT(workers.out, AllOf(HasSubstr("worker:0"), HasSubstr("worker:1"),
                                 HasSubstr("idle")));
  Result events = RunCommand(
      {kBin + "/lockstep", "events", job, "--coordinator", address_});
  EXPECT_THAT(events.out, AllOf(HasSubstr("generation_started"),
                                HasSubstr("job_succeeded")));
}

// DESIGN §3: a dead worker is named at once, the survivors keep their
// processes and state, a replacement joins, and the job ends with the same
// model as a run that never failed.
TEST_F(ClusterTest, KilledWorkerIsReplacedAndNothingIsRolledBack) {
  StartCluster(3);
  const std::vector<std::string> sets = {"max_steps=60", "global_batch_size=96",
                                         "log_every_steps=1"};
  std::string reference = UninterruptedDigest(sets);

  std::string job = SubmitAndTrainTo(sets, 15);
  ASSERT_FALSE(job.empty());
  absl::Time killed = absl::Now();
  ASSERT_EQ(kill(worker_pids_[2], SIGKILL), 0);
  v1::JobStatus recovering = WatchUntil(job, [](const v1::JobStatus& s) {
    return s.state() != v1::JOB_STATE_RUNNING;
  });
  absl::Duration detection = absl::Now() - killed;
  EXPECT_EQ(recovering.state(), v1::JOB_STATE_RECOVERING);
  EXPECT_THAT(recovering.error(),
              AllOf(HasSubstr("worker:2"), HasSubstr("rank 2"),
                    HasSubstr("lost its session")));
  EXPECT_LT(detection, absl::Seconds(2));
  EXPECT_TRUE(Alive(worker_pids_[0]));
  EXPECT_TRUE(Alive(worker_pids_[1]));

  StartWorker(2);
  v1::JobStatus done = WatchUntil(job, Ended);
  ASSERT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << done.error();
  EXPECT_EQ(done.generations(), 2);
  EXPECT_EQ(done.step(), 60);
  ExpectAllRanks(done, reference);
  const v1::JobEvent* resumed = FindEvent(done, "resumed");
  ASSERT_NE(resumed, nullptr);
  EXPECT_THAT(resumed->message(), HasSubstr("0 steps repeated"));
  EXPECT_TRUE(Alive(worker_pids_[0]));
  EXPECT_TRUE(Alive(worker_pids_[1]));
}

TEST_F(ClusterTest, JobSurvivesAKilledAndRestartedCoordinator) {
  StartCluster(2);
  const std::vector<std::string> sets = {"max_steps=80", "global_batch_size=64",
                                         "log_every_steps=1"};
  std::string reference = UninterruptedDigest(sets);

  std::string job = SubmitAndTrainTo(sets, 10);
  ASSERT_FALSE(job.empty());
  ASSERT_EQ(kill(coordinator_pid_, SIGKILL), 0);
  StartCoordinator(address_);

  v1::JobStatus done = WatchUntil(job, Ended);
  ASSERT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << done.error();
  EXPECT_GE(done.generations(), 2);
  ExpectAllRanks(done, reference);
  EXPECT_NE(FindEvent(done, "coordinator_restarted"), nullptr);
  EXPECT_TRUE(Alive(worker_pids_[0]));
  EXPECT_TRUE(Alive(worker_pids_[1]));
}

TEST_F(ClusterTest, HungWorkerIsCaughtByTheHeartbeatTimeout) {
  StartCluster(2, {"--heartbeat-timeout", "2"});
  const std::vector<std::string> sets = {"max_steps=80", "global_batch_size=64",
                                         "log_every_steps=1"};
  std::string reference = UninterruptedDigest(sets);

  std::string job = SubmitAndTrainTo(sets, 10);
  ASSERT_FALSE(job.empty());
  ASSERT_EQ(kill(worker_pids_[1], SIGSTOP), 0);
  v1::JobStatus recovering = WatchUntil(job, [](const v1::JobStatus& s) {
    return s.state() != v1::JOB_STATE_RUNNING;
  });
  kill(worker_pids_[1], SIGCONT);
  EXPECT_EQ(recovering.state(), v1::JOB_STATE_RECOVERING);
  EXPECT_THAT(recovering.error(),
              AllOf(HasSubstr("worker:1"), HasSubstr("missed heartbeats")));

  // The same process wakes up, reconnects and the job finishes.
  v1::JobStatus done = WatchUntil(job, Ended);
  ASSERT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << done.error();
  ExpectAllRanks(done, reference);
}

grpc::health::v1::HealthCheckResponse::ServingStatus Health(
    const std::string& address) {
  auto stub = grpc::health::v1::Health::NewStub(
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_wait_for_ready(true);
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(20));
  grpc::health::v1::HealthCheckResponse response;
  grpc::Status status =
      stub->Check(&context, grpc::health::v1::HealthCheckRequest(), &response);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return response.status();
}

TEST_F(ClusterTest, DaemonsServeGrpcHealthAndExitCleanlyOnSigterm) {
  StartCluster(1);
  EXPECT_EQ(Health(address_), grpc::health::v1::HealthCheckResponse::SERVING);
  std::string dir = TempDir("health");
  int out = -1;
  auto worker = processes_.Spawn(
      "health worker",
      {kBin + "/lockstep-worker", "--coordinator", "127.0.0.1:1",
       "--health-listen", "127.0.0.1:0", "--connect-timeout", "600"},
      {}, dir + "/worker.log", &out);
  ASSERT_TRUE(worker.ok());
  std::string line;
  char c;
  while (read(out, &c, 1) == 1 && c != '\n') line.push_back(c);
  close(out);
  std::string port = line.substr(line.rfind(':') + 1);
  ASSERT_THAT(line, HasSubstr("health service on 127.0.0.1:"));
  EXPECT_EQ(Health("127.0.0.1:" + port),
            grpc::health::v1::HealthCheckResponse::SERVING);
  ASSERT_EQ(kill(*worker, SIGTERM), 0);
  int status = 0;
  ASSERT_EQ(waitpid(*worker, &status, 0), *worker);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

// The operator's commands against a real coordinator: output, --json shape
// and exit codes.
TEST_F(ClusterTest, CliCommandsShowAJobTheirWay) {
  StartCluster(2);
  const std::vector<std::string> env = {"LOCKSTEP_COORDINATOR=" + address_};
  Result submit = RunCommand(
      {kBin + "/lockstep", "submit", kMlp, "--set", "max_steps=40", "--set",
       "global_batch_size=64", "--set", "log_every_steps=1", "--json"},
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
  EXPECT_EQ(rows[0], "step,samples_seen,loss,test_accuracy,test_loss");
  EXPECT_THAT(rows[1], ::testing::StartsWith("1,64,"));
  std::vector<std::string> last = absl::StrSplit(rows[40], ',');
  ASSERT_EQ(last.size(), 5u);
  EXPECT_EQ(last[0], "40");
  EXPECT_EQ(last[1], "2560");
  EXPECT_FALSE(last[3].empty());  // evaluated at the end
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
  for (const char* command : {"submit", "status", "watch", "stop", "workers",
                              "events", "checkpoints", "metrics", "compare"}) {
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
    argv.insert(argv.end(), {"--coordinator", "127.0.0.1:1"});
    Result unreachable = RunCommand(argv);
    EXPECT_EQ(unreachable.code, 3) << command << ": " << unreachable.err;
    EXPECT_THAT(unreachable.err, HasSubstr("cannot reach the coordinator"))
        << command;
  }
}

// `compare` on two real runs: the table, the warning that explains the
// curves, and a well-formed SVG.
TEST_F(ClusterTest, CompareTwoRunsGivesATableAWarningAndAPlot) {
  StartCluster(2);
  std::string a = Submit({"max_steps=30", "global_batch_size=64"});
  ASSERT_EQ(WatchUntil(a, Ended).state(), v1::JOB_STATE_SUCCEEDED);
  std::string b = Submit({"max_steps=30", "global_batch_size=128"});
  ASSERT_EQ(WatchUntil(b, Ended).state(), v1::JOB_STATE_SUCCEEDED);
  const std::string svg = TempDir("compare") + "/curves.svg";
  Result compare = RunCommand({kBin + "/lockstep", "compare", a, b, "--svg",
                               svg, "--coordinator", address_});
  ASSERT_EQ(compare.code, 0) << compare.err;
  EXPECT_THAT(compare.out, AllOf(HasSubstr("GLOBAL"), HasSubstr("SAMPLES/S"),
                                 HasSubstr(a), HasSubstr(b), HasSubstr(svg)));
  EXPECT_THAT(compare.err, HasSubstr("differ in global batch"));
  Result xml = RunCommand(
      {"/usr/bin/python3", "-c",
       "import sys, xml.etree.ElementTree as ET\n"
       "root = ET.parse(sys.argv[1]).getroot()\n"
       "ns = '{http://www.w3.org/2000/svg}'\n"
       "print(root.tag == ns + 'svg', len(root.findall(ns + 'polyline')))",
       svg});
  EXPECT_EQ(xml.code, 0) << xml.err;
  EXPECT_EQ(xml.out, "True 4\n");  // 2 runs x (by step, by samples)

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
}

// DESIGN §4: initial parameters are checked bit for bit across ranks; a rank
// that built different ones fails the job with a message, instead of
// training a silently diverging model.
TEST_F(ClusterTest, DifferentInitialParametersOnARankFailTheJob) {
  StartCluster(2, {}, {{1, {"LOCKSTEP_FAILPOINT=perturb_initial_parameters"}}});
  v1::JobStatus done = WatchUntil(Submit({"max_steps=20"}), Ended);
  EXPECT_EQ(done.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(done.error(),
              AllOf(HasSubstr("rank 1"),
                    HasSubstr("initial parameters differ from rank 0's"),
                    HasSubstr("same lockstep-worker build and job spec")));
  EXPECT_EQ(done.generations(), 1);  // not retried: retrying cannot fix it
}

TEST_F(ClusterTest, UnknownTaskAndConflictingTfConfigAreRefused) {
  StartCluster(2);
  // worker:5 is not in the coordinator's 2-worker cluster.
  Result unknown =
      RunCommand({kBin + "/lockstep-worker", "--coordinator", address_,
                  "--task-type", "worker", "--task-index", "5"});
  EXPECT_EQ(unknown.code, 2);
  EXPECT_THAT(unknown.err,
              AllOf(HasSubstr("worker:5"), HasSubstr("not a training task")));
  // A worker whose own TF_CONFIG describes another cluster.
  Result conflict = RunCommand(
      {kBin + "/lockstep-worker", "--coordinator", address_},
      {R"(TF_CONFIG={"cluster": {"worker": ["10.0.0.1:1", "10.0.0.2:1"]}, "task": {"type": "worker", "index": 1}})"});
  EXPECT_EQ(conflict.code, 2);
  EXPECT_THAT(conflict.err,
              AllOf(HasSubstr("worker:[10.0.0.1:1,10.0.0.2:1]"),
                    HasSubstr("worker:[127.0.0.1:1,127.0.0.1:1]")));
}

TEST(BadInputTest, CorruptStateDirIsAClearError) {
  std::string dir = TempDir("corrupt");
  ASSERT_TRUE(
      WriteFileAtomically(dir + "/coordinator.db", std::string(4096, 'x'))
          .ok());
  Result r = RunCommand({kBin + "/lockstep-coordinator", "--listen",
                         "127.0.0.1:0", "--state-dir", dir});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err,
              AllOf(HasSubstr(dir + "/coordinator.db"), HasSubstr("corrupt")));
}

// DESIGN §4: the global batch is the unit. The same job as 1x64, 2x32, 4x16
// and 2x16 with 2 accumulation steps follows the same loss curve and ends
// at the same accuracy.
TEST(LocalTest, OneTwoAndFourWorkersAccumulationAndRingGiveTheSameLosses) {
  std::string dir = TempDir("local");
  struct Config {
    const char* name;
    int workers;
    int per_replica;
    int accumulation;
    const char* algorithm = "direct";
  };
  const std::vector<Config> configs = {{"1x64", 1, 64, 1},
                                       {"2x32", 2, 32, 1},
                                       {"4x16", 4, 16, 1},
                                       {"4x16-ring", 4, 16, 1, "ring"},
                                       {"2x16x2", 2, 16, 2}};
  std::map<std::string, std::vector<double>> losses;
  std::map<std::string, double> accuracy;
  for (const Config& c : configs) {
    Result r = RunCommand(
        {kBin + "/lockstep", "local", "--workers", absl::StrCat(c.workers),
         "--threads", "1", "--json", "--set",
         absl::StrCat("per_replica_batch_size=", c.per_replica), "--set",
         absl::StrCat("accumulation_steps=", c.accumulation), "--set",
         absl::StrCat("communication.algorithm=", c.algorithm), "--set",
         "max_steps=100", "--metrics-out", dir + "/" + c.name + ".csv", kMlp});
    ASSERT_EQ(r.code, 0) << c.name << ": " << r.err;
    google::protobuf::Struct summary = LastJsonLine(r.out);
    const auto& f = summary.fields();
    EXPECT_EQ(f.at("state").string_value(), "succeeded");
    EXPECT_EQ(f.at("workers").number_value(), c.workers);
    EXPECT_EQ(f.at("steps").number_value(), 100);
    EXPECT_EQ(f.at("generations").number_value(), 1);
    EXPECT_EQ(f.at("model_digest").string_value().size(), 64u);
    for (const char* key :
         {"epochs", "final_loss", "test_accuracy", "samples_per_second"}) {
      EXPECT_TRUE(f.count(key)) << key;
    }
    accuracy[c.name] = f.at("test_accuracy").number_value();
    losses[c.name] = ReadLosses(dir + "/" + c.name + ".csv");
    ASSERT_EQ(losses[c.name].size(), 100u) << c.name;
  }
  EXPECT_GT(accuracy["1x64"], 0.5);
  const std::vector<double>& reference = losses["1x64"];
  for (const auto& [name, curve] : losses) {
    for (size_t i = 0; i < curve.size(); ++i) {
      EXPECT_NEAR(curve[i], reference[i], 1e-4 * std::abs(reference[i]))
          << name << " step " << i + 1;
    }
    EXPECT_NEAR(accuracy[name], accuracy["1x64"], 0.002) << name;
  }
  for (size_t i = 0; i < 100; ++i) {
    EXPECT_NEAR(losses["2x16x2"][i], losses["4x16"][i],
                1e-4 * std::abs(losses["4x16"][i]))
        << "step " << i + 1;
  }
  EXPECT_LT(reference.back(), reference.front());
}

// A .npy file as numpy.save writes it (format 1.0).
std::string NpyFile(const std::string& descr, const std::string& shape,
                    const void* data, size_t bytes) {
  std::string header =
      absl::StrCat("{'descr': '", descr,
                   "', 'fortran_order': False, 'shape': ", shape, ", }");
  while ((10 + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  std::string out = "\x93NUMPY\x01";
  out += '\0';
  out += static_cast<char>(header.size() & 0xff);
  out += static_cast<char>(header.size() >> 8);
  return out + header + std::string(static_cast<const char*>(data), bytes);
}

// Part of Fashion-MNIST converted to the npy layout: what a user who brings
// their own data writes with numpy.save.
std::string WriteNpyDataSet(int train_count, int test_count) {
  std::string dir = TempDir("npy");
  for (bool train : {true, false}) {
    auto split =
        worker::LoadFashionMnist("/usr/share/datasets/fashion-mnist", train);
    EXPECT_TRUE(split.ok()) << split.status();
    if (!split.ok()) return dir;
    const int64_t n = train ? train_count : test_count;
    const int64_t pixels = split->rows * split->cols;
    std::vector<int64_t> labels(split->labels.begin(),
                                split->labels.begin() + n);
    const std::string name = train ? "/train" : "/test";
    EXPECT_TRUE(
        WriteFileAtomically(dir + name + "_images.npy",
                            NpyFile("|u1", absl::StrCat("(", n, ", 28, 28)"),
                                    split->pixels.data(), n * pixels))
            .ok());
    EXPECT_TRUE(WriteFileAtomically(
                    dir + name + "_labels.npy",
                    NpyFile("<i8", absl::StrCat("(", n, ",)"), labels.data(),
                            labels.size() * sizeof(int64_t)))
                    .ok());
  }
  return dir;
}

TEST(LocalTest, TrainsOnNumpyArrays) {
  std::string dir = WriteNpyDataSet(12800, 2000);
  Result r =
      RunCommand({kBin + "/lockstep", "local", "--workers", "2", "--json",
                  "--set", "data.format=npy", "--set", "data.dir=" + dir,
                  "--set", "max_steps=150", "--set", "global_batch_size=64",
                  "--metrics-out", dir + "/losses.csv", kMlp});
  ASSERT_EQ(r.code, 0) << r.err;
  const auto summary = LastJsonLine(r.out).fields();
  EXPECT_EQ(summary.at("state").string_value(), "succeeded");
  EXPECT_GT(summary.at("test_accuracy").number_value(), 0.6);
  std::vector<double> losses = ReadLosses(dir + "/losses.csv");
  ASSERT_EQ(losses.size(), 150u);
  EXPECT_LT(losses.back(), losses.front() / 2);
}

// A user model exported as TorchScript trains as is, the final model comes
// back as TorchScript (a zip archive with the module's code), and a run
// restored from a checkpoint of it ends with the uninterrupted run's model.
TEST(LocalTest, TorchScriptModelTrainsResumesAndIsExportedAsTorchScript) {
  const std::string dir = TempDir("torchscript");
  const std::string model = dir + "/net.pt";
  Result made =
      RunCommand({kBin + "/lockstep-example-torchscript", model, "3"});
  ASSERT_EQ(made.code, 0) << made.err;
  auto run = [&](int steps, std::vector<std::string> sets) {
    std::vector<std::string> argv = {kBin + "/lockstep",
                                     "local",
                                     "--workers",
                                     "2",
                                     "--json",
                                     "--set",
                                     "model.torchscript=" + model,
                                     "--set",
                                     "global_batch_size=64",
                                     "--set",
                                     absl::StrCat("max_steps=", steps)};
    for (const std::string& set : sets) {
      argv.push_back("--set");
      argv.push_back(set);
    }
    argv.push_back("--metrics-out");
    argv.push_back(absl::StrCat(dir, "/losses-", steps, ".csv"));
    argv.push_back(kMlp);
    return RunCommand(argv);
  };
  Result whole = run(120, {"export=" + dir + "/trained.pt"});
  ASSERT_EQ(whole.code, 0) << whole.err;
  const auto summary = LastJsonLine(whole.out).fields();
  EXPECT_EQ(summary.at("state").string_value(), "succeeded");
  EXPECT_GT(summary.at("test_accuracy").number_value(), 0.6);
  std::vector<double> losses = ReadLosses(dir + "/losses-120.csv");
  ASSERT_EQ(losses.size(), 120u);
  double first = 0, last = 0;
  for (int i = 0; i < 10; ++i) {
    first += losses[i];
    last += losses[losses.size() - 1 - i];
  }
  EXPECT_LT(last, first / 2);
  auto exported = ReadFileToString(dir + "/trained.pt");
  ASSERT_TRUE(exported.ok()) << exported.status();
  EXPECT_EQ(exported->substr(0, 2), "PK");
  EXPECT_NE(exported->find("code/"), std::string::npos);

  // 80 steps saving at step 40, then the job again to 120: it restores the
  // checkpoint into the scripted module and continues from step 40.
  const std::vector<std::string> checkpoints = {
      "checkpoint.backup_dir=" + dir + "/backups",
      "checkpoint.save_every_steps=40", "checkpoint.keep_backups=true"};
  Result part = run(80, checkpoints);
  ASSERT_EQ(part.code, 0) << part.err;
  Result resumed = run(120, checkpoints);
  ASSERT_EQ(resumed.code, 0) << resumed.err;
  EXPECT_EQ(
      LastJsonLine(resumed.out).fields().at("model_digest").string_value(),
      summary.at("model_digest").string_value());
  EXPECT_THAT(resumed.out + resumed.err, HasSubstr("ckpt-000000040"));
}

// bf16 trains the CNN to the accuracy of fp32 after one epoch (of a
// 12,800-sample part of Fashion-MNIST); fp16 needs a GPU, and a CPU-only
// worker says so and suggests bf16.
TEST(LocalTest, EachPrecisionTrainsTheCnnAsWellAsFp32) {
  const std::string dir = WriteNpyDataSet(12800, 2000);
  std::map<std::string, double> accuracy;
  for (const char* precision : {"fp32", "bf16", "fp16"}) {
    Result r = RunCommand(
        {kBin + "/lockstep", "local", "--workers", "2", "--json", "--set",
         "model=cnn", "--set", "data.format=npy", "--set", "data.dir=" + dir,
         "--set", "epochs=1", "--set", "global_batch_size=64", "--set",
         absl::StrCat("precision=", precision), kMlp});
    if (std::string(precision) == "fp16") {
      EXPECT_EQ(r.code, 1) << r.out << r.err;
      EXPECT_THAT(r.out + r.err, AllOf(HasSubstr("fp16"), HasSubstr("GPU"),
                                       HasSubstr("bf16")));
      continue;
    }
    ASSERT_EQ(r.code, 0) << precision << ": " << r.err;
    const auto summary = LastJsonLine(r.out).fields();
    EXPECT_EQ(summary.at("steps").number_value(), 200) << precision;
    accuracy[precision] = summary.at("test_accuracy").number_value();
  }
  EXPECT_GT(accuracy["fp32"], 0.75);
  EXPECT_NEAR(accuracy["bf16"], accuracy["fp32"], 0.01);
}

TEST(BadInputTest, TruncatedNumpyFileFailsTheJobWithItsName) {
  std::string dir = WriteNpyDataSet(640, 100);
  auto labels = ReadFileToString(dir + "/test_labels.npy");
  ASSERT_TRUE(labels.ok());
  ASSERT_TRUE(WriteFileAtomically(dir + "/test_labels.npy",
                                  labels->substr(0, labels->size() - 9))
                  .ok());
  Result r = RunCommand({kBin + "/lockstep", "local", "--workers", "2", "--set",
                         "data.format=npy", "--set", "data.dir=" + dir, kMlp});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err, AllOf(HasSubstr(dir + "/test_labels.npy"),
                           HasSubstr("truncated")));
}

TEST(BadInputTest, MalformedTfConfigIsAClearError) {
  Result r = RunCommand(
      {kBin + "/lockstep-worker", "--coordinator", "127.0.0.1:1"},
      {R"(TF_CONFIG={"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 3}})"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, AllOf(HasSubstr("TF_CONFIG"), HasSubstr("out of range")));
  Result broken =
      RunCommand({kBin + "/lockstep-worker", "--coordinator", "127.0.0.1:1"},
                 {"TF_CONFIG={\"cluster\": "});
  EXPECT_EQ(broken.code, 2);
  EXPECT_THAT(broken.err, HasSubstr("not valid JSON"));
  Result coordinator =
      RunCommand({kBin + "/lockstep-coordinator", "--listen", "127.0.0.1:0",
                  "--state-dir", TempDir("state"), "--cluster",
                  R"({"cluster": {"chief": ["a:1", "b:1"]}})"});
  EXPECT_EQ(coordinator.code, 2);
  EXPECT_THAT(coordinator.err, HasSubstr("at most one chief"));
}

TEST(BadInputTest, UnknownJobSpecFieldIsNamed) {
  std::string dir = TempDir("spec");
  std::string path = dir + "/job.json";
  ASSERT_TRUE(
      WriteFileAtomically(path, R"({"global_batch_size": 64, "epocs": 2})")
          .ok());
  Result r = RunCommand({kBin + "/lockstep", "local", "--workers", "2", path});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, AllOf(HasSubstr("epocs"), HasSubstr(path)));
  Result set =
      RunCommand({kBin + "/lockstep", "local", "--set", "epocs=2", kMlp});
  EXPECT_EQ(set.code, 2);
  EXPECT_THAT(set.err, HasSubstr("epocs"));
}

TEST(BadInputTest, IndivisibleGlobalBatchNamesBothNumbers) {
  Result r = RunCommand({kBin + "/lockstep", "local", "--workers", "3", "--set",
                         "global_batch_size=64", kMlp});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, AllOf(HasSubstr("64"), HasSubstr("3 replicas")));
}

TEST(BadInputTest, WrongFlagAndUnreachableCoordinator) {
  Result flag =
      RunCommand({kBin + "/lockstep", "local", "--wrokers", "2", kMlp});
  EXPECT_EQ(flag.code, 2);
  EXPECT_THAT(flag.err, HasSubstr("--wrokers"));
  Result unreachable = RunCommand(
      {kBin + "/lockstep", "status", "--coordinator", "127.0.0.1:1"});
  EXPECT_EQ(unreachable.code, 3);
  EXPECT_THAT(unreachable.err, HasSubstr("cannot reach the coordinator"));
}

TEST(BadInputTest, MissingDataFailsTheJobWithTheFileName) {
  Result r = RunCommand({kBin + "/lockstep", "local", "--workers", "2", "--set",
                         "data.dir=/nonexistent/fmnist", kMlp});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err,
              AllOf(HasSubstr("/nonexistent/fmnist"), HasSubstr("rank")));
}

// ---- BackupAndRestore (DESIGN §6) ------------------------------------------

// What `lockstep checkpoints JOB --json` says, by checkpoint name.
std::map<std::string, google::protobuf::Struct> ListCheckpoints(
    const std::string& address, const std::string& job) {
  Result r = RunCommand({kBin + "/lockstep", "checkpoints", job, "--json",
                         "--coordinator", address});
  EXPECT_EQ(r.code, 0) << r.err;
  google::protobuf::ListValue list;
  EXPECT_TRUE(google::protobuf::util::JsonStringToMessage(r.out, &list).ok())
      << r.out;
  std::map<std::string, google::protobuf::Struct> out;
  for (const auto& value : list.values()) {
    out[value.struct_value().fields().at("name").string_value()] =
        value.struct_value();
  }
  return out;
}

class CheckpointTest : public ClusterTest {
 protected:
  void SetUp() override { backup_ = TempDir("backup") + "/ckpt"; }

  // The job's settings with checkpoints every `every` steps, kept after
  // success so the test can inspect them.
  std::vector<std::string> WithCheckpoints(std::vector<std::string> sets,
                                           int every) {
    sets.push_back("checkpoint.backup_dir=" + backup_);
    sets.push_back(absl::StrCat("checkpoint.save_every_steps=", every));
    sets.push_back("checkpoint.keep_backups=true");
    return sets;
  }

  // LATEST names a checkpoint that `lockstep checkpoints` verifies.
  void ExpectLatestVerifies(const std::string& job) {
    auto latest = ReadFileToString(backup_ + "/LATEST");
    ASSERT_TRUE(latest.ok()) << latest.status();
    std::string name(absl::StripAsciiWhitespace(*latest));
    auto listed = ListCheckpoints(address_, job);
    ASSERT_TRUE(listed.count(name)) << name;
    EXPECT_TRUE(listed[name].fields().at("verified").bool_value())
        << listed[name].fields().at("check").string_value();
  }

  static bool HasCheckpointAtLeast(const v1::JobStatus& s, int64_t step) {
    return s.checkpoints_size() > 0 &&
           s.checkpoints(s.checkpoints_size() - 1).step() >= step;
  }

  // Submits `sets` (kCheckpointJob by default) saving every 10 steps, waits
  // for the checkpoint of step 20, and SIGKILLs every worker (reaped): no
  // live state survives.
  std::string TrainThenKillEveryWorker(const std::vector<std::string>& sets);
  std::string TrainThenKillEveryWorker();

  std::string backup_;
};

const std::vector<std::string> kCheckpointJob = {
    "max_steps=60", "global_batch_size=64", "log_every_steps=1"};

std::string CheckpointTest::TrainThenKillEveryWorker() {
  return TrainThenKillEveryWorker(kCheckpointJob);
}

std::string CheckpointTest::TrainThenKillEveryWorker(
    const std::vector<std::string>& sets) {
  std::string job = Submit(WithCheckpoints(sets, 10));
  WatchUntil(job, [](const v1::JobStatus& s) {
    return HasCheckpointAtLeast(s, 20) || Ended(s);
  });
  for (pid_t pid : worker_pids_) EXPECT_EQ(kill(pid, SIGKILL), 0);
  for (pid_t pid : worker_pids_) waitpid(pid, nullptr, 0);
  return job;
}

// A process dying at each point of the save and commit path leaves LATEST
// naming a complete checkpoint, and the job still ends with the model of a
// run that never failed.
class FailurePointTest
    : public CheckpointTest,
      public ::testing::WithParamInterface<std::pair<const char*, int>> {};

TEST_P(FailurePointTest, DyingInTheSavePathLosesNothing) {
  const auto [point, victim] = GetParam();
  // The failure point fires at the second save, after the first committed.
  // The reference run saves nothing, so it never reaches the point.
  StartCluster(2, {},
               {{victim, {absl::StrCat("LOCKSTEP_FAILPOINT=", point, ":2")}}});
  std::string reference = UninterruptedDigest(kCheckpointJob);
  std::string job = Submit(WithCheckpoints(kCheckpointJob, 10));
  int status = 0;
  ASSERT_EQ(waitpid(worker_pids_[victim], &status, 0), worker_pids_[victim]);
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
      << "the failure point " << point << " was not reached";
  StartWorker(victim);
  v1::JobStatus done = WatchUntil(job, Ended);
  ASSERT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << done.error();
  EXPECT_GE(done.generations(), 2);
  ExpectAllRanks(done, reference);
  ExpectLatestVerifies(job);
  // Every save after the failure committed again.
  ASSERT_GT(done.checkpoints_size(), 0);
  EXPECT_EQ(done.checkpoints(done.checkpoints_size() - 1).step(), 50);
}

INSTANTIATE_TEST_SUITE_P(
    Points, FailurePointTest,
    ::testing::Values(std::pair{"checkpoint_before_prepare", 1},
                      std::pair{"checkpoint_after_first_file", 0},
                      std::pair{"checkpoint_before_commit", 0},
                      std::pair{"checkpoint_during_rename", 0},
                      std::pair{"checkpoint_before_latest", 0}),
    [](const auto& info) { return std::string(info.param.first); });

// With every worker lost there is no live state: the next generation restores
// the newest checkpoint and continues at exactly the next sample.
TEST_F(CheckpointTest, EveryWorkerKilledResumesFromTheCheckpointBitForBit) {
  StartCluster(2);
  std::string reference = UninterruptedDigest(kCheckpointJob);
  std::string job = TrainThenKillEveryWorker();
  StartWorker(0);
  StartWorker(1);
  v1::JobStatus done = WatchUntil(job, Ended);
  ASSERT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << done.error();
  ExpectAllRanks(done, reference);
  const v1::JobEvent* resumed = FindEvent(done, "resumed");
  ASSERT_NE(resumed, nullptr);
  EXPECT_THAT(resumed->message(), HasSubstr("from checkpoint ckpt-0000000"));
  ExpectLatestVerifies(job);
}

// Dropout masks are a function of (seed, rank, step), batch norm's running
// statistics travel in the checkpoint, and bf16 autocast is deterministic:
// the restored run still ends with the uninterrupted run's model.
TEST_F(CheckpointTest, ResnetWithDropoutInBf16ResumesBitForBit) {
  StartCluster(2);
  std::vector<std::string> sets = kCheckpointJob;
  for (const char* set : {"model.name=resnet", "model.dropout=0.2",
                          "precision=bf16", "max_steps=40"}) {
    sets.push_back(set);
  }
  std::string reference = UninterruptedDigest(sets);
  std::string job = TrainThenKillEveryWorker(sets);
  StartWorker(0);
  StartWorker(1);
  v1::JobStatus done = WatchUntil(job, Ended);
  ASSERT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << done.error();
  ExpectAllRanks(done, reference);
  ASSERT_NE(FindEvent(done, "resumed"), nullptr);
  ExpectLatestVerifies(job);
}

// A corrupt newest checkpoint is reported and skipped for the one before it.
TEST_F(CheckpointTest, CorruptNewestCheckpointIsSkippedForThePreviousOne) {
  StartCluster(2);
  std::string reference = UninterruptedDigest(kCheckpointJob);
  std::string job = TrainThenKillEveryWorker();
  auto latest = ReadFileToString(backup_ + "/LATEST");
  ASSERT_TRUE(latest.ok());
  std::string newest(absl::StripAsciiWhitespace(*latest));
  std::string model = backup_ + "/" + newest + "/model.pt";
  auto bytes = ReadFileToString(model);
  ASSERT_TRUE(bytes.ok());
  (*bytes)[bytes->size() / 2] ^= 0x01;
  ASSERT_TRUE(WriteFileAtomically(model, *bytes).ok());
  auto listed = ListCheckpoints(address_, job);
  EXPECT_FALSE(listed[newest].fields().at("verified").bool_value());
  EXPECT_THAT(listed[newest].fields().at("check").string_value(),
              HasSubstr("SHA-256"));

  StartWorker(0);
  StartWorker(1);
  v1::JobStatus done = WatchUntil(job, Ended);
  ASSERT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << done.error();
  ExpectAllRanks(done, reference);
  const v1::JobEvent* resumed = FindEvent(done, "resumed");
  ASSERT_NE(resumed, nullptr);
  EXPECT_THAT(resumed->message(), HasSubstr("from checkpoint ckpt-"));
  EXPECT_THAT(resumed->message(), ::testing::Not(HasSubstr(newest)));
}

// A save that cannot be written is an event; training goes on.
TEST_F(CheckpointTest, FailedSaveIsAnEventAndTrainingGoesOn) {
  StartCluster(2);
  std::string reference = UninterruptedDigest(kCheckpointJob);
  // The temporary folder cannot be created: a file is in its way.
  ASSERT_TRUE(MakeDirectories(backup_).ok());
  ASSERT_TRUE(WriteFileAtomically(backup_ + "/.tmp", "in the way").ok());
  v1::JobStatus done =
      WatchUntil(Submit(WithCheckpoints(kCheckpointJob, 10)), Ended);
  ASSERT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << done.error();
  ExpectAllRanks(done, reference);
  EXPECT_EQ(done.checkpoints_size(), 0);
  const v1::JobEvent* failed = FindEvent(done, "checkpoint_failed");
  ASSERT_NE(failed, nullptr);
  EXPECT_THAT(failed->message(),
              AllOf(HasSubstr("could not write its part"), HasSubstr(".tmp")));
}

// After success the final model is exported and the backups are removed.
TEST_F(CheckpointTest, SuccessExportsTheModelAndRemovesTheBackups) {
  StartCluster(2);
  std::string exported = TempDir("export") + "/models/final.pt";
  std::vector<std::string> sets = kCheckpointJob;
  sets.push_back("checkpoint.backup_dir=" + backup_);
  sets.push_back("checkpoint.save_every_steps=10");
  sets.push_back("export=" + exported);
  v1::JobStatus done = WatchUntil(Submit(sets), Ended);
  ASSERT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << done.error();
  EXPECT_EQ(done.checkpoints_size(), 5);
  auto model = ReadFileToString(exported);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EQ(model->substr(0, 2), "PK");  // a LibTorch (zip) archive
  EXPECT_FALSE(PathExists(backup_ + "/LATEST"));
  EXPECT_FALSE(PathExists(backup_ + "/ckpt-000000050"));
  EXPECT_FALSE(PathExists(backup_ + "/.tmp"));
}

// SIGKILL of the chief and then of the other worker at random steps.
TEST_F(CheckpointTest, ChiefAndWorkerKilledAtRandomStepsLoseNothing) {
  StartCluster(2);
  std::mt19937 random(::testing::UnitTest::GetInstance()->random_seed());
  const int64_t first = 5 + random() % 20, second = 35 + random() % 15;
  SCOPED_TRACE(absl::StrCat("kills after steps ", first, " and ", second));
  std::string reference = UninterruptedDigest(kCheckpointJob);
  std::string job =
      SubmitAndTrainTo(WithCheckpoints(kCheckpointJob, 10), first);
  ASSERT_FALSE(job.empty());
  ASSERT_EQ(kill(worker_pids_[0], SIGKILL), 0);
  worker_pids_[0] = StartWorker(0);
  WatchUntil(job, [&](const v1::JobStatus& s) {
    return (s.generation() >= 2 && s.state() == v1::JOB_STATE_RUNNING &&
            s.step() >= second) ||
           Ended(s);
  });
  ASSERT_EQ(kill(worker_pids_[1], SIGKILL), 0);
  StartWorker(1);
  v1::JobStatus done = WatchUntil(job, Ended);
  ASSERT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << done.error();
  ExpectAllRanks(done, reference);
  ExpectLatestVerifies(job);
}

// SIGTERM to every worker: they agree on one step, save it, exit 0, and the
// restarted job resumes at that step with nothing repeated.
TEST_F(CheckpointTest, SigtermSavesAnAgreedStepAndExitsZero) {
  StartCluster(2);
  std::string reference = UninterruptedDigest(kCheckpointJob);
  // Saves only on preemption.
  std::string job = SubmitAndTrainTo(WithCheckpoints(kCheckpointJob, 1000), 15);
  ASSERT_FALSE(job.empty());
  for (pid_t pid : worker_pids_) ASSERT_EQ(kill(pid, SIGTERM), 0);
  for (pid_t pid : worker_pids_) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  }
  v1::JobStatus preempted = WatchUntil(job, [](const v1::JobStatus& s) {
    return s.state() != v1::JOB_STATE_RUNNING;
  });
  EXPECT_EQ(preempted.state(), v1::JOB_STATE_RECOVERING) << preempted.error();
  EXPECT_EQ(preempted.preemptions(), 1);
  ASSERT_EQ(preempted.checkpoints_size(), 1);
  const int64_t saved = preempted.checkpoints(0).step();
  EXPECT_EQ(saved, preempted.step());
  EXPECT_NE(FindEvent(preempted, "preempted"), nullptr);

  StartWorker(0);
  StartWorker(1);
  v1::JobStatus done = WatchUntil(job, Ended);
  ASSERT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << done.error();
  ExpectAllRanks(done, reference);
  const v1::JobEvent* resumed = FindEvent(done, "resumed");
  ASSERT_NE(resumed, nullptr);
  EXPECT_THAT(
      resumed->message(),
      AllOf(HasSubstr(absl::StrCat("after step ", saved)),
            HasSubstr("from checkpoint"), HasSubstr("0 steps repeated")));
}

// A job checkpointed on 4 workers resumes on 2 with the same global batch,
// however the new job states its batch.
TEST_F(CheckpointTest, ResumeOnTwoWorkersOfAJobCheckpointedOnFour) {
  StartCluster(4);
  const std::vector<std::string> sets = {"epochs=1", "global_batch_size=64",
                                         "log_every_steps=1"};
  std::string first = SubmitAndTrainTo(WithCheckpoints(sets, 1000), 20);
  ASSERT_FALSE(first.empty());
  Result stop = RunCommand(
      {kBin + "/lockstep", "stop", first, "--coordinator", address_});
  ASSERT_EQ(stop.code, 0) << stop.err;
  v1::JobStatus stopped = WatchUntil(first, Ended);
  ASSERT_EQ(stopped.state(), v1::JOB_STATE_STOPPED);
  ASSERT_EQ(stopped.checkpoints_size(), 1);
  const int64_t saved = stopped.checkpoints(0).step();
  processes_.TerminateAll(absl::Seconds(5));
  worker_pids_.clear();

  StartCluster(2);
  // per_replica_batch_size 16 would make a fresh job's global batch 32.
  std::vector<std::string> again = WithCheckpoints(sets, 1000);
  again.push_back("per_replica_batch_size=16");
  v1::JobStatus done = WatchUntil(Submit(again), Ended);
  ASSERT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << done.error();
  EXPECT_EQ(done.world_size(), 2);
  EXPECT_EQ(done.total_steps(), 60000 / 64);  // the global batch stayed 64
  const v1::JobEvent* resumed = FindEvent(done, "resumed");
  ASSERT_NE(resumed, nullptr);
  EXPECT_THAT(resumed->message(), HasSubstr(absl::StrCat("after step ", saved,
                                                         " from checkpoint")));
}

// The first child of `parent` whose command name is `comm`, or -1.
pid_t FindChild(pid_t parent, const std::string& comm) {
  std::error_code error;
  for (const auto& entry :
       std::filesystem::directory_iterator("/proc", error)) {
    std::string stat =
        ReadFileToString(entry.path().string() + "/stat").value_or("");
    size_t open = stat.find('('), close = stat.rfind(')');
    if (open == std::string::npos || close == std::string::npos) continue;
    std::vector<std::string> rest = absl::StrSplit(stat.substr(close + 2), ' ');
    int ppid = 0, pid = 0;
    if (rest.size() > 1 && absl::SimpleAtoi(rest[1], &ppid) && ppid == parent &&
        stat.substr(open + 1, close - open - 1) == comm &&
        absl::SimpleAtoi(stat.substr(0, open - 1), &pid)) {
      return pid;
    }
  }
  return -1;
}

// `lockstep local` restarts a worker process that dies, as Kubernetes would.
TEST(LocalTest, SurvivesKillOfAWorker) {
  const std::vector<std::string> run = {kBin + "/lockstep",
                                        "local",
                                        "--workers",
                                        "2",
                                        "--json",
                                        "--set",
                                        "max_steps=200",
                                        "--set",
                                        "global_batch_size=64",
                                        "--set",
                                        "log_every_steps=1",
                                        kMlp};
  Result reference = RunCommand(run);
  ASSERT_EQ(reference.code, 0) << reference.err;

  // With --json, progress goes to stderr: read it through a pipe.
  std::string dir = TempDir("local_kill");
  int err_pipe[2];
  ASSERT_EQ(pipe(err_pipe), 0);
  pid_t local = fork();
  if (local == 0) {
    int out = open((dir + "/out").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(out, 1);
    dup2(err_pipe[1], 2);
    close(err_pipe[0]);
    std::vector<char*> argv;
    for (const std::string& arg : run)
      argv.push_back(const_cast<char*>(arg.c_str()));
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(err_pipe[1]);
  std::string err;
  char buffer[4096];
  ssize_t n;
  pid_t victim = -1;
  while ((n = read(err_pipe[0], buffer, sizeof(buffer))) > 0) {
    err.append(buffer, static_cast<size_t>(n));
    // A progress line of a generation that trains.
    if (victim < 0 && err.find("samples/s  ETA") != std::string::npos) {
      victim = FindChild(local, "lockstep-worker");
      ASSERT_GT(victim, 0) << err;
      ASSERT_EQ(kill(victim, SIGKILL), 0);
    }
  }
  close(err_pipe[0]);
  int status = 0;
  ASSERT_EQ(waitpid(local, &status, 0), local);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << err;
  ASSERT_GT(victim, 0) << "training never started: " << err;
  EXPECT_THAT(err, HasSubstr("restarting it"));
  const auto summary =
      LastJsonLine(ReadFileToString(dir + "/out").value_or("")).fields();
  EXPECT_EQ(summary.at("state").string_value(), "succeeded");
  EXPECT_GE(summary.at("generations").number_value(), 2);
  EXPECT_EQ(
      summary.at("model_digest").string_value(),
      LastJsonLine(reference.out).fields().at("model_digest").string_value());
}

}  // namespace
}  // namespace lockstep
