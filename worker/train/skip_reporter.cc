#include "worker/train/skip_reporter.h"

#include <algorithm>

#include "absl/strings/string_view.h"

namespace lockstep::worker {

void SkipReporter::Watch(const SplitSource* split) {
  if (split == nullptr || split->skipped() == nullptr) return;
  for (const Watched& watched : watched_) {
    if (watched.log == split->skipped()) return;
  }
  watched_.push_back({split->skipped()});
}

void SkipReporter::SendNew() {
  if (!send_) return;
  for (Watched& watched : watched_) {
    if (watched.log->count() == watched.sent) continue;
    const std::vector<SkippedRecordInfo> fresh =
        watched.log->Since(watched.sent);
    for (size_t first = 0; first < fresh.size();
         first += kMaxSkippedPerMessage) {
      v1::WorkerMessage message;
      v1::RecordsSkipped* skipped = message.mutable_skipped();
      skipped->set_job_id(assignment_.job_id());
      skipped->set_generation(assignment_.generation());
      const size_t end =
          std::min(fresh.size(), first + size_t{kMaxSkippedPerMessage});
      for (size_t i = first; i < end; ++i) {
        const SkippedRecordInfo& info = fresh[i];
        v1::SkippedRecord* record = skipped->add_records();
        record->set_file(info.file);
        record->set_record(info.record);
        record->set_offset(info.offset);
        record->set_bytes(info.bytes);
        record->set_reason(std::string(
            absl::string_view(info.reason).substr(0, kMaxSkipReasonBytes)));
        record->set_split(info.split);
      }
      send_(message);
    }
    watched.sent += fresh.size();
  }
}

}  // namespace lockstep::worker
