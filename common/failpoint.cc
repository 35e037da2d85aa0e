// Arming a failure point from LOCKSTEP_FAILPOINT and firing it (failpoint.h).
#include "common/failpoint.h"

#include <signal.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <string>

#include "absl/strings/numbers.h"
#include "absl/time/clock.h"
#include "common/log.h"

namespace lockstep {
namespace {

struct Armed {
  std::string name;  // empty: no failure point armed
  int64_t on_hit = 1;
  std::atomic<int64_t> hits{0};
};

Armed& GetArmed() {
  static Armed* armed = [] {
    auto* a = new Armed;
    const char* env = std::getenv("LOCKSTEP_FAILPOINT");
    if (env == nullptr || *env == '\0') return a;
    std::string spec = env;
    size_t colon = spec.find(':');
    a->name = spec.substr(0, colon);
    if (colon != std::string::npos &&
        (!absl::SimpleAtoi(spec.substr(colon + 1), &a->on_hit) ||
         a->on_hit < 1)) {
      LogWarning("ignoring LOCKSTEP_FAILPOINT=", spec,
                 ": the count after ':' must be a positive integer");
      a->name.clear();
    }
    return a;
  }();
  return *armed;
}

}  // namespace

bool FailPointHit(absl::string_view name) {
  Armed& armed = GetArmed();
  if (armed.name.empty() || armed.name != name) return false;
  return armed.hits.fetch_add(1) + 1 == armed.on_hit;
}

void FailPointWait(absl::string_view name, absl::string_view what,
                   absl::Duration limit) {
  const char* release = std::getenv("LOCKSTEP_FAILPOINT_RELEASE");
  LogInfo("failure point ", name, " (LOCKSTEP_FAILPOINT): ", what,
          "; holding until ", release == nullptr ? "(unset)" : release,
          " exists");
  const absl::Time deadline = absl::Now() + limit;
  while (release != nullptr && access(release, F_OK) != 0 &&
         absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  LogInfo("failure point ", name, " released");
}

void FailPoint(absl::string_view name) {
  if (!FailPointHit(name)) return;
  LogError("failure point ", name, " reached (LOCKSTEP_FAILPOINT): dying");
  kill(getpid(), SIGKILL);
  _exit(137);  // not reached
}

}  // namespace lockstep
