// Bad input is a clear error naming what is wrong: corrupt state, a
// malformed TF_CONFIG or job spec, wrong flags, missing or truncated data,
// an unknown task, and ranks that built different initial parameters.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/files.h"
#include "tests/integration/harness.h"

namespace lockstep::integration {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// docs/DESIGN.md §4: initial parameters are checked bit for bit across ranks; a
// rank that built different ones fails the job with a message, instead of
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
      RunCommand(WithTls({kBin + "/lockstep-worker", "--coordinator", address_,
                          "--task-type", "worker", "--task-index", "5"},
                         "spiffe://lockstep/worker/worker/5"));
  EXPECT_EQ(unknown.code, 2);
  EXPECT_THAT(unknown.err,
              AllOf(HasSubstr("worker:5"), HasSubstr("not a training task")));
  // A worker whose own TF_CONFIG describes another cluster.
  Result conflict = RunCommand(
      WithTls({kBin + "/lockstep-worker", "--coordinator", address_},
              "spiffe://lockstep/worker/worker/1"),
      {R"(TF_CONFIG={"cluster": {"worker": ["10.0.0.1:1", "10.0.0.2:1"]}, "task": {"type": "worker", "index": 1}})"});
  EXPECT_EQ(conflict.code, 2);
  EXPECT_THAT(conflict.err,
              AllOf(HasSubstr("worker:[10.0.0.1:1,10.0.0.2:1]"),
                    HasSubstr("worker:[127.0.0.1:1,127.0.0.1:1]")));
}

// Issue 14: 4 x 2^30 accumulation steps overflowed `int` to 0 and the CLI,
// then the coordinator, died of SIGFPE on `% 0`. Both refuse the spec now,
// naming the field and its bound, and the coordinator keeps serving.
TEST_F(ClusterTest, OverflowingBatchSpecIsRefusedAndTheCoordinatorServes) {
  StartCluster(2);
  Result cli = RunCommand(
      {kBin + "/lockstep", "submit", kMlp, "--set", "num_workers=4", "--set",
       "accumulation_steps=1073741824", "--set", "global_batch_size=64"},
      {"LOCKSTEP_COORDINATOR=" + address_});
  EXPECT_EQ(cli.code, 2);
  EXPECT_THAT(cli.err, AllOf(HasSubstr("accumulation_steps is 1073741824"),
                             HasSubstr("at most 65536")));
  // A client that skips the CLI's check reaches the coordinator's.
  v1::SubmitJobRequest request;
  request.mutable_spec()->set_num_workers(2);
  request.mutable_spec()->set_accumulation_steps(1073741824);
  request.mutable_spec()->set_global_batch_size(64);
  grpc::ClientContext context;
  v1::SubmitJobResponse response;
  grpc::Status refused = stub_->SubmitJob(&context, request, &response);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(refused.error_message(),
              HasSubstr("accumulation_steps is 1073741824; at most 65536"));
  v1::JobStatus done = WatchUntil(Submit({"max_steps=5"}), Ended);
  EXPECT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << done.error();
}

// Issue 14: 100 key-value writes of 4 MB took a coordinator from 18 MB to
// 437 MB (its Kubernetes limit is 512 Mi). Past --kv-max-bytes a write is
// refused with RESOURCE_EXHAUSTED naming the flag, the coordinator keeps
// serving (the job trains on, the CLI works), and a finished job can be
// deleted from the CLI while a running one cannot.
TEST_F(ClusterTest, HugeKeyValueWritesAreRefusedPastTheCapAndJobsCanBeDeleted) {
  StartCluster(2, {"--kv-max-bytes", "67108864"});  // 64 MiB: 16 writes
  // The ranks' own rendezvous is over once the job trains.
  std::string job = SubmitAndTrainTo({"max_steps=1000000", "epochs=50"}, 2);
  ASSERT_FALSE(job.empty());
  // Only a rank of the generation may use its store, and only with the
  // token of its assignment: rank 0's certificate alone (a stolen one, or
  // one its workers share) writes nothing. The cap itself, with the token,
  // is rogue_worker_test's KeyValueWritesPastTheCapAreRefused.
  const TlsOptions rank0 =
      IssueTestCertificate("spiffe://lockstep/worker/worker/0");
  std::unique_ptr<v1::Coordinator::Stub> as_rank0 =
      CoordinatorStub(address_, &rank0);
  for (int i = 0; i < 3; ++i) {
    v1::KvSetRequest request;
    request.set_job_id(job);
    request.set_generation(1);
    request.set_key(absl::StrCat("bulk-", i));
    request.set_value(std::string(4000000, 'x'));
    grpc::ClientContext context;
    v1::KvSetResponse response;
    grpc::Status status = as_rank0->KvSet(&context, request, &response);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
    EXPECT_THAT(status.error_message(),
                HasSubstr("without that rank's token"));
  }

  const std::vector<std::string> env = {"LOCKSTEP_COORDINATOR=" + address_};
  Result running = RunCommand({kBin + "/lockstep", "delete", job}, env);
  EXPECT_EQ(running.code, 1);
  EXPECT_THAT(running.err, AllOf(HasSubstr("stop it first"),
                                 HasSubstr("lockstep stop " + job)));
  // Still serving: the job trains on and stops on request.
  const int64_t step = WatchUntil(job, [](const v1::JobStatus& s) {
                         return s.step() >= 4 || Ended(s);
                       }).step();
  EXPECT_GE(step, 4);
  ASSERT_EQ(RunCommand({kBin + "/lockstep", "stop", job}, env).code, 0);
  EXPECT_EQ(WatchUntil(job, Ended).state(), v1::JOB_STATE_STOPPED);
  Result deleted = RunCommand({kBin + "/lockstep", "delete", job}, env);
  EXPECT_EQ(deleted.code, 0) << deleted.err;
  EXPECT_EQ(deleted.out, "deleted " + job + "\n");
  Result gone = RunCommand({kBin + "/lockstep", "status", job}, env);
  EXPECT_EQ(gone.code, 2);
  EXPECT_THAT(gone.err, HasSubstr("no job " + job));
  Result list = RunCommand({kBin + "/lockstep", "status"}, env);
  EXPECT_EQ(list.code, 0) << list.err;
  EXPECT_EQ(list.out, "no jobs\n");
}

TEST(BadInputTest, CorruptStateDirIsAClearError) {
  std::string dir = TempDir("corrupt");
  ASSERT_TRUE(
      WriteFileAtomically(dir + "/coordinator.db", std::string(4096, 'x'))
          .ok());
  Result r = RunCommand(WithTls({kBin + "/lockstep-coordinator", "--listen",
                                 "127.0.0.1:0", "--state-dir", dir},
                                kCoordinatorId));
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err,
              AllOf(HasSubstr(dir + "/coordinator.db"), HasSubstr("corrupt")));
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
  const std::vector<std::string> worker =
      WithTls({kBin + "/lockstep-worker", "--coordinator", "127.0.0.1:1"},
              "spiffe://lockstep/worker/worker/3");
  Result r = RunCommand(
      worker,
      {R"(TF_CONFIG={"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 3}})"});
  EXPECT_EQ(r.code, 2);
  EXPECT_THAT(r.err, AllOf(HasSubstr("TF_CONFIG"), HasSubstr("out of range")));
  Result broken = RunCommand(worker, {"TF_CONFIG={\"cluster\": "});
  EXPECT_EQ(broken.code, 2);
  EXPECT_THAT(broken.err, HasSubstr("not valid JSON"));
  Result coordinator = RunCommand(
      WithTls({kBin + "/lockstep-coordinator", "--listen", "127.0.0.1:0",
               "--state-dir", TempDir("state"), "--cluster",
               R"({"cluster": {"chief": ["a:1", "b:1"]}})"},
              kCoordinatorId));
  EXPECT_EQ(coordinator.code, 2);
  EXPECT_THAT(coordinator.err, HasSubstr("at most one chief"));
}

// Issue 15: a daemon runs with mutual TLS or, said explicitly and loudly,
// without; anything in between is a usage error naming the flag.
TEST(BadInputTest, DaemonsNeedTlsFilesOrAnExplicitInsecure) {
  const std::string state = TempDir("tls_state");
  for (const std::string& daemon :
       {kBin + "/lockstep-coordinator", kBin + "/lockstep-worker"}) {
    const std::vector<std::string> base =
        daemon == kBin + "/lockstep-worker"
            ? std::vector<std::string>{daemon, "--coordinator", "127.0.0.1:1"}
            : std::vector<std::string>{daemon, "--listen", "127.0.0.1:0",
                                       "--state-dir", state};
    Result neither = RunCommand(base);
    EXPECT_EQ(neither.code, 2) << daemon;
    EXPECT_THAT(neither.err,
                AllOf(HasSubstr("--tls-cert"), HasSubstr("--insecure")));
    std::vector<std::string> partial = base;
    partial.insert(partial.end(), {"--tls-cert", OperatorTls().cert_file,
                                   "--tls-ca", OperatorTls().ca_file});
    Result missing = RunCommand(partial);
    EXPECT_EQ(missing.code, 2) << daemon;
    EXPECT_THAT(missing.err, HasSubstr("missing: --tls-key"));
    std::vector<std::string> unreadable = base;
    unreadable.insert(unreadable.end(),
                      {"--tls-cert", OperatorTls().cert_file, "--tls-key",
                       state + "/nope.key", "--tls-ca", OperatorTls().ca_file});
    Result named = RunCommand(unreadable);
    EXPECT_EQ(named.code, 2) << daemon;
    EXPECT_THAT(named.err,
                AllOf(HasSubstr("--tls-key"), HasSubstr(state + "/nope.key")));
  }
  // The CLI too, from its flags or LOCKSTEP_TLS_*.
  Result cli = RunCommand(
      {kBin + "/lockstep", "status", "--coordinator", "127.0.0.1:1"},
      {"LOCKSTEP_TLS_CERT=", "LOCKSTEP_TLS_KEY=", "LOCKSTEP_TLS_CA="});
  EXPECT_EQ(cli.code, 2);
  EXPECT_THAT(cli.err, AllOf(HasSubstr("TLS is required"),
                             HasSubstr("LOCKSTEP_TLS_CERT")));
}

TEST_F(ClusterTest, AnInsecureCoordinatorSaysSoLoudly) {
  StartCluster(1, {"--insecure"});
  EXPECT_EQ(coordinator_pid_ > 0 && Alive(coordinator_pid_), true);
  const std::string log =
      ReadFileToString(dir_ + "/coordinator.log").value_or("");
  EXPECT_THAT(log, AllOf(HasSubstr("WARNING"), HasSubstr("--insecure"),
                         HasSubstr("open to anyone")));
  Result status = RunCommand(
      {kBin + "/lockstep", "status", "--coordinator", address_, "--insecure"});
  EXPECT_EQ(status.code, 0) << status.err;
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

// Issue 35: Gloo's TCP pairs, which a stranger's bytes can crash, were a
// per-worker runtime flag. They are for comparison benchmarks only: a worker
// (or lockstep local) refuses them without --insecure.
TEST(BadInputTest, GlooPairsNeedInsecure) {
  for (const std::vector<std::string>& argv : {
           WithTls({kBin + "/lockstep-worker", "--coordinator", "127.0.0.1:1",
                    "--data-plane-transport", "gloo", "--data-plane-encryption",
                    "off"},
                   "spiffe://lockstep/worker/worker/0"),
           std::vector<std::string>{kBin + "/lockstep", "local", "--workers",
                                    "2", "--data-plane-transport", "gloo",
                                    "--data-plane-encryption", "off", kMlp},
       }) {
    Result r = RunCommand(argv);
    EXPECT_EQ(r.code, 2) << argv[0] << " " << r.err;
    EXPECT_THAT(r.err, HasSubstr("comparison benchmarks only: it needs "
                                 "--insecure"))
        << argv[0];
  }
}

// --metrics-tls serves with the daemon's own certificate: without mutual
// TLS, or without --metrics-listen, both daemons refuse to start.
TEST(BadInputTest, MetricsTlsWithoutTlsOrAListenAddressIsAUsageError) {
  const std::string state = TempDir("metrics-tls");
  for (const std::vector<std::string>& argv : {
           std::vector<std::string>{kBin + "/lockstep-coordinator", "--listen",
                                    "127.0.0.1:0", "--state-dir", state,
                                    "--insecure", "--metrics-listen",
                                    "127.0.0.1:0", "--metrics-tls"},
           WithTls({kBin + "/lockstep-coordinator", "--listen", "127.0.0.1:0",
                    "--state-dir", state, "--metrics-tls"},
                   "spiffe://lockstep/coordinator"),
           std::vector<std::string>{kBin + "/lockstep-worker", "--coordinator",
                                    "127.0.0.1:1", "--insecure",
                                    "--metrics-listen", "127.0.0.1:0",
                                    "--metrics-tls"},
       }) {
    Result r = RunCommand(argv);
    EXPECT_EQ(r.code, 2) << argv[0] << " " << r.err;
    EXPECT_THAT(r.err, HasSubstr("--metrics-tls needs --metrics-listen and "
                                 "mutual TLS"))
        << argv[0];
  }
}

TEST(BadInputTest, MissingDataFailsTheJobWithTheFileName) {
  Result r = RunCommand({kBin + "/lockstep", "local", "--workers", "2", "--set",
                         "data.dir=/nonexistent/fmnist", kMlp});
  EXPECT_EQ(r.code, 1);
  EXPECT_THAT(r.err,
              AllOf(HasSubstr("/nonexistent/fmnist"), HasSubstr("rank")));
}

// Issue 14: `checkpoint.backup_dir: /etc` was accepted, and after success
// the chief deleted ckpt-*, .tmp and LATEST in /etc. A worker now refuses a
// path outside its --backup-root: the job fails at once, naming the field,
// the path, the roots and the flag, and the daemons keep serving.
TEST_F(ClusterTest, BackupDirOutsideTheWorkersRootsFailsTheJob) {
  StartCluster(2);
  v1::JobStatus done =
      WatchUntil(Submit({"max_steps=20", "checkpoint.backup_dir=/etc",
                         "checkpoint.save_every_steps=10"}),
                 Ended);
  EXPECT_EQ(done.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(done.error(), AllOf(HasSubstr("checkpoint.backup_dir \"/etc\""),
                                  HasSubstr("/var/lib/lockstep"),
                                  HasSubstr("--backup-root")));
  EXPECT_EQ(done.generations(), 1);  // not retried: retrying cannot fix it
  EXPECT_EQ(WatchUntil(Submit({"max_steps=5"}), Ended).state(),
            v1::JOB_STATE_SUCCEEDED);
}

// Issue 14: `export` naming an existing file replaced it with the model. A
// file that is not a lockstep export is refused before training and left as
// it was; the daemons keep serving.
TEST_F(ClusterTest, ExportOverAForeignFileIsRefusedAndTheFileIsUntouched) {
  StartCluster(2);
  const std::string foreign = TempDir("export") + "/passwd";
  ASSERT_TRUE(WriteFileAtomically(foreign, "root:x:0:0::/root:/bin/sh\n").ok());
  v1::JobStatus done =
      WatchUntil(Submit({"max_steps=5", "export=" + foreign}), Ended);
  EXPECT_EQ(done.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(done.error(),
              AllOf(HasSubstr(foreign), HasSubstr("not a lockstep export")));
  EXPECT_EQ(*ReadFileToString(foreign), "root:x:0:0::/root:/bin/sh\n");
  // A new path is exported, and the same job exported again replaces it.
  const std::string fresh = TempDir("export") + "/model.pt";
  for (int run = 0; run < 2; ++run) {
    EXPECT_EQ(
        WatchUntil(Submit({"max_steps=5", "export=" + fresh}), Ended).state(),
        v1::JOB_STATE_SUCCEEDED);
  }
  EXPECT_TRUE(PathExists(fresh));
}

// Issue 14: with the newest checkpoint's model.pt a link to /dev/zero the
// chief hashed forever and `lockstep checkpoints` hung. Links are not
// followed: the listing returns and marks that checkpoint corrupt.
TEST_F(CheckpointTest, CheckpointsListsAModelLinkedToDevZeroAsCorrupt) {
  StartCluster(2);
  const std::string job = Submit(WithCheckpoints(kQuietJob, 100));
  ASSERT_EQ(WatchUntil(job, Ended).state(), v1::JOB_STATE_SUCCEEDED);
  auto latest = ReadFileToString(backup_ + "/LATEST");
  ASSERT_TRUE(latest.ok()) << latest.status();
  const std::string newest(absl::StripAsciiWhitespace(*latest));
  const std::string model = backup_ + "/" + newest + "/model.pt";
  ASSERT_EQ(unlink(model.c_str()), 0);
  ASSERT_EQ(symlink("/dev/zero", model.c_str()), 0);

  auto listed = ListCheckpoints(address_, job);
  ASSERT_TRUE(listed.count(newest)) << newest;
  EXPECT_FALSE(listed[newest].fields().at("verified").bool_value());
  EXPECT_THAT(listed[newest].fields().at("check").string_value(),
              AllOf(HasSubstr("model.pt"), HasSubstr("symbolic link")));
  for (const auto& [name, row] : listed) {  // any older one is intact
    if (name != newest) EXPECT_TRUE(row.fields().at("verified").bool_value());
  }
}

}  // namespace
}  // namespace lockstep::integration
