// Issue 15's four attacks, against real daemons with mutual TLS on: a
// stranger who reaches the coordinator's port (no certificate, one from
// another CA, or one of the cluster's CA for an identity that may not do
// what it tries) cannot take a rank and forge a result, pose as a live
// worker, read the ranks' Gloo addresses, or submit and stop jobs. Each
// attack is refused with the agreed code (no certificate: UNAUTHENTICATED;
// another CA: UNAVAILABLE, the handshake fails; a known identity that may
// not: PERMISSION_DENIED), and the job's state, its result and the real
// workers are untouched.
//
// Then issue 27's cases that need a real coordinator: clients holding real
// worker certificates that speak the worker protocol themselves
// (RogueWorker) to forge a job's outcome or flood its status, one viewer's
// 1,000 watches, 20,000 spares, and a 4 MiB key-value value; each checked
// through the CLI as a user would see it.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/files.h"
#include "common/job_spec.h"
#include "common/tls.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "tests/integration/harness.h"
#include "worker/rpc/grpc_control_plane.h"

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
    v1::BarrierRequest barrier;
    barrier.set_job_id(job);
    barrier.set_generation(1);
    barrier.set_name("gloo");
    barrier.set_rank(1);
    barrier.set_timeout_ms(0);
    v1::BarrierResponse barrier_response;
    ExpectRefused(stub->Barrier(Context().get(), barrier, &barrier_response),
                  stranger, "entering a barrier as rank 1");
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

// A client holding a real worker certificate of the cluster's CA that
// speaks the worker protocol itself: it registers as its task, opens a
// session and sends whatever it likes instead of training (issue 27 #4: a
// compromised worker certificate).
class RogueWorker {
 public:
  RogueWorker(const std::string& address, int index)
      : files_(IssueTestCertificate(
            absl::StrCat("spiffe://lockstep/worker/worker/", index))) {
    grpc::SslCredentialsOptions options;
    options.pem_root_certs = ReadFileToString(files_.ca_file).value_or("");
    options.pem_cert_chain = ReadFileToString(files_.cert_file).value_or("");
    options.pem_private_key = ReadFileToString(files_.key_file).value_or("");
    stub_ = v1::Coordinator::NewStub(
        grpc::CreateChannel(address, grpc::SslCredentials(options)));
    v1::RegisterWorkerRequest request;
    request.mutable_task()->set_type("worker");
    request.mutable_task()->set_index(index);
    request.set_incarnation(0x7000 + index);
    request.set_host("127.0.0.1");
    v1::RegisterWorkerResponse response;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(20));
    grpc::Status status = stub_->RegisterWorker(&context, request, &response);
    EXPECT_TRUE(status.ok())
        << "worker:" << index << " " << status.error_message();
    context_.set_deadline(std::chrono::system_clock::now() +
                          std::chrono::minutes(3));
    stream_ = stub_->WorkerSession(&context_);
    v1::WorkerMessage hello;
    hello.mutable_hello()->set_worker_id(response.worker_id());
    hello.mutable_hello()->set_incarnation(0x7000 + index);
    Send(hello);
  }

  ~RogueWorker() {
    context_.TryCancel();
    stream_->Finish();
  }

  void Send(const v1::WorkerMessage& message) {
    EXPECT_TRUE(stream_->Write(message)) << "the session ended";
  }

  v1::Coordinator::Stub* stub() { return stub_.get(); }

  // The next assignment the coordinator sends (a failed test when the
  // session ends first).
  v1::Assignment NextAssignment() {
    v1::CoordinatorCommand command;
    while (stream_->Read(&command)) {
      if (command.has_assignment()) return command.assignment();
    }
    ADD_FAILURE() << "the session ended before an assignment";
    return v1::Assignment();
  }

 private:
  TlsOptions files_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
  grpc::ClientContext context_;
  std::unique_ptr<
      grpc::ClientReaderWriter<v1::WorkerMessage, v1::CoordinatorCommand>>
      stream_;
};

// A cluster of `workers` tasks whose coordinator runs alone: the test's
// rogue workers take the tasks.
class RogueWorkerTest : public SecurityTest {
 protected:
  void StartCoordinatorAlone(int workers) {
    dir_ = TempDir("cluster");
    workers_ = workers;
    StartCoordinator("127.0.0.1:0");
  }
};

// Issue 27 #4, with real certificates over real gRPC: both ranks of a job
// held by rogue clients reported success at step 999,999 of a 1,000-step
// plan with a forged digest, the chief a progress of step 1048576/1000 and
// a checkpoint commit for a job that saves none. The job fails naming the
// rank and the step, and nothing forged is shown as the job's.
TEST_F(RogueWorkerTest, TwoRogueWorkersCannotForgeAJobsOutcome) {
  StartCoordinatorAlone(2);
  RogueWorker chief(address_, 0), other(address_, 1);
  const std::string job = Submit({"max_steps=1000", "global_batch_size=64"});
  ASSERT_FALSE(job.empty());
  const v1::Assignment assigned = chief.NextAssignment();
  ASSERT_EQ(assigned.job_id(), job);
  ASSERT_EQ(assigned.rank(), 0);
  ASSERT_EQ(other.NextAssignment().rank(), 1);

  v1::WorkerMessage progress;
  progress.mutable_progress()->set_job_id(job);
  progress.mutable_progress()->set_generation(assigned.generation());
  progress.mutable_progress()->set_step(1048576);
  progress.mutable_progress()->set_total_steps(1000);
  chief.Send(progress);
  v1::WorkerMessage committed;
  v1::CheckpointCommitted* c = committed.mutable_committed();
  c->set_job_id(job);
  c->set_generation(assigned.generation());
  c->set_step(999999999);
  c->set_ok(true);
  c->set_name("ckpt-999999999");
  chief.Send(committed);
  for (auto [worker, rank] : {std::pair{&chief, 0}, std::pair{&other, 1}}) {
    v1::WorkerMessage result;
    v1::TaskResult* r = result.mutable_result();
    r->set_job_id(job);
    r->set_generation(assigned.generation());
    r->set_rank(rank);
    r->set_ok(true);
    r->set_steps(999999);
    r->set_model_digest("forged-digest-0000");
    worker->Send(result);
  }

  v1::JobStatus done = WatchUntil(job, Ended);
  EXPECT_EQ(done.state(), v1::JOB_STATE_FAILED) << History(job);
  EXPECT_THAT(done.error(),
              AllOf(HasSubstr("step 999999"), HasSubstr("max_steps 1000")));
  EXPECT_NE(done.step(), 1048576);
  EXPECT_LE(done.applied_step(), 1000);
  EXPECT_EQ(done.checkpoints_size(), 0);
  EXPECT_EQ(FindEvent(done, "checkpoint_committed"), nullptr);
  // `lockstep status` says it failed, not that it succeeded.
  Result status = RunCommand({kBin + "/lockstep", "status", job},
                             {"LOCKSTEP_COORDINATOR=" + address_});
  EXPECT_THAT(status.out, HasSubstr("failed")) << status.err;
}

// Issue 27 #7: the documented 4 MiB key-value value could not be sent
// (4194327 vs. 4194304 bytes). The worker's own key-value client, holding
// the rank of a real generation, sets one and reads it back over TLS; a
// byte more is refused by the coordinator's check, not by gRPC's limit.
TEST_F(RogueWorkerTest, AFourMiBKeyValueValueTravelsOverGrpc) {
  StartCoordinatorAlone(1);
  RogueWorker chief(address_, 0);
  const std::string job = Submit({"max_steps=1000", "global_batch_size=64"});
  ASSERT_FALSE(job.empty());
  const v1::Assignment assigned = chief.NextAssignment();
  ASSERT_EQ(assigned.job_id(), job);
  auto credentials = LoadChannelCredentials(
      IssueTestCertificate("spiffe://lockstep/worker/worker/0"));
  ASSERT_TRUE(credentials.ok()) << credentials.status();
  worker::GrpcControlPlane plane(address_, *credentials);
  auto kv = plane.KeyValue(job, assigned.generation());

  std::string value(size_t{4} << 20, '\0');
  for (size_t i = 0; i < value.size(); ++i) {
    value[i] = static_cast<char>(i * 2654435761u >> 24);
  }
  absl::Status stored = kv->Set("big", value);
  ASSERT_TRUE(stored.ok()) << stored;
  absl::StatusOr<std::string> got = kv->Get("big", absl::Seconds(10));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_TRUE(*got == value) << got->size() << " bytes back";

  absl::Status over = kv->Set("bigger", value + "x");
  EXPECT_TRUE(absl::IsInvalidArgument(over)) << over;
  EXPECT_THAT(std::string(over.message()), HasSubstr("value"));
}

// Issue 27 #7: a loss history of 2^20 steps broke `lockstep metrics`. A
// chief that reports 3 x 2^20 + 5 losses over real gRPC: the history is
// thinned to every fourth step, spans the whole job, and the CLI follows
// its pages (status, metrics as CSV and JSON).
TEST_F(RogueWorkerTest, AJobOfThreeMillionStepsStillShowsItsLossCurve) {
  StartCoordinatorAlone(1);
  RogueWorker chief(address_, 0);
  const int64_t steps = 3 * (int64_t{1} << 20) + 5;
  const std::string job = Submit(
      {absl::StrCat("max_steps=", steps + 1000), "global_batch_size=64"});
  ASSERT_FALSE(job.empty());
  const v1::Assignment assigned = chief.NextAssignment();
  ASSERT_EQ(assigned.job_id(), job);
  const int64_t per_report = int64_t{1} << 18;
  for (int64_t first = 0; first < steps; first += per_report) {
    const int64_t last = std::min(steps, first + per_report);
    v1::WorkerMessage message;
    v1::ProgressReport* p = message.mutable_progress();
    p->set_job_id(job);
    p->set_generation(assigned.generation());
    p->set_first_step(first);
    p->set_step(last);
    p->set_total_steps(steps + 1000);
    // Loss of step s (from 1): s, exact in a float below 2^24.
    for (int64_t s = first + 1; s <= last; ++s) {
      p->add_step_losses(static_cast<float>(s));
    }
    chief.Send(message);
  }
  WatchUntil(job, [&](const v1::JobStatus& s) { return s.step() >= steps; });

  Result status = RunCommand({kBin + "/lockstep", "status", job},
                             {"LOCKSTEP_COORDINATOR=" + address_});
  EXPECT_EQ(status.code, 0) << status.err;
  Result csv = RunCommand({kBin + "/lockstep", "metrics", job, "--csv"},
                          {"LOCKSTEP_COORDINATOR=" + address_});
  ASSERT_EQ(csv.code, 0) << csv.err;
  const std::vector<std::string> rows =
      absl::StrSplit(csv.out, '\n', absl::SkipEmpty());
  // A header, then steps 1, 5, 9, ..., 3 x 2^20 + 5.
  ASSERT_EQ(rows.size(), 1 + (steps + 3) / 4);
  EXPECT_EQ(rows[1], "1,64,1,,");
  EXPECT_EQ(rows[2], "5,320,5,,");
  EXPECT_EQ(rows.back(),
            absl::StrCat(steps, ",", steps * 64, ",", steps, ",,"));
  Result json = RunCommand({kBin + "/lockstep", "metrics", job, "--json"},
                           {"LOCKSTEP_COORDINATOR=" + address_});
  ASSERT_EQ(json.code, 0) << json.err;
  const google::protobuf::Struct metrics = LastJsonLine(json.out);
  const auto& points = metrics.fields().at("steps").list_value().values();
  ASSERT_EQ(points.size(), rows.size() - 1);
  const auto& last = points.rbegin()->struct_value().fields();
  EXPECT_EQ(last.at("step").number_value(), steps);
  EXPECT_EQ(last.at("loss").number_value(), steps);
  // And the comparison, plotted to the job's last step.
  const std::string svg = TempDir("compare") + "/curves.svg";
  Result compare =
      RunCommand({kBin + "/lockstep", "compare", job, job, "--svg", svg},
                 {"LOCKSTEP_COORDINATOR=" + address_});
  EXPECT_EQ(compare.code, 0) << compare.err;
  const std::string plot = ReadFileToString(svg).value_or("");
  EXPECT_THAT(plot, HasSubstr("<svg"));
  EXPECT_LT(plot.size(), size_t{1} << 20);
}

// Issue 27 #7: 150,000 progress reports with an evaluation each made
// `lockstep status`, `events` and `watch` of the job fail (a 4.8 MB
// status). The evaluations are thinned to at most 1,000 spanning the job,
// and every command answers.
TEST_F(RogueWorkerTest, AHundredAndFiftyThousandEvaluationsStillShow) {
  StartCoordinatorAlone(1);
  RogueWorker chief(address_, 0);
  const int64_t reports = 150000;
  const std::string job =
      Submit({absl::StrCat("max_steps=", reports), "global_batch_size=64"});
  ASSERT_FALSE(job.empty());
  const v1::Assignment assigned = chief.NextAssignment();
  ASSERT_EQ(assigned.job_id(), job);
  for (int64_t step = 1; step <= reports; ++step) {
    v1::WorkerMessage message;
    v1::ProgressReport* p = message.mutable_progress();
    p->set_job_id(job);
    p->set_generation(assigned.generation());
    p->set_step(step);
    p->set_total_steps(reports);
    p->set_test_accuracy(0.5);
    p->set_test_loss(1.0);
    chief.Send(message);
  }
  v1::JobStatus seen = WatchUntil(
      job, [&](const v1::JobStatus& s) { return s.step() >= reports; });
  EXPECT_LE(seen.evals_size(), 1000);
  EXPECT_EQ(seen.evals_size() + seen.dropped_evals(), reports);
  for (const char* command : {"status", "events", "metrics"}) {
    Result r = RunCommand({kBin + "/lockstep", command, job},
                          {"LOCKSTEP_COORDINATOR=" + address_});
    EXPECT_EQ(r.code, 0) << command << ": " << r.err;
  }
  // The rank reports the end; the watch shows it.
  v1::WorkerMessage result;
  v1::TaskResult* r = result.mutable_result();
  r->set_job_id(job);
  r->set_generation(assigned.generation());
  r->set_rank(0);
  r->set_ok(true);
  r->set_steps(reports);
  r->set_model_digest("d");
  chief.Send(result);
  Result watch = RunCommand({kBin + "/lockstep", "watch", job},
                            {"LOCKSTEP_COORDINATOR=" + address_});
  EXPECT_EQ(watch.code, 0) << watch.err;
  EXPECT_THAT(watch.out, HasSubstr("succeeded"));
}

// Issue 27 #8: the 1,000-watch cap was global, so one viewer's script
// holding 1,000 watches locked an operator's `lockstep watch` out. The
// viewer gets its own 100 (--max-watches-per-identity) and is refused past
// them, naming itself and the flag; the operator follows the job to its end.
TEST_F(RogueWorkerTest, OneViewersThousandWatchesLeaveTheOperatorsWatch) {
  StartCoordinatorAlone(1);
  const std::string job = Submit({"max_steps=20", "global_batch_size=64"});
  ASSERT_FALSE(job.empty());
  const std::string viewer = "spiffe://lockstep/viewer/grafana";
  const TlsOptions files = IssueTestCertificate(viewer);
  auto credentials = LoadChannelCredentials(files);
  ASSERT_TRUE(credentials.ok()) << credentials.status();
  auto stub =
      v1::Coordinator::NewStub(grpc::CreateChannel(address_, *credentials));
  struct Watch {
    grpc::ClientContext context;
    std::unique_ptr<grpc::ClientReader<v1::JobStatus>> reader;
  };
  std::vector<std::unique_ptr<Watch>> watches;
  int open = 0, refused = 0;
  std::string refusal;
  v1::WatchJobRequest request;
  request.set_job_id(job);
  for (int i = 0; i < 1000; ++i) {
    auto watch = std::make_unique<Watch>();
    watch->context.set_deadline(std::chrono::system_clock::now() +
                                std::chrono::minutes(3));
    watch->reader = stub->WatchJob(&watch->context, request);
    v1::JobStatus first;
    if (watch->reader->Read(&first)) {
      ++open;
      watches.push_back(std::move(watch));  // held open
    } else {
      grpc::Status status = watch->reader->Finish();
      EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
      refusal = status.error_message();
      ++refused;
    }
  }
  EXPECT_EQ(open, 100);
  EXPECT_EQ(refused, 900);
  EXPECT_THAT(refusal, AllOf(HasSubstr(viewer),
                             HasSubstr("--max-watches-per-identity 100")));

  // The job's worker comes, the job ends, and the operator's watch (the
  // CLI, started while the viewer holds its 100) shows it to the end.
  StartWorker(0);
  Result watch = RunCommand({kBin + "/lockstep", "watch", job},
                            {"LOCKSTEP_COORDINATOR=" + address_});
  EXPECT_EQ(watch.code, 0) << watch.err;
  EXPECT_THAT(watch.out, HasSubstr("succeeded"));
  for (auto& held : watches) held->context.TryCancel();
  for (auto& held : watches) held->reader->Finish();
}

// Issue 27 #7: 20,000 spare registrations made `lockstep workers` fail for
// an hour (one response over gRPC's 4 MiB). Under --insecure nothing ties a
// registration to an identity, so the flood is possible there; the list
// comes in pages and the CLI follows them.
TEST_F(RogueWorkerTest, TwentyThousandSparesStillList) {
  dir_ = TempDir("cluster");
  workers_ = 1;
  coordinator_flags_ = {"--insecure"};
  StartCoordinator("127.0.0.1:0");
  auto stub = v1::Coordinator::NewStub(
      grpc::CreateChannel(address_, grpc::InsecureChannelCredentials()));
  const int spares = 20000;
  for (int i = 0; i < spares; ++i) {
    v1::RegisterWorkerRequest request;
    request.set_spare(true);
    request.set_incarnation(0x100000 + i);
    request.set_host(absl::StrCat("spare-host-", i, ".example.com"));
    v1::RegisterWorkerResponse response;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(20));
    grpc::Status status = stub->RegisterWorker(&context, request, &response);
    ASSERT_TRUE(status.ok()) << i << ": " << status.error_message();
  }
  Result list = RunCommand({kBin + "/lockstep", "workers", "--insecure"},
                           {"LOCKSTEP_COORDINATOR=" + address_});
  ASSERT_EQ(list.code, 0) << list.err;
  for (int i : {0, spares / 2, spares - 1}) {
    EXPECT_THAT(list.out, HasSubstr(absl::StrCat("spare-host-", i, "."))) << i;
  }
  Result json =
      RunCommand({kBin + "/lockstep", "workers", "--json", "--insecure"},
                 {"LOCKSTEP_COORDINATOR=" + address_});
  ASSERT_EQ(json.code, 0) << json.err;
  size_t listed = 0;
  for (size_t at = 0;
       (at = json.out.find("\"worker_id\"", at)) != std::string::npos; ++at) {
    ++listed;
  }
  EXPECT_EQ(listed, size_t{spares}) << json.out.substr(0, 500);
}

}  // namespace
}  // namespace lockstep::integration
