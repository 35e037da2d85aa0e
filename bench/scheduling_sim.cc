// The pool scheduler on a simulated cluster (issue 33, docs/BENCHMARKS.md
// "Scheduling a shared pool"): the coordinator's own Scheduler
// (coordinator/scheduler.h) drives a discrete-event simulation of W workers
// and J jobs of mixed sizes, priorities, owners and durations arriving over
// simulated days, against the same arrival trace under FIFO gang scheduling
// and under one job at a time (the coordinator before several jobs could
// share the pool). No processes, no sleeping: simulated time only.
//
// Every job has a time limit, as a user would give it: its work times a
// factor from 1 to 3, rounded up to whole hours. The default policy
// ("priority", the coordinator's defaults) reserves workers for the first
// job waiting for workers from those limits (EASY backfill) and promotes a
// job that has waited --starvation-bound hours (12) to the highest class;
// "no-bound" is the same without the promotion, "no-reserve" without
// either (the scheduler before issue 52).
//
// Reports per policy: utilization (busy worker-time / total worker-time,
// over the whole trace, over the time some job waits, and over the time
// some waiting job would fit in the idle workers), mean and p99
// queue wait per priority class and for the largest jobs (of 64 workers,
// or the pool's size when smaller), preemptions, and the scheduler's time per
// decision (Plan only, measured with the thread's CPU clock). Then the
// decision time on a pool of W workers with Q queued jobs at once.
//
// Usage: scheduling_sim [--workers 1000] [--jobs 10000] [--queued 10000]
//                       [--load 0.95] [--stop-seconds 1] [--min-run 60]
//                       [--age-after SECS (default 0: never)]
//                       [--starvation-bound HOURS (default 12; 0: never)]
//                       [--starvation-priority N (default 100: urgent)]
//                       [--seed 1] [--seeds 1] [--overestimate 3]
//                       [--quota-share F] [--cuda-share F] [--mtbf-hours H]
//                       [--elastic-share F]
//                       [--policies priority,no-bound,no-reserve,fifo,one]
#include <time.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <map>
#include <queue>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/time/time.h"
#include "coordinator/scheduler.h"

namespace lockstep::coordinator {
namespace {

struct Config {
  int workers = 1000;
  int jobs = 10000;
  int queued = 10000;
  double load = 0.95;
  double stop_seconds = 1;  // a preempted job stops and saves in this long
  double min_run_seconds = 60;
  double age_after_seconds = 0;        // never, as the coordinator's default
  double starvation_bound_hours = 12;  // the coordinator's default
  int starvation_priority = 100;       // the urgent class's, as its default
  // The pool's variety, all off by default: the heaviest owner's quota as a
  // share of the pool; a share of the workers with GPUs, which as large a
  // share of the jobs asks for (placement.device "cuda"; the others take
  // any worker); each worker's mean time between failures (a failed
  // worker's job goes back to the queue with no work lost, as a recovery
  // from live state, and the worker returns after repair_minutes); the
  // elastic share below.
  double quota_share = 0;
  double cuda_share = 0;
  // The share of the jobs that are elastic: from half their size to all of
  // it, faster on more workers; a preemption shrinks one (it keeps its
  // first ranks and goes on) when that frees enough.
  double elastic_share = 0;
  double mtbf_hours = 0;
  double repair_minutes = 10;
  // Time limits: the work times a factor from 1 to this, rounded up to
  // whole hours.
  double overestimate = 3;
  uint64_t seed = 1;
  int seeds = 1;  // traces from seed on
  std::vector<std::string> policies = {"priority", "no-bound", "no-reserve",
                                       "fifo", "one"};
};

struct PriorityClass {
  const char* name;
  int priority;
  double share;
};
constexpr PriorityClass kClasses[] = {
    {"batch", 0, 0.70}, {"normal", 50, 0.25}, {"urgent", 100, 0.05}};

struct SimJob {
  int64_t seq = 0;
  std::string id;
  std::string owner;
  int priority = 0;
  int klass = 0;
  int size = 1;
  int most = 1;  // > size: elastic, from size to most workers
  double arrival = 0;
  double work = 0;    // seconds of training it needs on `most` workers
  double limit = 0;   // its time limit, seconds
  bool saves = true;  // saves checkpoints: may be preempted
  bool cuda = false;  // asks for GPU workers
};

double CpuMicros() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

double Percentile(std::vector<double> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  size_t i = static_cast<size_t>(std::ceil(p * values.size())) - 1;
  return values[std::min(i, values.size() - 1)];
}

// The arrival trace: sizes from 1 to 64 (most small), log-normal durations
// (median 1 h), three priority classes, 20 owners of whom the first submits
// a third of the jobs; arrivals Poisson over the span that makes the
// offered work `load` times the pool's capacity.
std::vector<SimJob> Trace(const Config& config) {
  std::mt19937_64 rng(config.seed);
  std::discrete_distribution<int> size_index({40, 20, 15, 12, 8, 4, 1});
  const int sizes[] = {1, 2, 4, 8, 16, 32, 64};
  std::lognormal_distribution<double> hours(0.0, 1.0);
  std::discrete_distribution<int> klass(
      {kClasses[0].share, kClasses[1].share, kClasses[2].share});
  std::vector<double> owner_weights = {33};
  for (int i = 1; i < 20; ++i) owner_weights.push_back(67.0 / 19);
  std::discrete_distribution<int> owner(owner_weights.begin(),
                                        owner_weights.end());
  std::bernoulli_distribution saves(0.8);
  // The limits from a stream of their own: the trace is the same as
  // before there were limits.
  std::mt19937_64 limits(config.seed + 1);
  std::uniform_real_distribution<double> overestimate(1.0, config.overestimate);
  std::vector<SimJob> jobs(config.jobs);
  double total_work = 0;
  for (int i = 0; i < config.jobs; ++i) {
    SimJob& job = jobs[i];
    job.seq = i + 1;
    job.id = absl::StrCat("job-", i + 1);
    job.owner = absl::StrCat("operator:user", owner(rng));
    job.klass = klass(rng);
    job.priority = kClasses[job.klass].priority;
    job.size = std::min(sizes[size_index(rng)], config.workers);
    job.work = std::clamp(hours(rng), 5.0 / 60, 48.0) * 3600;
    // Urgent work is short and always resumable; others save 80% of the
    // time.
    if (job.klass == 2) job.work = std::min(job.work, 3600.0);
    job.saves = job.klass == 2 || saves(rng);
    job.limit = std::ceil(job.work * overestimate(limits) / 3600) * 3600;
    job.cuda = config.cuda_share > 0 &&
               std::bernoulli_distribution(config.cuda_share)(limits);
    const bool elastic =
        config.elastic_share > 0 &&
        std::bernoulli_distribution(config.elastic_share)(limits);
    // A job fits its owner's quota, and a GPU job the GPU workers.
    if (config.quota_share > 0 && job.owner == "operator:user0") {
      job.size = std::min(
          job.size,
          std::max(1, static_cast<int>(config.quota_share * config.workers)));
    }
    if (job.cuda) {
      job.size = std::min(
          job.size,
          std::max(1, static_cast<int>(config.cuda_share * config.workers)));
    }
    job.most = job.size;
    if (elastic && job.size > 1) {
      // It may run on half its workers, and then takes twice as long: its
      // limit allows for that.
      job.size = job.most / 2;
      job.limit = std::ceil(job.work * 2 * overestimate(limits) / 3600) * 3600;
    }
    total_work += job.most * job.work;
  }
  const double span = total_work / (config.workers * config.load);
  std::uniform_real_distribution<double> at(0, span);
  std::vector<double> arrivals(config.jobs);
  for (double& t : arrivals) t = at(rng);
  std::sort(arrivals.begin(), arrivals.end());
  for (int i = 0; i < config.jobs; ++i) jobs[i].arrival = arrivals[i];
  return jobs;
}

struct Outcome {
  std::string policy;
  double makespan = 0;
  double utilization = 0;
  double utilization_while_waiting = 0;
  // While some queued job is small enough for the idle workers (the
  // issue's "whenever the queue holds work that fits").
  double utilization_while_fits = 0;
  std::vector<std::vector<double>> waits{3};
  std::vector<double> large_waits;  // the jobs of the largest size
  int64_t preemptions = 0;
  int64_t promotions = 0;
  int64_t shrinks = 0;  // of the preemptions
  int64_t failures = 0;
  int64_t decisions = 0;
  std::vector<double> decision_us;
};

// One policy over the trace.
Outcome Simulate(const Config& config, const std::vector<SimJob>& trace,
                 const std::string& name) {
  SchedulerPolicy policy;
  policy.order = name == "fifo"  ? SchedulerPolicy::Order::kFifo
                 : name == "one" ? SchedulerPolicy::Order::kOneAtATime
                                 : SchedulerPolicy::Order::kPriority;
  policy.reserve = name != "no-reserve";
  if (name == "priority" && config.starvation_bound_hours > 0) {
    policy.starvation_bound =
        absl::Seconds(config.starvation_bound_hours * 3600);
    policy.top_priority = config.starvation_priority;
  }
  if (config.quota_share > 0) {
    policy.quotas["operator:user0"] =
        std::max(1, static_cast<int>(config.quota_share * config.workers));
  }
  policy.min_run_time = absl::Seconds(config.min_run_seconds);
  policy.age_after = config.age_after_seconds > 0
                         ? absl::Seconds(config.age_after_seconds)
                         : absl::InfiniteDuration();
  const Scheduler scheduler(policy);

  struct State {
    bool queued = false, running = false, yielding = false;
    double remaining = 0;  // worker-seconds of work left
    double used = 0;       // of its time limit, in earlier runs
    double started = 0;    // of the current run
    double queued_since = 0;
    double waited = 0;
    // It reached the starvation bound: it is scheduled at the top
    // priority for the rest of its life.
    bool promoted = false;
    std::vector<int> workers;
    std::string yielding_for;
    int keeps = 0;           // > 0: it shrinks to its first `keeps` workers
    int64_t generation = 0;  // stale events are ignored
  };
  std::vector<State> state(trace.size());
  std::map<std::string, size_t> by_id;
  for (size_t i = 0; i < trace.size(); ++i) by_id[trace[i].id] = i;
  std::vector<int> holder(config.workers, -1);
  // The job that held the reservation after the last decision.
  std::string reserved;

  // Events: (time, kind, job or worker, generation); kinds: 0 arrival,
  // 1 finish, 2 stopped (a preemption completed), 3 a worker fails, 4 it
  // is back.
  using Event = std::tuple<double, int, size_t, int64_t>;
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> events;
  for (size_t i = 0; i < trace.size(); ++i)
    events.push({trace[i].arrival, 0, i, 0});
  std::vector<char> down(config.workers, 0);
  std::mt19937_64 failures(config.seed + 2);
  std::exponential_distribution<double> between(
      config.mtbf_hours > 0 ? 1 / (config.mtbf_hours * 3600) : 1);
  if (config.mtbf_hours > 0) {
    for (int w = 0; w < config.workers; ++w) {
      events.push({between(failures), 3, static_cast<size_t>(w), 0});
    }
  }

  Outcome out;
  double now = 0, busy = 0, busy_waiting = 0, time_waiting = 0;
  double busy_fits = 0, time_fits = 0;
  // The smallest queued job after the last decision (INT_MAX: none).
  int smallest_queued = std::numeric_limits<int>::max();
  int busy_workers = 0;
  size_t queued_count = 0, done = 0;
  std::vector<PoolWorker> pool(config.workers);
  const int gpus = static_cast<int>(config.cuda_share * config.workers);
  for (int i = 0; i < config.workers; ++i) {
    pool[i].id = absl::StrCat("free:", i);
    pool[i].device = i < gpus ? "cuda" : "cpu";
  }
  auto advance = [&](double to) {
    const double dt = to - now;
    busy += busy_workers * dt;
    if (queued_count > 0) {
      busy_waiting += busy_workers * dt;
      time_waiting += dt;
    }
    if (smallest_queued <= config.workers - busy_workers) {
      busy_fits += busy_workers * dt;
      time_fits += dt;
    }
    now = to;
  };
  auto release = [&](size_t j) {
    for (int w : state[j].workers) holder[w] = -1;
    busy_workers -= static_cast<int>(state[j].workers.size());
    state[j].workers.clear();
    state[j].running = state[j].yielding = false;
    state[j].keeps = 0;
  };
  // It trained until now, and waits again (preempted, or its worker
  // failed: nothing is lost).
  auto requeue = [&](size_t j) {
    State& s = state[j];
    s.remaining -= (now - s.started) * static_cast<double>(s.workers.size());
    s.used += now - s.started;
    release(j);
    s.queued = true;
    s.queued_since = now;
    ++queued_count;
  };
  // Failures never stop coming: a trace that cannot finish (it should
  // not) ends at a hundred times its arrivals' span.
  const double give_up = 100 * std::max(1.0, trace.back().arrival);
  while (done < trace.size()) {
    if (events.empty() || std::get<0>(events.top()) > give_up) {
      std::fprintf(stderr, "scheduling_sim: %zu jobs never finished\n",
                   trace.size() - done);
      break;
    }
    // Every event at this instant, then one decision.
    const double t = std::get<0>(events.top());
    advance(t);
    while (!events.empty() && std::get<0>(events.top()) <= t) {
      auto [time, kind, j, generation] = events.top();
      events.pop();
      if (kind == 3) {
        // A worker fails: its job goes back to the queue (nothing lost).
        const int w = static_cast<int>(j);
        down[w] = 1;
        ++out.failures;
        if (holder[w] >= 0) requeue(static_cast<size_t>(holder[w]));
        events.push({now + config.repair_minutes * 60, 4, j, 0});
        continue;
      }
      if (kind == 4) {
        down[j] = 0;
        events.push({now + between(failures), 3, j, 0});
        continue;
      }
      State& s = state[j];
      if (kind == 0) {
        s.queued = true;
        s.queued_since = now;
        s.remaining = trace[j].work * trace[j].most;
        ++queued_count;
      } else if (s.generation == generation && s.running) {
        if (kind == 1) {
          release(j);
          ++done;
        } else if (s.keeps > 0) {
          // It shrank: its last workers go, and it goes on with the
          // first ones as a new generation (a restart of its limit's
          // count is not modelled: a run's time simply goes on).
          s.remaining -=
              (now - s.started) * static_cast<double>(s.workers.size());
          s.used += now - s.started;
          for (size_t k = s.keeps; k < s.workers.size(); ++k) {
            holder[s.workers[k]] = -1;
          }
          busy_workers -= static_cast<int>(s.workers.size()) - s.keeps;
          s.workers.resize(s.keeps);
          s.keeps = 0;
          s.yielding = false;
          s.started = now;
          ++s.generation;
          events.push({now + std::min(s.remaining / s.workers.size(),
                                      trace[j].limit - s.used),
                       1, j, s.generation});
        } else {
          requeue(j);
        }
      }
    }
    std::vector<QueuedJob> queued;
    std::vector<size_t> queued_index;
    std::vector<RunningJob> running;
    std::vector<size_t> running_index;
    for (int w = 0; w < config.workers; ++w) {
      pool[w].free = holder[w] < 0 && !down[w];
    }
    const absl::Time at = absl::FromUnixSeconds(0) + absl::Seconds(now);
    for (size_t j = 0; j < trace.size(); ++j) {
      State& s = state[j];
      if (s.queued && !s.promoted &&
          Starved(policy, trace[j].priority,
                  absl::Seconds(s.waited + now - s.queued_since))) {
        s.promoted = true;
        ++out.promotions;
      }
      const int priority = s.promoted ? policy.top_priority : trace[j].priority;
      if (s.queued) {
        QueuedJob q;
        q.id = trace[j].id;
        q.seq = trace[j].seq;
        q.priority = priority;
        q.owner = trace[j].owner;
        q.size = trace[j].size;
        q.most = trace[j].most;
        q.queued_at = absl::FromUnixSeconds(0) + absl::Seconds(s.queued_since);
        q.time_limit = absl::Seconds(trace[j].limit - s.used);
        q.reserved = q.id == reserved;
        if (trace[j].cuda) q.placement.device = "cuda";
        queued.push_back(std::move(q));
        queued_index.push_back(j);
      } else if (s.running) {
        RunningJob r;
        r.id = trace[j].id;
        r.seq = trace[j].seq;
        r.priority = priority;
        r.owner = trace[j].owner;
        r.workers = s.workers;
        r.started = absl::FromUnixSeconds(0) + absl::Seconds(s.started);
        r.ends = r.started + absl::Seconds(trace[j].limit - s.used);
        r.can_yield = trace[j].saves && !s.yielding;
        r.min_workers = trace[j].most > trace[j].size ? trace[j].size : 0;
        r.can_shrink = r.min_workers > 0 && !s.yielding &&
                       static_cast<int>(s.workers.size()) > r.min_workers;
        r.keeps = s.keeps;
        r.yielding = s.yielding;
        r.yielding_for = s.yielding_for;
        running.push_back(std::move(r));
        running_index.push_back(j);
      }
    }
    const double before = CpuMicros();
    SchedulingPlan plan = scheduler.Plan(pool, queued, running, at);
    out.decision_us.push_back(CpuMicros() - before);
    ++out.decisions;
    reserved = plan.reservations.empty() ? "" : plan.reservations[0].job_id;
    for (const SchedulingPlan::Preemption& p : plan.preemptions) {
      State& s = state[by_id[p.job_id]];
      s.yielding = true;
      s.yielding_for = p.for_job;
      s.keeps = p.keep;
      if (p.keep > 0) ++out.shrinks;
      ++out.preemptions;
      events.push(
          {now + config.stop_seconds, 2, by_id[p.job_id], s.generation});
    }
    for (const SchedulingPlan::Start& start : plan.starts) {
      const size_t j = by_id[start.job_id];
      State& s = state[j];
      s.waited += now - s.queued_since;
      s.queued = false;
      s.running = true;
      s.started = now;
      s.workers = start.workers;
      ++s.generation;
      --queued_count;
      for (int w : start.workers) holder[w] = static_cast<int>(j);
      busy_workers += static_cast<int>(start.workers.size());
      // Its limit stops it if the work does not end first (the trace's
      // limits are never shorter than the work).
      events.push({now + std::min(s.remaining / start.workers.size(),
                                  trace[j].limit - s.used),
                   1, j, s.generation});
    }
    smallest_queued = std::numeric_limits<int>::max();
    for (const QueueEntry& entry : plan.waiting) {
      smallest_queued = std::min(smallest_queued, queued[entry.job].size);
    }
  }
  out.makespan = now;
  out.utilization = busy / (config.workers * now);
  out.utilization_while_waiting =
      time_waiting > 0 ? busy_waiting / (config.workers * time_waiting) : 1;
  out.utilization_while_fits =
      time_fits > 0 ? busy_fits / (config.workers * time_fits) : -1;
  int largest = 0;
  for (const SimJob& job : trace) largest = std::max(largest, job.size);
  for (size_t j = 0; j < trace.size(); ++j) {
    out.waits[trace[j].klass].push_back(state[j].waited);
    if (trace[j].size == largest) out.large_waits.push_back(state[j].waited);
  }
  return out;
}

// The decision time with `queued` jobs waiting on a full pool of `workers`
// (the worst case for a pass: every queued job is considered) and with
// half of it free.
void DecisionTimeAtScale(const Config& config) {
  Config shape = config;
  shape.jobs = config.queued;
  shape.seed = config.seed + 7;
  std::vector<SimJob> trace = Trace(shape);
  for (bool half_free : {false, true}) {
    std::vector<PoolWorker> pool(config.workers);
    std::vector<RunningJob> running;
    int next = 0;
    int64_t seq = 1'000'000;
    const int busy = half_free ? config.workers / 2 : config.workers;
    while (next < busy) {
      RunningJob r;
      r.id = absl::StrCat("running-", seq);
      r.seq = seq++;
      r.owner = absl::StrCat("operator:user", seq % 20);
      r.priority = kClasses[seq % 3].priority;
      r.can_yield = true;
      r.started = absl::FromUnixSeconds(0);
      r.ends = r.started + absl::Hours(1 + seq % 24);
      for (int k = 0; k < 8 && next < busy; ++k) r.workers.push_back(next++);
      running.push_back(std::move(r));
    }
    for (int i = 0; i < config.workers; ++i) {
      pool[i].id = absl::StrCat("free:", i);
      pool[i].device = "cpu";
      pool[i].free = i >= busy;
    }
    std::vector<QueuedJob> queued;
    for (const SimJob& job : trace) {
      QueuedJob q;
      q.id = job.id;
      q.seq = job.seq;
      q.priority = job.priority;
      q.owner = job.owner;
      // Big enough not to fit: the pass considers every one of them.
      q.size = q.most = half_free ? config.workers : job.size;
      q.time_limit = absl::Seconds(job.limit);
      queued.push_back(std::move(q));
    }
    SchedulerPolicy policy;
    policy.min_run_time = absl::Seconds(config.min_run_seconds);
    const Scheduler scheduler(policy);
    std::vector<double> times;
    for (int i = 0; i < 200; ++i) {
      const double before = CpuMicros();
      SchedulingPlan plan =
          scheduler.Plan(pool, queued, running, absl::FromUnixSeconds(3600));
      times.push_back(CpuMicros() - before);
    }
    std::printf(
        "decision time, %d workers (%s), %d queued jobs: p50 %.0f us, p99 "
        "%.0f us, max %.0f us\n",
        config.workers, half_free ? "half free" : "all busy", config.queued,
        Percentile(times, 0.5), Percentile(times, 0.99),
        Percentile(times, 1.0));
  }
}

int Run(const Config& config) {
  const std::vector<SimJob> trace = Trace(config);
  std::printf(
      "scheduling simulation: %d workers, %d jobs over %.1f simulated days "
      "(offered load %.2f), preemption stop %.1f s, min run time %.0f s, "
      "age after %.0f s, starvation bound %.0f h to priority %d (priority), "
      "time limits up to %.1fx the work, seed %llu%s\n",
      config.workers, config.jobs, trace.back().arrival / 86400, config.load,
      config.stop_seconds, config.min_run_seconds, config.age_after_seconds,
      config.starvation_bound_hours, config.starvation_priority,
      config.overestimate, static_cast<unsigned long long>(config.seed),
      config.seeds > 1 ? absl::StrCat(" and the next ", config.seeds - 1,
                                      " (waits pooled, the rest averaged)")
                             .c_str()
                       : "");
  if (config.quota_share > 0 || config.cuda_share > 0 ||
      config.mtbf_hours > 0 || config.elastic_share > 0) {
    std::printf(
        "variety: operator:user0's quota %.0f%% of the pool; %.0f%% of the "
        "workers and of the jobs cuda; worker MTBF %.0f h (0: none), %.0f "
        "min repair; %.0f%% of the jobs elastic\n",
        100 * config.quota_share, 100 * config.cuda_share, config.mtbf_hours,
        config.repair_minutes, 100 * config.elastic_share);
  }
  std::printf(
      "%-10s %7s %9s %9s %11s %16s %16s %16s %16s %7s %6s %8s %6s %7s "
      "%7s\n",
      "policy", "util", "util/wait", "util/fits", "makespan(d)", "batch wait",
      "normal wait", "urgent wait", "largest wait", "preempt", "shrunk",
      "promoted", "fail", "dec p50", "dec p99");
  std::printf(
      "%-10s %7s %9s %9s %11s %16s %16s %16s %16s %7s %6s %8s %6s %7s "
      "%7s\n",
      "", "", "", "", "", "mean/p99 (h)", "mean/p99 (h)", "mean/p99 (s)",
      "mean/p99 (h)", "", "", "", "", "(us)", "(us)");
  for (const std::string& name : config.policies) {
    // Over --seeds traces: waits pooled, utilization and makespan
    // averaged, preemptions summed.
    Outcome out;
    int fits_runs = 0;
    for (int k = 0; k < config.seeds; ++k) {
      Config one = config;
      one.seed = config.seed + k;
      Outcome run = Simulate(one, k == 0 ? trace : Trace(one), name);
      out.utilization += run.utilization / config.seeds;
      out.utilization_while_waiting +=
          run.utilization_while_waiting / config.seeds;
      if (run.utilization_while_fits >= 0) {
        out.utilization_while_fits += run.utilization_while_fits;
        ++fits_runs;
      }
      out.makespan += run.makespan / config.seeds;
      for (int c = 0; c < 3; ++c) {
        out.waits[c].insert(out.waits[c].end(), run.waits[c].begin(),
                            run.waits[c].end());
      }
      out.large_waits.insert(out.large_waits.end(), run.large_waits.begin(),
                             run.large_waits.end());
      out.preemptions += run.preemptions;
      out.promotions += run.promotions;
      out.shrinks += run.shrinks;
      out.failures += run.failures;
      out.decision_us.insert(out.decision_us.end(), run.decision_us.begin(),
                             run.decision_us.end());
    }
    out.utilization_while_fits =
        fits_runs > 0 ? out.utilization_while_fits / fits_runs : -1;
    auto mean = [](const std::vector<double>& v) {
      double sum = 0;
      for (double x : v) sum += x;
      return v.empty() ? 0 : sum / v.size();
    };
    std::printf(
        "%-10s %6.1f%% %8.1f%% %9s %11.2f %7.2f/%-8.2f %7.2f/%-8.2f "
        "%7.1f/%-8.1f %7.2f/%-8.2f %7lld %6lld %8lld %6lld %7.0f %7.0f\n",
        name.c_str(), 100 * out.utilization,
        100 * out.utilization_while_waiting,
        out.utilization_while_fits < 0
            ? "never"
            : absl::StrFormat("%.1f%%", 100 * out.utilization_while_fits)
                  .c_str(),
        out.makespan / 86400, mean(out.waits[0]) / 3600,
        Percentile(out.waits[0], 0.99) / 3600, mean(out.waits[1]) / 3600,
        Percentile(out.waits[1], 0.99) / 3600, mean(out.waits[2]),
        Percentile(out.waits[2], 0.99), mean(out.large_waits) / 3600,
        Percentile(out.large_waits, 0.99) / 3600,
        static_cast<long long>(out.preemptions),
        static_cast<long long>(out.shrinks),
        static_cast<long long>(out.promotions),
        static_cast<long long>(out.failures), Percentile(out.decision_us, 0.5),
        Percentile(out.decision_us, 0.99));
  }
  DecisionTimeAtScale(config);
  return 0;
}

}  // namespace
}  // namespace lockstep::coordinator

int main(int argc, char** argv) {
  lockstep::coordinator::Config config;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i], value = argv[i + 1];
    bool ok = true;
    if (flag == "--workers") {
      ok = absl::SimpleAtoi(value, &config.workers) && config.workers > 0;
    } else if (flag == "--jobs") {
      ok = absl::SimpleAtoi(value, &config.jobs) && config.jobs > 0;
    } else if (flag == "--queued") {
      ok = absl::SimpleAtoi(value, &config.queued) && config.queued > 0;
    } else if (flag == "--load") {
      ok = absl::SimpleAtod(value, &config.load) && config.load > 0;
    } else if (flag == "--stop-seconds") {
      ok = absl::SimpleAtod(value, &config.stop_seconds) &&
           config.stop_seconds >= 0;
    } else if (flag == "--min-run") {
      ok = absl::SimpleAtod(value, &config.min_run_seconds) &&
           config.min_run_seconds >= 0;
    } else if (flag == "--age-after") {
      ok = absl::SimpleAtod(value, &config.age_after_seconds) &&
           config.age_after_seconds >= 0;
    } else if (flag == "--starvation-bound") {
      ok = absl::SimpleAtod(value, &config.starvation_bound_hours) &&
           config.starvation_bound_hours >= 0;
    } else if (flag == "--starvation-priority") {
      ok = absl::SimpleAtoi(value, &config.starvation_priority);
    } else if (flag == "--elastic-share") {
      ok = absl::SimpleAtod(value, &config.elastic_share) &&
           config.elastic_share >= 0 && config.elastic_share <= 1;
    } else if (flag == "--quota-share") {
      ok = absl::SimpleAtod(value, &config.quota_share) &&
           config.quota_share >= 0 && config.quota_share <= 1;
    } else if (flag == "--cuda-share") {
      ok = absl::SimpleAtod(value, &config.cuda_share) &&
           config.cuda_share >= 0 && config.cuda_share <= 1;
    } else if (flag == "--mtbf-hours") {
      ok =
          absl::SimpleAtod(value, &config.mtbf_hours) && config.mtbf_hours >= 0;
    } else if (flag == "--overestimate") {
      ok = absl::SimpleAtod(value, &config.overestimate) &&
           config.overestimate >= 1;
    } else if (flag == "--seeds") {
      ok = absl::SimpleAtoi(value, &config.seeds) && config.seeds > 0 &&
           config.seeds <= 1000;
    } else if (flag == "--seed") {
      ok = absl::SimpleAtoi(value, &config.seed);
    } else if (flag == "--policies") {
      config.policies = absl::StrSplit(value, ',');
    } else {
      ok = false;
    }
    if (!ok) {
      std::fprintf(stderr,
                   "scheduling_sim: bad flag %s %s (see the file's "
                   "head for usage)\n",
                   flag.c_str(), value.c_str());
      return 2;
    }
  }
  if (argc % 2 == 0) {
    std::fprintf(stderr,
                 "scheduling_sim: flags come in pairs (see the file's "
                 "head for usage)\n");
    return 2;
  }
  return lockstep::coordinator::Run(config);
}
