// One generation of a job: its ranks, reports and rendezvous state.
#include "coordinator/generation.h"

#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <algorithm>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"

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

namespace {

void AppendField(std::string* message, absl::string_view field) {
  const uint64_t size = field.size();
  for (int i = 0; i < 8; ++i)
    message->push_back(static_cast<char>(size >> (8 * i)));
  message->append(field.data(), field.size());
}

// HMAC-SHA256 keyed with the secret over `label`, the job, the generation and
// `fields`, each preceded by its length so no two lists encode alike.
absl::StatusOr<std::string> Derive(
    const std::string& secret, absl::string_view label,
    const std::string& job_id, int64_t number,
    std::initializer_list<absl::string_view> fields) {
  std::string message;
  AppendField(&message, label);
  AppendField(&message, job_id);
  AppendField(&message, absl::StrCat(number));
  for (absl::string_view field : fields) AppendField(&message, field);
  std::string out(32, '\0');
  unsigned int size = 0;
  if (HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
           reinterpret_cast<const unsigned char*>(message.data()),
           message.size(), reinterpret_cast<unsigned char*>(out.data()),
           &size) == nullptr ||
      size != out.size()) {
    return absl::InternalError(absl::StrCat(
        "OpenSSL's HMAC failed deriving the data-plane keys of job ", job_id,
        " generation ", number, " (error ", ERR_get_error(),
        "); the coordinator is out of memory"));
  }
  return out;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> Generation::PairKeysOf(
    int rank) const {
  std::vector<std::string> keys(rank_workers_.size());
  for (int peer = 0; peer < world_size(); ++peer) {
    if (peer == rank) continue;
    const int low = std::min(rank, peer);
    const int high = std::max(rank, peer);
    ASSIGN_OR_RETURN(keys[peer],
                     Derive(data_plane_secret_, "lockstep pair key v1", job_id_,
                            number_, {absl::StrCat(low), absl::StrCat(high)}));
  }
  return keys;
}

absl::StatusOr<std::string> Generation::RankToken(int rank) const {
  return Derive(data_plane_secret_, "lockstep rank token v1", job_id_, number_,
                {absl::StrCat(rank)});
}

bool Generation::TokenMatches(int rank, absl::string_view token) const {
  absl::StatusOr<std::string> expected = RankToken(rank);
  return expected.ok() && token.size() == expected->size() &&
         CRYPTO_memcmp(token.data(), expected->data(), token.size()) == 0;
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
        " keys, the most --kv-max-entries (", limits_.max_entries,
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
  kv_entries_ = 0;
  kv_bytes_ = 0;
  checkpoints_.DropPending();
}

bool Generation::AddOkResult(int rank, const std::string& digest, int64_t steps,
                             bool stopped, int64_t planned_end) {
  results_ok_[rank] = {digest, steps, stopped, planned_end};
  return static_cast<int>(results_ok_.size()) == world_size();
}

std::string Generation::Disagreement() const {
  // (step, digest, plan's end) -> the ranks that ended there, in rank order.
  std::map<std::tuple<int64_t, std::string, int64_t>, std::vector<int>> ends;
  for (const auto& [rank, result] : results_ok_) {
    ends[{result.steps, result.digest, result.planned_end}].push_back(rank);
  }
  if (ends.size() <= 1) return "";
  std::set<int64_t> plans;
  for (const auto& [end, ranks] : ends) plans.insert(std::get<2>(end));
  std::string text;
  for (const auto& [end, ranks] : ends) {
    absl::StrAppend(&text, text.empty() ? "" : "; ",
                    ranks.size() == 1 ? "rank " : "ranks ",
                    absl::StrJoin(ranks, ", "), ": step ", std::get<0>(end),
                    ", digest ", std::get<1>(end).substr(0, 24));
    if (plans.size() > 1) {
      absl::StrAppend(&text, ", plan ends at step ", std::get<2>(end));
    }
  }
  return text;
}

bool Generation::AnyStopped() const {
  for (const auto& [rank, result] : results_ok_) {
    if (result.stopped) return true;
  }
  return false;
}

int64_t Generation::PlannedEnd() const {
  return results_ok_.empty() ? 0 : results_ok_.begin()->second.planned_end;
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
