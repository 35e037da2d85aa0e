// The rendezvous of the jobs' live generations (docs/DESIGN.md §2): the
// pending KvGet calls and when each is answered. A call is answered by the
// fence (its generation is over or replaced: Aborted; the coordinator is
// stopping: Cancelled; an unknown job: NotFound), by its key once a rank
// sets it, by its deadline on the coordinator's clock (DeadlineExceeded),
// or by its caller giving up (Cancelled).
//
// The keys live in each Generation; the fence is the Coordinator's (which
// generation of a job is live), given at construction. The waits are
// indexed by RendezvousWaits, so a key set or a fence moved answers only
// the calls that wait on it.
//
// Thread-compatible: the Coordinator calls it with its lock held, and the
// fence and every callback run under that lock.
#ifndef LOCKSTEP_COORDINATOR_RENDEZVOUS_H_
#define LOCKSTEP_COORDINATOR_RENDEZVOUS_H_

#include <cstdint>
#include <optional>
#include <string>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/clock.h"
#include "coordinator/generation.h"
#include "coordinator/rendezvous_waits.h"

namespace lockstep::coordinator {

class Rendezvous {
 public:
  using WaitId = RendezvousWaits::WaitId;
  using KvGetDone = RendezvousWaits::KvGetDone;
  // The live generation `number` of `job_id`, or the status that refuses
  // a call on it.
  using Fence = absl::AnyInvocable<absl::StatusOr<Generation*>(
      const std::string& job_id, int64_t number)>;

  Rendezvous(Clock* clock, Fence fence)
      : clock_(clock), fence_(std::move(fence)) {}

  // A KvGet of `key` in generation `generation` of `job_id`: answers `done`
  // at once when it can (the key is set, the fence refuses, timeout_ms is
  // 0) and returns 0; else keeps the call and returns its id.
  WaitId KvGet(const std::string& job_id, int64_t generation,
               const std::string& key, int64_t timeout_ms, KvGetDone done);
  // The caller gave up on call `id` (a no-op once it is answered).
  void Cancel(WaitId id);

  // Answers the calls that can be answered now: those waiting on a key
  // that was just set; those of a job whose fence moved (its generation
  // ended or was replaced); every call, including those past their
  // deadline (from Sweep, and at Shutdown where the fence refuses all).
  void KeySet(const std::string& job_id, int64_t generation,
              const std::string& key);
  void FenceMoved(const std::string& job_id);
  void AnswerDue();

  size_t pending() const { return waits_.size(); }

 private:
  // What KvGet returns now, or nullopt while it must wait.
  std::optional<absl::StatusOr<std::string>> Ready(const std::string& job_id,
                                                   int64_t generation,
                                                   const std::string& key);
  // Answers call `id` with `forced`, or, without it, if it can be answered
  // now.
  void Answer(WaitId id, std::optional<absl::Status> forced);

  Clock* const clock_;
  Fence fence_;
  RendezvousWaits waits_;
};

}  // namespace lockstep::coordinator

#endif  // LOCKSTEP_COORDINATOR_RENDEZVOUS_H_
