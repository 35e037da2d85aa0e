// A deterministic simulation of the real Coordinator on a shared pool
// (issue 52 §4): the coordinator's own code (sessions, reports, the
// scheduler and what carries its plans out, the job store on disk,
// restarts on the same store) driven by simulated workers on a fake clock.
// Random submissions (sizes, elastic ranges, priorities, owners with and
// without quotas, checkpointing or not, time limits), training and checkpoint
// commits, results delivered in any order, worker deaths and returns, stops,
// deletes and coordinator restarts cross each other; after every event the
// pool's invariants are checked:
//
//   1. no worker serves two jobs, and no rank is held by two workers;
//   2. no owner's active jobs hold more workers than its quota, and nobody
//      gets a priority above the default that was not granted to it (but
//      for the starvation bound, which every other seed sets to minutes:
//      it promotes a job to the top class's priority only);
//   3. a preempted job resumes from the step it agreed and saved (no step
//      lost, none repeated), and a job that reached its plan's end is never
//      queued again;
//   4. a preemption is never for nothing: when a job yields, the job it
//      yielded for starts (or still waits only for the other jobs yielding
//      to it), unless a worker died or the coordinator restarted meanwhile;
//      never does it wait on its owner's quota, nor does a job of a lower
//      priority take a worker it released (strict_preemptions: nor any
//      job); and an idle pool leaves no job waiting that fits it, but
//      for workers promised to a job that waits for other released
//      workers to come back, for at most the heartbeat timeout;
//   5. a restart keeps every job: final states, steps and checkpoints.
//
// A run is a function of its seed: its trace (one line per event) replays
// it. The store lives under `state_dir` (the caller makes it empty).
//
// Thread-compatible.
#ifndef LOCKSTEP_TESTS_SIM_COORDINATOR_SIM_H_
#define LOCKSTEP_TESTS_SIM_COORDINATOR_SIM_H_

#include <cstdint>
#include <string>
#include <vector>

namespace lockstep::coordinator::sim {

struct SimOptions {
  uint64_t seed = 1;
  int workers = 6;
  int events = 200;
  // The folder of the coordinator's job store (SQLite, fsynced: put it on a
  // tmpfs for speed). Empty: no store, and no restarts.
  std::string state_dir;
  // Stop at the first violation (tests) or count them all (the bench).
  bool stop_at_first = true;
  // Invariant 4 in full: also a preemption whose workers went to a job of
  // a higher priority than its preemptor (a recovering job, or one
  // submitted later), or whose preemptor was stopped before it started.
  // Preemptions are not yet called off or redirected (issue 52), so only
  // the bench checks this; the tests check the rest.
  bool strict_preemptions = false;
};

struct SimResult {
  int64_t events = 0;
  // "event 37: invariant 2: owner operator:alice holds 5 workers, quota 4"
  std::vector<std::string> violations;
  // One line per event, in order.
  std::vector<std::string> trace;
  // What happened, for the bench's report.
  int64_t jobs_submitted = 0;
  int64_t preemptions = 0;
  int64_t restarts = 0;
  int64_t promotions = 0;  // jobs the starvation bound promoted
};

SimResult RunSimulation(const SimOptions& options);

// The last `lines` lines of the trace and every violation, for a failure
// message.
std::string Describe(const SimOptions& options, const SimResult& result,
                     int lines = 80);

}  // namespace lockstep::coordinator::sim

#endif  // LOCKSTEP_TESTS_SIM_COORDINATOR_SIM_H_
