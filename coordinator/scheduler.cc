// The pool scheduler's one pass (scheduler.h has the rules).
#include "coordinator/scheduler.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <queue>
#include <tuple>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace lockstep::coordinator {

bool Matches(const Placement& placement, const PoolWorker& worker) {
  if (!placement.device.empty() && placement.device != worker.device) {
    return false;
  }
  for (const auto& [key, value] : placement.labels) {
    auto it = worker.labels.find(key);
    if (it == worker.labels.end() || it->second != value) return false;
  }
  return true;
}

bool Starved(const SchedulerPolicy& policy, int priority,
             absl::Duration waited) {
  return policy.starvation_bound != absl::InfiniteDuration() &&
         priority < policy.top_priority && waited >= policy.starvation_bound;
}

const char* WaitReasonName(WaitReason reason) {
  switch (reason) {
    case WaitReason::kNoFit:
      return "no_fit";
    case WaitReason::kQuota:
      return "quota";
    case WaitReason::kPriority:
      return "priority";
    case WaitReason::kPreempting:
      return "preempting";
    case WaitReason::kMinRunTime:
      return "min_run_time";
    case WaitReason::kWholePool:
      return "whole_pool";
    case WaitReason::kReserved:
      return "reserved";
  }
  return "unknown";
}

namespace {

std::string When(absl::Time t) {
  return absl::FormatTime("%Y-%m-%d %H:%M:%S UTC", t, absl::UTCTimeZone());
}

// What a job holding the reservation is told.
std::string Reserved(const QueueEntry& entry) {
  return absl::StrCat(
      "; it holds the reservation: it starts by ", When(entry.reserved_start),
      " at the latest, when the running jobs' time limits "
      "free enough workers (",
      entry.reserved_workers, " free ones are held for it meanwhile)");
}

}  // namespace

std::string QueueMessage(const QueueEntry& entry) {
  const bool holds_reservation =
      entry.reason != WaitReason::kReserved && !entry.reservation.empty();
  const std::string workers = entry.needed == 0 ? std::string("the whole pool")
                              : entry.needed == 1
                                  ? std::string("1 worker")
                                  : absl::StrCat(entry.needed, " workers");
  switch (entry.reason) {
    case WaitReason::kNoFit:
      return absl::StrCat("needs ", workers, "; ", entry.free_matching,
                          " free workers match its placement",
                          holds_reservation ? Reserved(entry) : "");
    case WaitReason::kQuota:
      return absl::StrCat("needs ", workers, "; its owner holds ",
                          entry.owner_holds, " of a quota of ", entry.quota);
    case WaitReason::kPriority:
      return absl::StrCat("needs ", workers,
                          "; jobs ahead of it (of a higher priority, of an "
                          "owner holding fewer workers, or submitted earlier) "
                          "come first",
                          holds_reservation ? Reserved(entry) : "");
    case WaitReason::kPreempting:
      return absl::StrCat("needs ", workers, "; waiting for ",
                          absl::StrJoin(entry.preempts, ", "),
                          " to stop at an agreed step and save it");
    case WaitReason::kMinRunTime:
      return absl::StrCat("needs ", workers, "; would preempt ",
                          absl::StrJoin(entry.preempts, ", "),
                          " once they have run the minimum run time");
    case WaitReason::kWholePool:
      return absl::StrCat(
          "runs on the whole pool: waits until no other job runs",
          holds_reservation ? Reserved(entry) : "");
    case WaitReason::kReserved:
      return absl::StrCat(
          "needs ", workers, "; the free workers are reserved for ",
          entry.reservation, ", which starts by ", When(entry.reserved_start),
          " at the latest, and this job could run past then (its time limit "
          "is later, or it has none)");
  }
  return "";
}

namespace {

// One call of Plan: the pool's free workers as they are given out.
class Pass {
 public:
  Pass(const SchedulerPolicy& policy, const std::vector<PoolWorker>& pool,
       const std::vector<QueuedJob>& queued,
       const std::vector<RunningJob>& running, absl::Time now,
       SchedulingPlan& plan)
      : policy_(policy),
        pool_(pool),
        queued_(queued),
        running_(running),
        now_(now),
        plan_(plan),
        promised_(pool.size(), 0),
        victim_(running.size(), 0),
        counted_on_(running.size(), 0) {
    absl::flat_hash_map<std::string, size_t> promisees;
    for (const PoolWorker& worker : pool) {
      if (!worker.promised_to.empty()) promisees[worker.promised_to] = SIZE_MAX;
    }
    if (!promisees.empty()) {
      for (size_t q = 0; q < queued.size(); ++q) {
        if (auto it = promisees.find(queued[q].id); it != promisees.end()) {
          it->second = q;
        }
      }
    }
    for (size_t i = 0; i < pool.size(); ++i) {
      if (!pool[i].free || pool[i].spare) continue;
      // A worker promised to a queued job waits for that job's turn.
      auto promisee = pool[i].promised_to.empty()
                          ? promisees.end()
                          : promisees.find(pool[i].promised_to);
      if (promisee != promisees.end() && promisee->second != SIZE_MAX) {
        promised_free_[promisee->second].push_back(static_cast<int>(i));
      } else {
        free_.push_back(static_cast<int>(i));
      }
    }
    initial_free_ = free_;
    absl::flat_hash_map<std::string, size_t> queued_ids;
    for (const RunningJob& job : running) {
      if (job.yielding) queued_ids[job.yielding_for] = SIZE_MAX;
    }
    if (!queued_ids.empty()) {
      for (size_t i = 0; i < queued.size(); ++i) {
        if (auto it = queued_ids.find(queued[i].id); it != queued_ids.end()) {
          it->second = i;
        }
      }
    }
    for (size_t r = 0; r < running.size(); ++r) {
      const RunningJob& job = running[r];
      held_[job.owner] +=
          std::max(static_cast<int>(job.workers.size()), job.holds);
      if (job.yielding) {
        // Workers already promised: to the queued job they were freed for,
        // or to whoever needs them when that job is gone.
        yielding_.push_back({r, queued_ids[job.yielding_for]});
        yielding_workers_ += static_cast<int>(job.workers.size());
      } else if (job.can_yield || job.can_shrink) {
        candidates_.push_back(r);
        yieldable_[job.priority] += static_cast<int>(job.workers.size());
      }
    }
    // The lowest priorities first; among equals, the most recently started
    // (it has had the least of its turn).
    std::sort(candidates_.begin(), candidates_.end(), [&](size_t a, size_t b) {
      const RunningJob& x = running[a];
      const RunningJob& y = running[b];
      return std::tuple(x.priority, y.started, x.seq) <
             std::tuple(y.priority, x.started, y.seq);
    });
  }

  // Considers queued job `q`, whose owner holds `holds` workers; true when
  // it starts.
  bool Consider(size_t q, int holds) {
    // The reservation is made before the first job of its holder's
    // priority takes workers, from the free workers no one was promised
    // (issue 52, simulation seed 319: made after this job's promised
    // workers had joined the free ones, it took them from it).
    while (target_ != SIZE_MAX && reservation_ == SIZE_MAX &&
           queued_[q].priority <= queued_[target_].priority) {
      Reserve();
    }
    // Its turn: the workers promised to it are free for it (and, if it
    // does not keep them, for the jobs after it). A job of a higher
    // priority than a promisee may take that promisee's workers too, but
    // those it does not take stay the promisee's (issue 52, simulation seed
    // 1478: a job of a higher priority waiting on its quota let a later job
    // of the promisee's priority take them).
    std::vector<int> kept_waiting;
    std::vector<std::pair<size_t, int>> borrowed;
    if (!promised_free_.empty()) {
      bool released = false;
      for (auto it = promised_free_.begin(); it != promised_free_.end();) {
        const bool own = it->first == q;
        if (!own && queued_[it->first].priority >= queued_[q].priority) {
          ++it;
          continue;
        }
        for (int i : it->second) {
          if (!own) {
            borrowed.push_back({it->first, i});
          } else if (pool_[i].promise_outlasts_wait) {
            kept_waiting.push_back(i);
          }
        }
        free_.insert(free_.end(), it->second.begin(), it->second.end());
        promised_free_.erase(it++);
        released = true;
      }
      if (released) std::sort(free_.begin(), free_.end());
    }
    const bool holder = reservation_ == q;
    ends_before_reservation_ =
        reservation_ != SIZE_MAX &&
        (holder || now_ + queued_[q].time_limit <= reserved_start_);
    // The holder may use the workers held for it, and so may a job whose
    // time limit ends before the holder starts: they join the free ones
    // for its decision (only when they could make a difference: most jobs
    // of a long queue fit neither way), and those it does not take are
    // held again.
    std::vector<int> reserved;
    if (ends_before_reservation_ && !reserved_free_.empty()) {
      const QueuedJob& job = queued_[q];
      const int could = CountMatching(job.placement, free_) +
                        CountMatching(job.placement, reserved_free_);
      if (job.size == 0 || could >= job.size || MightPreempt(job, could)) {
        reserved = std::move(reserved_free_);
        reserved_free_.clear();
        std::vector<int> merged;
        merged.reserve(free_.size() + reserved.size());
        std::merge(free_.begin(), free_.end(), reserved.begin(), reserved.end(),
                   std::back_inserter(merged));
        free_ = std::move(merged);
      }
    }
    const size_t waiting = plan_.waiting.size();
    const bool started = Decide(q, holds, kept_waiting);
    if (!reserved.empty()) {
      std::set_intersection(reserved.begin(), reserved.end(), free_.begin(),
                            free_.end(), std::back_inserter(reserved_free_));
      Take(reserved_free_);
    }
    if (holder) {
      // It keeps the reservation while it waits for workers to come free.
      const bool waits_for_workers =
          !started && (plan_.waiting[waiting].reason == WaitReason::kNoFit ||
                       plan_.waiting[waiting].reason == WaitReason::kPriority ||
                       plan_.waiting[waiting].reason == WaitReason::kWholePool);
      if (waits_for_workers) {
        QueueEntry& entry = plan_.waiting[waiting];
        entry.reservation = queued_[q].id;
        entry.reserved_start = reserved_start_;
        reservation_entry_ = waiting;
      } else {
        // It started, or it preempts or waits for something else: the
        // jobs after it are free of the reservation.
        free_.insert(free_.end(), reserved_free_.begin(), reserved_free_.end());
        std::sort(free_.begin(), free_.end());
        reserved_free_.clear();
        std::fill(counted_on_.begin(), counted_on_.end(), 0);
        reservation_ = SIZE_MAX;
        NextTarget();
      }
    }
    std::vector<int> returned;
    for (const auto& [promisee, i] : borrowed) {
      if (std::binary_search(free_.begin(), free_.end(), i)) {
        promised_free_[promisee].push_back(i);
        returned.push_back(i);
      }
    }
    if (!returned.empty()) {
      std::sort(returned.begin(), returned.end());
      Take(returned);
    }
    return started;
  }

  // Consider's decision for job `q` once the workers it may take are in
  // free_; `kept_waiting`: those promised to it that it keeps while it
  // waits for the others to come back.
  bool Decide(size_t q, int holds, const std::vector<int>& kept_waiting) {
    const QueuedJob& job = queued_[q];
    QueueEntry entry;
    entry.job = q;
    entry.needed = job.size;
    entry.owner_holds = holds;
    if (auto it = policy_.quotas.find(job.owner); it != policy_.quotas.end()) {
      entry.quota = it->second;
    }
    if (entry.quota >= 0 &&
        entry.owner_holds + std::max(job.size, 1) > entry.quota) {
      return Wait(entry, WaitReason::kQuota);
    }
    // Counted without a copy: most jobs of a long queue do not fit.
    entry.free_matching = CountMatching(job.placement, free_);
    if (job.size == 0) {
      if (!running_.empty() || started_any_) {
        return Wait(entry, WaitReason::kWholePool);
      }
      if (entry.free_matching == 0) return Wait(entry, WaitReason::kNoFit);
      std::vector<int> matching = FreeMatching(job.placement, free_);
      if (entry.quota >= 0) {
        matching.resize(std::min<size_t>(
            matching.size(),
            static_cast<size_t>(entry.quota - entry.owner_holds)));
      }
      return Start(q, std::move(matching));
    }
    if (entry.free_matching >= job.size) {
      std::vector<int> matching = FreeMatching(job.placement, free_);
      int take = std::max(job.size, std::min<int>(job.most, matching.size()));
      if (entry.quota >= 0) {
        take =
            std::max(job.size, std::min(take, entry.quota - entry.owner_holds));
      }
      if (job.placement.device.empty() &&
          take < static_cast<int>(matching.size())) {
        // A job that may run anywhere takes CPU workers first: the GPU
        // workers stay for the jobs that need them (issue 52: in the
        // simulation, jobs without placement held the GPUs while urgent
        // GPU jobs waited hours).
        std::stable_partition(matching.begin(), matching.end(),
                              [&](int i) { return pool_[i].device == "cpu"; });
        matching.resize(take);
        std::sort(matching.begin(), matching.end());
      } else {
        matching.resize(take);
      }
      return Start(q, std::move(matching));
    }
    if (policy_.order == SchedulerPolicy::Order::kPriority &&
        MightPreempt(job, entry.free_matching) && TryPreemption(q, entry)) {
      return false;
    }
    const int at_start = CountMatching(job.placement, initial_free_);
    WaitReason reason =
        at_start >= job.size ? WaitReason::kPriority : WaitReason::kNoFit;
    if (reason == WaitReason::kNoFit && !kept_waiting.empty()) {
      // Its released workers that are back wait for the others.
      Take(kept_waiting);
      plan_.holds.push_back({job.id, kept_waiting});
      return Wait(entry, reason);
    }
    if (reservation_ != SIZE_MAX && !ends_before_reservation_ &&
        entry.free_matching + CountMatching(job.placement, reserved_free_) >=
            job.size) {
      entry.reservation = queued_[reservation_].id;
      entry.reserved_start = reserved_start_;
      return Wait(entry, WaitReason::kReserved);
    }
    return Wait(entry, reason);
  }

  // The head of a FIFO queue did not start: everything behind it waits.
  void Blocked(size_t q) {
    QueueEntry entry;
    entry.job = q;
    entry.needed = queued_[q].size;
    entry.owner_holds = Holds(queued_[q].owner);
    Wait(entry, WaitReason::kPriority);
  }

  // Workers the owner's jobs hold, running and started in this pass.
  int Holds(const std::string& owner) const {
    auto it = held_.find(owner);
    return it == held_.end() ? 0 : it->second;
  }

 private:
  int CountMatching(const Placement& placement,
                    const std::vector<int>& among) const {
    if (placement.empty()) return static_cast<int>(among.size());
    int n = 0;
    for (int i : among) n += Matches(placement, pool_[i]);
    return n;
  }

  bool Aged(const QueuedJob& job) const {
    // (A job whose queued_at is unknown is not aged when aging is off.)
    return policy_.age_after != absl::InfiniteDuration() &&
           now_ - job.queued_at >= policy_.age_after;
  }

  // A bound that ignores placement and the minimum run time: whether the
  // free workers, those of yielding jobs and those of the jobs it may
  // preempt could be enough. Most jobs of a long queue fail it at once.
  bool MightPreempt(const QueuedJob& job, int free_matching) const {
    int64_t could = free_matching + yielding_workers_;
    for (const auto& [priority, workers] : yieldable_) {
      if (priority > job.priority || (priority == job.priority && !Aged(job))) {
        break;
      }
      could += workers;
    }
    return could >= job.size;
  }

  std::vector<int> FreeMatching(const Placement& placement,
                                const std::vector<int>& among) const {
    if (placement.empty()) return among;
    std::vector<int> matching;
    for (int i : among) {
      if (Matches(placement, pool_[i])) matching.push_back(i);
    }
    return matching;
  }

  bool Start(size_t q, std::vector<int> workers) {
    const QueuedJob& job = queued_[q];
    held_[job.owner] += static_cast<int>(workers.size());
    Take(workers);
    started_any_ = true;
    started_.push_back({now_ + job.time_limit, workers});
    plan_.starts.push_back({job.id, std::move(workers)});
    return true;
  }

  bool Wait(QueueEntry& entry, WaitReason reason) {
    entry.reason = reason;
    entry.position = ++position_;
    plan_.waiting.push_back(std::move(entry));
    return false;
  }

  // Removes `workers` (sorted by pool index, as free_ is) from the free ones.
  void Take(const std::vector<int>& workers) {
    std::vector<int> rest;
    rest.reserve(free_.size());
    std::set_difference(free_.begin(), free_.end(), workers.begin(),
                        workers.end(), std::back_inserter(rest));
    free_ = std::move(rest);
  }

  // Of the job's workers from rank `from` on (those it would give up), the
  // ones not promised yet that match `placement`.
  int MatchingWorkersOf(const RunningJob& job, const Placement& placement,
                        int from = 0) const {
    int n = 0;
    for (size_t k = from; k < job.workers.size(); ++k) {
      const int i = job.workers[k];
      if (!promised_[i] && Matches(placement, pool_[i])) ++n;
    }
    return n;
  }

  // The workers a yielding job releases: all, or those past what it keeps.
  int Released(const RunningJob& job, const Placement& placement) const {
    return MatchingWorkersOf(job, placement, job.yielding ? job.keeps : 0);
  }

  void Promise(const RunningJob& job, int from = 0) {
    for (size_t k = from; k < job.workers.size(); ++k) {
      promised_[job.workers[k]] = 1;
    }
  }

  // ---- the reservation (EASY backfill) ----
 public:
  // Chooses the job each priority may reserve workers for (EASY backfill,
  // with the longest wait first rather than the queue's head, so that no
  // owner's turn passes it for ever): of the jobs that cannot start on the
  // free workers nor preempt, the one that has waited longest. The pass
  // makes one reservation: for the highest priority's, or, when that job
  // starts or preempts after all, for the next one's. Called once, before
  // any job is considered.
  void ChooseReservation(
      const std::map<int, std::vector<size_t>, std::greater<int>>& levels) {
    if (!policy_.reserve) return;
    for (const auto& [priority, level] : levels) {
      size_t target = SIZE_MAX;
      // The workers of the jobs it may preempt: of lower priorities, and
      // of its own once aged. (Not MightPreempt's bound: the workers of
      // yielding jobs go to the jobs they yield for.)
      int lower = 0;
      int equal = 0;
      for (const auto& [other, workers] : yieldable_) {
        if (other > priority) break;
        (other < priority ? lower : equal) += workers;
      }
      for (size_t q : level) {
        const QueuedJob& job = queued_[q];
        if (!policy_.quotas.empty()) {
          auto quota = policy_.quotas.find(job.owner);
          if (quota != policy_.quotas.end() &&
              Holds(job.owner) + std::max(job.size, 1) > quota->second) {
            continue;
          }
        }
        const int free_matching = CountMatching(job.placement, free_);
        const int could =
            free_matching + lower + (equal > 0 && Aged(job) ? equal : 0);
        const bool blocked =
            job.size == 0 ? !running_.empty() : could < job.size;
        const bool preempts =
            job.size > 0 && free_matching < job.size && could >= job.size;
        if (job.reserved && !preempts) {
          target = q;  // it keeps the reservation it held, also once it fits
          break;
        }
        if (!blocked) continue;
        if (target == SIZE_MAX || job.seq < queued_[target].seq) target = q;
      }
      if (target != SIZE_MAX) targets_.push_back(target);
    }
    if (!targets_.empty()) target_ = targets_.front();
  }

  // The reservation in the plan, with the free workers still held for it
  // once every job was considered (jobs ending before its start may have
  // taken some). Called once, last.
  void FinishReservation() {
    if (reservation_entry_ == SIZE_MAX) return;
    plan_.waiting[reservation_entry_].reserved_workers =
        static_cast<int>(reserved_free_.size());
    plan_.reservations.push_back(
        {queued_[reservation_].id, reserved_start_, reserved_free_});
  }

 private:
  void NextTarget() {
    target_ =
        ++next_target_ < targets_.size() ? targets_[next_target_] : SIZE_MAX;
  }

  // The reservation for target_: the earliest time the time limits of the
  // jobs holding workers free enough of them for it (for a job of the
  // whole pool: all of them). The free workers it needs then, beyond those
  // of the jobs ending by that time, are held for it; those jobs may not
  // be preempted by a job that would outlast it.
  void Reserve() {
    const QueuedJob& job = queued_[target_];
    // When a job ends, the matching workers it gives, and its index in
    // running_ (SIZE_MAX: started in this pass).
    struct Ending {
      absl::Time at;
      int gives;
      size_t r;
    };
    std::vector<Ending> endings;
    for (size_t r = 0; r < running_.size(); ++r) {
      const RunningJob& other = running_[r];
      // A yielding job's workers, and those of a victim of this pass, go
      // to the job they were preempted for.
      if (other.yielding || victim_[r]) continue;
      const int gives =
          job.size == 0 ? 1 : MatchingWorkersOf(other, job.placement);
      if (gives > 0) endings.push_back({other.ends, gives, r});
    }
    for (const auto& [ends, workers] : started_) {
      const int gives =
          job.size == 0 ? 1 : CountMatching(job.placement, workers);
      if (gives > 0) endings.push_back({ends, gives, SIZE_MAX});
    }
    std::sort(endings.begin(), endings.end(),
              [](const Ending& a, const Ending& b) { return a.at < b.at; });
    absl::Time start = absl::InfiniteFuture();
    int needed = 0;
    size_t counted = endings.size();
    if (job.size == 0) {
      // Every other job ends first; all free workers wait for it.
      if (!endings.empty()) start = endings.back().at;
      needed = static_cast<int>(free_.size());
    } else {
      const int have = CountMatching(job.placement, free_);
      int gained = 0;
      if (have >= job.size) {
        start = now_;  // it fits now: it starts in its turn
        counted = 0;
      }
      for (size_t k = 0; k < endings.size() && have < job.size; ++k) {
        if (endings[k].at == absl::InfiniteFuture()) break;
        gained += endings[k].gives;
        if (have + gained < job.size) continue;
        start = endings[k].at;
        // The jobs ending at that same time give theirs too.
        while (k + 1 < endings.size() && endings[k + 1].at == start) {
          gained += endings[++k].gives;
        }
        counted = k + 1;
        break;
      }
      needed = std::max(0, job.size - gained);
    }
    if (start == absl::InfiniteFuture()) {
      NextTarget();  // no end known: nothing to reserve by
      return;
    }
    for (size_t k = 0; k < counted; ++k) {
      if (endings[k].r != SIZE_MAX) counted_on_[endings[k].r] = 1;
    }
    std::vector<int> held =
        job.size == 0 ? free_ : FreeMatching(job.placement, free_);
    held.resize(std::min<size_t>(held.size(), needed));
    Take(held);
    reservation_ = target_;
    reserved_start_ = start;
    reserved_free_ = std::move(held);
  }

  // ---- preemption ----
  // A running job asked to give workers to the job being considered: all
  // of them (keep 0), or its ranks from `keep` on when it shrinks.
  struct Victim {
    size_t r;  // index into running_
    int keep;
    int gives;  // workers it frees that match the job's placement
  };
  // What a preemption for one job would take.
  struct Victims {
    std::vector<size_t> yielding;  // jobs already yielding to it (or anyone)
    std::vector<Victim> chosen;    // jobs to ask now
    std::vector<size_t> young;     // jobs it would ask once they have run
                                   // min_run_time
    int gained = 0;                // workers of `yielding` and `chosen`
    int young_gain = 0;            // workers of `young`
  };

  // Job `q` does not fit in the free workers: it waits for the workers of
  // jobs already yielding to it, or preempts more. Returns whether it
  // waits for a preemption (entry recorded).
  bool TryPreemption(size_t q, QueueEntry& entry) {
    const QueuedJob& job = queued_[q];
    std::vector<int> matching = FreeMatching(job.placement, free_);
    const int need = job.size - static_cast<int>(matching.size());
    Victims victims = AlreadyYielding(q);
    if (victims.gained < need) {
      ChooseVictims(job, need, victims);
      if (victims.gained < need) {
        if (victims.gained + victims.young_gain < need) return false;
        for (size_t r : victims.yielding) {
          entry.preempts.push_back(running_[r].id);
        }
        for (const Victim& v : victims.chosen) {
          entry.preempts.push_back(running_[v.r].id);
        }
        for (size_t r : victims.young) entry.preempts.push_back(running_[r].id);
        Wait(entry, WaitReason::kMinRunTime);
        return true;
      }
      DropUnneeded(need, victims);
    }
    Preempt(job, victims, entry);
    // The free workers it counts on are held for it, and what it waits for
    // counts against its owner's quota (issue 52).
    matching.resize(std::min<size_t>(
        matching.size(),
        static_cast<size_t>(std::max(0, job.size - victims.gained))));
    Take(matching);
    if (!matching.empty()) plan_.holds.push_back({job.id, matching});
    held_[job.owner] += job.size;
    Wait(entry, WaitReason::kPreempting);
    return true;
  }

  // The jobs already yielding whose workers go to queued job `q` (to it,
  // or to whoever needs them) and match its placement.
  Victims AlreadyYielding(size_t q) const {
    Victims victims;
    for (const auto& [r, for_queued] : yielding_) {
      if (for_queued != q && for_queued != SIZE_MAX) continue;
      const int n = Released(running_[r], queued_[q].placement);
      if (n == 0) continue;
      victims.gained += n;
      victims.yielding.push_back(r);
    }
    return victims;
  }

  // Adds victims in candidates_ order (the lowest priority first) until
  // they free `need` workers: jobs of a lower priority, or of its own
  // submitted after it once `job` is aged; not the jobs a reservation
  // counts on (unless `job` ends before it starts); those that have not
  // run min_run_time go to `young`.
  void ChooseVictims(const QueuedJob& job, int need, Victims& victims) const {
    const bool aged = Aged(job);
    for (size_t r : candidates_) {
      const RunningJob& victim = running_[r];
      if (victim.priority > job.priority ||
          (victim.priority == job.priority && !aged)) {
        break;
      }
      // An equal only if it was submitted later: it passed this job.
      if (victim.priority == job.priority && victim.seq < job.seq) continue;
      if (victim_[r]) continue;
      if (counted_on_[r] && !ends_before_reservation_) continue;
      const Victim taken = WhatItGives(r, job, need - victims.gained);
      if (taken.gives == 0) continue;
      if (now_ - victim.started < policy_.min_run_time) {
        victims.young.push_back(r);
        victims.young_gain += taken.gives;
        continue;
      }
      victims.chosen.push_back(taken);
      victims.gained += taken.gives;
      if (victims.gained >= need) return;
    }
  }

  // What running job `r` would give `job`, which still needs `short_by`
  // workers: its last ranks when shrinking frees enough (it keeps its live
  // state) or when it cannot stop, else all its workers; gives 0 when it
  // can give nothing.
  Victim WhatItGives(size_t r, const QueuedJob& job, int short_by) const {
    const RunningJob& victim = running_[r];
    const int size = static_cast<int>(victim.workers.size());
    if (victim.can_shrink) {
      const int spare = size - std::max(victim.min_workers, 1);
      int keep = size;
      int gives = 0;
      while (keep > size - spare && gives < short_by) {
        --keep;
        gives = MatchingWorkersOf(victim, job.placement, keep);
      }
      if (gives > 0 && (gives >= short_by || !victim.can_yield)) {
        return {r, keep, gives};
      }
    }
    if (!victim.can_yield) return {r, 0, 0};
    return {r, 0, MatchingWorkersOf(victim, job.placement)};
  }

  // As few as needed: drops, highest priority first, each chosen victim
  // the others make unnecessary.
  static void DropUnneeded(int need, Victims& victims) {
    for (size_t k = victims.chosen.size(); k-- > 0;) {
      if (victims.gained - victims.chosen[k].gives >= need) {
        victims.gained -= victims.chosen[k].gives;
        victims.chosen.erase(victims.chosen.begin() + k);
      }
    }
  }

  // Promises the workers of the yielding jobs and of the victims to `job`,
  // and asks the victims to yield (the plan's preemptions).
  void Preempt(const QueuedJob& job, const Victims& victims,
               QueueEntry& entry) {
    for (size_t r : victims.yielding) {
      Promise(running_[r], running_[r].keeps);
      entry.preempts.push_back(running_[r].id);
    }
    for (const Victim& v : victims.chosen) {
      const RunningJob& victim = running_[v.r];
      victim_[v.r] = 1;
      yieldable_[victim.priority] -= static_cast<int>(victim.workers.size());
      Promise(victim, v.keep);
      entry.preempts.push_back(victim.id);
      plan_.preemptions.push_back({victim.id, job.id, v.keep});
    }
  }

  const SchedulerPolicy& policy_;
  const std::vector<PoolWorker>& pool_;
  const std::vector<QueuedJob>& queued_;
  const std::vector<RunningJob>& running_;
  const absl::Time now_;
  SchedulingPlan& plan_;
  // Free workers that are not spares, by pool index (ascending), and
  // those promised to a queued job (by its index), until its turn.
  std::vector<int> free_;
  std::map<size_t, std::vector<int>> promised_free_;
  std::vector<int> initial_free_;
  // Workers per owner, running and started in this pass.
  absl::flat_hash_map<std::string, int> held_;
  // Pool workers promised to a waiting job in this pass.
  std::vector<char> promised_;
  // Running jobs chosen as victims in this pass.
  std::vector<char> victim_;
  // The pass's reservation: the queued job chosen for it (target_), the
  // job holding it once made (reservation_; SIZE_MAX: none), when it
  // starts at the latest, the free workers held for it, the running jobs
  // whose ends it counts on, and the jobs started in this pass with their
  // ends. ends_before_reservation_: the job being considered may use the
  // held workers (it holds them, or ends before that start).
  std::vector<size_t> targets_;  // one per priority at most, highest first
  size_t next_target_ = 0;
  size_t target_ = SIZE_MAX;
  size_t reservation_ = SIZE_MAX;
  size_t reservation_entry_ = SIZE_MAX;  // its holder's in plan_.waiting
  absl::Time reserved_start_ = absl::InfiniteFuture();
  std::vector<int> reserved_free_;
  std::vector<char> counted_on_;
  std::vector<std::pair<absl::Time, std::vector<int>>> started_;
  bool ends_before_reservation_ = false;
  // Running jobs already yielding, with the queued job they yield to
  // (SIZE_MAX: to whoever needs them).
  std::vector<std::pair<size_t, size_t>> yielding_;
  // Running jobs that may be preempted, lowest priority first, and their
  // workers by priority (less those chosen in this pass); the workers of
  // jobs already yielding.
  std::vector<size_t> candidates_;
  std::map<int, int> yieldable_;
  int yielding_workers_ = 0;
  int64_t position_ = 0;
  bool started_any_ = false;
};

// The queued jobs of one priority (in submission order), owner by owner:
// the owner holding the fewest workers goes next.
void ConsiderFairly(Pass& pass, const std::vector<QueuedJob>& queued,
                    const std::vector<size_t>& level) {
  absl::flat_hash_map<std::string, std::vector<size_t>> by_owner;
  for (size_t q : level) by_owner[queued[q].owner].push_back(q);
  struct Turn {
    int holds;
    int64_t head_seq;
    const std::string* owner;
    const std::vector<size_t>* jobs;
    size_t next;
    bool operator>(const Turn& other) const {
      return std::tie(holds, head_seq) > std::tie(other.holds, other.head_seq);
    }
  };
  // by_owner is not changed from here on: the pointers stay valid.
  std::vector<Turn> first;
  for (const auto& [owner, jobs] : by_owner) {
    first.push_back(
        {pass.Holds(owner), queued[jobs.front()].seq, &owner, &jobs, 0});
  }
  std::priority_queue<Turn, std::vector<Turn>, std::greater<Turn>> turns(
      std::greater<Turn>(), std::move(first));
  while (!turns.empty()) {
    Turn turn = turns.top();
    turns.pop();
    const std::vector<size_t>& jobs = *turn.jobs;
    while (turn.next < jobs.size()) {
      const size_t q = jobs[turn.next++];
      // What the owner holds now: a job of its that waits for a
      // preemption counts too.
      if (pass.Consider(q, pass.Holds(*turn.owner))) {
        if (turn.next < jobs.size()) {
          turn.holds = pass.Holds(*turn.owner);
          turn.head_seq = queued[jobs[turn.next]].seq;
          turns.push(turn);
        }
        break;
      }
    }
  }
}

// The queued jobs by priority, highest first, each level in submission
// order. The coordinator's queue is in that order already but for jobs
// preempted back into it: a level is sorted only when it is not.
std::map<int, std::vector<size_t>, std::greater<int>> Levels(
    const std::vector<QueuedJob>& queued) {
  std::map<int, std::vector<size_t>, std::greater<int>> levels;
  for (size_t q = 0; q < queued.size(); ++q) {
    levels[queued[q].priority].push_back(q);
  }
  for (auto& [priority, level] : levels) {
    auto by_seq = [&](size_t a, size_t b) {
      return queued[a].seq < queued[b].seq;
    };
    if (!std::is_sorted(level.begin(), level.end(), by_seq)) {
      std::sort(level.begin(), level.end(), by_seq);
    }
  }
  return levels;
}

}  // namespace

SchedulingPlan Scheduler::Plan(const std::vector<PoolWorker>& pool,
                               const std::vector<QueuedJob>& queued,
                               const std::vector<RunningJob>& running,
                               absl::Time now) const {
  SchedulingPlan plan;
  plan.waiting.reserve(queued.size());
  Pass pass(policy_, pool, queued, running, now, plan);
  if (policy_.order != SchedulerPolicy::Order::kPriority) {
    std::vector<size_t> order(queued.size());
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return queued[a].seq < queued[b].seq;
    });
    bool blocked = policy_.order == SchedulerPolicy::Order::kOneAtATime &&
                   !running.empty();
    for (size_t q : order) {
      if (blocked) {
        pass.Blocked(q);
        continue;
      }
      const bool started = pass.Consider(q, pass.Holds(queued[q].owner));
      blocked =
          !started || policy_.order == SchedulerPolicy::Order::kOneAtATime;
    }
    return plan;
  }
  const auto levels = Levels(queued);
  pass.ChooseReservation(levels);
  for (const auto& [priority, level] : levels) {
    ConsiderFairly(pass, queued, level);
  }
  pass.FinishReservation();
  return plan;
}

}  // namespace lockstep::coordinator
