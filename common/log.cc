// Timestamped, tagged log lines to stderr (log.h).
#include "common/log.h"

#include <atomic>
#include <cstdio>
#include <string>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace lockstep {
namespace {

absl::Mutex tag_mu(absl::kConstInit);
std::string* tag ABSL_GUARDED_BY(tag_mu) = nullptr;

// 0: everything; 1: warnings and errors; 2: errors.
std::atomic<int> min_rank{0};

int Rank(char level) { return level == 'E' ? 2 : level == 'W' ? 1 : 0; }

}  // namespace

void SetMinLogLevel(char level) { min_rank.store(Rank(level)); }

void SetLogTag(absl::string_view new_tag) {
  absl::MutexLock lock(&tag_mu);
  delete tag;
  tag = new std::string(new_tag);
}

void LogLine(char level, absl::string_view message) {
  if (Rank(level) < min_rank.load(std::memory_order_relaxed)) return;
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
