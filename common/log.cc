// Timestamped, tagged log lines to stderr (log.h).
#include "common/log.h"

#include <cstdio>
#include <string>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace lockstep {
namespace {

absl::Mutex tag_mu(absl::kConstInit);
std::string* tag ABSL_GUARDED_BY(tag_mu) = nullptr;

}  // namespace

void SetLogTag(absl::string_view new_tag) {
  absl::MutexLock lock(&tag_mu);
  delete tag;
  tag = new std::string(new_tag);
}

void LogLine(char level, absl::string_view message) {
  std::string stamp =
      absl::FormatTime("%m%d %H:%M:%E3S", absl::Now(), absl::LocalTimeZone());
  std::string line;
  {
    absl::MutexLock lock(&tag_mu);
    line = absl::StrCat(std::string(1, level), stamp, " ",
                        tag ? *tag : "lockstep", "] ", message, "\n");
  }
  fputs(line.c_str(), stderr);
}

}  // namespace lockstep
