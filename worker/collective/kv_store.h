// A gloo::rendezvous::Store backed by the coordinator's key-value store, so
// Gloo's full-mesh bootstrap travels through the control plane, scoped by
// (job, generation). Gloo's Store interface cannot return errors: failures
// are thrown as std::runtime_error and caught at the Communicator boundary.
#ifndef LOCKSTEP_WORKER_COLLECTIVE_KV_STORE_H_
#define LOCKSTEP_WORKER_COLLECTIVE_KV_STORE_H_

#include <gloo/rendezvous/store.h>

#include <chrono>
#include <map>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "worker/control_plane.h"

namespace lockstep::worker {

class KvStore : public gloo::rendezvous::Store {
 public:
  // `kv` must outlive the store. `timeout` bounds waits without their own.
  KvStore(KeyValueClient* kv, absl::Duration timeout)
      : kv_(kv), timeout_(timeout) {}

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys) override;
  void wait(const std::vector<std::string>& keys,
            const std::chrono::milliseconds& timeout) override;

 private:
  KeyValueClient* const kv_;
  const absl::Duration timeout_;
  // Values fetched by wait(), so get() does not ask twice.
  std::map<std::string, std::string> fetched_;
};

}  // namespace lockstep::worker

#endif  // LOCKSTEP_WORKER_COLLECTIVE_KV_STORE_H_
