// Several jobs on one pool of workers with real processes (issue 33): jobs
// that fit run at once on disjoint workers and end with the digests they
// have alone, a job of a higher priority preempts a running one that later
// resumes with no step repeated and its uninterrupted digest, a worker
// killed in one job leaves the other untouched, and a coordinator killed
// with three jobs running brings all three back.
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/files.h"
#include "tests/integration/harness.h"

namespace lockstep::integration {
namespace {

using ::testing::HasSubstr;

// The MLP on `workers` workers with `seed`, `steps` steps of global batch 64.
std::vector<std::string> Mlp(int workers, int seed, int steps) {
  return {absl::StrCat("num_workers=", workers), absl::StrCat("seed=", seed),
          absl::StrCat("max_steps=", steps), "global_batch_size=64",
          "log_every_steps=1"};
}

class PoolTest : public ClusterTest {
 protected:
  PoolTest() { pool_ = true; }

  // The time of the first event of `kind`, or -1.
  static double FirstEventTime(const v1::JobStatus& status,
                               const std::string& kind) {
    for (const v1::JobEvent& event : status.events()) {
      if (event.kind() == kind) return event.time();
    }
    return -1;
  }

  // Waits until `count` workers have a session, so that jobs submitted
  // next start together rather than as the workers come up. The
  // coordinator offers no stream of registrations: it is asked every 50 ms.
  void WaitForWorkers(int count) {
    const absl::Time give_up = absl::Now() + absl::Seconds(60);
    int connected = 0;
    while (absl::Now() < give_up) {
      grpc::ClientContext context;
      v1::ListWorkersResponse response;
      connected = 0;
      if (stub_->ListWorkers(&context, v1::ListWorkersRequest(), &response)
              .ok()) {
        for (const v1::WorkerInfo& worker : response.workers()) {
          connected += worker.connected();
        }
      }
      if (connected >= count) return;
      usleep(50 * 1000);
    }
    FAIL() << connected << " of " << count << " workers connected in 60 s";
  }

  // The pid of the pool worker that registered as `worker_id` (its log
  // says so), of the `count` started by StartCluster; -1 if none.
  pid_t PidOf(const std::string& worker_id, int count) {
    for (int i = 0; i < count; ++i) {
      auto log = ReadFileToString(
          absl::StrCat(dir_, "/worker-", i, "-", i + 1, ".log"));
      if (log.ok() && log->find(absl::StrCat("registered as ", worker_id,
                                             ";")) != std::string::npos) {
        return worker_pids_[i];
      }
    }
    return -1;
  }
};

TEST_F(PoolTest, TwoJobsShareThePoolAndEndWithTheDigestsTheyHaveAlone) {
  StartCluster(4);
  ASSERT_NO_FATAL_FAILURE(WaitForWorkers(4));
  const std::vector<std::string> a = Mlp(2, 1, 150), b = Mlp(2, 2, 150);
  const std::string job_a = Submit(a);
  const std::string job_b = Submit(b);
  const v1::JobStatus done_a = WatchUntil(job_a, Ended);
  const v1::JobStatus done_b = WatchUntil(job_b, Ended);
  ASSERT_EQ(done_a.state(), v1::JOB_STATE_SUCCEEDED) << History(job_a);
  ASSERT_EQ(done_b.state(), v1::JOB_STATE_SUCCEEDED) << History(job_b);
  // They ran at once: each started before the other ended, on two workers
  // of its own.
  EXPECT_LT(FirstEventTime(done_b, "generation_started"),
            FirstEventTime(done_a, "job_succeeded"));
  EXPECT_LT(FirstEventTime(done_a, "generation_started"),
            FirstEventTime(done_b, "job_succeeded"));
  ASSERT_EQ(done_a.ranks_size(), 2);
  ASSERT_EQ(done_b.ranks_size(), 2);
  for (const v1::RankResult& rank : done_a.ranks()) {
    for (const v1::RankResult& other : done_b.ranks()) {
      EXPECT_NE(rank.worker_id(), other.worker_id());
    }
  }
  EXPECT_EQ(done_a.generations(), 1);
  EXPECT_EQ(done_b.generations(), 1);
  // Alone, one after the other, each trains to the same model.
  const std::string alone_a = UninterruptedDigest(a);
  const std::string alone_b = UninterruptedDigest(b);
  EXPECT_NE(alone_a, alone_b);
  ExpectAllRanks(done_a, alone_a);
  ExpectAllRanks(done_b, alone_b);
}

TEST_F(PoolTest, AWorkerKilledInOneJobLeavesTheOtherUntouched) {
  StartCluster(4);
  ASSERT_NO_FATAL_FAILURE(WaitForWorkers(4));
  const std::vector<std::string> steady = Mlp(2, 1, 200);
  const std::vector<std::string> hit = Mlp(2, 2, 200);
  const std::string job_steady = Submit(steady);
  const std::string job_hit = SubmitAndTrainTo(hit, 10);
  ASSERT_FALSE(job_hit.empty());
  const v1::JobStatus running = WatchUntil(
      job_hit, [](const v1::JobStatus& s) { return s.ranks_size() == 2; });
  const pid_t victim = PidOf(running.ranks(1).worker_id(), 4);
  ASSERT_GT(victim, 0) << running.ranks(1).worker_id();
  ASSERT_EQ(kill(victim, SIGKILL), 0);
  // As Kubernetes would, the worker's process comes back (a new one).
  const int index = static_cast<int>(
      std::find(worker_pids_.begin(), worker_pids_.end(), victim) -
      worker_pids_.begin());
  worker_pids_[index] = StartWorker(index);

  const v1::JobStatus done_hit = WatchUntil(job_hit, Ended);
  const v1::JobStatus done_steady = WatchUntil(job_steady, Ended);
  ASSERT_EQ(done_hit.state(), v1::JOB_STATE_SUCCEEDED) << History(job_hit);
  ASSERT_EQ(done_steady.state(), v1::JOB_STATE_SUCCEEDED)
      << History(job_steady);
  EXPECT_GE(done_hit.generations(), 2);
  EXPECT_NE(FindEvent(done_hit, "worker_failed"), nullptr) << History(job_hit);
  const v1::JobEvent* resumed = FindEvent(done_hit, "resumed");
  ASSERT_NE(resumed, nullptr) << History(job_hit);
  EXPECT_THAT(resumed->message(), HasSubstr("; 0 steps repeated"))
      << History(job_hit);
  // The other job never noticed: one generation, no failure, no abort.
  EXPECT_EQ(done_steady.generations(), 1) << History(job_steady);
  EXPECT_EQ(FindEvent(done_steady, "worker_failed"), nullptr);
  EXPECT_EQ(FindEvent(done_steady, "generation_failed"), nullptr);
  // And both trained to their uninterrupted models.
  ExpectAllRanks(done_hit, UninterruptedDigest(hit));
  ExpectAllRanks(done_steady, UninterruptedDigest(steady));
}

TEST_F(PoolTest, ACoordinatorKilledWithThreeJobsRunningResumesAllThree) {
  StartCluster(3);
  ASSERT_NO_FATAL_FAILURE(WaitForWorkers(3));
  std::vector<std::vector<std::string>> specs;
  std::vector<std::string> jobs;
  for (int seed = 1; seed <= 3; ++seed) {
    specs.push_back(Mlp(1, seed, 300));
    jobs.push_back(Submit(specs.back()));
  }
  for (const std::string& job : jobs) {
    WatchUntil(
        job, [](const v1::JobStatus& s) { return s.step() >= 5 || Ended(s); });
  }
  for (const std::string& job : jobs) {
    ASSERT_EQ(
        WatchUntil(job, [](const v1::JobStatus&) { return true; }).state(),
        v1::JOB_STATE_RUNNING)
        << History(job);
  }
  ASSERT_EQ(kill(coordinator_pid_, SIGKILL), 0);
  StartCoordinator(address_);

  std::vector<std::string> digests;
  for (size_t i = 0; i < jobs.size(); ++i) {
    const v1::JobStatus done = WatchUntil(jobs[i], Ended);
    ASSERT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << History(jobs[i]);
    EXPECT_GE(done.generations(), 2);
    EXPECT_NE(FindEvent(done, "coordinator_restarted"), nullptr);
    // Each re-formed on its own worker, from the live state it held.
    const v1::JobEvent* resumed = FindEvent(done, "resumed");
    ASSERT_NE(resumed, nullptr) << History(jobs[i]);
    EXPECT_THAT(resumed->message(), HasSubstr("; 0 steps repeated"))
        << History(jobs[i]);
    digests.push_back(done.ranks(0).model_digest());
  }
  for (pid_t pid : worker_pids_) EXPECT_TRUE(Alive(pid));
  for (size_t i = 0; i < jobs.size(); ++i) {
    EXPECT_EQ(digests[i], UninterruptedDigest(specs[i])) << jobs[i];
  }
}

TEST_F(PoolTest, AnUrgentJobPreemptsOneThatResumesWithNoStepRepeated) {
  // A priority above the default is an admin's (or a granted class's).
  StartCluster(2, {"--min-run-time", "0", "--admin", "operator:harness"});
  ASSERT_NO_FATAL_FAILURE(WaitForWorkers(2));
  const std::string backup = TempDir("backup");
  // The preempted job saves only the step it stops at (no periodic saves).
  std::vector<std::string> low = Mlp(2, 1, 1500);
  low.push_back("checkpoint.backup_dir=" + backup + "/low");
  std::vector<std::string> urgent = Mlp(2, 2, 40);
  urgent.push_back("priority=10");
  const std::string low_job = SubmitAndTrainTo(low, 20);
  ASSERT_FALSE(low_job.empty());

  const absl::Time submitted = absl::Now();
  const std::string urgent_job = Submit(urgent);
  const v1::JobStatus first_step = WatchUntil(
      urgent_job,
      [](const v1::JobStatus& s) { return s.step() >= 1 || Ended(s); });
  const absl::Duration round_trip = absl::Now() - submitted;
  ASSERT_EQ(first_step.state(), v1::JOB_STATE_RUNNING) << History(urgent_job);
  // The preemption round trip, for docs/BENCHMARKS.md (no threshold: the
  // machines are shared).
  std::cout << "preemption round trip (submit to the urgent job's first "
               "step): "
            << absl::ToDoubleMilliseconds(round_trip) << " ms" << std::endl;
  RecordProperty("preemption_round_trip_ms",
                 static_cast<int>(absl::ToDoubleMilliseconds(round_trip)));

  const v1::JobStatus done_urgent = WatchUntil(urgent_job, Ended);
  ASSERT_EQ(done_urgent.state(), v1::JOB_STATE_SUCCEEDED)
      << History(urgent_job);
  const v1::JobStatus done_low = WatchUntil(low_job, Ended);
  ASSERT_EQ(done_low.state(), v1::JOB_STATE_SUCCEEDED) << History(low_job);
  EXPECT_EQ(done_low.yields(), 1) << History(low_job);
  EXPECT_EQ(done_low.generations(), 2) << History(low_job);
  const v1::JobEvent* preempted = FindEvent(done_low, "preempted");
  ASSERT_NE(preempted, nullptr) << History(low_job);
  EXPECT_THAT(preempted->message(), HasSubstr("back in the queue"));
  ASSERT_NE(FindEvent(done_low, "resumed_after_preemption"), nullptr)
      << History(low_job);
  // It went on from the step it saved, on the workers the urgent job
  // freed, and lost nothing.
  const v1::JobEvent* resumed = FindEvent(done_low, "resumed");
  ASSERT_NE(resumed, nullptr) << History(low_job);
  EXPECT_THAT(resumed->message(), HasSubstr("; 0 steps repeated"))
      << History(low_job);
  const double back =
      resumed->time() - FindEvent(done_urgent, "job_succeeded")->time();
  std::cout << "resume after the urgent job ended: " << back * 1000 << " ms"
            << std::endl;
  // The urgent job ran while the other waited.
  EXPECT_LT(FindEvent(done_low, "preempted")->time(),
            FindEvent(done_urgent, "generation_started")->time() + 1e-3);
  std::vector<std::string> alone = low;
  alone.back() = "checkpoint.backup_dir=" + backup + "/alone";
  ExpectAllRanks(done_low, UninterruptedDigest(alone));
}

// An elastic job on the whole 4-worker pool shrinks to 2 workers for an
// urgent job and goes on from its first ranks' live state with no step
// repeated, to its last step. (Its model is not bitwise an uninterrupted
// run's: the world size changes mid-run, and with it the order of the
// all-reduce's sums; docs/DESIGN.md §6.)
TEST_F(PoolTest, AnElasticJobShrinksForAnUrgentOneAndLosesNothing) {
  StartCluster(4, {"--min-run-time", "0", "--admin", "operator:harness"});
  ASSERT_NO_FATAL_FAILURE(WaitForWorkers(4));
  std::vector<std::string> elastic = {
      "min_workers=2", "max_workers=4",        "seed=3",
      "max_steps=600", "global_batch_size=64", "log_every_steps=1"};
  const std::string elastic_job = SubmitAndTrainTo(elastic, 20);
  ASSERT_FALSE(elastic_job.empty());
  ASSERT_EQ(WatchUntil(elastic_job, [](const v1::JobStatus&) { return true; })
                .world_size(),
            4);
  std::vector<std::string> urgent = Mlp(2, 4, 40);
  urgent.push_back("priority=10");
  const std::string urgent_job = Submit(urgent);
  const v1::JobStatus done_urgent = WatchUntil(urgent_job, Ended);
  ASSERT_EQ(done_urgent.state(), v1::JOB_STATE_SUCCEEDED)
      << History(urgent_job);
  const v1::JobStatus done = WatchUntil(elastic_job, Ended);
  ASSERT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << History(elastic_job);
  ASSERT_NE(FindEvent(done, "shrunk"), nullptr) << History(elastic_job);
  EXPECT_EQ(done.yields(), 0);
  // Every re-formation went on from live state, nothing repeated.
  int resumes = 0;
  for (const v1::JobEvent& event : done.events()) {
    if (event.kind() != "resumed") continue;
    ++resumes;
    EXPECT_THAT(event.message(), HasSubstr("live state"))
        << History(elastic_job);
    EXPECT_THAT(event.message(), HasSubstr("; 0 steps repeated"))
        << History(elastic_job);
  }
  EXPECT_GE(resumes, 1) << History(elastic_job);
  EXPECT_EQ(done.step(), 600);
  EXPECT_EQ(done.world_size(), 2);
  ASSERT_EQ(done.ranks_size(), 2);
  ExpectAllRanks(done, done.ranks(0).model_digest());
}

// Issue 33: two operators share a 2-worker pool under `--quota
// operator:alice=1`:
// Alice queues four 1-worker jobs, then Bob two. Alice never holds two
// workers at once, Bob's first job does not wait for Alice's queue, Bob
// may stop only his own jobs, and every job succeeds.
TEST_F(PoolTest, QuotasAndOwnersHoldOverAQueueOfManyJobs) {
  StartCluster(2, {"--quota", "operator:alice=1", "--priority-class",
                   "urgent=100", "--priority-grant", "urgent=operator:bob"});
  ASSERT_NO_FATAL_FAILURE(WaitForWorkers(2));
  // The CLI's environment as operator `name`.
  auto as = [&](const std::string& name) {
    std::vector<std::string> env =
        TlsEnv(IssueTestCertificate("spiffe://lockstep/operator/" + name));
    env.push_back("LOCKSTEP_COORDINATOR=" + address_);
    return env;
  };
  // Alice's jobs are longer than the time it takes to submit them all.
  auto submit_as = [&](const std::string& name, int seed, int steps) {
    std::vector<std::string> argv = {kBin + "/lockstep", "submit", kMlp};
    for (const std::string& set : Mlp(1, seed, steps)) {
      argv.insert(argv.end(), {"--set", set});
    }
    Result submit = RunCommand(argv, as(name));
    EXPECT_EQ(submit.code, 0) << submit.err;
    return submit.out.substr(0, submit.out.find('\n'));
  };
  std::vector<std::string> alice, bob;
  for (int i = 0; i < 4; ++i) alice.push_back(submit_as("alice", 10 + i, 150));
  for (int i = 0; i < 2; ++i) bob.push_back(submit_as("bob", 20 + i, 30));

  // Bob may not stop Alice's job.
  Result refused =
      RunCommand({kBin + "/lockstep", "stop", alice.back()}, as("bob"));
  EXPECT_NE(refused.code, 0);
  EXPECT_THAT(refused.err, HasSubstr("belongs to operator:alice"));
  // Nor may Alice take a priority that was not granted to her (issue 52);
  // the queue says who may use which.
  Result taken = RunCommand(
      {kBin + "/lockstep", "submit", kMlp, "--set", "priority_class=urgent"},
      as("alice"));
  EXPECT_NE(taken.code, 0);
  EXPECT_THAT(taken.err, AllOf(HasSubstr("operator:alice may not use "
                                         "priority_class \"urgent\""),
                               HasSubstr("operator:bob")));
  Result queue = RunCommand({kBin + "/lockstep", "queue"}, as("alice"));
  EXPECT_EQ(queue.code, 0) << queue.err;
  EXPECT_THAT(queue.out,
              HasSubstr("priority classes: urgent=100 (operator:bob); admins "
                        "(any priority): none; starvation bound: a job that "
                        "has waited 12h in all is promoted to priority 100"));

  struct Span {
    double start, end;
  };
  auto span_of = [&](const std::string& job) {
    const v1::JobStatus done = WatchUntil(job, Ended);
    EXPECT_EQ(done.state(), v1::JOB_STATE_SUCCEEDED) << History(job);
    return Span{FirstEventTime(done, "generation_started"),
                FirstEventTime(done, "job_succeeded")};
  };
  std::vector<Span> alices, bobs;
  for (const std::string& job : alice) alices.push_back(span_of(job));
  for (const std::string& job : bob) bobs.push_back(span_of(job));
  for (const std::string& job : alice) {
    EXPECT_EQ(WatchUntil(job, Ended).owner(), "operator:alice");
  }
  // Alice's jobs ran one after another: her quota is one worker.
  for (size_t i = 0; i < alices.size(); ++i) {
    for (size_t j = i + 1; j < alices.size(); ++j) {
      EXPECT_TRUE(alices[i].end <= alices[j].start ||
                  alices[j].end <= alices[i].start)
          << alice[i] << " and " << alice[j] << " overlapped";
    }
  }
  // Bob's first job started while Alice still had jobs queued.
  EXPECT_LT(bobs[0].start, alices.back().start);
}

}  // namespace
}  // namespace lockstep::integration
