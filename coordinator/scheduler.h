// The scheduler of a shared pool of workers (docs/DESIGN.md §2, "Several
// jobs on one pool"): which queued jobs start now and on which workers,
// which running jobs are preempted to make room for a job of a higher
// priority, and why every other queued job waits.
//
// It is a pure function of a snapshot: the Coordinator builds the snapshot
// under its lock and carries the plan out (coordinator.cc); the scheduling
// simulation (bench/scheduling_sim.cc) drives the same code on a simulated
// pool. It knows nothing of generations, sessions or the store.
//
// The rules, in the order Plan applies them:
//   - Gang: a job starts with its whole group (num_workers, or min_workers
//     for an elastic job, which then grows up to max_workers) or not at
//     all. A job of the whole pool (no num_workers) starts only on a pool
//     where no other job runs. Spares are never given to a first start.
//   - Placement: only workers whose device kind and labels match. A job
//     that names no device takes CPU workers first, leaving GPU workers to
//     the jobs that need them.
//   - Order: higher priority first; among equal priorities, the owner whose
//     running jobs hold fewer workers first (so nobody starves the others
//     by queueing many jobs); then submission order. A job that does not
//     fit waits without holding back a later one that does (backfill).
//   - Reservation (EASY backfill, as Slurm's): of the highest priority with
//     a job that can neither start on the free workers nor preempt, the job
//     that has waited longest gets the reservation when the time limits of
//     the running jobs say when enough workers come free (its start at the
//     latest). The free workers it will need then are held for it; a job
//     may take them only if its own time limit ends before that start, and
//     may not preempt the jobs whose ends the reservation counts on. It
//     keeps the reservation until it starts (QueuedJob.reserved), so no job
//     of its priority takes the workers when they come free. So small jobs
//     cannot pass a large one for ever. Without time limits (a running
//     job's end unknown) there is no reservation: holding workers for an
//     unknown time would leave them idle for as long as the others run.
//   - Starvation bound (applied by the caller to the snapshot, Starved):
//     a job that has waited starvation_bound is promoted to top_priority
//     for good. Ahead of every class, it gets the reservation first; no
//     job of a class passes it or, once it runs, preempts it. So even a
//     steady stream of jobs of a higher class cannot keep a large job of a
//     lower one waiting for ever.
//   - Aging: a job that has waited age_after may preempt running jobs of
//     its own priority submitted after it (those that passed it).
//   - Quotas: an owner's running jobs hold at most its quota of workers;
//     a job waiting for a preemption counts as holding the workers it
//     waits for, so an owner cannot preempt beyond its quota.
//   - Preemption: a job that does not fit preempts running jobs of a lower
//     priority (or, aged, of its own) that can stop and resume without loss
//     (they save checkpoints), the lowest priorities first and as few as
//     needed, and only jobs that have run at least min_run_time since they last
//     started. An elastic job above its min_workers shrinks instead when
//     that frees enough (or when it cannot stop): it gives up its last
//     ranks and goes on with the first ones, whose live state it keeps.
//     The workers it waits for are held for it meanwhile, across passes
//     (PoolWorker.promised_to): no job of its priority or lower takes them
//     while it is queued, and one of a higher priority leaves those it
//     does not take promised.
//
// Thread-compatible; Plan is const.
#ifndef LOCKSTEP_COORDINATOR_SCHEDULER_H_
#define LOCKSTEP_COORDINATOR_SCHEDULER_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/time/time.h"

namespace lockstep::coordinator {

// Which workers a job may run on (v1::Placement): every label must match;
// an empty device kind matches any.
struct Placement {
  std::string device;  // "", "cpu", "cuda"
  std::vector<std::pair<std::string, std::string>> labels;
  bool empty() const { return device.empty() && labels.empty(); }
};

// One connected worker as the scheduler sees it.
struct PoolWorker {
  std::string id;
  std::string device;  // "cpu" or "cuda"
  std::map<std::string, std::string> labels;
  bool spare = false;
  // Idle, not leaving, and not kept for a recovering job.
  bool free = false;
  // A queued job it was promised to (a preemption released it, or a pass
  // held it for that job): only that job may take it while it is queued.
  std::string promised_to;
  // The promise holds even while that job cannot start: the other workers
  // released to it may still come back (one failed while its job yielded,
  // or the coordinator restarted). Otherwise a promisee that neither starts
  // nor preempts leaves the worker to the jobs after it.
  bool promise_outlasts_wait = false;
};

bool Matches(const Placement& placement, const PoolWorker& worker);

struct QueuedJob {
  std::string id;
  int64_t seq = 0;  // submission order
  int priority = 0;
  std::string owner;
  // Workers it needs at least; 0: the whole pool (any number, at least
  // one, with no other job running).
  int size = 0;
  // Workers it takes at most when more are free (elastic); = size else.
  int most = 0;
  Placement placement;
  // When it last entered the queue (submitted, or preempted).
  absl::Time queued_at = absl::InfinitePast();
  // The most it runs once started (what is left of its time limit);
  // infinite: no limit.
  absl::Duration time_limit = absl::InfiniteDuration();
  // It held the reservation in the previous pass: it keeps it until it
  // starts, also once it fits (SchedulingPlan.reservations).
  bool reserved = false;
};

struct RunningJob {
  std::string id;
  int64_t seq = 0;
  int priority = 0;
  std::string owner;
  // Its workers, as indices into the pool, in rank order.
  std::vector<int> workers;
  // Workers charged to its owner's quota when more than `workers` holds:
  // its whole group, some of whose workers may have reported already or
  // be gone (a recovering job).
  int holds = 0;
  // When its current generation started.
  absl::Time started;
  // When its time limit stops it at the latest; infinite future: no limit.
  absl::Time ends = absl::InfiniteFuture();
  // It can stop at an agreed step and resume from it (it saves
  // checkpoints, it is RUNNING, no stop is under way).
  bool can_yield = false;
  // An elastic job above its min_workers (RUNNING, no stop under way): it
  // can shrink, keeping its first ranks and their live state.
  bool can_shrink = false;
  int min_workers = 0;
  // A preemption of it is under way: its workers come free soon (all, or
  // those past its first `keeps` when it shrinks), and they are promised
  // to `yielding_for`.
  bool yielding = false;
  std::string yielding_for;
  int keeps = 0;
};

struct SchedulerPolicy {
  enum class Order {
    // The rules above.
    kPriority,
    // Submission order, no priorities, no preemption, no backfill: the head
    // of the queue starts when its group is free, and nothing passes it.
    kFifo,
    // One job at a time on the pool, in submission order (the coordinator
    // before several jobs could share it).
    kOneAtATime,
  };
  Order order = Order::kPriority;
  // Most workers one owner's running jobs may hold; owners not named have
  // none.
  std::map<std::string, int> quotas;
  // A job is not preempted before it has run this long since it last
  // started.
  absl::Duration min_run_time = absl::Minutes(1);
  // A job that has waited this long may preempt running jobs of its own
  // priority submitted after it; infinite (the default): never.
  absl::Duration age_after = absl::InfiniteDuration();
  // The first job that waits for workers gets a reservation from the
  // running jobs' time limits (EASY backfill); false: none (before issue
  // 52, and the simulation's reference).
  bool reserve = true;
  // The starvation bound: a job that has waited this long in the queue,
  // over all its times there (a preempted job's earlier waits count), is
  // promoted to top_priority for the rest of its life (Starved; the caller
  // changes its priority, which the coordinator stores). Infinite: never.
  absl::Duration starvation_bound = absl::InfiniteDuration();
  // The priority a starved job is promoted to: the highest the pool's
  // classes give, so that no job of a class can pass it or preempt it,
  // and it gets the reservation before any of them. (A raw priority
  // above it, for admins only, still comes first.)
  int top_priority = 0;
};

// Whether a job of `priority` that has waited `waited` in the queue in all
// has reached the policy's starvation bound, to be promoted to
// policy.top_priority (docs/DESIGN.md, "The starvation bound").
bool Starved(const SchedulerPolicy& policy, int priority,
             absl::Duration waited);

// Why a queued job waits.
enum class WaitReason {
  kNoFit,       // not enough free workers that match
  kQuota,       // its owner's quota is used
  kPriority,    // it would fit, but jobs ahead of it took the workers
  kPreempting,  // the jobs it preempted are stopping
  kMinRunTime,  // the jobs it could preempt have not run min_run_time
  kWholePool,   // a job of the whole pool waits for an empty pool
  kReserved,    // it would fit, but the free workers are reserved for an
                // earlier job and its time limit ends after that job starts
};

// "no_fit", "quota", ... (QueuePosition.reason).
const char* WaitReasonName(WaitReason reason);

struct QueueEntry {
  size_t job = 0;        // index into the `queued` given to Plan
  int64_t position = 0;  // 1: the first waiting job considered
  WaitReason reason = WaitReason::kNoFit;
  int needed = 0;         // workers it needs
  int free_matching = 0;  // free workers matching its placement
  int owner_holds = 0;    // workers its owner's running jobs hold
  int quota = -1;         // its owner's quota, -1: none
  // The running jobs it preempts (kPreempting) or would (kMinRunTime).
  std::vector<std::string> preempts;
  // The job holding the reservation (itself when it holds it; kReserved:
  // the earlier job), and when that job starts at the latest.
  std::string reservation;
  absl::Time reserved_start = absl::InfiniteFuture();
  int reserved_workers = 0;  // free workers held for it now
};

// The reason in words, with its numbers.
std::string QueueMessage(const QueueEntry& entry);

struct SchedulingPlan {
  struct Start {
    std::string job_id;
    std::vector<int> workers;  // indices into the pool, in rank order
  };
  struct Preemption {
    std::string job_id;   // the running job to stop
    std::string for_job;  // the queued job it makes room for
    // > 0: the job shrinks to its first `keep` ranks instead of stopping.
    int keep = 0;
  };
  // Free workers held for a job waiting for a preemption, or (promised to
  // it, promise_outlasts_wait) for workers to come back: they stay its
  // (PoolWorker.promised_to) until it starts or leaves the queue.
  struct Hold {
    std::string job_id;
    std::vector<int> workers;  // indices into the pool
  };
  std::vector<Start> starts;
  std::vector<Preemption> preemptions;
  std::vector<Hold> holds;
  // The reservation of this pass, if any: the job, when it starts at the
  // latest, and the free workers held for it until then (a job that ends
  // before may use them).
  struct Reservation {
    std::string job_id;
    absl::Time start = absl::InfiniteFuture();
    std::vector<int> workers;  // indices into the pool
  };
  std::vector<Reservation> reservations;  // at most one
  // Every queued job that does not start, in the order considered.
  std::vector<QueueEntry> waiting;
};

class Scheduler {
 public:
  explicit Scheduler(SchedulerPolicy policy) : policy_(std::move(policy)) {}

  const SchedulerPolicy& policy() const { return policy_; }

  // `queued` in any order; `running` are the jobs holding workers (a
  // recovering job's workers are simply not free).
  SchedulingPlan Plan(const std::vector<PoolWorker>& pool,
                      const std::vector<QueuedJob>& queued,
                      const std::vector<RunningJob>& running,
                      absl::Time now) const;

 private:
  const SchedulerPolicy policy_;
};

}  // namespace lockstep::coordinator

#endif  // LOCKSTEP_COORDINATOR_SCHEDULER_H_
