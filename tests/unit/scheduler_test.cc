// The pool scheduler's rules on snapshots (coordinator/scheduler.h): gang
// fit, backfill, placement, priority order, owner fairness, quotas,
// preemption of the fewest and lowest jobs, the minimum run time, and the
// FIFO and one-at-a-time baselines the simulation compares against, and
// the reservation from time limits (EASY backfill).
#include "coordinator/scheduler.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace lockstep::coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

const absl::Time kNow = absl::FromUnixSeconds(1'000'000);

std::vector<PoolWorker> Pool(int n, bool free = true) {
  std::vector<PoolWorker> pool(n);
  for (int i = 0; i < n; ++i) {
    pool[i].id = "free:" + std::to_string(i);
    pool[i].device = "cpu";
    pool[i].free = free;
  }
  return pool;
}

QueuedJob Queued(const std::string& id, int64_t seq, int size, int priority = 0,
                 const std::string& owner = "operator:alice") {
  QueuedJob job;
  job.id = id;
  job.seq = seq;
  job.size = size;
  job.most = size;
  job.priority = priority;
  job.owner = owner;
  return job;
}

// A running job on pool workers `workers` (marked busy), started `ran` ago.
RunningJob Running(std::vector<PoolWorker>& pool, const std::string& id,
                   int64_t seq, std::vector<int> workers, int priority = 0,
                   absl::Duration ran = absl::Hours(1),
                   const std::string& owner = "operator:bob") {
  RunningJob job;
  job.id = id;
  job.seq = seq;
  job.priority = priority;
  job.owner = owner;
  job.workers = workers;
  job.started = kNow - ran;
  job.can_yield = true;
  for (int i : workers) pool[i].free = false;
  return job;
}

// A plan and the queue it was made for (its entries name jobs by index).
struct Planned : SchedulingPlan {
  std::vector<QueuedJob> queued;
};

Planned PlanFor(const Scheduler& scheduler, const std::vector<PoolWorker>& pool,
                std::vector<QueuedJob> queued,
                const std::vector<RunningJob>& running, absl::Time now) {
  Planned planned;
  static_cast<SchedulingPlan&>(planned) =
      scheduler.Plan(pool, queued, running, now);
  planned.queued = std::move(queued);
  return planned;
}

std::vector<std::string> Started(const SchedulingPlan& plan) {
  std::vector<std::string> ids;
  for (const auto& start : plan.starts) ids.push_back(start.job_id);
  return ids;
}

std::vector<std::string> Preempted(const SchedulingPlan& plan) {
  std::vector<std::string> ids;
  for (const auto& preemption : plan.preemptions) {
    ids.push_back(preemption.job_id + "->" + preemption.for_job);
  }
  return ids;
}

const QueueEntry* WaitOf(const Planned& plan, const std::string& id) {
  for (const QueueEntry& entry : plan.waiting) {
    if (plan.queued[entry.job].id == id) return &entry;
  }
  return nullptr;
}

TEST(SchedulerTest, JobsThatFitStartAndOneThatDoesNotWaitsWithoutBlocking) {
  Scheduler scheduler({});
  Planned plan = PlanFor(
      scheduler, Pool(4),
      {Queued("a", 1, 2), Queued("big", 2, 4), Queued("c", 3, 2)}, {}, kNow);
  EXPECT_THAT(Started(plan), ElementsAre("a", "c"));
  EXPECT_THAT(plan.starts[0].workers, ElementsAre(0, 1));
  EXPECT_THAT(plan.starts[1].workers, ElementsAre(2, 3));
  const QueueEntry* big = WaitOf(plan, "big");
  ASSERT_NE(big, nullptr);
  // It would have fitted in the pool as it was: jobs ahead took it.
  EXPECT_EQ(big->reason, WaitReason::kPriority);
  EXPECT_EQ(big->needed, 4);
}

TEST(SchedulerTest, PlacementPicksOnlyMatchingWorkers) {
  std::vector<PoolWorker> pool = Pool(4);
  pool[1].labels["zone"] = "a";
  pool[3].labels["zone"] = "a";
  pool[3].device = "cuda";
  QueuedJob zone_a = Queued("zone-a", 1, 2);
  zone_a.placement.labels = {{"zone", "a"}};
  QueuedJob gpus = Queued("gpus", 2, 2);
  gpus.placement.device = "cuda";
  Planned plan = PlanFor(Scheduler({}), pool, {zone_a, gpus}, {}, kNow);
  ASSERT_THAT(Started(plan), ElementsAre("zone-a"));
  EXPECT_THAT(plan.starts[0].workers, ElementsAre(1, 3));
  const QueueEntry* waits = WaitOf(plan, "gpus");
  ASSERT_NE(waits, nullptr);
  EXPECT_EQ(waits->reason, WaitReason::kNoFit);
  EXPECT_EQ(waits->free_matching, 0);
  EXPECT_EQ(QueueMessage(*waits),
            "needs 2 workers; 0 free workers match its placement");
}

// A job that may run anywhere leaves the GPU workers to the jobs that
// need them.
TEST(SchedulerTest, AJobWithoutPlacementTakesCpuWorkersFirst) {
  std::vector<PoolWorker> pool = Pool(4);
  pool[0].device = pool[1].device = "cuda";
  QueuedJob anywhere = Queued("anywhere", 1, 2);
  QueuedJob gpus = Queued("gpus", 2, 2);
  gpus.placement.device = "cuda";
  Planned plan = PlanFor(Scheduler({}), pool, {anywhere, gpus}, {}, kNow);
  ASSERT_THAT(Started(plan), ElementsAre("anywhere", "gpus"));
  EXPECT_THAT(plan.starts[0].workers, ElementsAre(2, 3));
  EXPECT_THAT(plan.starts[1].workers, ElementsAre(0, 1));
  // With only GPU workers free, it takes them.
  plan = PlanFor(Scheduler({}), pool, {Queued("wide", 1, 3)}, {}, kNow);
  EXPECT_THAT(plan.starts[0].workers, ElementsAre(0, 2, 3));
}

TEST(SchedulerTest, SparesNeverTakeAFirstStartAndElasticJobsGrow) {
  std::vector<PoolWorker> pool = Pool(4);
  pool[3].spare = true;
  QueuedJob elastic = Queued("elastic", 1, 1);
  elastic.most = 8;
  Planned plan = PlanFor(Scheduler({}), pool, {elastic}, {}, kNow);
  ASSERT_THAT(Started(plan), ElementsAre("elastic"));
  EXPECT_THAT(plan.starts[0].workers, ElementsAre(0, 1, 2));
}

TEST(SchedulerTest, AJobOfTheWholePoolWaitsForAnEmptyPool) {
  std::vector<PoolWorker> pool = Pool(4);
  RunningJob running = Running(pool, "r", 1, {0});
  Planned plan =
      PlanFor(Scheduler({}), pool, {Queued("all", 2, 0)}, {running}, kNow);
  EXPECT_THAT(plan.starts, IsEmpty());
  EXPECT_EQ(WaitOf(plan, "all")->reason, WaitReason::kWholePool);
  plan = PlanFor(Scheduler({}), Pool(4), {Queued("all", 2, 0)}, {}, kNow);
  ASSERT_THAT(Started(plan), ElementsAre("all"));
  EXPECT_EQ(plan.starts[0].workers.size(), 4u);
}

TEST(SchedulerTest, HigherPriorityStartsFirst) {
  Planned plan =
      PlanFor(Scheduler({}), Pool(2),
              {Queued("low", 1, 2, 0), Queued("high", 2, 2, 10)}, {}, kNow);
  EXPECT_THAT(Started(plan), ElementsAre("high"));
  EXPECT_EQ(WaitOf(plan, "low")->position, 1);
}

TEST(SchedulerTest, AmongEqualPrioritiesTheOwnerHoldingFewerWorkersGoesFirst) {
  // Alice queued first and more, but Bob holds nothing: the free workers
  // alternate between them instead of all going to Alice.
  std::vector<QueuedJob> queued;
  for (int i = 0; i < 4; ++i) {
    queued.push_back(
        Queued("alice-" + std::to_string(i), 1 + i, 1, 0, "operator:alice"));
  }
  queued.push_back(Queued("bob-0", 10, 1, 0, "operator:bob"));
  queued.push_back(Queued("bob-1", 11, 1, 0, "operator:bob"));
  Planned plan = PlanFor(Scheduler({}), Pool(4), queued, {}, kNow);
  EXPECT_THAT(Started(plan),
              ElementsAre("alice-0", "bob-0", "alice-1", "bob-1"));
}

TEST(SchedulerTest, AQuotaCapsTheWorkersOneOwnerHolds) {
  SchedulerPolicy policy;
  policy.quotas["operator:alice"] = 3;
  std::vector<PoolWorker> pool = Pool(8);
  RunningJob running =
      Running(pool, "alice-run", 1, {0}, 0, absl::Hours(1), "operator:alice");
  Planned plan = PlanFor(Scheduler(policy), pool,
                         {Queued("alice-a", 2, 2), Queued("alice-b", 3, 1),
                          Queued("bob", 4, 2, 0, "operator:bob")},
                         {running}, kNow);
  EXPECT_THAT(Started(plan), ElementsAre("bob", "alice-a"));
  const QueueEntry* waits = WaitOf(plan, "alice-b");
  ASSERT_NE(waits, nullptr);
  EXPECT_EQ(waits->reason, WaitReason::kQuota);
  EXPECT_EQ(waits->owner_holds, 3);
  EXPECT_EQ(QueueMessage(*waits),
            "needs 1 worker; its owner holds 3 of a quota of 3");
}

TEST(SchedulerTest, AQuotaAlsoCapsHowFarAnElasticJobGrows) {
  SchedulerPolicy policy;
  policy.quotas["operator:alice"] = 3;
  QueuedJob elastic = Queued("elastic", 1, 2);
  elastic.most = 8;
  Planned plan = PlanFor(Scheduler(policy), Pool(8), {elastic}, {}, kNow);
  ASSERT_THAT(Started(plan), ElementsAre("elastic"));
  EXPECT_EQ(plan.starts[0].workers.size(), 3u);
}

// Issue 52: what a job waits for from a preemption counts against its
// owner's quota, so a second urgent job of the same owner preempts nobody
// for workers its owner could not use.
TEST(SchedulerTest, PreemptingCountsAgainstThePreemptorsQuota) {
  SchedulerPolicy policy;
  policy.quotas["operator:alice"] = 2;
  std::vector<PoolWorker> pool = Pool(4);
  std::vector<RunningJob> running = {Running(pool, "low-1", 1, {0, 1}),
                                     Running(pool, "low-2", 2, {2, 3})};
  Planned plan =
      PlanFor(Scheduler(policy), pool,
              {Queued("urgent-1", 3, 2, 10), Queued("urgent-2", 4, 2, 10)},
              running, kNow);
  EXPECT_THAT(Preempted(plan), ElementsAre("low-1->urgent-1"));
  EXPECT_EQ(WaitOf(plan, "urgent-2")->reason, WaitReason::kQuota);
}

// Issue 52 (simulation seed 479): the workers a preemption released stay
// promised to its preemptor in later passes; an equal job that comes first
// by owner fairness does not take them.
TEST(SchedulerTest, WorkersPromisedToAJobAreTakenOnlyByIt) {
  std::vector<PoolWorker> pool = Pool(5);
  RunningJob carols =
      Running(pool, "carol-run", 1, {4}, 0, absl::Hours(1), "operator:carol");
  carols.can_yield = false;
  for (int i = 0; i < 4; ++i) pool[i].promised_to = "urgent";
  Planned plan = PlanFor(Scheduler({}), pool,
                         {Queued("urgent", 2, 4, 10, "operator:carol"),
                          Queued("bobs", 3, 3, 10, "operator:bob")},
                         {carols}, kNow);
  EXPECT_THAT(Started(plan), ElementsAre("urgent"));
  EXPECT_EQ(WaitOf(plan, "bobs")->reason, WaitReason::kNoFit);

  // A job of a higher priority than the promisee may take them.
  Planned higher = PlanFor(Scheduler({}), pool,
                           {Queued("urgent", 2, 4, 10, "operator:carol"),
                            Queued("higher", 3, 4, 20, "operator:bob")},
                           {carols}, kNow);
  EXPECT_THAT(Started(higher), ElementsAre("higher"));

  // Once its promisee is gone from the queue, a promise means nothing.
  Planned after =
      PlanFor(Scheduler({}), pool, {Queued("bobs", 3, 3, 10, "operator:bob")},
              {carols}, kNow);
  EXPECT_THAT(Started(after), ElementsAre("bobs"));
}

// Issue 52 (simulation seed 1478): a job of a higher priority may take the
// workers promised to a lower one, but those it does not take (it waits on
// its quota here) stay promised: a later job of the promisee's priority,
// whose owner's turn comes first, does not get them.
TEST(SchedulerTest, PromisedWorkersAHigherJobLeavesStayPromised) {
  SchedulerPolicy policy;
  policy.quotas["operator:dave"] = 1;
  std::vector<PoolWorker> pool = Pool(3);
  RunningJob yielding =
      Running(pool, "yielding", 1, {2}, 0, absl::Hours(1), "operator:carol");
  yielding.yielding = true;
  yielding.yielding_for = "promisee";
  pool[0].promised_to = pool[1].promised_to = "promisee";
  Planned plan = PlanFor(Scheduler(policy), pool,
                         {Queued("promisee", 13, 3, 5, "operator:carol"),
                          Queued("higher", 16, 2, 10, "operator:dave"),
                          Queued("later", 20, 1, 5, "operator:bob")},
                         {yielding}, kNow);
  EXPECT_EQ(WaitOf(plan, "higher")->reason, WaitReason::kQuota);
  EXPECT_EQ(WaitOf(plan, "promisee")->reason, WaitReason::kPreempting);
  EXPECT_EQ(WaitOf(plan, "later")->reason, WaitReason::kNoFit);
  EXPECT_THAT(plan.starts, IsEmpty());
}

// Issue 52: workers released to a job that cannot start yet because other
// released workers are away (one failed while its job yielded, or the
// coordinator restarted) stay its while the promise outlasts the wait;
// otherwise a promisee that neither starts nor preempts leaves them to the
// jobs after it.
TEST(SchedulerTest, APromiseThatOutlastsTheWaitKeepsTheWorkersBack) {
  std::vector<PoolWorker> pool = Pool(2);
  for (PoolWorker& worker : pool) worker.promised_to = "urgent";
  const std::vector<QueuedJob> queued = {Queued("urgent", 2, 3, 10),
                                         Queued("small", 3, 1)};
  Planned loose = PlanFor(Scheduler({}), pool, queued, {}, kNow);
  EXPECT_EQ(WaitOf(loose, "urgent")->reason, WaitReason::kNoFit);
  EXPECT_THAT(Started(loose), ElementsAre("small"));
  EXPECT_THAT(loose.holds, IsEmpty());

  for (PoolWorker& worker : pool) worker.promise_outlasts_wait = true;
  Planned kept = PlanFor(Scheduler({}), pool, queued, {}, kNow);
  EXPECT_EQ(WaitOf(kept, "urgent")->reason, WaitReason::kNoFit);
  EXPECT_EQ(WaitOf(kept, "small")->reason, WaitReason::kNoFit);
  EXPECT_THAT(kept.starts, IsEmpty());
  ASSERT_EQ(kept.holds.size(), 1u);
  EXPECT_EQ(kept.holds[0].job_id, "urgent");
  EXPECT_THAT(kept.holds[0].workers, ElementsAre(0, 1));
}

// A recovering job whose workers are not connected (a coordinator restart)
// is still charged its group.
TEST(SchedulerTest, ARecoveringJobIsChargedItsWholeGroup) {
  SchedulerPolicy policy;
  policy.quotas["operator:alice"] = 3;
  std::vector<PoolWorker> pool = Pool(4);
  RunningJob recovering =
      Running(pool, "recovering", 1, {}, 0, absl::Hours(1), "operator:alice");
  recovering.holds = 2;
  recovering.can_yield = false;
  Planned plan = PlanFor(Scheduler(policy), pool, {Queued("more", 2, 2)},
                         {recovering}, kNow);
  EXPECT_THAT(plan.starts, IsEmpty());
  EXPECT_EQ(WaitOf(plan, "more")->reason, WaitReason::kQuota);
}

TEST(SchedulerTest, PreemptsTheFewestAndLowestJobs) {
  std::vector<PoolWorker> pool = Pool(8);
  std::vector<RunningJob> running = {
      Running(pool, "p5-small", 1, {0}, 5),
      Running(pool, "p1-big", 2, {1, 2, 3}, 1),
      Running(pool, "p1-small", 3, {4}, 1),
      Running(pool, "p0-small", 4, {5}, 0),
      Running(pool, "p9", 5, {6, 7}, 9),
  };
  // Needs 4: the lowest first (p0-small, then the p1 jobs); p0-small alone
  // with p1-small is not enough, and once p1-big is in, p1-small is not
  // needed. p5 and p9 are never touched.
  Planned plan =
      PlanFor(Scheduler({}), pool, {Queued("urgent", 9, 4, 8)}, running, kNow);
  EXPECT_THAT(plan.starts, IsEmpty());
  EXPECT_THAT(Preempted(plan),
              ElementsAre("p0-small->urgent", "p1-big->urgent"));
  const QueueEntry* waits = WaitOf(plan, "urgent");
  EXPECT_EQ(waits->reason, WaitReason::kPreempting);
  EXPECT_THAT(waits->preempts, ElementsAre("p0-small", "p1-big"));
}

TEST(SchedulerTest, AnElasticJobShrinksInsteadOfStoppingWhenThatIsEnough) {
  std::vector<PoolWorker> pool = Pool(6);
  std::vector<RunningJob> running = {
      Running(pool, "elastic", 1, {0, 1, 2, 3}, 0),
      Running(pool, "fixed", 2, {4, 5}, 0)};
  running[0].can_shrink = true;
  running[0].min_workers = 2;
  running[0].started += absl::Seconds(1);  // the newer: considered first
  // Needs 2: the elastic job gives up its last two ranks and keeps its
  // first two; the other job runs on.
  Planned plan =
      PlanFor(Scheduler({}), pool, {Queued("urgent", 3, 2, 10)}, running, kNow);
  ASSERT_EQ(plan.preemptions.size(), 1u);
  EXPECT_EQ(plan.preemptions[0].job_id, "elastic");
  EXPECT_EQ(plan.preemptions[0].keep, 2);
  // Needs 4: shrinking frees only 2, so a job that can stop stops whole.
  plan =
      PlanFor(Scheduler({}), pool, {Queued("bigger", 3, 4, 10)}, running, kNow);
  EXPECT_THAT(Preempted(plan), ElementsAre("elastic->bigger"));
  EXPECT_EQ(plan.preemptions[0].keep, 0);
  // One that saves no checkpoints can only shrink, to its min_workers.
  running[0].can_yield = false;
  plan =
      PlanFor(Scheduler({}), pool, {Queued("bigger", 3, 4, 10)}, running, kNow);
  ASSERT_EQ(plan.preemptions.size(), 2u);
  EXPECT_EQ(plan.preemptions[0].job_id, "elastic");
  EXPECT_EQ(plan.preemptions[0].keep, 2);
  EXPECT_EQ(plan.preemptions[1].job_id, "fixed");
  EXPECT_EQ(plan.preemptions[1].keep, 0);

  // While it shrinks, only the ranks it gives up are counted as coming
  // free.
  running[0].yielding = true;
  running[0].yielding_for = "urgent";
  running[0].keeps = 2;
  running[0].can_shrink = false;
  running[1].can_yield = false;
  plan =
      PlanFor(Scheduler({}), pool, {Queued("urgent", 3, 4, 10)}, running, kNow);
  EXPECT_THAT(plan.preemptions, IsEmpty());
  EXPECT_EQ(WaitOf(plan, "urgent")->reason, WaitReason::kNoFit);
  plan =
      PlanFor(Scheduler({}), pool, {Queued("urgent", 3, 2, 10)}, running, kNow);
  EXPECT_EQ(WaitOf(plan, "urgent")->reason, WaitReason::kPreempting);
}

TEST(SchedulerTest, NeverPreemptsEqualOrHigherPriorityOrJobsThatCannotYield) {
  std::vector<PoolWorker> pool = Pool(4);
  std::vector<RunningJob> running = {Running(pool, "same", 1, {0, 1}, 5),
                                     Running(pool, "nockpt", 2, {2, 3}, 0)};
  running[1].can_yield = false;  // it saves no checkpoints
  Planned plan =
      PlanFor(Scheduler({}), pool, {Queued("q", 3, 2, 5)}, running, kNow);
  EXPECT_THAT(plan.preemptions, IsEmpty());
  EXPECT_EQ(WaitOf(plan, "q")->reason, WaitReason::kNoFit);
}

TEST(SchedulerTest, FreeWorkersAreHeldForAJobWaitingOnAPreemption) {
  std::vector<PoolWorker> pool = Pool(4);
  std::vector<RunningJob> running = {Running(pool, "low", 1, {0, 1}, 0)};
  // Workers 2 and 3 are free; urgent needs 4: it preempts "low" and holds 2
  // and 3, so the small job behind it does not take them.
  Planned plan = PlanFor(Scheduler({}), pool,
                         {Queued("urgent", 2, 4, 10), Queued("small", 3, 1, 0)},
                         running, kNow);
  EXPECT_THAT(Preempted(plan), ElementsAre("low->urgent"));
  EXPECT_THAT(plan.starts, IsEmpty());
  EXPECT_EQ(WaitOf(plan, "small")->reason, WaitReason::kPriority);

  // The next pass, while "low" stops: nothing is preempted again.
  running[0].can_yield = false;
  running[0].yielding = true;
  running[0].yielding_for = "urgent";
  plan = PlanFor(Scheduler({}), pool,
                 {Queued("urgent", 2, 4, 10), Queued("small", 3, 1, 0)},
                 running, kNow);
  EXPECT_THAT(plan.preemptions, IsEmpty());
  EXPECT_THAT(plan.starts, IsEmpty());
  EXPECT_EQ(WaitOf(plan, "urgent")->reason, WaitReason::kPreempting);
  EXPECT_THAT(WaitOf(plan, "urgent")->preempts, ElementsAre("low"));
}

TEST(SchedulerTest, AJobIsNotPreemptedBeforeItRanTheMinimumRunTime) {
  SchedulerPolicy policy;
  policy.min_run_time = absl::Minutes(10);
  std::vector<PoolWorker> pool = Pool(2);
  std::vector<RunningJob> running = {
      Running(pool, "young", 1, {0, 1}, 0, absl::Minutes(3))};
  Planned plan = PlanFor(Scheduler(policy), pool, {Queued("urgent", 2, 2, 10)},
                         running, kNow);
  EXPECT_THAT(plan.preemptions, IsEmpty());
  const QueueEntry* waits = WaitOf(plan, "urgent");
  EXPECT_EQ(waits->reason, WaitReason::kMinRunTime);
  EXPECT_THAT(waits->preempts, ElementsAre("young"));

  plan = PlanFor(Scheduler(policy), pool, {Queued("urgent", 2, 2, 10)}, running,
                 kNow + absl::Minutes(7));
  EXPECT_THAT(Preempted(plan), ElementsAre("young->urgent"));
}

TEST(SchedulerTest, AnAgedJobPreemptsItsEqualsThatPassedIt) {
  SchedulerPolicy policy;
  policy.age_after = absl::Hours(4);
  std::vector<PoolWorker> pool = Pool(4);
  // Two small jobs of its priority run: one submitted before the big job,
  // one after (it passed the big one by backfill).
  std::vector<RunningJob> running = {Running(pool, "earlier", 1, {0, 1}, 0),
                                     Running(pool, "passed", 3, {2, 3}, 0)};
  QueuedJob big = Queued("big", 2, 2, 0);
  big.queued_at = kNow - absl::Hours(3);
  Planned plan = PlanFor(Scheduler(policy), pool, {big}, running, kNow);
  EXPECT_THAT(plan.preemptions, IsEmpty());
  EXPECT_EQ(WaitOf(plan, "big")->reason, WaitReason::kNoFit);
  big.queued_at = kNow - absl::Hours(4);
  plan = PlanFor(Scheduler(policy), pool, {big}, running, kNow);
  EXPECT_THAT(Preempted(plan), ElementsAre("passed->big"));
}

TEST(SchedulerTest, PreemptionCountsOnlyWorkersMatchingThePlacement) {
  std::vector<PoolWorker> pool = Pool(4);
  pool[2].device = pool[3].device = "cuda";
  std::vector<RunningJob> running = {Running(pool, "cpu-job", 1, {0, 1}, 0),
                                     Running(pool, "gpu-job", 2, {2, 3}, 0)};
  QueuedJob gpus = Queued("gpus", 3, 2, 10);
  gpus.placement.device = "cuda";
  Planned plan = PlanFor(Scheduler({}), pool, {gpus}, running, kNow);
  EXPECT_THAT(Preempted(plan), ElementsAre("gpu-job->gpus"));
}

TEST(SchedulerTest, FifoLetsNothingPassTheHead) {
  SchedulerPolicy policy;
  policy.order = SchedulerPolicy::Order::kFifo;
  Planned plan = PlanFor(
      Scheduler(policy), Pool(4),
      {Queued("a", 1, 2), Queued("big", 2, 4), Queued("c", 3, 2)}, {}, kNow);
  EXPECT_THAT(Started(plan), ElementsAre("a"));
  EXPECT_EQ(WaitOf(plan, "c")->reason, WaitReason::kPriority);
}

TEST(SchedulerTest, OneAtATimeRunsASingleJob) {
  SchedulerPolicy policy;
  policy.order = SchedulerPolicy::Order::kOneAtATime;
  Planned plan = PlanFor(Scheduler(policy), Pool(4),
                         {Queued("a", 1, 2), Queued("b", 2, 2)}, {}, kNow);
  EXPECT_THAT(Started(plan), ElementsAre("a"));
  std::vector<PoolWorker> pool = Pool(4);
  RunningJob running = Running(pool, "r", 1, {0});
  plan = PlanFor(Scheduler(policy), pool, {Queued("b", 2, 1)}, {running}, kNow);
  EXPECT_THAT(plan.starts, IsEmpty());
}

// ---- the reservation (EASY backfill, issue 52) ----

// A job running on `workers` until `ends`.
RunningJob Ending(std::vector<PoolWorker>& pool, const std::string& id,
                  int64_t seq, std::vector<int> workers, absl::Time ends,
                  int priority = 0) {
  RunningJob job = Running(pool, id, seq, std::move(workers), priority);
  job.ends = ends;
  return job;
}

QueuedJob Limited(QueuedJob job, absl::Duration limit) {
  job.time_limit = limit;
  return job;
}

TEST(SchedulerTest, ABigJobReservesWorkersThatOnlyJobsEndingFirstMayUse) {
  std::vector<PoolWorker> pool = Pool(8);
  std::vector<RunningJob> running = {
      Ending(pool, "r", 1, {0, 1, 2, 3}, kNow + absl::Hours(2))};
  Planned plan = PlanFor(
      Scheduler({}), pool,
      {Queued("big", 2, 8), Limited(Queued("short", 3, 2), absl::Hours(1)),
       Limited(Queued("long", 4, 2), absl::Hours(3)), Queued("open", 5, 2)},
      running, kNow);
  EXPECT_THAT(Started(plan), ElementsAre("short"));
  const QueueEntry* big = WaitOf(plan, "big");
  ASSERT_NE(big, nullptr);
  EXPECT_EQ(big->reason, WaitReason::kNoFit);
  EXPECT_EQ(big->reservation, "big");
  EXPECT_EQ(big->reserved_start, kNow + absl::Hours(2));
  EXPECT_THAT(QueueMessage(*big),
              HasSubstr("it holds the reservation: it starts by "
                        "1970-01-12 15:46:40 UTC at the latest"));
  for (const char* id : {"long", "open"}) {
    const QueueEntry* entry = WaitOf(plan, id);
    ASSERT_NE(entry, nullptr) << id;
    EXPECT_EQ(entry->reason, WaitReason::kReserved) << id;
    EXPECT_EQ(entry->reservation, "big") << id;
  }
  ASSERT_EQ(plan.reservations.size(), 1u);
  EXPECT_EQ(plan.reservations[0].workers.size(), 2u);  // 4 free, 2 to short

  // Without the reservation (the scheduler before it), the small jobs
  // take every free worker and the big one waits for as long as they run.
  SchedulerPolicy policy;
  policy.reserve = false;
  plan = PlanFor(
      Scheduler(policy), pool,
      {Queued("big", 2, 8), Limited(Queued("short", 3, 2), absl::Hours(1)),
       Limited(Queued("long", 4, 2), absl::Hours(3))},
      running, kNow);
  EXPECT_THAT(Started(plan), ElementsAre("short", "long"));
}

TEST(SchedulerTest, NoReservationWithoutTheRunningJobsTimeLimits) {
  std::vector<PoolWorker> pool = Pool(8);
  std::vector<RunningJob> running = {Running(pool, "r", 1, {0, 1, 2, 3})};
  Planned plan =
      PlanFor(Scheduler({}), pool, {Queued("big", 2, 8), Queued("small", 3, 2)},
              running, kNow);
  EXPECT_THAT(Started(plan), ElementsAre("small"));
  EXPECT_THAT(plan.reservations, IsEmpty());
  EXPECT_EQ(WaitOf(plan, "big")->reservation, "");
}

TEST(SchedulerTest, TheJobThatHeldTheReservationKeepsItOnceItFits) {
  // alice holds more workers than bob: bob's job would go first.
  std::vector<PoolWorker> pool = Pool(8);
  std::vector<RunningJob> running = {Running(pool, "alices", 1, {4, 5, 6, 7}, 0,
                                             absl::Hours(1), "operator:alice")};
  QueuedJob old = Queued("old", 2, 4, 0, "operator:alice");
  QueuedJob young = Queued("young", 3, 4, 0, "operator:bob");
  Planned plan = PlanFor(Scheduler({}), pool, {old, young}, running, kNow);
  EXPECT_THAT(Started(plan), ElementsAre("young"));

  old.reserved = true;
  plan = PlanFor(Scheduler({}), pool, {old, young}, running, kNow);
  EXPECT_THAT(Started(plan), ElementsAre("old"));
  EXPECT_EQ(WaitOf(plan, "young")->reason, WaitReason::kReserved);
}

TEST(SchedulerTest, AWholePoolJobReservesEveryFreeWorker) {
  std::vector<PoolWorker> pool = Pool(4);
  std::vector<RunningJob> running = {
      Ending(pool, "r", 1, {0, 1}, kNow + absl::Hours(1))};
  Planned plan = PlanFor(
      Scheduler({}), pool,
      {Queued("whole", 2, 0), Limited(Queued("short", 3, 1), absl::Minutes(30)),
       Limited(Queued("long", 4, 1), absl::Hours(2))},
      running, kNow);
  EXPECT_THAT(Started(plan), ElementsAre("short"));
  EXPECT_EQ(WaitOf(plan, "whole")->reason, WaitReason::kWholePool);
  EXPECT_EQ(WaitOf(plan, "whole")->reserved_start, kNow + absl::Hours(1));
  EXPECT_EQ(WaitOf(plan, "long")->reason, WaitReason::kReserved);
}

TEST(SchedulerTest, NoJobPreemptsTheJobsAReservationCountsOn) {
  // "big" cannot preempt its equal "r"; the aged job could (r was
  // submitted after it), but big's reservation counts on r's end.
  SchedulerPolicy policy;
  policy.age_after = absl::Hours(1);
  std::vector<PoolWorker> pool = Pool(4);
  std::vector<RunningJob> running = {
      Ending(pool, "r", 9, {0, 1}, kNow + absl::Hours(1))};
  QueuedJob big = Queued("big", 1, 4);
  big.queued_at = kNow;
  QueuedJob aged = Queued("aged", 2, 4);
  aged.queued_at = kNow - absl::Hours(2);
  Planned plan = PlanFor(Scheduler(policy), pool, {big, aged}, running, kNow);
  EXPECT_THAT(plan.preemptions, IsEmpty());
  EXPECT_EQ(WaitOf(plan, "big")->reservation, "big");

  // One that ends before big starts may.
  aged.time_limit = absl::Minutes(30);
  plan = PlanFor(Scheduler(policy), pool, {big, aged}, running, kNow);
  EXPECT_THAT(Preempted(plan), ElementsAre("r->aged"));
}

// The starvation bound promotes a job below the top priority once its
// waits add up to the bound; without one, or at the top, never.
TEST(SchedulerTest, AJobStarvesAtTheBoundBelowTheTopPriority) {
  SchedulerPolicy policy;
  policy.top_priority = 100;
  EXPECT_FALSE(Starved(policy, 0, absl::Hours(24 * 365)));  // no bound
  policy.starvation_bound = absl::Hours(12);
  EXPECT_FALSE(Starved(policy, 0, absl::Hours(12) - absl::Seconds(1)));
  EXPECT_TRUE(Starved(policy, 0, absl::Hours(12)));
  EXPECT_TRUE(Starved(policy, -10, absl::Hours(13)));
  EXPECT_FALSE(Starved(policy, 100, absl::Hours(13)));   // at the top
  EXPECT_FALSE(Starved(policy, 1000, absl::Hours(13)));  // an admin's
}

}  // namespace
}  // namespace lockstep::coordinator
