// What bench/chaos_soak prints: one row per injected fault, the job's
// events after a failed run, and the run's summary line.
#ifndef LOCKSTEP_BENCH_CHAOS_REPORT_H_
#define LOCKSTEP_BENCH_CHAOS_REPORT_H_

#include <cstdint>
#include <deque>
#include <optional>
#include <string>

#include "absl/time/time.h"
#include "bench/chaos_faults.h"
#include "lockstep/v1/coordinator.pb.h"

namespace lockstep::chaos {

// One injected fault and what the job did about it.
struct Fault {
  FaultKind kind;
  int worker = -1;           // the target, or -1 for the coordinator
  double at_s = 0;           // since the faulted job was submitted
  double held_s = 0;         // from the fault to the restart or SIGCONT
  int64_t step = 0;          // the job's step when it was injected
  int64_t generation = 0;    // the job's generation then
  double detected_s = -1;    // fault to the coordinator naming a failure
  double resumed_s = -1;     // fault to training again; -1: never
  int64_t repeated = -1;     // from the `resumed` event; 0 without one
  int64_t resumed_at = -1;   // the step the job trained again after
  int64_t step_at_cont = 0;  // the job's step when a stopped worker went on
  std::string resumed_from;  // the state the job resumed from
  std::string problem;       // what went wrong, empty if nothing
  bool overlap = false;      // the next fault hits this one's recovery
  int spacing = 0;           // steps trained between the last resume and it
  double delay_s = 0;        // restart delay or stop length, as planned
};

// Fault `number` (from 1) as a table row; the header before the first.
void PrintFault(const Fault& fault, size_t number);

// The job's events (checkpoint commits left out), in seconds since `start`,
// to read beside the processes' logs.
void PrintEvents(const v1::JobStatus& status, absl::Time start);

// Per fault kind: how many, how often and how fast the coordinator named a
// failure, and how long until training resumed (mean and longest).
void PrintKinds(const std::deque<Fault>& faults);

// One line: the seed, how the faults were resumed from, and how the job
// ended after `elapsed_s` against the uninterrupted `reference_s`.
void PrintSummary(uint32_t seed, const std::deque<Fault>& faults,
                  const std::string& job,
                  const std::optional<v1::JobStatus>& last, double elapsed_s,
                  double reference_s);

}  // namespace lockstep::chaos

#endif  // LOCKSTEP_BENCH_CHAOS_REPORT_H_
