// One generation of a job: its ranks, reports and rendezvous state.
#include "coordinator/generation.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace lockstep::coordinator {

Generation::Generation(std::string job_id, int64_t number,
                       std::vector<std::string> rank_workers)
    : job_id_(std::move(job_id)),
      number_(number),
      rank_workers_(std::move(rank_workers)),
      checkpoints_(static_cast<int>(rank_workers_.size())) {}

void Generation::Set(const std::string& key, std::string value) {
  kv_[key] = std::move(value);
}

const std::string* Generation::Get(const std::string& key) const {
  auto it = kv_.find(key);
  return it == kv_.end() ? nullptr : &it->second;
}

void Generation::End() {
  ended_ = true;
  kv_.clear();
  barriers_.clear();
  checkpoints_.DropPending();
}

void Generation::Arrive(const std::string& name, int rank) {
  barriers_[name].insert(rank);
}

bool Generation::AllArrived(const std::string& name) const {
  auto it = barriers_.find(name);
  int arrived = it == barriers_.end() ? 0 : static_cast<int>(it->second.size());
  return arrived >= world_size();
}

std::vector<std::string> Generation::Missing(const std::string& name) const {
  auto it = barriers_.find(name);
  std::vector<std::string> missing;
  for (int rank = 0; rank < world_size(); ++rank) {
    if (it == barriers_.end() || it->second.count(rank) == 0) {
      missing.push_back(
          absl::StrCat("rank ", rank, " (", rank_workers_[rank], ")"));
    }
  }
  return missing;
}

bool Generation::AddOkResult() {
  ++results_ok_;
  return results_ok_ == world_size();
}

void Generation::Suspect(const std::string& cause, absl::Time deadline) {
  if (!suspect_.empty()) return;
  suspect_ = cause;
  suspect_deadline_ = deadline;
}

bool Generation::SuspectDue(absl::Time now) const {
  return !suspect_.empty() && now >= suspect_deadline_;
}

bool Generation::StartPreemption(const std::string& reason) {
  if (preempting_) return false;
  preempting_ = true;
  preempt_reason_ = reason;
  return true;
}

}  // namespace lockstep::coordinator
