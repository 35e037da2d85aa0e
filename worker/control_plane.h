// The worker's view of the coordinator, behind interfaces so the agent and
// the collectives can be tested without a network. worker/rpc/ implements
// them over gRPC.
#ifndef LOCKSTEP_WORKER_CONTROL_PLANE_H_
#define LOCKSTEP_WORKER_CONTROL_PLANE_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "lockstep/v1/coordinator.pb.h"

namespace lockstep::worker {

// The coordinator's key-value store, scoped to one (job, generation).
// Thread-safe.
class KeyValueClient {
 public:
  virtual ~KeyValueClient() = default;
  virtual absl::Status Set(const std::string& key,
                           const std::string& value) = 0;
  // Waits up to `timeout` for the key. Errors: DeadlineExceeded, Aborted when
  // the generation is over.
  virtual absl::StatusOr<std::string> Get(const std::string& key,
                                          absl::Duration timeout) = 0;
  // Ends every pending call at once, and every later one, with Aborted: the
  // generation is over on this worker, and no rendezvous may hold it.
  virtual void Cancel() = 0;
};

// One long-lived worker session. Send is thread-safe; Receive is called by
// one thread only.
class Session {
 public:
  virtual ~Session() = default;
  virtual bool Send(const v1::WorkerMessage& message) = 0;
  // Blocks for the next command; false when the session ended.
  virtual bool Receive(v1::CoordinatorCommand* command) = 0;
  // Why the session ended (after Receive returned false).
  virtual absl::Status Finish() = 0;
  // Half-closes the upward stream once what was sent is on its way: the
  // coordinator sees the worker leave cleanly. Nothing may be sent after.
  virtual void CloseWrites() {}
};

class ControlPlane {
 public:
  virtual ~ControlPlane() = default;
  virtual absl::StatusOr<v1::RegisterWorkerResponse> Register(
      const v1::RegisterWorkerRequest& request) = 0;
  virtual absl::StatusOr<std::unique_ptr<Session>> OpenSession(
      const std::string& worker_id, uint64_t incarnation) = 0;
  // The store of `job_id`'s generation `generation`, for its rank `rank`,
  // whose Assignment carried `rank_token` (it proves, with each key set,
  // that the call comes from that rank).
  virtual std::unique_ptr<KeyValueClient> KeyValue(
      const std::string& job_id, int64_t generation, int rank,
      const std::string& rank_token) = 0;
  // Streams the file at `path` to the coordinator as the artifact `header`
  // declares (its info's size and SHA-256 are this function's to fill),
  // within `timeout`. Returns what the coordinator kept. Errors: the
  // coordinator's (it names the job and rank), or the file's.
  virtual absl::StatusOr<v1::ArtifactInfo> UploadArtifact(
      v1::ArtifactUpload::Header header, const std::string& path,
      absl::Duration timeout) {
    return absl::UnimplementedError("this control plane uploads nothing");
  }
};

}  // namespace lockstep::worker

#endif  // LOCKSTEP_WORKER_CONTROL_PLANE_H_
