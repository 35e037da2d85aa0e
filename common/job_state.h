// Job states: which are final, and their names, the one definition every
// component uses.
#ifndef LOCKSTEP_COMMON_JOB_STATE_H_
#define LOCKSTEP_COMMON_JOB_STATE_H_

#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/strip.h"
#include "lockstep/v1/coordinator.pb.h"

namespace lockstep {

// True for SUCCEEDED, FAILED and STOPPED: the job will not change again, so
// a watcher can stop watching and the coordinator accepts no more reports
// for it. QUEUED, RUNNING and RECOVERING are not terminal.
inline bool IsTerminal(v1::JobState state) {
  return state == v1::JOB_STATE_SUCCEEDED || state == v1::JOB_STATE_FAILED ||
         state == v1::JOB_STATE_STOPPED;
}

// JOB_STATE_RUNNING -> "running": the name every view, log line, event
// kind ("job_stopped") and metric label uses.
inline std::string StateName(v1::JobState state) {
  return absl::AsciiStrToLower(
      absl::StripPrefix(v1::JobState_Name(state), "JOB_STATE_"));
}

}  // namespace lockstep

#endif  // LOCKSTEP_COMMON_JOB_STATE_H_
