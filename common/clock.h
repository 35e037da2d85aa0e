// Time, injected. Everything in lockstep that reads the time or waits on it
// takes a Clock so tests can advance time instead of sleeping.
#ifndef LOCKSTEP_COMMON_CLOCK_H_
#define LOCKSTEP_COMMON_CLOCK_H_

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace lockstep {

class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;
};

// The wall clock. Thread-safe; one process-wide instance.
class RealClock : public Clock {
 public:
  static RealClock* Get();
  absl::Time Now() const override { return absl::Now(); }
};

// A clock that moves only when told to. Thread-safe.
class FakeClock : public Clock {
 public:
  explicit FakeClock(absl::Time start = absl::UnixEpoch()) : now_(start) {}
  absl::Time Now() const override;
  void Advance(absl::Duration d);

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_);
};

}  // namespace lockstep

#endif  // LOCKSTEP_COMMON_CLOCK_H_
