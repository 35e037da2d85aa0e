// The two-phase checkpoint commit tally of one generation.
#include "coordinator/checkpoint_tally.h"

#include "absl/strings/str_cat.h"

namespace lockstep::coordinator {

std::optional<v1::CommitCheckpoint> CheckpointTally::Prepare(
    const v1::CheckpointPrepared& p, absl::Time now) {
  if (abandoned_.count(p.step()) > 0) return std::nullopt;
  if (p.ok()) {
    first_prepared_.try_emplace(p.step(), now);
    // A chief that died never commits: bound the steps waiting for it.
    if (first_prepared_.size() > kKeptCommits) {
      first_prepared_.erase(first_prepared_.begin());
    }
  } else {
    first_prepared_.erase(p.step());
  }
  v1::CommitCheckpoint commit;
  commit.set_job_id(p.job_id());
  commit.set_generation(p.generation());
  commit.set_step(p.step());
  if (!p.ok()) {
    abandoned_.insert(p.step());
    prepares_.erase(p.step());
    commit.set_abandoned(p.error());
    last_failed_ = p.step();
    last_failure_ =
        absl::StrCat("rank ", p.rank(), " could not prepare it: ", p.error());
    return commit;
  }
  auto& ranks = prepares_[p.step()];
  ranks[p.rank()] = p;
  if (static_cast<int>(ranks.size()) < world_size_) return std::nullopt;
  for (auto& [rank, prepared] : ranks) *commit.add_ranks() = prepared;
  sent_.insert(p.step());
  if (sent_.size() > kKeptCommits) sent_.erase(sent_.begin());
  // Ranks save the same steps in order: older incomplete steps are over.
  prepares_.erase(prepares_.begin(), prepares_.upper_bound(p.step()));
  return commit;
}

std::optional<absl::Duration> CheckpointTally::Committed(
    const v1::CheckpointCommitted& committed, absl::Time now) {
  std::optional<absl::Duration> latency;
  const auto it = first_prepared_.find(committed.step());
  if (committed.ok() && it != first_prepared_.end()) latency = now - it->second;
  // Older steps will not be committed any more (abandoned, or dropped for
  // this newer one).
  first_prepared_.erase(first_prepared_.begin(),
                        first_prepared_.upper_bound(committed.step()));
  if (!committed.ok()) {
    last_failed_ = committed.step();
    last_failure_ =
        absl::StrCat("the chief could not commit it: ", committed.error());
  }
  return latency;
}

void CheckpointTally::StopSaveFailed(int64_t step, const std::string& why) {
  if (last_failed_ == step) return;
  last_failed_ = step;
  last_failure_ = why;
}

std::string CheckpointTally::FailureOf(int64_t step) const {
  return last_failed_ == step ? last_failure_ : "";
}

}  // namespace lockstep::coordinator
