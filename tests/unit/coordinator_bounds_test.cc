// Coordinator tests of issue 14's bounds: every rendezvous and job call is
// range-checked (INVALID_ARGUMENT, nothing changes), a generation's
// key-value store has caps (RESOURCE_EXHAUSTED naming them), finished jobs
// and their events are kept within limits, vanished free workers are
// forgotten, and the job list comes in bounded pages.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <set>
#include <string>
#include <vector>

#include "common/tf_config.h"
#include "coordinator/coordinator.h"
#include "coordinator/generation.h"
#include "coordinator/job_status.h"
#include "coordinator/message_checks.h"
#include "tests/unit/coordinator_fixture.h"

namespace lockstep::coordinator {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

std::string NewStateDir() {
  std::string tmpl = ::testing::TempDir() + "coordinator_bounds_XXXXXX";
  return mkdtemp(tmpl.data());
}

v1::KvSetRequest Set(const std::string& job, const std::string& key,
                     const std::string& value) {
  v1::KvSetRequest request;
  request.set_job_id(job);
  request.set_generation(1);
  request.set_key(key);
  request.set_value(value);
  return request;
}

v1::KvGetRequest Get(const std::string& job, const std::string& key) {
  v1::KvGetRequest request;
  request.set_job_id(job);
  request.set_generation(1);
  request.set_key(key);
  request.set_timeout_ms(0);
  return request;
}

// A page of job summaries after `token`.
v1::GetJobStatusRequest Page(int size, const std::string& token) {
  v1::GetJobStatusRequest request;
  request.set_page_size(size);
  request.set_page_token(token);
  return request;
}

class BoundsTest : public CoordinatorTest {
 protected:
  // Submits `count` jobs that stay queued (no workers) and stops them.
  std::vector<std::string> SubmitStopped(int count) {
    std::vector<std::string> ids;
    for (int i = 0; i < count; ++i) {
      ids.push_back(*coordinator_->SubmitJob(Spec(1)));
      EXPECT_TRUE(coordinator_->StopJob(ids.back()).ok());
    }
    return ids;
  }
};

TEST_F(BoundsTest, OutOfRangeRendezvousRequestsAreRefusedAndChangeNothing) {
  Make();
  FakeSink a;
  Connect(1, &a);
  std::string job = *coordinator_->SubmitJob(Spec(1));
  const int64_t version = Status(job).version();
  std::vector<v1::KvSetRequest> sets = {
      Set(job, "", "v"),
      Set(job, "two words", "v"),
      Set(job, std::string(kMaxKeyBytes + 1, 'k'), "v"),
      Set(job, "k\x1b[2J", "v"),
      Set(job, "k", std::string(kMaxKvValueBytes + 1, 'v')),
      Set("../../etc", "k", "v"),
      Set(std::string(kMaxJobIdBytes + 1, 'j'), "k", "v"),
  };
  sets.push_back(Set(job, "k", "v"));
  sets.back().set_generation(-1);
  for (const v1::KvSetRequest& request : sets) {
    absl::Status refused = coordinator_->KvSet(Anyone(), request);
    EXPECT_TRUE(absl::IsInvalidArgument(refused)) << refused;
    EXPECT_THAT(refused.message(), HasSubstr("KvSet: "));
  }
  v1::KvGetRequest negative = Get(job, "k");
  negative.set_timeout_ms(-1);
  v1::KvGetRequest forever = Get(job, "k");
  forever.set_timeout_ms(kMaxWaitMs + 1);
  for (const v1::KvGetRequest& request : {negative, forever}) {
    auto refused = KvGet(Anyone(), request);
    EXPECT_TRUE(absl::IsInvalidArgument(refused.status())) << refused.status();
    EXPECT_THAT(refused.status().message(), HasSubstr("timeout_ms is"));
  }
  v1::KvGetRequest far = Get(job, "k");
  far.set_rank(kMaxRank + 1);
  EXPECT_TRUE(absl::IsInvalidArgument(KvGet(Anyone(), far).status()));
  // Nothing was stored and the job did not change.
  EXPECT_TRUE(
      absl::IsDeadlineExceeded(KvGet(Anyone(), Get(job, "k")).status()));
  EXPECT_EQ(Status(job).version(), version);
  EXPECT_EQ(Status(job).state(), v1::JOB_STATE_RUNNING);
  ASSERT_TRUE(coordinator_->KvSet(Anyone(), Signed(Set(job, "k", "v"))).ok());
  EXPECT_EQ(*KvGet(Anyone(), Get(job, "k")), "v");
}

TEST_F(BoundsTest, OutOfRangeJobCallsAreRefused) {
  Make();
  std::string job = *coordinator_->SubmitJob(Spec(1));
  const std::string bad_id = "job\n-1";
  EXPECT_TRUE(absl::IsInvalidArgument(coordinator_->StopJob(bad_id)));
  EXPECT_TRUE(absl::IsInvalidArgument(coordinator_->DeleteJob(bad_id)));
  EXPECT_TRUE(absl::IsInvalidArgument(coordinator_->DeleteJob("")));
  EXPECT_TRUE(absl::IsInvalidArgument(
      coordinator_
          ->WatchJob(bad_id,
                     [](absl::StatusOr<std::shared_ptr<const v1::JobStatus>>) {
                       ADD_FAILURE() << "a refused watch was called";
                     })
          .status()));
  v1::GetJobStatusRequest status;
  status.set_job_id(std::string(kMaxJobIdBytes + 1, 'j'));
  EXPECT_TRUE(
      absl::IsInvalidArgument(coordinator_->GetJobStatus(status).status()));
  for (int size : {-1, kMaxStatusPage + 1}) {
    auto refused = coordinator_->GetJobStatus(Page(size, ""));
    EXPECT_TRUE(absl::IsInvalidArgument(refused.status())) << size;
    EXPECT_THAT(refused.status().message(), HasSubstr("page_size is"));
  }
  for (const std::string& token : {"abc", "-3", "0", "1 2"}) {
    EXPECT_TRUE(absl::IsInvalidArgument(
        coordinator_->GetJobStatus(Page(10, token)).status()))
        << token;
  }
  v1::JobSpec huge = Spec(1);
  huge.mutable_data()->set_dir(std::string(kMaxSpecBytes, 'd'));
  auto refused = coordinator_->SubmitJob(huge);
  EXPECT_TRUE(absl::IsInvalidArgument(refused.status()));
  EXPECT_THAT(refused.status().message(), HasSubstr("spec size is"));
  // Only the first job exists, still queued.
  auto all = coordinator_->GetJobStatus(Page(0, ""));
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->jobs_size(), 1);
  EXPECT_EQ(all->jobs(0).job_id(), job);
  EXPECT_EQ(all->jobs(0).state(), v1::JOB_STATE_QUEUED);
}

// Issue 14: 100 key-value writes of 4 MB took the coordinator from 18 MB to
// 437 MB. A generation's store refuses past its caps, naming the flag, and
// keeps serving the keys it holds; the next generation starts empty.
TEST_F(BoundsTest, KeyValueCapsRefuseOnceFullAndTheGenerationKeepsWorking) {
  configure_ = [](Coordinator::Options& options) {
    options.kv_limits = {/*max_entries=*/4, /*max_bytes=*/1000};
  };
  Make();
  FakeSink a, b;
  std::string id_a = Connect(1, &a);
  Connect(2, &b);
  std::string job = *coordinator_->SubmitJob(Spec(2));
  for (int key = 0; key < 4; ++key) {
    ASSERT_TRUE(
        coordinator_->KvSet(Anyone(), Signed(Set(job, absl::StrCat(key), "v")))
            .ok());
  }

  absl::Status full = coordinator_->KvSet(Anyone(), Signed(Set(job, "4", "v")));
  EXPECT_TRUE(absl::IsResourceExhausted(full)) << full;
  EXPECT_THAT(full.message(),
              AllOf(HasSubstr(job), HasSubstr("--kv-max-entries (4)")));
  absl::Status big = coordinator_->KvSet(
      Anyone(), Signed(Set(job, "1", std::string(2000, 'x'))));
  EXPECT_TRUE(absl::IsResourceExhausted(big)) << big;
  EXPECT_THAT(big.message(), HasSubstr("--kv-max-bytes (1000)"));
  // What the store holds still works: read, replaced within the caps.
  EXPECT_EQ(*KvGet(Anyone(), Get(job, "1")), "v");
  ASSERT_TRUE(
      coordinator_
          ->KvSet(Anyone(), Signed(Set(job, "1", std::string(900, 'y'))))
          .ok());
  EXPECT_EQ(KvGet(Anyone(), Get(job, "1"))->size(), 900u);

  // The generation ends (a worker fails); its store is dropped and the next
  // generation has the whole budget.
  coordinator_->CloseSession(id_a, 1, &a, absl::UnavailableError("gone"));
  FakeSink again;
  Connect(1, &again);
  ASSERT_EQ(Status(job).generation(), 2);
  for (int key = 0; key < 4; ++key) {
    v1::KvSetRequest request = Set(job, absl::StrCat(key), "v");
    request.set_generation(2);
    EXPECT_TRUE(coordinator_->KvSet(Anyone(), Signed(request)).ok()) << key;
  }
}

TEST(GenerationBoundsTest, AnEndedGenerationFreesItsStore) {
  Generation generation("job-1", 1, {"free:0", "free:1"},
                        KvLimits{/*max_entries=*/10, /*max_bytes=*/100});
  ASSERT_TRUE(generation.Set("k", std::string(50, 'v')).ok());
  ASSERT_TRUE(generation.Set("other", "x").ok());
  EXPECT_EQ(generation.kv_entries(), 2);
  EXPECT_EQ(generation.kv_bytes(), 1 + 50 + 5 + 1);
  ASSERT_TRUE(generation.Set("k", "short").ok());  // replacing frees bytes
  EXPECT_EQ(generation.kv_bytes(), 1 + 5 + 5 + 1);
  generation.End();
  EXPECT_EQ(generation.kv_entries(), 0);
  EXPECT_EQ(generation.kv_bytes(), 0);
  EXPECT_EQ(generation.Get("k"), nullptr);
}

// The oldest finished jobs beyond --keep-finished-jobs go, from memory and
// from the store: a restarted coordinator does not bring them back, and a
// new job never reuses a deleted job's id.
TEST_F(BoundsTest, RetentionDeletesTheOldestFinishedJobsAcrossARestart) {
  const std::string dir = NewStateDir();
  configure_ = [](Coordinator::Options& options) {
    options.keep_finished_jobs = 2;
  };
  Make(std::nullopt, *JobStore::Open(dir));
  std::vector<std::string> ids = SubmitStopped(4);
  std::string queued = *coordinator_->SubmitJob(Spec(1));
  coordinator_->Sweep();
  for (int i = 0; i < 2; ++i) {
    EXPECT_TRUE(absl::IsNotFound(GetJobStatus(ids[i], false).status()))
        << ids[i];
  }
  EXPECT_EQ(Status(ids[2]).state(), v1::JOB_STATE_STOPPED);
  EXPECT_EQ(Status(ids[3]).state(), v1::JOB_STATE_STOPPED);
  EXPECT_EQ(Status(queued).state(), v1::JOB_STATE_QUEUED);  // never deleted
  coordinator_.reset();

  Make(std::nullopt, *JobStore::Open(dir));
  auto jobs = GetJobStatus("", false);
  ASSERT_TRUE(jobs.ok());
  std::vector<std::string> kept;
  for (const v1::JobStatus& job : *jobs) kept.push_back(job.job_id());
  EXPECT_THAT(kept, ::testing::ElementsAre(queued, ids[3], ids[2]));
  std::string next = *coordinator_->SubmitJob(Spec(1));
  EXPECT_EQ(next, "test-6");
}

TEST_F(BoundsTest, FinishedJobsOlderThanTheTtlAreDeleted) {
  configure_ = [](Coordinator::Options& options) {
    options.finished_job_ttl = absl::Hours(1);
  };
  Make();
  std::vector<std::string> old = SubmitStopped(2);
  clock_.Advance(absl::Minutes(40));
  std::vector<std::string> young = SubmitStopped(1);
  clock_.Advance(absl::Minutes(30));
  coordinator_->Sweep();
  for (const std::string& id : old) {
    EXPECT_TRUE(absl::IsNotFound(GetJobStatus(id, false).status()));
  }
  EXPECT_EQ(Status(young[0]).state(), v1::JOB_STATE_STOPPED);
}

TEST_F(BoundsTest, DeleteJobRefusesAnUnfinishedJobAndForgetsAFinishedOne) {
  const std::string dir = NewStateDir();
  Make(std::nullopt, *JobStore::Open(dir));
  FakeSink a;
  Connect(1, &a);
  std::string running = *coordinator_->SubmitJob(Spec(1));
  std::string queued = *coordinator_->SubmitJob(Spec(1));
  for (const std::string& id : {running, queued}) {
    absl::Status refused = coordinator_->DeleteJob(id);
    EXPECT_TRUE(absl::IsFailedPrecondition(refused)) << refused;
    EXPECT_THAT(refused.message(),
                AllOf(HasSubstr(id), HasSubstr("stop it first"),
                      HasSubstr("lockstep stop " + id)));
  }
  EXPECT_EQ(Status(running).state(), v1::JOB_STATE_RUNNING);
  ASSERT_TRUE(coordinator_->StopJob(queued).ok());
  ASSERT_TRUE(coordinator_->DeleteJob(queued).ok());
  EXPECT_TRUE(absl::IsNotFound(coordinator_->DeleteJob(queued)));
  EXPECT_TRUE(absl::IsNotFound(GetJobStatus(queued, false).status()));
  coordinator_.reset();
  Make(std::nullopt, *JobStore::Open(dir));
  EXPECT_TRUE(absl::IsNotFound(GetJobStatus(queued, false).status()));
  EXPECT_EQ(Status(running).state(), v1::JOB_STATE_RECOVERING);
}

// Free workers that went away are forgotten after --forget-workers-after;
// a static cluster's tasks stay listed.
TEST_F(BoundsTest, VanishedFreeWorkersAreForgottenAfterTheirTime) {
  configure_ = [](Coordinator::Options& options) {
    options.forget_workers_after = absl::Minutes(1);
  };
  Make();
  FakeSink stays, goes;
  std::string kept = Connect(1, &stays);
  std::string gone = Connect(2, &goes);
  coordinator_->CloseSession(gone, 2, &goes, absl::UnavailableError("exit"));
  auto listed = [this] {
    std::set<std::string> ids;
    for (const v1::WorkerInfo& info : ListWorkers()) {
      ids.insert(info.worker_id());
    }
    return ids;
  };
  for (int i = 0; i < 11; ++i) {  // 55 s: not yet
    clock_.Advance(absl::Seconds(5));
    Beat(kept, "", 0);
    coordinator_->Sweep();
  }
  EXPECT_EQ(listed(), (std::set<std::string>{kept, gone}));
  for (int i = 0; i < 2; ++i) {
    clock_.Advance(absl::Seconds(5));
    Beat(kept, "", 0);
    coordinator_->Sweep();
  }
  EXPECT_EQ(listed(), std::set<std::string>{kept});
  // The same process coming back registers as a new free worker.
  FakeSink back;
  EXPECT_NE(Connect(2, &back), kept);
  EXPECT_EQ(listed().size(), 2u);
}

TEST_F(BoundsTest, StaticClusterTasksStayListedWhenGone) {
  configure_ = [](Coordinator::Options& options) {
    options.forget_workers_after = absl::Minutes(1);
  };
  auto config = ParseTfConfig(R"({"cluster": {"worker": ["a:1", "b:1"]}})");
  ASSERT_TRUE(config.ok());
  Make(config->cluster);
  FakeSink sink;
  ConnectTask(0, 1, &sink);
  coordinator_->CloseSession("worker:0", 1, &sink,
                             absl::UnavailableError("exit"));
  clock_.Advance(absl::Hours(2));
  coordinator_->Sweep();
  ASSERT_EQ(ListWorkers().size(), 1u);
  EXPECT_EQ(ListWorkers()[0].state(), "disconnected");
}

// Issue 14: `lockstep status` failed for good ("message larger than max")
// once enough was stored. The list comes in pages that hold every job
// exactly once, newest first, even when jobs are deleted between pages.
TEST_F(BoundsTest, PagesHoldEveryJobExactlyOnce) {
  Make();
  std::vector<std::string> ids = SubmitStopped(25);
  std::vector<std::string> seen;
  std::string token;
  int pages = 0;
  do {
    auto page = coordinator_->GetJobStatus(Page(10, token));
    ASSERT_TRUE(page.ok()) << page.status();
    EXPECT_LE(page->jobs_size(), 10);
    for (const v1::JobStatus& job : page->jobs()) {
      seen.push_back(job.job_id());
      EXPECT_EQ(job.events_size(), 0);  // summaries
    }
    token = page->next_page_token();
    if (++pages == 1) {
      // A job of the next page is deleted meanwhile: nothing is repeated.
      ASSERT_TRUE(coordinator_->DeleteJob(ids[14]).ok());
    }
  } while (!token.empty() && pages < 10);
  EXPECT_EQ(pages, 3);
  std::vector<std::string> expected(ids.rbegin(), ids.rend());
  expected.erase(std::find(expected.begin(), expected.end(), ids[14]));
  EXPECT_EQ(seen, expected);
  // The default page: the newest kDefaultStatusPage.
  SubmitStopped(kDefaultStatusPage);
  auto first = coordinator_->GetJobStatus(Page(0, ""));
  ASSERT_TRUE(first.ok());
  EXPECT_EQ(first->jobs_size(), kDefaultStatusPage);
  EXPECT_FALSE(first->next_page_token().empty());
}

// A page also ends before it passes kMaxStatusPageBytes.
TEST_F(BoundsTest, APageStaysWithinItsByteBound) {
  Make();
  FakeSink a;
  std::string worker = Connect(1, &a);
  for (int i = 0; i < 40; ++i) {
    // Each job fails with a 60 kB error, the most a result may carry.
    std::string job = *coordinator_->SubmitJob(Spec(1));
    v1::WorkerMessage message;
    v1::TaskResult* result = message.mutable_result();
    result->set_job_id(job);
    result->set_generation(1);
    result->set_rank(0);
    result->set_code(static_cast<int>(absl::StatusCode::kInvalidArgument));
    result->set_error(std::string(60000, 'e'));
    ASSERT_TRUE(coordinator_->HandleWorkerMessage(worker, message).ok());
    ASSERT_EQ(Status(job).state(), v1::JOB_STATE_FAILED);
  }
  auto page = coordinator_->GetJobStatus(Page(kMaxStatusPage, ""));
  ASSERT_TRUE(page.ok());
  EXPECT_LT(page->ByteSizeLong(), kMaxStatusPageBytes);
  EXPECT_LT(page->jobs_size(), 40);
  EXPECT_FALSE(page->next_page_token().empty());
}

// Issue 14: a job named with 3 MB of text (stored before names were
// bounded) broke `lockstep status` for good. Listed, such a record comes
// without its spec and with its error cut, and it can be deleted.
TEST_F(BoundsTest, AHugeStoredRecordIsListedSmallAndCanBeDeleted) {
  const std::string dir = NewStateDir();
  {
    auto store = JobStore::Open(dir);
    ASSERT_TRUE(store.ok()) << store.status();
    v1::JobStatus huge;
    huge.set_job_id("huge-1");
    huge.set_state(v1::JOB_STATE_FAILED);
    *huge.mutable_spec() = Spec(1);
    huge.mutable_spec()->set_name(std::string(3 << 20, 'n'));
    huge.set_error(std::string(1 << 20, 'e'));
    ASSERT_TRUE((*store)->Save(huge).ok());
  }
  Make(std::nullopt, *JobStore::Open(dir));
  std::string next = *coordinator_->SubmitJob(Spec(1));
  auto page = coordinator_->GetJobStatus(Page(0, ""));
  ASSERT_TRUE(page.ok()) << page.status();
  ASSERT_EQ(page->jobs_size(), 2);
  EXPECT_EQ(page->jobs(0).job_id(), next);
  EXPECT_EQ(page->jobs(1).job_id(), "huge-1");
  EXPECT_LT(page->ByteSizeLong(), kMaxStatusPageBytes);
  ASSERT_TRUE(coordinator_->DeleteJob("huge-1").ok());
}

// A job keeps its newest kMaxEvents events, counting those dropped, and
// cuts an event's message to kMaxEventMessageBytes.
TEST_F(BoundsTest, EventsAreCappedAndCounted) {
  Make();
  FakeSink a;
  std::string id = Connect(1, &a);
  std::string job = *coordinator_->SubmitJob(Spec(1));
  for (int report = 1; report <= 20; ++report) {
    v1::WorkerMessage message;
    v1::ProgressReport* progress = message.mutable_progress();
    progress->set_job_id(job);
    progress->set_generation(1);
    progress->set_step(report);
    progress->set_first_step(report);
    for (int w = 0; w < kMaxWarningsPerReport; ++w) {
      progress->add_warnings(std::string(w == 0 ? 10000 : 10, 'w'));
    }
    ASSERT_TRUE(coordinator_->HandleWorkerMessage(id, message).ok());
  }
  v1::JobStatus status = Status(job);
  EXPECT_EQ(status.events_size(), 1000);
  // placed, generation_started and 20 x 64 warnings, of which 1000 are
  // kept.
  EXPECT_EQ(status.dropped_events(), 2 + 20 * kMaxWarningsPerReport - 1000);
  const v1::JobEvent& last_long = status.events(1000 - kMaxWarningsPerReport);
  EXPECT_LT(last_long.message().size(), 2100u);
  EXPECT_THAT(last_long.message(), HasSubstr("more bytes]"));
}

// communication.algorithm "auto": the chief's first report says what its
// generation chose and by which times; the coordinator keeps it in the plan,
// records an event, and refuses a probe out of range.
TEST_F(BoundsTest, TheAlgorithmAutoChoseIsAnEventAndItsTimesAreChecked) {
  Make();
  FakeSink a;
  std::string id = Connect(1, &a);
  std::string job = *coordinator_->SubmitJob(Spec(1));
  auto report = [&](double ring_seconds) {
    v1::WorkerMessage message;
    v1::ProgressReport* progress = message.mutable_progress();
    progress->set_job_id(job);
    progress->set_generation(1);
    progress->set_resumed_at_step(0);
    v1::TrainingPlan* plan = progress->mutable_plan();
    plan->set_replicas(3);
    plan->set_all_reduce_algorithm("ring");
    plan->mutable_algorithm_probe()->set_bytes(4 << 20);
    plan->mutable_algorithm_probe()->set_direct_seconds(0.9);
    plan->mutable_algorithm_probe()->set_ring_seconds(ring_seconds);
    return coordinator_->HandleWorkerMessage(id, message);
  };
  const absl::Status refused = report(-1);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(), HasSubstr("plan.algorithm_probe"));
  ASSERT_TRUE(report(0.6).ok());
  v1::JobStatus status = Status(job);
  EXPECT_EQ(status.plan().all_reduce_algorithm(), "ring");
  std::vector<std::string> chosen;
  for (const v1::JobEvent& event : status.events()) {
    if (event.kind() == "all_reduce_algorithm") {
      chosen.push_back(event.message());
    }
  }
  EXPECT_THAT(chosen, ::testing::ElementsAre(
                          "generation 1 all-reduces by the ring: 4.0 MiB "
                          "took 0.900 s direct, 0.600 s by the ring ("
                          "each rank's fastest try, summed over 3 ranks)"));
}

}  // namespace
}  // namespace lockstep::coordinator
