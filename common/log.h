// Minimal logging to stderr: "I1130 10:42:03.123 coordinator] message".
// Debian's Abseil (20220623) predates absl/log, so lockstep keeps this one.
#ifndef LOCKSTEP_COMMON_LOG_H_
#define LOCKSTEP_COMMON_LOG_H_

#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace lockstep {

// Sets the tag printed on every line (the program name, a rank).
void SetLogTag(absl::string_view tag);

// Drops the lines below `level` ('I' < 'W' < 'E'): a simulation that
// drives a component through millions of events keeps only its errors.
void SetMinLogLevel(char level);

void LogLine(char level, absl::string_view message);

template <typename... Args>
void LogInfo(const Args&... args) {
  LogLine('I', absl::StrCat(args...));
}
template <typename... Args>
void LogWarning(const Args&... args) {
  LogLine('W', absl::StrCat(args...));
}
template <typename... Args>
void LogError(const Args&... args) {
  LogLine('E', absl::StrCat(args...));
}

}  // namespace lockstep

#endif  // LOCKSTEP_COMMON_LOG_H_
