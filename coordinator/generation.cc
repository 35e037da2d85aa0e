// One generation of a job: its ranks, reports and rendezvous state.
#include "coordinator/generation.h"

#include <openssl/err.h>
#include <openssl/rand.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace lockstep::coordinator {

absl::StatusOr<std::string> NewDataPlaneSecret() {
  std::string secret(32, '\0');
  if (RAND_bytes(reinterpret_cast<unsigned char*>(secret.data()),
                 static_cast<int>(secret.size())) != 1) {
    return absl::InternalError(absl::StrCat(
        "OpenSSL's RAND_bytes could not make a generation's data-plane "
        "secret (error ",
        ERR_get_error(), "); the machine has no source of randomness"));
  }
  return secret;
}

Generation::Generation(std::string job_id, int64_t number,
                       std::vector<std::string> rank_workers, KvLimits limits,
                       std::string data_plane_secret)
    : job_id_(std::move(job_id)),
      number_(number),
      rank_workers_(std::move(rank_workers)),
      limits_(limits),
      data_plane_secret_(std::move(data_plane_secret)),
      checkpoints_(static_cast<int>(rank_workers_.size())) {}

absl::Status Generation::Admit(int64_t entries, int64_t bytes) const {
  if (kv_entries_ + entries > limits_.max_entries) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "job ", job_id_, " generation ", number_,
        ": the rendezvous store holds ", kv_entries_,
        " keys and barriers, the most --kv-max-entries (", limits_.max_entries,
        ") allows; a client writes keys without bound, or the coordinator "
        "needs a larger --kv-max-entries for this world size"));
  }
  if (kv_bytes_ + bytes > limits_.max_bytes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "job ", job_id_, " generation ", number_,
        ": the rendezvous store holds ", kv_bytes_, " bytes; ", bytes,
        " more would pass --kv-max-bytes (", limits_.max_bytes,
        "); a client writes values without bound, or the coordinator needs a "
        "larger --kv-max-bytes for this world size"));
  }
  return absl::OkStatus();
}

absl::Status Generation::Set(const std::string& key, std::string value) {
  auto it = kv_.find(key);
  const int64_t old_bytes =
      it == kv_.end() ? 0
                      : static_cast<int64_t>(key.size() + it->second.size());
  const int64_t new_bytes = static_cast<int64_t>(key.size() + value.size());
  absl::Status admitted = Admit(it == kv_.end() ? 1 : 0,
                                std::max<int64_t>(0, new_bytes - old_bytes));
  if (!admitted.ok()) return admitted;
  if (it == kv_.end()) ++kv_entries_;
  kv_bytes_ += new_bytes - old_bytes;
  kv_[key] = std::move(value);
  return absl::OkStatus();
}

const std::string* Generation::Get(const std::string& key) const {
  auto it = kv_.find(key);
  return it == kv_.end() ? nullptr : &it->second;
}

void Generation::SetRankIdentity(int rank, const std::string& identity) {
  ranks_by_identity_[identity].push_back(rank);
}

const std::vector<int>& Generation::RanksOf(const std::string& identity) const {
  static const std::vector<int>* const kNone = new std::vector<int>();
  auto it = ranks_by_identity_.find(identity);
  return it == ranks_by_identity_.end() ? *kNone : it->second;
}

void Generation::End() {
  ended_ = true;
  kv_.clear();
  barriers_.clear();
  kv_entries_ = 0;
  kv_bytes_ = 0;
  checkpoints_.DropPending();
}

absl::Status Generation::Arrive(const std::string& name, int rank) {
  auto it = barriers_.find(name);
  if (it == barriers_.end()) {
    absl::Status admitted = Admit(1, static_cast<int64_t>(name.size()));
    if (!admitted.ok()) return admitted;
    ++kv_entries_;
    kv_bytes_ += static_cast<int64_t>(name.size());
    it = barriers_.emplace(name, std::set<int>()).first;
  }
  it->second.insert(rank);
  return absl::OkStatus();
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

bool Generation::AddOkResult(int rank, const std::string& digest,
                             int64_t steps) {
  results_ok_[rank] = {digest, steps};
  return static_cast<int>(results_ok_.size()) == world_size();
}

std::string Generation::Disagreement() const {
  // (step, digest) -> the ranks that ended there, in rank order.
  std::map<std::pair<int64_t, std::string>, std::vector<int>> ends;
  for (const auto& [rank, result] : results_ok_) {
    ends[{result.second, result.first}].push_back(rank);
  }
  if (ends.size() <= 1) return "";
  std::string text;
  for (const auto& [end, ranks] : ends) {
    absl::StrAppend(&text, text.empty() ? "" : "; ",
                    ranks.size() == 1 ? "rank " : "ranks ",
                    absl::StrJoin(ranks, ", "), ": step ", end.first,
                    ", digest ", end.second.substr(0, 24));
  }
  return text;
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
