// A KeyValueClient held in memory, for ranks that run as threads of one
// process: unit tests and benchmarks of the collectives. Thread-safe.
#ifndef LOCKSTEP_WORKER_COLLECTIVE_IN_MEMORY_KV_H_
#define LOCKSTEP_WORKER_COLLECTIVE_IN_MEMORY_KV_H_

#include <map>
#include <string>

#include "absl/synchronization/mutex.h"
#include "worker/control_plane.h"

namespace lockstep::worker {

class InMemoryKeyValue : public KeyValueClient {
 public:
  absl::Status Set(const std::string& key, const std::string& value) override {
    absl::MutexLock lock(&mu_);
    if (cancelled_) return Cancelled(key);
    values_[key] = value;
    return absl::OkStatus();
  }

  absl::StatusOr<std::string> Get(const std::string& key,
                                  absl::Duration timeout) override {
    absl::MutexLock lock(&mu_);
    auto present = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return cancelled_ || values_.count(key) > 0;
    };
    if (!mu_.AwaitWithTimeout(absl::Condition(&present), timeout)) {
      return absl::DeadlineExceededError("key '" + key +
                                         "' was not set in time");
    }
    if (cancelled_) return Cancelled(key);
    return values_[key];
  }

  void Cancel() override {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
  }

 private:
  static absl::Status Cancelled(const std::string& key) {
    return absl::AbortedError("key '" + key + "': the store was cancelled");
  }

  absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::string, std::string> values_ ABSL_GUARDED_BY(mu_);
};

}  // namespace lockstep::worker

#endif  // LOCKSTEP_WORKER_COLLECTIVE_IN_MEMORY_KV_H_
