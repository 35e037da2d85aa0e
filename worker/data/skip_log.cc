#include "worker/data/skip_log.h"

#include "absl/strings/str_cat.h"

namespace lockstep::worker {

absl::Status SkipLog::Note(SkippedRecordInfo record, bool* fresh) {
  absl::MutexLock lock(&mu_);
  // Past the limit nothing more is kept: the job is failing.
  const bool full = static_cast<int64_t>(records_.size()) > limit_;
  const bool added =
      !full && seen_
                   .insert({absl::StrCat(record.split, "/", record.file, "/",
                                         record.record),
                            record.offset})
                   .second;
  if (added) records_.push_back(record);
  if (fresh != nullptr) *fresh = added;
  if (static_cast<int64_t>(records_.size()) <= limit_) {
    return absl::OkStatus();
  }
  return absl::DataLossError(absl::StrCat(
      "more than ", limit_, " record", limit_ == 1 ? "" : "s",
      " of the data could not be read (data.skip_corrupt: ", limit_,
      "); the last: ", DescribeSkipped(record),
      "; repair or rewrite the damaged files, or allow more"));
}

std::vector<SkippedRecordInfo> SkipLog::Since(size_t from) const {
  absl::MutexLock lock(&mu_);
  if (from >= records_.size()) return {};
  return std::vector<SkippedRecordInfo>(records_.begin() + from,
                                        records_.end());
}

size_t SkipLog::count() const {
  absl::MutexLock lock(&mu_);
  return records_.size();
}

std::string DescribeSkipped(const SkippedRecordInfo& record) {
  std::string where = absl::StrCat(record.file, " record ", record.record);
  // A GZIP stream's record has no offset in the file.
  if (record.offset >= 0) absl::StrAppend(&where, " at byte ", record.offset);
  if (record.bytes > 0) absl::StrAppend(&where, " (", record.bytes, " bytes)");
  return absl::StrCat(where, ": ", record.reason);
}

}  // namespace lockstep::worker
