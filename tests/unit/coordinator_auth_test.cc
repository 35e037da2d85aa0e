// Authorization in the coordinator's core, with Caller values (no TLS): the
// role table, a worker registering only as its own task, sessions held only
// by their registrant, no session stealing, the rendezvous served only to a
// generation's ranks, reports only for the rank a session owns, and
// incarnations shown to nobody.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/files.h"
#include "common/sha256.h"
#include "common/tf_config.h"
#include "coordinator/authorization.h"
#include "coordinator/coordinator.h"
#include "tests/unit/coordinator_fixture.h"

namespace lockstep::coordinator {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kWorker0[] = "spiffe://lockstep/worker/worker/0";
constexpr char kWorker1[] = "spiffe://lockstep/worker/worker/1";
constexpr char kPool[] = "spiffe://lockstep/worker/pool-7";
constexpr char kSpare[] = "spiffe://lockstep/spare/spare-0";
constexpr char kOperator[] = "spiffe://lockstep/operator/alice";
constexpr char kViewer[] = "spiffe://lockstep/viewer/grafana";
// An incarnation whose hex form no message may show.
constexpr uint64_t kSecretIncarnation = 0x5ec12e7c0ffee;
constexpr char kSecretHex[] = "5ec12e7c0ffee";

Caller Nobody() {
  Caller caller;
  caller.id = "no client certificate";
  caller.peer = "ipv4:10.0.0.66:5000";
  return caller;
}

// ---- the role table
// ------------------------------------------------------------

using RoleCase = std::tuple<Call, std::string, absl::StatusCode>;

class RoleTableTest : public ::testing::TestWithParam<RoleCase> {};

TEST_P(RoleTableTest, AllowsOnlyTheRolesOfTheCall) {
  const auto& [call, id, code] = GetParam();
  Caller caller = id.empty() ? Nobody() : Identity(id);
  absl::Status status = AuthorizeRole(caller, call);
  EXPECT_EQ(status.code(), code) << CallName(call) << " by " << id;
  if (!status.ok()) {
    // Who tried what, from where.
    EXPECT_THAT(status.message(),
                AllOf(HasSubstr(std::string(CallName(call))),
                      HasSubstr(caller.peer), HasSubstr(caller.id)));
  }
}

std::vector<RoleCase> RoleCases() {
  const absl::StatusCode kOk = absl::StatusCode::kOk;
  const absl::StatusCode kDenied = absl::StatusCode::kPermissionDenied;
  const absl::StatusCode kNoIdentity = absl::StatusCode::kUnauthenticated;
  std::vector<RoleCase> cases;
  auto add = [&](Call call, absl::StatusCode worker, absl::StatusCode op,
                 absl::StatusCode viewer) {
    cases.emplace_back(call, kWorker0, worker);
    cases.emplace_back(call, kSpare, worker);
    cases.emplace_back(call, kOperator, op);
    cases.emplace_back(call, kViewer, viewer);
    cases.emplace_back(call, "spiffe://lockstep/coordinator",
                       call == Call::kHealthCheck ? kOk : kDenied);
    cases.emplace_back(call, "", kNoIdentity);
    cases.emplace_back(call, "spiffe://lockstep/admin/root", kNoIdentity);
  };
  for (Call call : {Call::kRegisterWorker, Call::kWorkerSession, Call::kKvSet,
                    Call::kKvGet, Call::kUploadArtifact}) {
    add(call, kOk, kDenied, kDenied);
  }
  for (Call call : {Call::kSubmitJob, Call::kStopJob, Call::kDeleteJob}) {
    add(call, kDenied, kOk, kDenied);
  }
  for (Call call : {Call::kGetJobStatus, Call::kWatchJob, Call::kListWorkers,
                    Call::kListQueue, Call::kListArtifacts,
                    Call::kDownloadArtifact, Call::kCompareJobs}) {
    add(call, kDenied, kOk, kOk);
  }
  add(Call::kHealthCheck, kOk, kOk, kOk);
  return cases;
}

INSTANTIATE_TEST_SUITE_P(EveryCallAndRole, RoleTableTest,
                         ::testing::ValuesIn(RoleCases()));

TEST(RoleTable, InsecureDaemonsAllowEverything) {
  for (int call = 0; call <= static_cast<int>(Call::kHealthCheck); ++call) {
    EXPECT_TRUE(AuthorizeRole(Anyone(), static_cast<Call>(call)).ok());
  }
}

// ---- the coordinator's state-dependent checks
// ----------------------------------

class CoordinatorAuthTest : public CoordinatorTest {
 protected:
  std::string StartWithArtifactDir();
  // The wait of the fixture, beside the request builder of the same name.
  using CoordinatorTest::KvGet;

  // A static cluster of worker:0 and worker:1.
  void MakeCluster() {
    auto config = ParseTfConfig(R"({"cluster": {"worker": ["a:1", "b:1"]}})");
    Make(config->cluster);
  }

  static v1::RegisterWorkerRequest Task(int index, uint64_t incarnation) {
    v1::RegisterWorkerRequest request = Free(incarnation);
    request.mutable_task()->set_type("worker");
    request.mutable_task()->set_index(index);
    return request;
  }

  // Registers worker:`index` as its own identity and opens its session.
  void JoinAs(int index, uint64_t incarnation, FakeSink* sink) {
    Caller caller = Identity(index == 0 ? kWorker0 : kWorker1,
                             absl::StrCat("ipv4:10.0.0.", index, ":4000"));
    auto registered =
        coordinator_->RegisterWorker(caller, Task(index, incarnation));
    ASSERT_TRUE(registered.ok()) << registered.status();
    sinks_.push_back(sink);
    ASSERT_TRUE(
        coordinator_
            ->OpenSession(caller, registered->worker_id(), incarnation, sink)
            .ok());
  }

  // Both tasks joined and job `job_` runs generation 1.
  void StartJob() {
    MakeCluster();
    JoinAs(0, 10, &sink0_);
    JoinAs(1, 11, &sink1_);
    job_ = *coordinator_->SubmitJob(Spec(0));
    ASSERT_EQ(Status(job_).state(), v1::JOB_STATE_RUNNING);
  }

  v1::KvSetRequest KvSet(const std::string& key) const {
    v1::KvSetRequest request;
    request.set_job_id(job_);
    request.set_generation(1);
    request.set_key(key);
    request.set_value("10.0.0.1:9000");
    return request;
  }
  v1::KvGetRequest KvGet(const std::string& key) const {
    v1::KvGetRequest request;
    request.set_job_id(job_);
    request.set_generation(1);
    request.set_key(key);
    return request;
  }
  // The same as rank `rank` sends them: with its assignment's token.
  v1::KvGetRequest KvGetAs(int rank, const std::string& key) const {
    v1::KvGetRequest request = KvGet(key);
    request.set_rank(rank);
    request.set_rank_token(TokenOf(job_, 1, rank));
    return request;
  }
  v1::WorkerMessage Result(int rank) const {
    v1::WorkerMessage message;
    v1::TaskResult* result = message.mutable_result();
    result->set_job_id(job_);
    result->set_generation(1);
    result->set_rank(rank);
    result->set_ok(true);
    result->set_steps(999999);
    result->set_model_digest(std::string(64, 'f'));
    return message;
  }

  FakeSink sink0_, sink1_;
  std::string job_;
};

TEST_F(CoordinatorAuthTest, AWorkerRegistersOnlyAsTheTaskItsCertificateNames) {
  MakeCluster();
  auto own = coordinator_->RegisterWorker(Identity(kWorker1), Task(1, 11));
  ASSERT_TRUE(own.ok()) << own.status();
  EXPECT_EQ(own->worker_id(), "worker:1");

  auto other = coordinator_->RegisterWorker(Identity(kWorker0), Task(1, 12));
  EXPECT_TRUE(absl::IsPermissionDenied(other.status())) << other.status();
  EXPECT_THAT(other.status().message(),
              AllOf(HasSubstr(kWorker0), HasSubstr("worker:1"),
                    HasSubstr("worker:0"), HasSubstr("RegisterWorker")));

  // A worker identity without a task: free registration only.
  auto pool_task = coordinator_->RegisterWorker(Identity(kPool), Task(0, 13));
  EXPECT_TRUE(absl::IsPermissionDenied(pool_task.status()));
  EXPECT_THAT(pool_task.status().message(), HasSubstr("names no task"));
  // Nor, in a static cluster, as a spare (issue 27 #6: a spare takes a
  // failed task's rank and the generation's secret).
  v1::RegisterWorkerRequest spare = Free(14);
  spare.set_spare(true);
  auto pool_spare = coordinator_->RegisterWorker(Identity(kPool), spare);
  EXPECT_TRUE(absl::IsPermissionDenied(pool_spare.status()));
  EXPECT_THAT(pool_spare.status().message(),
              AllOf(HasSubstr(kPool), HasSubstr("not a spare's"),
                    HasSubstr("spare/NAME")));
  // A spare identity registers as a spare, and only so.
  EXPECT_TRUE(coordinator_->RegisterWorker(Identity(kSpare), spare).ok());
  auto spare_task = coordinator_->RegisterWorker(Identity(kSpare), Task(0, 15));
  EXPECT_TRUE(absl::IsPermissionDenied(spare_task.status()));
  EXPECT_THAT(spare_task.status().message(),
              HasSubstr("registers only as a hot spare"));
  auto spare_free = coordinator_->RegisterWorker(Identity(kSpare), Free(16));
  EXPECT_TRUE(absl::IsPermissionDenied(spare_free.status()));
  EXPECT_EQ(ListWorkers().size(), 2);  // worker:1, the spare
}

TEST_F(CoordinatorAuthTest, AnElasticClusterTakesTaskLessWorkersAndSpares) {
  Make();
  v1::RegisterWorkerRequest spare = Free(17);
  spare.set_spare(true);
  EXPECT_TRUE(coordinator_->RegisterWorker(Identity(kPool), Free(18)).ok());
  EXPECT_TRUE(coordinator_->RegisterWorker(Identity(kSpare), spare).ok());
  EXPECT_TRUE(absl::IsPermissionDenied(
      coordinator_->RegisterWorker(Identity(kSpare), Free(19)).status()));
}

// --deny-identities: a revoked worker loses its session at the next sweep,
// and its rank's generation fails so that the job re-forms without it.
TEST_F(CoordinatorAuthTest, ARevokedWorkerLosesItsSession) {
  std::set<std::string> revoked;
  configure_ = [&revoked](Coordinator::Options& options) {
    options.revoked = [&revoked](const std::string& id) {
      return revoked.count(id) > 0;
    };
  };
  StartJob();
  coordinator_->Sweep();
  EXPECT_FALSE(sink1_.closed);
  revoked.insert(kWorker1);
  coordinator_->Sweep();
  EXPECT_TRUE(sink1_.closed);
  EXPECT_FALSE(sink0_.closed);
  v1::JobStatus status = Status(job_);
  EXPECT_NE(status.state(), v1::JOB_STATE_RUNNING);
  bool named = false;
  for (const v1::JobEvent& event : status.events()) {
    if (event.kind() == "identity_revoked") {
      named = true;
      EXPECT_THAT(event.message(),
                  AllOf(HasSubstr(kWorker1), HasSubstr("--deny-identities")));
    }
  }
  EXPECT_TRUE(named);
}

// A revoked caller is told it is revoked and how it may call again, not
// that it lacks a certificate of the cluster's CA.
TEST_F(CoordinatorAuthTest, ARevokedCallerIsToldItIsRevoked) {
  MakeCluster();
  Caller revoked = Identity(kWorker1);
  revoked.role = Role::kNone;
  revoked.revoked = true;
  absl::Status refused =
      coordinator_->RegisterWorker(revoked, Task(1, 1)).status();
  EXPECT_TRUE(absl::IsUnauthenticated(refused));
  EXPECT_THAT(std::string(refused.message()),
              AllOf(HasSubstr(kWorker1), HasSubstr("--deny-identities list"),
                    Not(HasSubstr("signed by the cluster's CA"))));
}

TEST_F(CoordinatorAuthTest, OnlyWorkerIdentitiesRegister) {
  MakeCluster();
  EXPECT_TRUE(absl::IsPermissionDenied(
      coordinator_->RegisterWorker(Identity(kOperator), Task(0, 1)).status()));
  EXPECT_TRUE(absl::IsPermissionDenied(
      coordinator_->RegisterWorker(Identity(kViewer), Task(0, 1)).status()));
  EXPECT_TRUE(absl::IsUnauthenticated(
      coordinator_->RegisterWorker(Nobody(), Task(0, 1)).status()));
  EXPECT_TRUE(ListWorkers().empty());
}

TEST_F(CoordinatorAuthTest, ASessionOpensOnlyForItsRegistrant) {
  Make();
  Caller pool = Identity(kPool);
  auto registered = coordinator_->RegisterWorker(pool, Free(21));
  ASSERT_TRUE(registered.ok());
  FakeSink thief;
  absl::Status stolen =
      coordinator_->OpenSession(Identity("spiffe://lockstep/worker/pool-8"),
                                registered->worker_id(), 21, &thief);
  EXPECT_TRUE(absl::IsPermissionDenied(stolen)) << stolen;
  EXPECT_THAT(stolen.message(), HasSubstr("registered by another identity"));
  EXPECT_TRUE(absl::IsPermissionDenied(coordinator_->OpenSession(
      Identity(kViewer), registered->worker_id(), 21, &thief)));
  FakeSink own;
  EXPECT_TRUE(
      coordinator_->OpenSession(pool, registered->worker_id(), 21, &own).ok());
}

TEST_F(CoordinatorAuthTest, FreeIdsAreKeptPerIdentity) {
  Make();
  auto first =
      coordinator_->RegisterWorker(Identity(kPool), Free(kSecretIncarnation));
  // Another identity naming the same incarnation is another worker.
  auto second = coordinator_->RegisterWorker(
      Identity("spiffe://lockstep/worker/pool-8"), Free(kSecretIncarnation));
  ASSERT_TRUE(first.ok() && second.ok());
  EXPECT_NE(first->worker_id(), second->worker_id());
}

TEST_F(CoordinatorAuthTest, ALiveSessionIsNotTakenOverByANewProcess) {
  StartJob();
  Caller restarted = Identity(kWorker1, "ipv4:10.0.0.77:4100");
  auto refused = coordinator_->RegisterWorker(restarted, Task(1, 99));
  EXPECT_TRUE(absl::IsUnavailable(refused.status())) << refused.status();
  // Both peers are named, and what to do.
  EXPECT_THAT(
      refused.status().message(),
      AllOf(HasSubstr("ipv4:10.0.0.77:4100"), HasSubstr("ipv4:10.0.0.1:4000"),
            HasSubstr("worker:1"), HasSubstr("register again")));
  EXPECT_EQ(Status(job_).state(), v1::JOB_STATE_RUNNING);
  EXPECT_FALSE(sink1_.closed);

  // The same process (its incarnation) may register again: it keeps its
  // session until it opens a new one.
  EXPECT_TRUE(
      coordinator_->RegisterWorker(Identity(kWorker1), Task(1, 11)).ok());
  EXPECT_EQ(Status(job_).state(), v1::JOB_STATE_RUNNING);
}

TEST_F(CoordinatorAuthTest, TheRendezvousServesOnlyTheGenerationsRanks) {
  StartJob();
  EXPECT_TRUE(
      coordinator_->KvSet(Identity(kWorker0), Signed(KvSet("rank0"))).ok());
  auto got = KvGet(Identity(kWorker1), KvGetAs(1, "rank0"));
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, "10.0.0.1:9000");

  // A worker identity that holds no rank, an operator, a viewer, nobody.
  FakeSink idle;
  auto pool = coordinator_->RegisterWorker(Identity(kSpare), [] {
    v1::RegisterWorkerRequest spare = Free(30);
    spare.set_spare(true);
    return spare;
  }());
  ASSERT_TRUE(pool.ok());
  ASSERT_TRUE(
      coordinator_->OpenSession(Identity(kSpare), pool->worker_id(), 30, &idle)
          .ok());
  for (const Caller& stranger :
       {Identity(kSpare), Identity(kOperator), Identity(kViewer)}) {
    absl::StatusOr<std::string> read = KvGet(stranger, KvGet("rank0"));
    EXPECT_TRUE(absl::IsPermissionDenied(read.status())) << stranger.id;
    EXPECT_THAT(read.status().message(), Not(HasSubstr("10.0.0.1:9000")));
    EXPECT_TRUE(absl::IsPermissionDenied(
        coordinator_->KvSet(stranger, KvSet("rank0"))));
  }
  EXPECT_THAT(KvGet(Identity(kSpare), KvGet("rank0")).status().message(),
              HasSubstr("holds no rank of job"));
  EXPECT_TRUE(
      absl::IsUnauthenticated(KvGet(Nobody(), KvGet("rank0")).status()));
  // A rank that names itself without its token, or with another's.
  absl::Status tokenless = KvGet(Identity(kWorker1), KvGet("rank0")).status();
  EXPECT_TRUE(absl::IsPermissionDenied(tokenless)) << tokenless;
  v1::KvGetRequest borrowed = KvGetAs(0, "rank0");
  borrowed.set_rank(1);
  EXPECT_THAT(KvGet(Identity(kWorker1), borrowed).status().message(),
              HasSubstr("without that rank's token"));
  // Nothing a stranger sent was stored.
  EXPECT_EQ(*KvGet(Identity(kWorker0), KvGetAs(0, "rank0")), "10.0.0.1:9000");
}

// Issue 35: any rank could set any rank's rendezvous key, so rank 1 could
// publish its own address as rank 0's and sit between rank 0 and the rest.
// A rank's number as a key is that rank's, every other key rank 0's, and
// the call must carry the owner's token, which only its assignment holds.
TEST_F(CoordinatorAuthTest, ARankSetsOnlyItsOwnRendezvousKeys) {
  StartJob();
  v1::KvSetRequest own = KvSet("1");
  own = Signed(own);
  ASSERT_EQ(own.rank(), 1);
  EXPECT_TRUE(coordinator_->KvSet(Identity(kWorker1), own).ok());
  own.set_key("bench/1");  // "name/<rank>" is the rank's too
  EXPECT_TRUE(coordinator_->KvSet(Identity(kWorker1), own).ok());

  // Rank 1, with its own token, naming rank 0 or itself for rank 0's keys.
  for (const std::string& key : {"0", "bench/0", "nccl_unique_id"}) {
    v1::KvSetRequest forged = KvSet(key);
    forged.set_rank(0);
    forged.set_rank_token(own.rank_token());
    absl::Status refused = coordinator_->KvSet(Identity(kWorker1), forged);
    EXPECT_TRUE(absl::IsPermissionDenied(refused)) << refused;
    EXPECT_THAT(refused.message(),
                AllOf(HasSubstr("holds rank 1"), HasSubstr("not rank 0")));
    forged.set_rank(1);
    refused = coordinator_->KvSet(Identity(kWorker1), forged);
    EXPECT_TRUE(absl::IsPermissionDenied(refused)) << refused;
    EXPECT_THAT(refused.message(), HasSubstr("names rank 1"));
  }
  // The same without TLS identities: the token alone decides.
  v1::KvSetRequest forged = KvSet("0");
  forged.set_rank(0);
  forged.set_rank_token(own.rank_token());
  EXPECT_TRUE(absl::IsPermissionDenied(coordinator_->KvSet(Anyone(), forged)));
  EXPECT_TRUE(absl::IsDeadlineExceeded(
      KvGet(Identity(kWorker0), KvGetAs(0, "0")).status()));
  // Rank 0 sets its own.
  EXPECT_TRUE(coordinator_->KvSet(Identity(kWorker0), Signed(KvSet("0"))).ok());
}

TEST_F(CoordinatorAuthTest, ARankReadsTheRendezvousOnlyAsItself) {
  StartJob();
  // Rank 1 naming rank 0, with rank 0's token or its own.
  for (const std::string& token : {TokenOf(job_, 1, 0), TokenOf(job_, 1, 1)}) {
    v1::KvGetRequest as_other = KvGet("0");
    as_other.set_rank(0);
    as_other.set_rank_token(token);
    absl::Status other = KvGet(Identity(kWorker1), as_other).status();
    EXPECT_TRUE(absl::IsPermissionDenied(other)) << other;
    EXPECT_THAT(other.message(), HasSubstr("holds rank 1"));
  }
  // As itself it waits for the key.
  v1::KvGetRequest own = KvGetAs(1, "0");
  own.set_timeout_ms(0);
  EXPECT_TRUE(
      absl::IsDeadlineExceeded(KvGet(Identity(kWorker1), own).status()));
}

// Issue 52 §3: workers may share one certificate (on Kubernetes every
// task's certificate is in every pod). A worker of one job that shares its
// identity with a rank of another job neither reads that job's rendezvous
// (data-plane addresses, nccl_unique_id): the rank's token, which only its
// own assignment carried, decides.
TEST_F(CoordinatorAuthTest, JobsWhoseWorkersShareACertificateKeepApart) {
  Make();
  FakeSink sinks[2];
  std::string ids[2];
  for (int i = 0; i < 2; ++i) {
    const Caller pool = Identity(kPool, absl::StrCat("ipv4:10.0.1.", i, ":1"));
    auto registered = coordinator_->RegisterWorker(pool, Free(40 + i));
    ASSERT_TRUE(registered.ok()) << registered.status();
    ids[i] = registered->worker_id();
    sinks_.push_back(&sinks[i]);
    ASSERT_TRUE(
        coordinator_->OpenSession(pool, ids[i], 40 + i, &sinks[i]).ok());
  }
  const std::string a = *coordinator_->SubmitJob(Spec(1));
  const std::string b = *coordinator_->SubmitJob(Spec(1));
  ASSERT_EQ(Status(a).state(), v1::JOB_STATE_RUNNING);
  ASSERT_EQ(Status(b).state(), v1::JOB_STATE_RUNNING);
  job_ = b;
  v1::KvSetRequest secret = KvSet("nccl_unique_id");
  secret.set_value("b's id");
  ASSERT_TRUE(coordinator_->KvSet(Identity(kPool), Signed(secret)).ok());

  // A's rank 0, same certificate: with A's token, or none.
  v1::KvGetRequest read = KvGet("nccl_unique_id");
  read.set_rank_token(TokenOf(a, 1, 0));
  for (const std::string& token : {TokenOf(a, 1, 0), std::string()}) {
    read.set_rank_token(token);
    absl::StatusOr<std::string> got = KvGet(Identity(kPool), read);
    EXPECT_TRUE(absl::IsPermissionDenied(got.status())) << got.status();
    EXPECT_THAT(got.status().message(), Not(HasSubstr("b's id")));
  }
  // B's rank reads its own.
  EXPECT_EQ(KvGet(Identity(kPool), KvGetAs(0, "nccl_unique_id")).value_or(""),
            "b's id");
}

TEST_F(CoordinatorAuthTest, AsyncRendezvousRefusalsAnswerAtOnce) {
  StartJob();
  absl::Status got;
  EXPECT_EQ(coordinator_->KvGetAsync(Identity(kOperator), KvGet("rank0"),
                                     [&](absl::StatusOr<std::string> value) {
                                       got = value.status();
                                     }),
            0u);
  EXPECT_TRUE(absl::IsPermissionDenied(got));
  // Rank 0 reading as rank 1.
  EXPECT_EQ(coordinator_->KvGetAsync(Identity(kWorker0), KvGetAs(1, "rank0"),
                                     [&](absl::StatusOr<std::string> value) {
                                       got = value.status();
                                     }),
            0u);
  EXPECT_TRUE(absl::IsPermissionDenied(got));
}

TEST_F(CoordinatorAuthTest, ARankWithoutItsSessionIsFencedOut) {
  StartJob();
  coordinator_->CloseSession("worker:1", 11, &sink1_,
                             absl::UnavailableError("stream broke"));
  // The generation is over: the late rank sees the fence, and retries.
  EXPECT_TRUE(
      absl::IsAborted(KvGet(Identity(kWorker1), KvGet("rank0")).status()));
}

TEST_F(CoordinatorAuthTest, ResultsCountOnlyForTheSessionsOwnRank) {
  StartJob();
  // Rank 1 reports success for rank 0 and for itself twice: only its own
  // result counts, once, and the job waits for rank 0.
  ASSERT_TRUE(coordinator_->HandleWorkerMessage("worker:1", Result(0)).ok());
  ASSERT_TRUE(coordinator_->HandleWorkerMessage("worker:1", Result(1)).ok());
  ASSERT_TRUE(coordinator_->HandleWorkerMessage("worker:1", Result(1)).ok());
  v1::JobStatus status = Status(job_);
  EXPECT_EQ(status.state(), v1::JOB_STATE_RUNNING);
  EXPECT_NE(status.ranks(0).model_digest(), std::string(64, 'f'));
  ASSERT_TRUE(coordinator_->HandleWorkerMessage("worker:0", Result(0)).ok());
  EXPECT_EQ(Status(job_).state(), v1::JOB_STATE_SUCCEEDED);
}

TEST_F(CoordinatorAuthTest, ProgressComesOnlyFromTheChief) {
  StartJob();
  v1::WorkerMessage progress;
  progress.mutable_progress()->set_job_id(job_);
  progress.mutable_progress()->set_generation(1);
  progress.mutable_progress()->set_step(1);
  progress.mutable_progress()->set_first_step(0);
  progress.mutable_progress()->add_step_losses(0.5f);
  ASSERT_TRUE(coordinator_->HandleWorkerMessage("worker:1", progress).ok());
  EXPECT_EQ(Status(job_).step(), 0);
  ASSERT_TRUE(coordinator_->HandleWorkerMessage("worker:0", progress).ok());
  EXPECT_EQ(Status(job_).step(), 1);
}

TEST_F(CoordinatorAuthTest, CommitsComeOnlyFromTheChiefAndPreparesPerRank) {
  StartJob();
  ASSERT_TRUE(
      coordinator_->HandleWorkerMessage("worker:1", Committed(job_, 1, 100))
          .ok());
  EXPECT_EQ(Status(job_).checkpoints_size(), 0);
  // Rank 1 preparing for rank 0 does not complete the step.
  ASSERT_TRUE(
      coordinator_->HandleWorkerMessage("worker:1", Prepared(job_, 1, 0, 100))
          .ok());
  ASSERT_TRUE(
      coordinator_->HandleWorkerMessage("worker:1", Prepared(job_, 1, 1, 100))
          .ok());
  EXPECT_TRUE(CommandsOf(sink0_, v1::CoordinatorCommand::kCommit).empty());
}

TEST_F(CoordinatorAuthTest, OnlyAFormerRankReportsLiveStateOfAJob) {
  StartJob();
  // A spare that never held a rank of the job cannot add a checkpoint.
  FakeSink idle;
  v1::RegisterWorkerRequest spare = Free(30);
  spare.set_spare(true);
  auto pool = coordinator_->RegisterWorker(Identity(kSpare), spare);
  ASSERT_TRUE(pool.ok());
  ASSERT_TRUE(
      coordinator_->OpenSession(Identity(kSpare), pool->worker_id(), 30, &idle)
          .ok());
  v1::WorkerMessage live = Preempt(job_, "SIGTERM");
  live.mutable_preempt()->set_live_state_done(true);
  live.mutable_preempt()->set_live_step(500);
  live.mutable_preempt()->set_saved_checkpoint("ckpt-000000500");
  ASSERT_TRUE(coordinator_->HandleWorkerMessage(pool->worker_id(), live).ok());
  EXPECT_EQ(Status(job_).checkpoints_size(), 0);
  EXPECT_EQ(Status(job_).applied_step(), 0);
}

TEST_F(CoordinatorAuthTest, IncarnationsAreShownToNobody) {
  MakeCluster();
  Caller first = Identity(kWorker1, "ipv4:10.0.0.1:4000");
  FakeSink sink;
  ASSERT_TRUE(
      coordinator_->RegisterWorker(first, Task(1, kSecretIncarnation)).ok());
  ASSERT_TRUE(
      coordinator_->OpenSession(first, "worker:1", kSecretIncarnation, &sink)
          .ok());
  auto refused = coordinator_->RegisterWorker(first, Task(1, 1));
  EXPECT_THAT(refused.status().message(), Not(HasSubstr(kSecretHex)));
  FakeSink stale;
  absl::Status wrong = coordinator_->OpenSession(first, "worker:1", 1, &stale);
  EXPECT_TRUE(absl::IsAborted(wrong));
  EXPECT_THAT(wrong.message(), Not(HasSubstr(kSecretHex)));
  for (const v1::WorkerInfo& info : ListWorkers()) {
    EXPECT_THAT(info.DebugString(), Not(HasSubstr(kSecretHex)));
    EXPECT_THAT(info.DebugString(),
                Not(HasSubstr(absl::StrCat(kSecretIncarnation))));
  }
}

// A cluster of two joined workers whose coordinator keeps artifacts in a
// fresh folder under the returned one.
std::string CoordinatorAuthTest::StartWithArtifactDir() {
  std::string tmpl = ::testing::TempDir() + "artifact_auth_test_XXXXXX";
  const std::string dir = mkdtemp(tmpl.data());
  configure_ = [dir](Coordinator::Options& options) {
    options.artifact_dir = dir + "/artifacts";
  };
  MakeCluster();
  JoinAs(0, 10, &sink0_);
  JoinAs(1, 11, &sink1_);
  return dir;
}

// Issue 53: only rank 0 of the live generation uploads its job's export,
// with its token and as the export it is; only the job's owner, an admin or
// a viewer lists and reads it.
TEST_F(CoordinatorAuthTest, OnlyTheChiefUploadsTheExportAndOnlyItsReadersRead) {
  const std::string dir = StartWithArtifactDir();
  v1::JobSpec spec = Spec(0);
  spec.set_export_path("/exports/mnist/model.pt");
  spec.set_export_format("torchscript");
  job_ = *coordinator_->SubmitJob(spec, kOperator);
  ASSERT_EQ(Status(job_).state(), v1::JOB_STATE_RUNNING);
  ASSERT_TRUE(AssignmentOf(job_, 1, 0)->upload_export());
  EXPECT_FALSE(AssignmentOf(job_, 1, 1)->upload_export());

  auto header = [&](int rank, int token_of) {
    v1::ArtifactUpload::Header header;
    header.set_job_id(job_);
    header.set_generation(1);
    header.set_rank(rank);
    header.set_rank_token(TokenOf(job_, 1, token_of));
    v1::ArtifactInfo* info = header.mutable_info();
    info->set_name("model");
    info->set_file_name("model.pt");
    info->set_format("torchscript");
    info->set_bytes(3);
    info->set_sha256(*Sha256Hex("abc"));
    return header;
  };
  // Worker 1 may not upload as rank 0, nor as itself.
  EXPECT_EQ(coordinator_->BeginArtifactUpload(Identity(kWorker1), header(0, 0))
                .status()
                .code(),
            absl::StatusCode::kPermissionDenied);
  auto not_chief =
      coordinator_->BeginArtifactUpload(Identity(kWorker1), header(1, 1));
  EXPECT_EQ(not_chief.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_THAT(not_chief.status().message(), HasSubstr("is not the chief"));
  // Nor may the chief upload another file as the export.
  v1::ArtifactUpload::Header other = header(0, 0);
  other.mutable_info()->set_file_name("other.pt");
  EXPECT_EQ(coordinator_->BeginArtifactUpload(Identity(kWorker0), other)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  // Nor a checkpoint the job did not ask for.
  EXPECT_FALSE(AssignmentOf(job_, 1, 0)->upload_checkpoint());
  v1::ArtifactUpload::Header checkpoint = header(0, 0);
  checkpoint.mutable_info()->set_name("checkpoint");
  checkpoint.mutable_info()->set_file_name("ckpt-000000000.tar");
  checkpoint.mutable_info()->set_format("checkpoint");
  auto unasked =
      coordinator_->BeginArtifactUpload(Identity(kWorker0), checkpoint);
  EXPECT_EQ(unasked.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(unasked.status().message(),
              HasSubstr("does not ask for its checkpoint"));
  auto upload =
      coordinator_->BeginArtifactUpload(Identity(kWorker0), header(0, 0));
  ASSERT_TRUE(upload.ok()) << upload.status();
  ASSERT_TRUE((*upload)->Append("abc").ok());
  auto kept = (*upload)->Finish();
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_EQ(kept->owner(), "operator:alice");
  coordinator_->ArtifactUploadEnded(job_, 0, "model", kept);
  EXPECT_EQ(EventsOf(Status(job_), "artifact_kept").size(), 1u);

  auto listed = coordinator_->ListArtifacts(Identity(kOperator), job_);
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_EQ(listed->size(), 1u);
  EXPECT_EQ((*listed)[0].sha256(), *Sha256Hex("abc"));
  EXPECT_TRUE(coordinator_->ListArtifacts(Identity(kViewer), job_).ok());
  auto stranger = coordinator_->ListArtifacts(
      Identity("spiffe://lockstep/operator/carol"), job_);
  EXPECT_EQ(stranger.status().code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(
      coordinator_->ListArtifacts(Identity(kWorker0), job_).status().code(),
      absl::StatusCode::kPermissionDenied);
  auto opened = coordinator_->OpenArtifact(Identity(kViewer), job_, "model");
  ASSERT_TRUE(opened.ok()) << opened.status();
  char bytes[4] = {};
  EXPECT_EQ(read(opened->first, bytes, sizeof(bytes)), 3);
  close(opened->first);
  EXPECT_EQ(std::string(bytes), "abc");
  coordinator_.reset();
  ASSERT_TRUE(RemoveRecursively(dir).ok());
}

// A job that asks for its checkpoint (checkpoint.upload_last): the chief
// uploads it as ckpt-<step>.tar of format "checkpoint", and nothing else
// under that name.
TEST_F(CoordinatorAuthTest, TheChiefUploadsTheCheckpointAJobAsksFor) {
  const std::string dir = StartWithArtifactDir();
  v1::JobSpec spec = Spec(0);
  spec.mutable_checkpoint()->set_backup_dir("/backups/mnist");
  spec.mutable_checkpoint()->set_upload_last(true);
  job_ = *coordinator_->SubmitJob(spec, kOperator);
  ASSERT_TRUE(AssignmentOf(job_, 1, 0)->upload_checkpoint());
  EXPECT_FALSE(AssignmentOf(job_, 1, 0)->upload_export());
  EXPECT_FALSE(AssignmentOf(job_, 1, 1)->upload_checkpoint());
  v1::ArtifactUpload::Header header;
  header.set_job_id(job_);
  header.set_generation(1);
  header.set_rank(0);
  header.set_rank_token(TokenOf(job_, 1, 0));
  v1::ArtifactInfo* info = header.mutable_info();
  info->set_name("checkpoint");
  info->set_file_name("ckpt-000000012.tar");
  info->set_format("checkpoint");
  info->set_step(20);  // not the file's step
  info->set_bytes(3);
  info->set_sha256(*Sha256Hex("abc"));
  auto mismatched =
      coordinator_->BeginArtifactUpload(Identity(kWorker0), header);
  EXPECT_EQ(mismatched.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(mismatched.status().message(),
              HasSubstr("ckpt-<step, 9 digits>.tar"));
  info->set_step(12);
  auto upload = coordinator_->BeginArtifactUpload(Identity(kWorker0), header);
  ASSERT_TRUE(upload.ok()) << upload.status();
  ASSERT_TRUE((*upload)->Append("abc").ok());
  auto kept = (*upload)->Finish();
  ASSERT_TRUE(kept.ok()) << kept.status();
  coordinator_->ArtifactUploadEnded(job_, 0, "checkpoint", kept);
  std::vector<v1::JobEvent> events = EventsOf(Status(job_), "artifact_kept");
  ASSERT_EQ(events.size(), 1u);
  EXPECT_THAT(events[0].message(),
              AllOf(HasSubstr("keeps the checkpoint ckpt-000000012.tar"),
                    HasSubstr("artifacts get " + job_ + " checkpoint")));
  coordinator_.reset();
  ASSERT_TRUE(RemoveRecursively(dir).ok());
}

TEST_F(CoordinatorAuthTest, WithoutAnArtifactDirNothingIsUploaded) {
  MakeCluster();
  JoinAs(0, 10, &sink0_);
  JoinAs(1, 11, &sink1_);
  v1::JobSpec spec = Spec(0);
  spec.set_export_path("/exports/mnist/model.pt");
  job_ = *coordinator_->SubmitJob(spec);
  EXPECT_FALSE(AssignmentOf(job_, 1, 0)->upload_export());
  v1::ArtifactUpload::Header header;
  header.set_job_id(job_);
  header.set_generation(1);
  header.set_rank(0);
  header.set_rank_token(TokenOf(job_, 1, 0));
  auto refused = coordinator_->BeginArtifactUpload(Identity(kWorker0), header);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.status().message(),
              HasSubstr("job " + job_ +
                        " rank 0: this coordinator keeps no "
                        "artifacts"));
}

}  // namespace
}  // namespace lockstep::coordinator
