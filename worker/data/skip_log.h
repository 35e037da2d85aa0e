// The unreadable records a split skipped (data.skip_corrupt: N, tf.data's
// ignore_errors with a bound): each distinct record once, in the order they
// were found, and the error that ends the job when the N+1st turns up.
//
// Thread-safe: the decode threads note records while the training thread
// reads what was noted.
#ifndef LOCKSTEP_WORKER_DATA_SKIP_LOG_H_
#define LOCKSTEP_WORKER_DATA_SKIP_LOG_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace lockstep::worker {

struct SkippedRecordInfo {
  std::string file;    // relative to data.dir
  int64_t record = 0;  // its number in the file
  int64_t offset = 0;  // its first byte
  int64_t bytes = 0;   // what the damage spans (0: one whole record)
  std::string reason;
  std::string split;  // "train" or "test"
};

class SkipLog {
 public:
  // At most `limit` distinct records may be skipped.
  explicit SkipLog(int64_t limit) : limit_(limit) {}

  // Notes that `record` was skipped; `*fresh` (if given) says whether it
  // was new. Noting one again changes nothing. Errors: DataLoss once more
  // than the limit are noted, naming the record and the limit (every later
  // call fails too).
  absl::Status Note(SkippedRecordInfo record, bool* fresh = nullptr);

  // The distinct records noted, from the `from`th on.
  std::vector<SkippedRecordInfo> Since(size_t from) const;
  size_t count() const;
  int64_t limit() const { return limit_; }

 private:
  const int64_t limit_;
  mutable absl::Mutex mu_;
  std::vector<SkippedRecordInfo> records_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_set<std::pair<std::string, int64_t>> seen_
      ABSL_GUARDED_BY(mu_);
};

// "FILE record R at byte B: REASON", as events and errors name a record.
std::string DescribeSkipped(const SkippedRecordInfo& record);

}  // namespace lockstep::worker

#endif  // LOCKSTEP_WORKER_DATA_SKIP_LOG_H_
