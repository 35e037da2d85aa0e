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

#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "client/process.h"
#include "common/files.h"
#include "lockstep/v1/coordinator.grpc.pb.h"

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

// A coordinator with a static two-worker cluster and its workers, started
// and killed by pid.
class ClusterTest : public ::testing::Test {
 protected:
  void StartCoordinator(const std::string& cluster_json) {
    dir_ = TempDir("cluster");
    int out = -1;
    auto pid = processes_.Spawn(
        "coordinator",
        {kBin + "/lockstep-coordinator", "--listen", "127.0.0.1:0",
         "--state-dir", dir_ + "/state", "--cluster", cluster_json},
        {}, dir_ + "/coordinator.log", &out);
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

  pid_t StartWorker(const std::string& tf_config, int index) {
    auto pid = processes_.Spawn(absl::StrCat("worker ", index),
                                {kBin + "/lockstep-worker", "--coordinator",
                                 address_, "--threads", "1"},
                                {"TF_CONFIG=" + tf_config, "OMP_NUM_THREADS=1",
                                 "OPENBLAS_NUM_THREADS=1"},
                                absl::StrCat(dir_, "/worker-", index, ".log"));
    EXPECT_TRUE(pid.ok()) << pid.status();
    return pid.value_or(-1);
  }

  // Follows the job until `done` holds for a status; returns that status.
  v1::JobStatus WatchUntil(
      const std::string& job,
      const std::function<bool(const v1::JobStatus&)>& done) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::minutes(3));
    v1::WatchJobRequest request;
    request.set_job_id(job);
    auto reader = stub_->WatchJob(&context, request);
    v1::JobStatus status;
    while (reader->Read(&status)) {
      if (done(status)) {
        context.TryCancel();
        break;
      }
    }
    reader->Finish();
    return status;
  }

  void TearDown() override { processes_.TerminateAll(absl::Seconds(5)); }

  client::ProcessGroup processes_;
  std::string dir_;
  std::string address_;
  pid_t coordinator_pid_ = -1;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
};

std::string TfConfig(int index) {
  return absl::StrCat(
      R"({"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}, "task": {"type": "worker", "index": )",
      index, "}}");
}
constexpr char kClusterOnly[] =
    R"({"cluster": {"worker": ["127.0.0.1:1", "127.0.0.1:2"]}})";

TEST_F(ClusterTest, TwoWorkersTrainFiftyStepsToTheSameModel) {
  StartCoordinator(kClusterOnly);
  StartWorker(TfConfig(0), 0);
  StartWorker(TfConfig(1), 1);
  Result submit =
      RunCommand({kBin + "/lockstep", "submit", kMlp, "--set", "max_steps=50",
                  "--set", "global_batch_size=64", "--watch"},
                 {"LOCKSTEP_COORDINATOR=" + address_});
  ASSERT_EQ(submit.code, 0) << submit.out << submit.err
                            << client::TailOfFile(dir_ + "/worker-1.log", 20);
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
}

TEST_F(ClusterTest, KilledWorkerFailsTheJobByNameAndTheSurvivorLives) {
  StartCoordinator(kClusterOnly);
  pid_t w0 = StartWorker(TfConfig(0), 0);
  pid_t w1 = StartWorker(TfConfig(1), 1);
  Result submit = RunCommand({kBin + "/lockstep", "submit", kMlp, "--set",
                              "epochs=50", "--set", "log_every_steps=1"},
                             {"LOCKSTEP_COORDINATOR=" + address_});
  ASSERT_EQ(submit.code, 0) << submit.err;
  std::string job = submit.out.substr(0, submit.out.find('\n'));
  v1::JobStatus running = WatchUntil(job, [](const v1::JobStatus& s) {
    return s.step() >= 5 || s.state() != v1::JOB_STATE_RUNNING &&
                                s.state() != v1::JOB_STATE_QUEUED;
  });
  ASSERT_EQ(running.state(), v1::JOB_STATE_RUNNING) << running.error();

  ASSERT_EQ(kill(w1, SIGKILL), 0);
  v1::JobStatus failed = WatchUntil(job, [](const v1::JobStatus& s) {
    return s.state() == v1::JOB_STATE_FAILED;
  });
  EXPECT_EQ(failed.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(failed.error(), AllOf(HasSubstr("worker:1"), HasSubstr("rank 1"),
                                    HasSubstr("lost its session")));
  // The survivor and the coordinator keep running.
  EXPECT_EQ(waitpid(w0, nullptr, WNOHANG), 0);
  EXPECT_EQ(kill(w0, 0), 0);
  EXPECT_EQ(kill(coordinator_pid_, 0), 0);
  Result workers = RunCommand(
      {kBin + "/lockstep", "status", job, "--coordinator", address_});
  EXPECT_THAT(workers.out, HasSubstr("failed"));
}

TEST(LocalTest, OneWorkerAndTwoWorkersGiveTheSameLosses) {
  std::string dir = TempDir("local");
  Result one =
      RunCommand({kBin + "/lockstep", "local", "--workers", "1", "--json",
                  "--set", "per_replica_batch_size=64", "--set", "max_steps=40",
                  "--metrics-out", dir + "/one.csv", kMlp});
  ASSERT_EQ(one.code, 0) << one.err;
  Result two =
      RunCommand({kBin + "/lockstep", "local", "--workers", "2", "--json",
                  "--set", "per_replica_batch_size=32", "--set", "max_steps=40",
                  "--metrics-out", dir + "/two.csv", kMlp});
  ASSERT_EQ(two.code, 0) << two.err;

  google::protobuf::Struct summary = LastJsonLine(two.out);
  const auto& f = summary.fields();
  EXPECT_EQ(f.at("state").string_value(), "succeeded");
  EXPECT_EQ(f.at("workers").number_value(), 2);
  EXPECT_EQ(f.at("steps").number_value(), 40);
  EXPECT_EQ(f.at("generations").number_value(), 1);
  EXPECT_EQ(f.at("model_digest").string_value().size(), 64u);
  for (const char* key :
       {"epochs", "final_loss", "test_accuracy", "samples_per_second"}) {
    EXPECT_TRUE(f.count(key)) << key;
  }
  EXPECT_GT(f.at("test_accuracy").number_value(), 0.5);

  std::vector<double> a = ReadLosses(dir + "/one.csv");
  std::vector<double> b = ReadLosses(dir + "/two.csv");
  ASSERT_EQ(a.size(), 40u);
  ASSERT_EQ(b.size(), 40u);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_NEAR(a[i], b[i], 1e-4 * std::abs(a[i])) << "step " << i + 1;
  }
  EXPECT_LT(a.back(), a.front());
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

}  // namespace
}  // namespace lockstep
