// The data plane's throughput from each peer, as a rank's collectives
// measure it: the bytes a peer's data took to arrive, from this rank's first
// read of them to its last, leaving out what was already queued at the first
// read (mesh_communicator.cc), a moving average over recent collectives.
// Neither the peer's lateness (its compute) nor this rank's counts as link
// time. The heartbeats carry it to the coordinator, which names the rank
// whose links every other rank finds slow (a capped or congested host).
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
  // `bytes` of `peer`'s arrived over `seconds`.
  void Record(int peer, size_t bytes, double seconds);
  // MB/s from each peer (0: not measured yet).
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
