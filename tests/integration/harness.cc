// The end-to-end harness of harness.h: processes run to completion, the
// cluster fixtures' processes and WatchJob streams, and the readers of what
// the binaries print and write.
#include "tests/integration/harness.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "common/files.h"
#include "common/job_state.h"
#include "worker/data/idx.h"

namespace lockstep::integration {

using ::testing::HasSubstr;

const std::string kBin = LOCKSTEP_BIN_DIR;
const std::string kSource = LOCKSTEP_SOURCE_DIR;
const std::string kMlp = kSource + "/examples/fashion_mnist_mlp.json";

std::string TempDir(const std::string& name) {
  std::string tmpl = ::testing::TempDir() + name + "_XXXXXX";
  return mkdtemp(tmpl.data());
}

// ---- mutual TLS ------------------------------------------------------------

namespace {

// The harness's CAs and the certificates issued so far, by CA and ID.
struct TestPki {
  absl::Mutex mu;
  std::string dir;
  KeyAndCertificate ca;
  KeyAndCertificate foreign_ca;
  std::map<std::pair<bool, std::string>, TlsOptions> issued ABSL_GUARDED_BY(mu);
  int count ABSL_GUARDED_BY(mu) = 0;
};

TestPki& Pki() {
  static TestPki* pki = [] {
    auto* made = new TestPki;
    made->dir = TempDir("tls");
    auto ca = MakeCertificateAuthority("lockstep integration-test CA");
    auto foreign = MakeCertificateAuthority("a CA lockstep does not trust");
    if (!ca.ok() || !foreign.ok()) {
      ADD_FAILURE() << "cannot make the test CAs: " << ca.status() << " "
                    << foreign.status();
      abort();
    }
    made->ca = *ca;
    made->foreign_ca = *foreign;
    return made;
  }();
  return *pki;
}

}  // namespace

const KeyAndCertificate& HarnessCa() { return Pki().ca; }

TlsOptions IssueTestCertificate(const std::string& spiffe_id, bool foreign_ca) {
  TestPki& pki = Pki();
  absl::MutexLock lock(&pki.mu);
  auto [it, fresh] = pki.issued.try_emplace({foreign_ca, spiffe_id});
  if (!fresh) return it->second;
  CertificateSpec spec;
  spec.spiffe_id = spiffe_id;
  absl::StatusOr<TlsOptions> files =
      IssueTlsFiles(foreign_ca ? pki.foreign_ca : pki.ca, spec, pki.dir,
                    absl::StrCat("cert-", ++pki.count));
  if (!files.ok()) {
    ADD_FAILURE() << "cannot issue " << spiffe_id << ": " << files.status();
    pki.issued.erase(it);
    return TlsOptions();
  }
  it->second = *files;
  return *files;
}

std::vector<std::string> TlsFlags(const TlsOptions& files) {
  return {"--tls-cert",   files.cert_file, "--tls-key",
          files.key_file, "--tls-ca",      files.ca_file};
}

std::vector<std::string> TlsFlagsFor(const std::string& spiffe_id) {
  return TlsFlags(IssueTestCertificate(spiffe_id));
}

std::vector<std::string> WithTls(std::vector<std::string> argv,
                                 const std::string& spiffe_id) {
  for (std::string& flag : TlsFlagsFor(spiffe_id)) {
    argv.push_back(std::move(flag));
  }
  return argv;
}

std::vector<std::string> TlsEnv(const TlsOptions& files) {
  return {"LOCKSTEP_TLS_CERT=" + files.cert_file,
          "LOCKSTEP_TLS_KEY=" + files.key_file,
          "LOCKSTEP_TLS_CA=" + files.ca_file};
}

const TlsOptions& OperatorTls() {
  static const TlsOptions* files =
      new TlsOptions(IssueTestCertificate(kOperatorId));
  return *files;
}

std::shared_ptr<grpc::ChannelCredentials> TestCredentials(
    const TlsOptions* client, ServerCheck server) {
  if (client != nullptr) {
    absl::StatusOr<TlsMaterial> loaded = LoadTlsMaterial(*client);
    EXPECT_TRUE(loaded.ok()) << loaded.status();
    if (loaded.ok()) return ChannelCredentials(*loaded, server);
  }
  grpc::SslCredentialsOptions server_only;
  server_only.pem_root_certs = HarnessCa().cert_pem;
  return grpc::SslCredentials(server_only);
}

std::unique_ptr<v1::Coordinator::Stub> CoordinatorStub(
    const std::string& address, const TlsOptions* client) {
  return v1::Coordinator::NewStub(
      grpc::CreateChannel(address, TestCredentials(client)));
}

// Runs a command to completion; `env` entries are added to the environment.
Result RunCommand(const std::vector<std::string>& argv,
                  const std::vector<std::string>& env) {
  // Made before fork: the child only calls putenv and exec.
  std::vector<std::string> full_env = TlsEnv(OperatorTls());
  full_env.insert(full_env.end(), env.begin(), env.end());
  std::string dir = TempDir("run");
  std::string out_path = dir + "/out", err_path = dir + "/err";
  pid_t pid = fork();
  if (pid == 0) {
    int out = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int err = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(out, 1);
    dup2(err, 2);
    for (const std::string& var : full_env) {
      putenv(const_cast<char*>(var.c_str()));
    }
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

std::vector<std::string> LocalMlpRun() {
  return {kBin + "/lockstep",
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
}

Result RunAndKillAWorker(const std::vector<std::string>& argv) {
  Result result;
  // With --json, progress goes to stderr: read it through a pipe.
  std::string dir = TempDir("local_kill");
  int err_pipe[2];
  if (pipe(err_pipe) != 0) return result;
  pid_t local = fork();
  if (local == 0) {
    int out = open((dir + "/out").c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(out, 1);
    dup2(err_pipe[1], 2);
    close(err_pipe[0]);
    std::vector<char*> args;
    for (const std::string& arg : argv) {
      args.push_back(const_cast<char*>(arg.c_str()));
    }
    args.push_back(nullptr);
    execv(args[0], args.data());
    _exit(127);
  }
  close(err_pipe[1]);
  char buffer[4096];
  ssize_t n;
  pid_t victim = -1;
  while ((n = read(err_pipe[0], buffer, sizeof(buffer))) > 0) {
    result.err.append(buffer, static_cast<size_t>(n));
    // A progress line of a generation that trains.
    if (victim < 0 && result.err.find("samples/s  ETA") != std::string::npos) {
      victim = FindChild(local, "lockstep-worker");
      if (victim > 0) kill(victim, SIGKILL);
    }
  }
  close(err_pipe[0]);
  int status = 0;
  waitpid(local, &status, 0);
  result.out = ReadFileToString(dir + "/out").value_or("");
  const bool exited_ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
  result.code = exited_ok && victim > 0 ? 0 : 1;
  if (victim <= 0)
    result.err += "\n(training never started: no worker was killed)";
  return result;
}

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

grpc::health::v1::HealthCheckResponse::ServingStatus Health(
    const std::string& address) {
  auto stub = grpc::health::v1::Health::NewStub(grpc::CreateChannel(
      address, TestCredentials(&OperatorTls(), ServerCheck::kAnyDaemon)));
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

namespace {

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

}  // namespace

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

// ---- ClusterTest ----------------------------------------------------------

void ClusterTest::StartCluster(
    int workers, std::vector<std::string> coordinator_flags,
    std::map<int, std::vector<std::string>> worker_env) {
  dir_ = TempDir("cluster");
  workers_ = workers;
  coordinator_flags_ = std::move(coordinator_flags);
  StartCoordinator("127.0.0.1:0");
  for (int i = 0; i < workers; ++i) {
    worker_pids_.push_back(StartWorker(i, worker_env[i]));
  }
  for (int i = 0; i < spares_; ++i) spare_pids_.push_back(StartSpare(i));
}

void ClusterTest::StartCoordinator(const std::string& listen) {
  int out = -1;
  std::vector<std::string> argv = {kBin + "/lockstep-coordinator", "--listen",
                                   listen, "--state-dir", dir_ + "/state"};
  if (!pool_) argv.insert(argv.end(), {"--cluster", ClusterJson()});
  argv.insert(argv.end(), coordinator_flags_.begin(), coordinator_flags_.end());
  const bool own_tls =
      std::any_of(coordinator_flags_.begin(), coordinator_flags_.end(),
                  [](const std::string& flag) {
                    return flag == "--insecure" || flag == "--tls-cert";
                  });
  if (!own_tls) {
    for (const std::string& flag : TlsFlagsFor(kCoordinatorId)) {
      argv.push_back(flag);
    }
  }
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
  const bool insecure = std::count(coordinator_flags_.begin(),
                                   coordinator_flags_.end(), "--insecure") > 0;
  stub_ = insecure ? v1::Coordinator::NewStub(grpc::CreateChannel(
                         address_, grpc::InsecureChannelCredentials()))
                   : CoordinatorStub(address_, &OperatorTls());
}

std::string ClusterTest::ClusterJson() const {
  auto list = [](int count) {
    std::vector<std::string> addresses(count, "\"127.0.0.1:1\"");
    return absl::StrCat("[", absl::StrJoin(addresses, ", "), "]");
  };
  return absl::StrCat(
      R"({"cluster": {"worker": )", list(workers_),
      spares_ > 0 ? absl::StrCat(R"(, "spare": )", list(spares_)) : "", "}}");
}

pid_t ClusterTest::StartWorker(int index, std::vector<std::string> env) {
  return StartTask("worker", index, std::move(env));
}

pid_t ClusterTest::StartSpare(int index) { return StartTask("spare", index); }

pid_t ClusterTest::StartTask(const std::string& type, int index,
                             std::vector<std::string> env) {
  std::string tf_config = absl::StrCat(
      R"({"cluster": )", ClusterJson().substr(12, ClusterJson().size() - 13),
      R"(, "task": {"type": ")", type, R"(", "index": )", index, "}}");
  const int nth = ++spawned_;  // sequenced: both names below use it
  std::vector<std::string> argv = {kBin + "/lockstep-worker",
                                   "--coordinator",
                                   address_,
                                   "--threads",
                                   "1",
                                   "--device",
                                   "cpu"};
  // A pool's workers register freely: no task, an identity of their own.
  for (const std::string& flag :
       TlsFlagsFor(pool_ ? absl::StrCat("spiffe://lockstep/worker/pool-", index)
                         : absl::StrCat("spiffe://lockstep/worker/", type, "/",
                                        index))) {
    argv.push_back(flag);
  }
  auto pid = processes_.Spawn(
      absl::StrCat(type, " ", index, " #", nth), argv,
      [&] {
        env.insert(env.end(), {pool_ ? "TF_CONFIG=" : "TF_CONFIG=" + tf_config,
                               "OMP_NUM_THREADS=1", "OPENBLAS_NUM_THREADS=1"});
        return env;
      }(),
      absl::StrCat(dir_, "/", type, "-", index, "-", nth, ".log"));
  EXPECT_TRUE(pid.ok()) << pid.status();
  return pid.value_or(-1);
}

std::string ClusterTest::Submit(const std::vector<std::string>& sets) {
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
v1::JobStatus ClusterTest::WatchUntil(
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

std::string ClusterTest::History(const std::string& job) {
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() +
                       std::chrono::seconds(10));
  v1::GetJobStatusRequest request;
  request.set_job_id(job);
  request.set_include_history(true);
  v1::GetJobStatusResponse response;
  grpc::Status status = stub_->GetJobStatus(&context, request, &response);
  if (!status.ok() || response.jobs_size() == 0) {
    return "(no history: " + status.error_message() + ")";
  }
  std::string history;
  for (const v1::JobEvent& event : response.jobs(0).events()) {
    absl::StrAppend(&history, "generation ", event.generation(), " ",
                    event.kind(), ": ", event.message(), "\n");
  }
  return history;
}

bool ClusterTest::Ended(const v1::JobStatus& s) {
  return IsTerminal(s.state());
}

// Submits `sets` and returns the job id once it trained `step` steps, or
// "" (with a test failure) if it ended before.
std::string ClusterTest::SubmitAndTrainTo(const std::vector<std::string>& sets,
                                          int64_t step) {
  std::string job = Submit(sets);
  v1::JobStatus running = WatchUntil(job, [step](const v1::JobStatus& s) {
    return s.step() >= step || Ended(s);
  });
  EXPECT_EQ(running.state(), v1::JOB_STATE_RUNNING) << running.error();
  return running.state() == v1::JOB_STATE_RUNNING ? job : "";
}

// The model digest of `sets` trained without interruption.
std::string ClusterTest::UninterruptedDigest(
    const std::vector<std::string>& sets) {
  v1::JobStatus done = WatchUntil(Submit(sets), Ended);
  EXPECT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << done.error();
  EXPECT_EQ(done.generations(), 1);
  return done.ranks_size() ? done.ranks(0).model_digest() : "";
}

void ClusterTest::ExpectAllRanks(const v1::JobStatus& status,
                                 const std::string& digest) {
  ASSERT_GT(status.ranks_size(), 0);
  for (const v1::RankResult& rank : status.ranks()) {
    EXPECT_EQ(rank.model_digest(), digest) << "rank " << rank.rank();
  }
}

// The last event of `kind`, or null.
const v1::JobEvent* ClusterTest::FindEvent(const v1::JobStatus& status,
                                           const std::string& kind) {
  for (int i = status.events_size() - 1; i >= 0; --i) {
    if (status.events(i).kind() == kind) return &status.events(i);
  }
  return nullptr;
}

bool ClusterTest::Alive(pid_t pid) { return kill(pid, 0) == 0; }

void ClusterTest::TearDown() { processes_.TerminateAll(absl::Seconds(5)); }

// ---- CheckpointTest -------------------------------------------------------

const std::vector<std::string> kCheckpointJob = {
    "max_steps=60", "global_batch_size=64", "log_every_steps=1"};

// log_every_steps beyond the run: the chief reports progress only at a
// generation's first step.
const std::vector<std::string> kQuietJob = {
    "max_steps=200", "global_batch_size=64", "log_every_steps=1000"};

std::string CheckpointTest::KillRankOnePastACheckpoint(int64_t* saved_step) {
  std::string job = Submit(WithCheckpoints(kQuietJob, 40));
  v1::JobStatus saved = WatchUntil(job, [](const v1::JobStatus& s) {
    return HasCheckpointAtLeast(s, 40) || Ended(s);
  });
  EXPECT_EQ(saved.state(), v1::JOB_STATE_RUNNING) << saved.error();
  if (saved.state() != v1::JOB_STATE_RUNNING) return "";
  *saved_step = saved.checkpoints(saved.checkpoints_size() - 1).step();
  EXPECT_EQ(kill(worker_pids_[1], SIGKILL), 0);
  waitpid(worker_pids_[1], nullptr, 0);
  // Rank 0's result (aborted) says where it stopped.
  v1::JobStatus recovering =
      WatchUntil(job, [saved = *saved_step](const v1::JobStatus& s) {
        return Ended(s) || (s.state() == v1::JOB_STATE_RECOVERING &&
                            s.applied_step() > saved);
      });
  EXPECT_EQ(recovering.state(), v1::JOB_STATE_RECOVERING);
  return recovering.state() == v1::JOB_STATE_RECOVERING ? job : "";
}

void CheckpointTest::SetUp() { backup_ = TempDir("backup") + "/ckpt"; }

// The job's settings with checkpoints every `every` steps, kept after
// success so the test can inspect them.
std::vector<std::string> CheckpointTest::WithCheckpoints(
    std::vector<std::string> sets, int every) {
  sets.push_back("checkpoint.backup_dir=" + backup_);
  sets.push_back(absl::StrCat("checkpoint.save_every_steps=", every));
  sets.push_back("checkpoint.keep_backups=true");
  return sets;
}

// LATEST names a checkpoint that `lockstep checkpoints` verifies.
void CheckpointTest::ExpectLatestVerifies(const std::string& job) {
  auto latest = ReadFileToString(backup_ + "/LATEST");
  ASSERT_TRUE(latest.ok()) << latest.status();
  std::string name(absl::StripAsciiWhitespace(*latest));
  auto listed = ListCheckpoints(address_, job);
  ASSERT_TRUE(listed.count(name)) << name;
  EXPECT_TRUE(listed[name].fields().at("verified").bool_value())
      << listed[name].fields().at("check").string_value();
}

bool CheckpointTest::HasCheckpointAtLeast(const v1::JobStatus& s,
                                          int64_t step) {
  return s.checkpoints_size() > 0 &&
         s.checkpoints(s.checkpoints_size() - 1).step() >= step;
}

std::string CheckpointTest::TrainThenKillEveryWorker() {
  return TrainThenKillEveryWorker(kCheckpointJob);
}

std::string CheckpointTest::TrainThenKillEveryWorker(
    const std::vector<std::string>& sets, int every) {
  std::string job = Submit(WithCheckpoints(sets, every));
  WatchUntil(job, [every](const v1::JobStatus& s) {
    return HasCheckpointAtLeast(s, 2 * every) || Ended(s);
  });
  for (pid_t pid : worker_pids_) EXPECT_EQ(kill(pid, SIGKILL), 0);
  for (pid_t pid : worker_pids_) waitpid(pid, nullptr, 0);
  return job;
}

}  // namespace lockstep::integration
