// Gloo's rendezvous store calls over the coordinator's key-value store
// (kv_store.h).
#include "worker/collective/kv_store.h"

#include <stdexcept>

namespace lockstep::worker {

void KvStore::set(const std::string& key, const std::vector<char>& data) {
  absl::Status status = kv_->Set(key, std::string(data.begin(), data.end()));
  if (!status.ok()) throw std::runtime_error(status.ToString());
}

std::vector<char> KvStore::get(const std::string& key) {
  auto it = fetched_.find(key);
  if (it == fetched_.end()) {
    wait({key});
    it = fetched_.find(key);
  }
  return std::vector<char>(it->second.begin(), it->second.end());
}

void KvStore::wait(const std::vector<std::string>& keys) {
  wait(keys, absl::ToChronoMilliseconds(timeout_));
}

void KvStore::wait(const std::vector<std::string>& keys,
                   const std::chrono::milliseconds& timeout) {
  absl::Time deadline = absl::Now() + absl::FromChrono(timeout);
  for (const std::string& key : keys) {
    if (fetched_.count(key)) continue;
    auto value =
        kv_->Get(key, std::max(deadline - absl::Now(), absl::ZeroDuration()));
    if (!value.ok()) throw std::runtime_error(value.status().ToString());
    fetched_[key] = *std::move(value);
  }
}

}  // namespace lockstep::worker
