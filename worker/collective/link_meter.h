// The data plane's throughput with each peer, as a rank's collectives
// measure it: the bytes moved with a peer (both ways) over the time the
// collective waited for that peer to finish, a moving average over recent
// collectives. The heartbeats carry it to the coordinator, which names the
// rank whose links every other rank finds slow (a capped or congested
// host).
//
// Thread-safe: the communication thread records, the heartbeat thread reads.
#ifndef LOCKSTEP_WORKER_COLLECTIVE_LINK_METER_H_
#define LOCKSTEP_WORKER_COLLECTIVE_LINK_METER_H_

#include <cstddef>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace lockstep::worker {

class LinkMeter {
 public:
  // Exchanges smaller than this are latency, not bandwidth: not recorded.
  static constexpr size_t kMinBytes = size_t{64} << 10;

  // Forgets everything; `world` peers from now on (a new generation).
  void Reset(int world);
  // `peer` moved `bytes` in `seconds` of a collective's wait.
  void Record(int peer, size_t bytes, double seconds);
  // MB/s with each peer (0: not measured yet).
  std::vector<double> Rates() const;

 private:
  // The weight of what came before each new record.
  static constexpr double kDecay = 0.8;

  mutable absl::Mutex mu_;
  std::vector<double> bytes_ ABSL_GUARDED_BY(mu_);
  std::vector<double> seconds_ ABSL_GUARDED_BY(mu_);
};

}  // namespace lockstep::worker

#endif  // LOCKSTEP_WORKER_COLLECTIVE_LINK_METER_H_
