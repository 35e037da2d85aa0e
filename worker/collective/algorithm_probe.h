// communication.algorithm "auto": the ranks of a generation time both CPU
// all-reduce algorithms on a buffer of the size their buckets move, agree on
// the numbers, and all run the faster one from then on. Which one wins
// depends on the network (the direct algorithm's concurrent flows contend
// on a capped link, the ring pays 2(W-1) latencies), and so does the sum
// order: a job that must be reproducible names its algorithm instead.
#ifndef LOCKSTEP_WORKER_COLLECTIVE_ALGORITHM_PROBE_H_
#define LOCKSTEP_WORKER_COLLECTIVE_ALGORITHM_PROBE_H_

#include <cstddef>
#include <functional>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "worker/collective/communicator.h"

namespace lockstep::worker {

struct AlgorithmProbe {
  AllReduceAlgorithm algorithm = AllReduceAlgorithm::kDirect;
  size_t bytes = 0;  // of one timed all-reduce
  // Each algorithm's time, the fastest of its tries on each rank, summed
  // over the ranks: the same numbers on every rank.
  double direct_seconds = 0;
  double ring_seconds = 0;
};

// The ring only where it is clearly faster: the direct algorithm has the
// fewest latencies and sums every element in rank order.
AllReduceAlgorithm FasterAlgorithm(double direct_seconds, double ring_seconds);

// Times each algorithm on `bytes` (rounded down to whole floats, at least
// one), once untimed and then `tries` times each, alternating, every try
// after a barrier; sums the times over the ranks and sets the faster
// algorithm on `comm`. Collective: every rank calls it with the same
// arguments. `now` is the clock (tests inject one). Errors: those of the
// collectives; FailedPrecondition when `comm` has no choice of algorithm.
absl::StatusOr<AlgorithmProbe> ChooseAllReduceAlgorithm(
    Communicator& comm, size_t bytes, int tries = 2,
    const std::function<absl::Time()>& now = absl::Now);

}  // namespace lockstep::worker

#endif  // LOCKSTEP_WORKER_COLLECTIVE_ALGORITHM_PROBE_H_
