// The pending non-blocking rendezvous calls (Coordinator::KvGetAsync): who
// waits on which key of which job's generation, until when, and whom to
// call back. It only keeps them, indexed
// by what they wait on; the Coordinator decides when one is over and calls
// its callback.
//
// Each wait is keyed by (job, generation, key): two jobs' waits never meet, and
// a job's waits are found without scanning the others' (a fence wakes only its
// own job's).
//
// Thread-compatible: the Coordinator calls it with its lock held.
#ifndef LOCKSTEP_COORDINATOR_RENDEZVOUS_WAITS_H_
#define LOCKSTEP_COORDINATOR_RENDEZVOUS_WAITS_H_

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace lockstep::coordinator {

class RendezvousWaits {
 public:
  using WaitId = uint64_t;  // never 0
  using KvGetDone = absl::AnyInvocable<void(absl::StatusOr<std::string>)>;

  // One pending call.
  struct Wait {
    std::string job_id;
    int64_t generation = 0;
    std::string name;  // the key
    int64_t timeout_ms = 0;
    absl::Time deadline;  // on the coordinator's clock
    KvGetDone kv_done;
  };

  // Keeps `wait`; returns its id.
  WaitId Add(Wait wait);
  // The wait, or null when it is over (or never was).
  Wait* Find(WaitId id);
  // Removes the wait and returns it, to be answered. It must exist.
  Wait Take(WaitId id);

  // The waits on (job, generation, key).
  std::vector<WaitId> On(const std::string& job_id, int64_t generation,
                         const std::string& name) const;
  // Every wait of `job_id`, of any generation.
  std::vector<WaitId> OfJob(const std::string& job_id) const;
  // Every wait.
  std::vector<WaitId> All() const;

  size_t size() const { return waits_.size(); }

 private:
  using Key = std::tuple<std::string, int64_t, std::string>;
  struct Entry {
    Wait wait;
    // Its place in by_key_: removed in O(1) however many ranks wait on
    // the same key.
    std::multimap<Key, WaitId>::iterator index;
  };

  WaitId next_id_ = 1;
  std::map<WaitId, Entry> waits_;
  std::multimap<Key, WaitId> by_key_;
};

}  // namespace lockstep::coordinator

#endif  // LOCKSTEP_COORDINATOR_RENDEZVOUS_WAITS_H_
