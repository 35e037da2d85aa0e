// The process-wide real clock and the fake clock tests advance (clock.h).
#include "common/clock.h"

namespace lockstep {

RealClock* RealClock::Get() {
  static RealClock* clock = new RealClock;
  return clock;
}

absl::Time FakeClock::Now() const {
  absl::MutexLock lock(&mu_);
  return now_;
}

void FakeClock::Advance(absl::Duration d) {
  absl::MutexLock lock(&mu_);
  now_ += d;
}

}  // namespace lockstep
