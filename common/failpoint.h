// Named failure points for crash tests: a test sets LOCKSTEP_FAILPOINT in a
// process's environment and the process kills itself (SIGKILL, like a lost
// node) when it reaches that point, or (FailPointHit) misbehaves there.
//
// clang-format off
//   LOCKSTEP_FAILPOINT=checkpoint_before_latest     fires the first time
//   LOCKSTEP_FAILPOINT=checkpoint_before_latest:3   fires the third time
// clang-format on
//
// Compiled into every build: without the variable a failure point costs one
// load and a branch.
#ifndef LOCKSTEP_COMMON_FAILPOINT_H_
#define LOCKSTEP_COMMON_FAILPOINT_H_

#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace lockstep {

void FailPoint(absl::string_view name);

// For points where a test changes what the process does instead of killing
// it (the same variable and counting): true the Nth time it is reached.
bool FailPointHit(absl::string_view name);

// For points where a test acts while the process waits (a stranger connects
// to a rank's port in its rendezvous): call once FailPointHit(name) said
// true. Logs `what` and waits until the file named by
// LOCKSTEP_FAILPOINT_RELEASE exists, at most `limit`.
void FailPointWait(absl::string_view name, absl::string_view what,
                   absl::Duration limit);

}  // namespace lockstep

#endif  // LOCKSTEP_COMMON_FAILPOINT_H_
