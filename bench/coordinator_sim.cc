// The real Coordinator on a simulated pool, at length (issue 52 §4,
// tests/sim/coordinator_sim.h; docs/BENCHMARKS.md "The coordinator
// simulated"). Runs seeds until --events events have passed, and reports
// events per second and the violations found, each with its seed.
//
// Usage: coordinator_sim [--seed 1] [--seeds N] [--events 1000000]
//                        [--per-seed 500] [--workers 0 (3..6 by seed)]
//                        [--trace]   (one seed: print its every event)
//                        [--tested]  (invariant 4 as the test checks it,
//                                     not in full: see SimOptions)
#include "tests/sim/coordinator_sim.h"

#include <stdlib.h>
#include <time.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "absl/strings/numbers.h"

namespace {

double Seconds() {
  timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return now.tv_sec + now.tv_nsec * 1e-9;
}

std::string FreshStateDir() {
  std::string templ = std::filesystem::is_directory("/dev/shm")
                          ? "/dev/shm/lockstep-sim-XXXXXX"
                          : "/tmp/lockstep-sim-XXXXXX";
  return mkdtemp(templ.data()) == nullptr ? "" : templ;
}

int Usage(const char* why) {
  std::fprintf(stderr,
               "coordinator_sim: %s\nusage: coordinator_sim [--seed N] "
               "[--seeds N] [--events N] [--per-seed N] [--workers N] "
               "[--trace]\n",
               why);
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  using lockstep::coordinator::sim::Describe;
  using lockstep::coordinator::sim::RunSimulation;
  using lockstep::coordinator::sim::SimOptions;
  using lockstep::coordinator::sim::SimResult;
  int64_t seed = 1, seeds = 0, events = 1000000, per_seed = 500, workers = 0;
  bool trace = false;
  bool strict = true;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (flag == "--trace") {
      trace = true;
      continue;
    }
    if (flag == "--tested") {  // only what coordinator_sim_test checks
      strict = false;
      continue;
    }
    if (i + 1 >= argc) return Usage(("no value for " + flag).c_str());
    int64_t* target = flag == "--seed"       ? &seed
                      : flag == "--seeds"    ? &seeds
                      : flag == "--events"   ? &events
                      : flag == "--per-seed" ? &per_seed
                      : flag == "--workers"  ? &workers
                                             : nullptr;
    if (target == nullptr) return Usage(("unknown flag " + flag).c_str());
    if (!absl::SimpleAtoi(argv[++i], target) || *target < 0 ||
        *target > 1000000000) {
      return Usage(("bad value for " + flag).c_str());
    }
  }
  if (per_seed < 1) return Usage("--per-seed must be at least 1");
  if (trace) seeds = 1;
  int64_t total = 0, violations = 0, runs = 0, failed = 0;
  int64_t submitted = 0, preemptions = 0, restarts = 0, promotions = 0;
  const double start = Seconds();
  for (int64_t s = seed; seeds > 0 ? runs < seeds : total < events; ++s) {
    SimOptions options;
    options.seed = static_cast<uint64_t>(s);
    options.workers =
        workers > 0 ? static_cast<int>(workers) : 3 + static_cast<int>(s % 4);
    options.events = static_cast<int>(per_seed);
    options.state_dir = FreshStateDir();
    options.stop_at_first = false;
    options.strict_preemptions = strict;
    if (options.state_dir.empty()) return Usage("mkdtemp failed");
    const SimResult result = RunSimulation(options);
    std::filesystem::remove_all(options.state_dir);
    ++runs;
    total += result.events;
    submitted += result.jobs_submitted;
    preemptions += result.preemptions;
    restarts += result.restarts;
    promotions += result.promotions;
    if (trace) {
      std::fputs(Describe(options, result, 1 << 30).c_str(), stdout);
    } else if (!result.violations.empty()) {
      std::fputs(Describe(options, result, 40).c_str(), stdout);
    }
    if (!result.violations.empty()) ++failed;
    violations += static_cast<int64_t>(result.violations.size());
  }
  const double elapsed = Seconds() - start;
  std::printf(
      "coordinator_sim: %lld seeds from %lld, %lld events in %.1f s "
      "(%.0f events/s); %lld jobs submitted, %lld preemptions, %lld "
      "coordinator restarts, %lld promoted by the starvation bound; %lld "
      "violations in %lld seeds\n",
      static_cast<long long>(runs), static_cast<long long>(seed),
      static_cast<long long>(total), elapsed, total / elapsed,
      static_cast<long long>(submitted), static_cast<long long>(preemptions),
      static_cast<long long>(restarts), static_cast<long long>(promotions),
      static_cast<long long>(violations), static_cast<long long>(failed));
  return violations == 0 ? 0 : 1;
}
