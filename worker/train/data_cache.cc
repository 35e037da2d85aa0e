// The per-process cache of opened splits (data_cache.h).
#include "worker/train/data_cache.h"

#include <iterator>
#include <map>
#include <string>
#include <utility>

#include "absl/synchronization/mutex.h"
#include "common/status_macros.h"
#include "google/protobuf/io/coded_stream.h"
#include "google/protobuf/io/zero_copy_stream_impl_lite.h"

namespace lockstep::worker {
namespace {

// The data spec (serialized: every field matters, the globs and features
// too) and the split.
using CacheKey = std::pair<std::string, bool>;

absl::Mutex cache_mu(absl::kConstInit);
std::map<CacheKey, std::shared_ptr<const SplitSource>>* cache
    ABSL_GUARDED_BY(cache_mu) = nullptr;

std::string KeyOf(const v1::DataSpec& spec) {
  std::string key;
  // Deterministic: a map field's entries are serialized in key order.
  google::protobuf::io::StringOutputStream out(&key);
  google::protobuf::io::CodedOutputStream coded(&out);
  coded.SetSerializationDeterministic(true);
  spec.SerializeToCodedStream(&coded);
  return key;
}

}  // namespace

absl::StatusOr<std::shared_ptr<const SplitSource>> LoadSplit(
    const v1::DataSpec& spec, bool train) {
  const std::string data = KeyOf(spec);
  const CacheKey key = std::make_pair(data, train);
  {
    absl::MutexLock lock(&cache_mu);
    if (cache != nullptr) {
      auto it = cache->find(key);
      if (it != cache->end()) return it->second;
    }
  }
  ASSIGN_OR_RETURN(std::shared_ptr<const SplitSource> split,
                   OpenSplit(spec, train));
  absl::MutexLock lock(&cache_mu);
  if (cache == nullptr) {
    cache = new std::map<CacheKey, std::shared_ptr<const SplitSource>>;
  }
  // One data set at a time: another one's splits go.
  for (auto it = cache->begin(); it != cache->end();) {
    it = it->first.first == data ? std::next(it) : cache->erase(it);
  }
  (*cache)[key] = split;
  return split;
}

void ForgetCachedData() {
  absl::MutexLock lock(&cache_mu);
  if (cache != nullptr) cache->clear();
}

}  // namespace lockstep::worker
