// Issue 15's four attacks, against real daemons with mutual TLS on: a
// stranger who reaches the coordinator's port (no certificate, one from
// another CA, or one of the cluster's CA for an identity that may not do
// what it tries) cannot take a rank and forge a result, pose as a live
// worker, read the ranks' Gloo addresses, or submit and stop jobs. Each
// attack is refused with the agreed code (no certificate: UNAUTHENTICATED;
// another CA: UNAVAILABLE, the handshake fails; a known identity that may
// not: PERMISSION_DENIED), and the job's state, its result and the real
// workers are untouched.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/files.h"
#include "common/job_spec.h"
#include "common/tls.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "tests/integration/harness.h"

namespace lockstep::integration {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// The MLP long enough that the attacks land while it trains.
const std::vector<std::string> kJob = {"max_steps=200", "global_batch_size=64",
                                       "log_every_steps=1"};

// Someone who calls the coordinator, and how the coordinator must answer
// a call it may not make.
struct Attacker {
  std::string who;  // for failure messages
  // PEM files; cert and key empty: no client certificate.
  std::string cert_file, key_file, ca_file;
  grpc::StatusCode refused_with;
  // Text the refusal must contain (the identity), or "" (a failed
  // handshake says nothing of it).
  std::string named;
};

class SecurityTest : public ClusterTest {
 protected:
  // A certificate of the cluster's CA for `spiffe_id`.
  static Attacker Known(const std::string& spiffe_id,
                        grpc::StatusCode refused_with) {
    const TlsOptions files = IssueTestCertificate(spiffe_id);
    return {spiffe_id,     files.cert_file, files.key_file,
            files.ca_file, refused_with,    spiffe_id};
  }

  // No client certificate; the coordinator's is verified as usual.
  static Attacker Anonymous() {
    return {"no certificate",
            "",
            "",
            OperatorTls().ca_file,
            grpc::StatusCode::UNAUTHENTICATED,
            "no client certificate"};
  }

  // worker:1's identity from a CA the cluster does not trust; the client
  // still trusts the coordinator's, so it is the server that refuses.
  static Attacker Foreign() {
    const TlsOptions files = IssueTestCertificate(
        "spiffe://lockstep/worker/worker/1", /*foreign_ca=*/true);
    return {"worker:1 of another CA",
            files.cert_file,
            files.key_file,
            OperatorTls().ca_file,
            grpc::StatusCode::UNAVAILABLE,
            ""};
  }

  // Strangers every attack is tried with: no certificate, another CA's, a
  // worker identity the cluster has no task for, and a viewer.
  static std::vector<Attacker> Strangers() {
    return {Anonymous(), Foreign(),
            Known("spiffe://lockstep/worker/worker/5",
                  grpc::StatusCode::PERMISSION_DENIED),
            Known("spiffe://lockstep/viewer/grafana",
                  grpc::StatusCode::PERMISSION_DENIED)};
  }

  std::unique_ptr<v1::Coordinator::Stub> StubOf(const Attacker& attacker) {
    grpc::SslCredentialsOptions options;
    options.pem_root_certs = ReadFileToString(attacker.ca_file).value_or("");
    if (!attacker.cert_file.empty()) {
      options.pem_cert_chain =
          ReadFileToString(attacker.cert_file).value_or("");
      options.pem_private_key =
          ReadFileToString(attacker.key_file).value_or("");
    }
    return v1::Coordinator::NewStub(
        grpc::CreateChannel(address_, grpc::SslCredentials(options)));
  }

  static void ExpectRefused(const grpc::Status& status,
                            const Attacker& attacker, const std::string& what) {
    EXPECT_EQ(status.error_code(), attacker.refused_with)
        << attacker.who << " " << what << ": " << status.error_message();
    if (!attacker.named.empty()) {
      EXPECT_THAT(status.error_message(), HasSubstr(attacker.named))
          << attacker.who << " " << what;
    }
  }

  static std::unique_ptr<grpc::ClientContext> Context() {
    auto context = std::make_unique<grpc::ClientContext>();
    context->set_deadline(std::chrono::system_clock::now() +
                          std::chrono::seconds(20));
    return context;
  }

  // Registers as task worker:1 with a new incarnation.
  static grpc::Status RegisterAsWorkerOne(v1::Coordinator::Stub* stub,
                                          uint64_t incarnation) {
    v1::RegisterWorkerRequest request;
    request.mutable_task()->set_type("worker");
    request.mutable_task()->set_index(1);
    request.set_incarnation(incarnation);
    request.set_host("127.0.0.1");
    v1::RegisterWorkerResponse response;
    return stub->RegisterWorker(Context().get(), request, &response);
  }

  // Opens a session as worker:1 and reports that rank 0 finished the job
  // at step 999,999 with a forged digest; returns how the stream ended.
  grpc::Status ForgeSuccess(v1::Coordinator::Stub* stub,
                            const std::string& job) {
    auto context = Context();
    auto stream = stub->WorkerSession(context.get());
    v1::WorkerMessage hello;
    hello.mutable_hello()->set_worker_id("worker:1");
    hello.mutable_hello()->set_incarnation(0x5eed);
    v1::WorkerMessage progress;
    v1::ProgressReport* p = progress.mutable_progress();
    p->set_job_id(job);
    p->set_generation(1);
    p->set_step(999999);
    p->set_total_steps(999999);
    v1::WorkerMessage result;
    v1::TaskResult* r = result.mutable_result();
    r->set_job_id(job);
    r->set_generation(1);
    r->set_rank(0);
    r->set_ok(true);
    r->set_steps(999999);
    r->set_model_digest("forged");
    for (const v1::WorkerMessage* m : {&hello, &progress, &result}) {
      if (!stream->Write(*m)) break;
    }
    stream->WritesDone();
    v1::CoordinatorCommand command;
    while (stream->Read(&command)) {
      ADD_FAILURE() << "the coordinator sent a stranger a command: "
                    << command.DebugString();
    }
    return stream->Finish();
  }

  v1::JobSpec Spec() {
    auto spec = LoadJobSpec(kMlp);
    EXPECT_TRUE(spec.ok()) << spec.status();
    v1::JobSpec out = spec.value_or(v1::JobSpec());
    for (const std::string& set : kJob) {
      EXPECT_TRUE(ApplyOverride(set, &out).ok()) << set;
    }
    return out;
  }

  // The workers are the processes the test started, alive, and the job
  // never had to restart them.
  void ExpectWorkersUntouched(const v1::JobStatus& done) {
    for (pid_t pid : worker_pids_) EXPECT_TRUE(Alive(pid)) << pid;
    EXPECT_EQ(done.generations(), 1) << History(done.job_id());
    EXPECT_EQ(FindEvent(done, "worker_failed"), nullptr)
        << History(done.job_id());
  }
};

// Attack 1: a stranger took a rank, then reported the job succeeded at step
// 999,999 with a forged digest, without training.
TEST_F(SecurityTest, AStrangerCannotTakeARankOrReportAForgedSuccess) {
  StartCluster(2);
  const std::string digest = UninterruptedDigest(kJob);
  ASSERT_FALSE(digest.empty());
  const std::string job = SubmitAndTrainTo(kJob, 2);
  ASSERT_FALSE(job.empty());
  uint64_t incarnation = 0xbad0;
  for (const Attacker& stranger : Strangers()) {
    auto stub = StubOf(stranger);
    ExpectRefused(RegisterAsWorkerOne(stub.get(), ++incarnation), stranger,
                  "registering as worker:1");
    ExpectRefused(ForgeSuccess(stub.get(), job), stranger,
                  "reporting a forged success");
  }
  v1::JobStatus done = WatchUntil(job, Ended);
  EXPECT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << done.error();
  EXPECT_EQ(done.step(), 200);
  EXPECT_EQ(done.ranks_size(), 2);
  ExpectAllRanks(done, digest);
  ExpectWorkersUntouched(done);
}

// Attack 2: a stranger registered as worker:1 four times during a run: four
// restarts, then the job failed while the real worker was alive.
TEST_F(SecurityTest, AStrangerRegisteringAsWorkerOneRestartsNothing) {
  StartCluster(2);
  const std::string job = SubmitAndTrainTo(kJob, 2);
  ASSERT_FALSE(job.empty());
  const Attacker other = Known("spiffe://lockstep/worker/worker/0",
                               grpc::StatusCode::PERMISSION_DENIED);
  const Attacker none = Anonymous();
  for (uint64_t attempt = 1; attempt <= 4; ++attempt) {
    ExpectRefused(RegisterAsWorkerOne(StubOf(other).get(), attempt), other,
                  "registering as worker:1");
    ExpectRefused(RegisterAsWorkerOne(StubOf(none).get(), 100 + attempt), none,
                  "registering as worker:1");
  }
  // Even worker:1's own (stolen) certificate cannot take over the live
  // session of the real worker:1.
  const Attacker stolen = Known("spiffe://lockstep/worker/worker/1",
                                grpc::StatusCode::PERMISSION_DENIED);
  grpc::Status takeover = RegisterAsWorkerOne(StubOf(stolen).get(), 0xf00d);
  EXPECT_FALSE(takeover.ok()) << "a second worker:1 took the live session";
  EXPECT_THAT(takeover.error_message(), HasSubstr("worker:1"));

  v1::JobStatus done = WatchUntil(job, Ended);
  EXPECT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << done.error();
  EXPECT_EQ(done.step(), 200);
  ExpectWorkersUntouched(done);
}

// A worker process whose certificate names another task is refused for
// good: it exits 2 (a configuration error, which Kubernetes should not
// restart forever) and says which identity claimed which task.
TEST_F(SecurityTest, AWorkerWhoseCertificateNamesAnotherTaskExitsTwo) {
  StartCluster(2);
  std::vector<std::string> argv = {kBin + "/lockstep-worker",
                                   "--coordinator",
                                   address_,
                                   "--task-type",
                                   "worker",
                                   "--task-index",
                                   "1",
                                   "--device",
                                   "cpu",
                                   "--connect-timeout",
                                   "20"};
  for (const std::string& flag :
       TlsFlagsFor("spiffe://lockstep/worker/worker/0")) {
    argv.push_back(flag);
  }
  Result worker = RunCommand(argv);
  EXPECT_EQ(worker.code, 2) << worker.err;
  EXPECT_THAT(worker.err, HasSubstr("worker/worker/0"));
  EXPECT_THAT(worker.err, HasSubstr("worker:1"));
  // The real worker:1 kept its session: a job trains in one generation.
  const std::string job = Submit({"max_steps=20", "global_batch_size=64"});
  v1::JobStatus done = WatchUntil(job, Ended);
  EXPECT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << done.error();
  ExpectWorkersUntouched(done);
}

// Attack 3: a stranger read the key-value store during a run and got every
// rank's Gloo address (published under the rank's number); writing there
// would point a rank's peers at the stranger.
TEST_F(SecurityTest, AStrangerCannotReadOrWriteTheRanksAddresses) {
  StartCluster(2);
  const std::string job = SubmitAndTrainTo(kJob, 2);
  ASSERT_FALSE(job.empty());
  std::vector<Attacker> strangers = Strangers();
  // A worker of the cluster's CA that is not a rank of this generation.
  strangers.push_back(Known("spiffe://lockstep/worker/pool-7",
                            grpc::StatusCode::PERMISSION_DENIED));
  for (const Attacker& stranger : strangers) {
    auto stub = StubOf(stranger);
    v1::KvGetRequest get;
    get.set_job_id(job);
    get.set_generation(1);
    get.set_key("0");
    get.set_timeout_ms(0);
    v1::KvGetResponse value;
    grpc::Status read = stub->KvGet(Context().get(), get, &value);
    ExpectRefused(read, stranger, "reading rank 0's Gloo address");
    EXPECT_TRUE(value.value().empty()) << stranger.who;
    v1::KvSetRequest set;
    set.set_job_id(job);
    set.set_generation(1);
    set.set_key("1");
    set.set_value("the stranger's address");
    v1::KvSetResponse set_response;
    ExpectRefused(stub->KvSet(Context().get(), set, &set_response), stranger,
                  "writing rank 1's Gloo address");
  }
  v1::JobStatus done = WatchUntil(job, Ended);
  EXPECT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << done.error();
  ExpectWorkersUntouched(done);
}

// Attack 4: anyone could submit or stop any job. Only an operator can.
TEST_F(SecurityTest, OnlyAnOperatorCanSubmitOrStopAJob) {
  StartCluster(2);
  std::vector<Attacker> strangers = Strangers();
  // A worker of this very cluster is no operator either.
  strangers.push_back(Known("spiffe://lockstep/worker/worker/0",
                            grpc::StatusCode::PERMISSION_DENIED));
  v1::SubmitJobRequest submit;
  *submit.mutable_spec() = Spec();
  for (const Attacker& stranger : strangers) {
    v1::SubmitJobResponse response;
    ExpectRefused(
        StubOf(stranger)->SubmitJob(Context().get(), submit, &response),
        stranger, "submitting a job");
    EXPECT_TRUE(response.job_id().empty()) << stranger.who;
  }
  // Nothing was queued: the operator's list is empty.
  const Attacker alice =
      Known("spiffe://lockstep/operator/alice", grpc::StatusCode::OK);
  v1::GetJobStatusResponse listed;
  ASSERT_TRUE(
      StubOf(alice)
          ->GetJobStatus(Context().get(), v1::GetJobStatusRequest(), &listed)
          .ok());
  EXPECT_EQ(listed.jobs_size(), 0);

  // The CLI says who was refused, with a viewer's certificate.
  const Attacker viewer = Known("spiffe://lockstep/viewer/grafana",
                                grpc::StatusCode::PERMISSION_DENIED);
  Result cli = RunCommand({kBin + "/lockstep", "submit", kMlp},
                          {"LOCKSTEP_COORDINATOR=" + address_,
                           "LOCKSTEP_TLS_CERT=" + viewer.cert_file,
                           "LOCKSTEP_TLS_KEY=" + viewer.key_file,
                           "LOCKSTEP_TLS_CA=" + viewer.ca_file});
  EXPECT_NE(cli.code, 0);
  EXPECT_THAT(cli.err, HasSubstr("viewer"));

  // An operator submits; nobody else can stop the job; the operator can.
  v1::SubmitJobResponse submitted;
  grpc::Status accepted =
      StubOf(alice)->SubmitJob(Context().get(), submit, &submitted);
  ASSERT_TRUE(accepted.ok()) << accepted.error_message();
  const std::string job = submitted.job_id();
  ASSERT_EQ(
      WatchUntil(
          job, [](const v1::JobStatus& s) { return s.step() >= 2 || Ended(s); })
          .state(),
      v1::JOB_STATE_RUNNING);
  v1::StopJobRequest stop;
  stop.set_job_id(job);
  for (const Attacker& stranger : strangers) {
    v1::StopJobResponse response;
    ExpectRefused(StubOf(stranger)->StopJob(Context().get(), stop, &response),
                  stranger, "stopping the job");
  }
  v1::StopJobResponse stopped;
  grpc::Status by_operator =
      StubOf(alice)->StopJob(Context().get(), stop, &stopped);
  EXPECT_TRUE(by_operator.ok()) << by_operator.error_message();
  v1::JobStatus done = WatchUntil(job, Ended);
  EXPECT_EQ(done.state(), v1::JOB_STATE_STOPPED) << done.error();
  ExpectWorkersUntouched(done);
}

// Issue 27 #10: any operator could overwrite another operator's export.
// The marker records who submitted the job that exported; only a job of the
// same submitter replaces it.
TEST_F(SecurityTest, AnotherOperatorsJobDoesNotReplaceAnExport) {
  StartCluster(2);
  const std::string path = TempDir("export") + "/model.pt";
  auto train_as = [&](const Attacker& who) {
    v1::SubmitJobRequest submit;
    *submit.mutable_spec() = Spec();
    submit.mutable_spec()->set_max_steps(5);
    submit.mutable_spec()->set_export_path(path);
    v1::SubmitJobResponse submitted;
    grpc::Status accepted =
        StubOf(who)->SubmitJob(Context().get(), submit, &submitted);
    EXPECT_TRUE(accepted.ok()) << who.who << ": " << accepted.error_message();
    return WatchUntil(submitted.job_id(), Ended);
  };
  const Attacker alice =
      Known("spiffe://lockstep/operator/alice", grpc::StatusCode::OK);
  const Attacker bob =
      Known("spiffe://lockstep/operator/bob", grpc::StatusCode::OK);
  ASSERT_EQ(train_as(alice).state(), v1::JOB_STATE_SUCCEEDED);
  const std::string alices = *ReadFileToString(path);
  v1::JobStatus refused = train_as(bob);
  EXPECT_EQ(refused.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(refused.error(),
              AllOf(HasSubstr(path),
                    HasSubstr("submitted by spiffe://lockstep/operator/alice"),
                    HasSubstr("spiffe://lockstep/operator/bob")));
  EXPECT_EQ(*ReadFileToString(path), alices);
  // Alice's next run replaces her own export.
  EXPECT_EQ(train_as(alice).state(), v1::JOB_STATE_SUCCEEDED);
}

// Issue 27 #10: certificates could not be revoked. An identity put on the
// coordinator's --deny-identities list while it holds a rank loses its
// session at once and cannot register again; taken off the list, the
// worker's task comes back and the job finishes.
TEST_F(SecurityTest, ARevokedWorkerIsCutOffUntilItIsAllowedAgain) {
  const std::string deny = TempDir("deny") + "/deny.txt";
  ASSERT_TRUE(WriteFileAtomically(deny, "# nobody yet\n").ok());
  StartCluster(2, {"--deny-identities", deny});
  // Long enough (about 10 s here) that the revocation, read within a
  // second, lands while it trains.
  const std::string job = SubmitAndTrainTo(
      {"max_steps=3000", "global_batch_size=64", "log_every_steps=10"}, 2);
  ASSERT_FALSE(job.empty());
  ASSERT_TRUE(
      WriteFileAtomically(deny, "spiffe://lockstep/worker/worker/1\n").ok());
  v1::JobStatus cut = WatchUntil(job, [](const v1::JobStatus& s) {
    return FindEvent(s, "identity_revoked") != nullptr || Ended(s);
  });
  const v1::JobEvent* revoked = FindEvent(cut, "identity_revoked");
  ASSERT_NE(revoked, nullptr) << History(job);
  EXPECT_THAT(revoked->message(),
              AllOf(HasSubstr("spiffe://lockstep/worker/worker/1"),
                    HasSubstr("--deny-identities")));
  // Not even the health service answers it.
  {
    const TlsOptions files =
        IssueTestCertificate("spiffe://lockstep/worker/worker/1");
    auto health = grpc::health::v1::Health::NewStub(grpc::CreateChannel(
        address_, TestCredentials(&files, ServerCheck::kAnyDaemon)));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(20));
    grpc::health::v1::HealthCheckResponse response;
    grpc::Status checked = health->Check(
        &context, grpc::health::v1::HealthCheckRequest(), &response);
    EXPECT_EQ(checked.error_code(), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_THAT(checked.error_message(), HasSubstr("revoked"));
  }
  // Its registrations are refused: it gives up and exits.
  const pid_t revoked_pid = worker_pids_[1];
  int status = 0;
  pid_t exited = 0;
  for (int i = 0; i < 600 && exited == 0; ++i) {
    exited = waitpid(revoked_pid, &status, WNOHANG);
    if (exited == 0) usleep(50 * 1000);
  }
  ASSERT_EQ(exited, revoked_pid) << "the revoked worker did not exit";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0) << status;
  EXPECT_NE(WatchUntil(job, [](const v1::JobStatus&) { return true; }).state(),
            v1::JOB_STATE_SUCCEEDED);
  // Allowed again: a new process of the task rejoins and the job ends.
  ASSERT_TRUE(WriteFileAtomically(deny, "\n").ok());
  // The coordinator reads the list again within a second of the change,
  // and says so in its log.
  for (int i = 0; i < 600; ++i) {
    if (absl::StrContains(
            ReadFileToString(dir_ + "/coordinator.log").value_or(""),
            "changed: 0 identities are refused")) {
      break;
    }
    usleep(50 * 1000);
  }
  StartWorker(1);
  EXPECT_EQ(WatchUntil(job, Ended).state(), v1::JOB_STATE_SUCCEEDED)
      << History(job);
}

}  // namespace
}  // namespace lockstep::integration
