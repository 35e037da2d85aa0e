// One generation of a job (docs/DESIGN.md §3): the workers holding its ranks,
// what the ranks reported (results, a suspect error, a preemption, checkpoint
// prepares), and the rendezvous state scoped to it (its key-value store).
//
// Lifecycle: the Coordinator creates a Generation at each start of a job and
// replaces the previous one whole, so nothing of an older generation can
// leak into the next. When the generation ends (a failure, a preemption, the
// job's end) it is marked ended and kept until the next start only for its
// rank order (the next generation puts those workers first). Fencing is one
// question, Admits(number): a key-value call or report names a generation,
// and anything but the current, live one is refused.
//
// Thread-compatible: the Coordinator calls it with its lock held. Blocked
// callers (KvGet) hold no pointer to it across a wait: they look the job's
// current generation up again each time they wake.
#ifndef LOCKSTEP_COORDINATOR_GENERATION_H_
#define LOCKSTEP_COORDINATOR_GENERATION_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "coordinator/checkpoint_tally.h"

namespace lockstep::coordinator {

// What one generation's rendezvous may hold: key-value entries, and the
// bytes of their keys and values. A real rendezvous
// writes one entry per rank (a Gloo rank publishes one ~136-byte address per
// peer; NCCL one 128-byte id), so the defaults, flags of the coordinator,
// hold a Gloo full mesh of about 1,400 ranks; they stop a client that writes
// without bound from exhausting the coordinator's memory.
struct KvLimits {
  int64_t max_entries = 1 << 18;           // --kv-max-entries
  int64_t max_bytes = int64_t{256} << 20;  // --kv-max-bytes
};

// 32 fresh random bytes from OpenSSL's RAND_bytes: a generation's data-plane
// secret (docs/DESIGN.md, "Data-plane membership"). Errors: Internal when
// OpenSSL has no randomness to give.
absl::StatusOr<std::string> NewDataPlaneSecret();

class Generation {
 public:
  // Generation `number` of `job_id`; `rank_workers` holds the worker id of
  // each rank; `data_plane_secret` (NewDataPlaneSecret) goes to each rank in
  // its Assignment and nowhere else.
  Generation(std::string job_id, int64_t number,
             std::vector<std::string> rank_workers, KvLimits limits = {},
             std::string data_plane_secret = "");

  const std::string& job_id() const { return job_id_; }
  int64_t number() const { return number_; }
  int world_size() const { return static_cast<int>(rank_workers_.size()); }
  const std::vector<std::string>& rank_workers() const { return rank_workers_; }
  // The secret the ranks prove they hold to each other on the data plane.
  // Held in memory only: never logged, persisted or put in a JobStatus.
  const std::string& data_plane_secret() const { return data_plane_secret_; }
  // The CPU data plane's keys of `rank` (Assignment.data_plane_pair_keys):
  // at index j the key of the pair {rank, j}, HMAC-SHA256 of the secret over
  // the job, the generation and both ranks; empty at `rank`. Ranks i and j
  // get the same key for their pair and nobody else gets it. Errors:
  // Internal when OpenSSL fails (never a key of known bytes).
  absl::StatusOr<std::vector<std::string>> PairKeysOf(int rank) const;
  // The token only `rank`'s Assignment carries (rank_token), and whether
  // `token` is it (compared in constant time).
  absl::StatusOr<std::string> RankToken(int rank) const;
  bool TokenMatches(int rank, absl::string_view token) const;

  // Records the identity (Caller::id) that registered rank `rank`'s worker,
  // once, at the start: the rendezvous serves only the ranks' identities.
  void SetRankIdentity(int rank, const std::string& identity);
  // The ranks whose workers `identity` registered (none: empty).
  const std::vector<int>& RanksOf(const std::string& identity) const;

  // The fence: true only for this generation's number while it is live.
  bool Admits(int64_t number) const { return !ended_ && number == number_; }
  bool ended() const { return ended_; }
  // The generation is over; it admits nothing from now on.
  // Its key-value entries and pending prepares are dropped: no one may read
  // them any more.
  void End();

  // ---- key-value store ----
  // Sets `key` (replacing its value). Errors: ResourceExhausted when the
  // store would pass a KvLimits cap; nothing changes then.
  absl::Status Set(const std::string& key, std::string value);
  // The value of `key`, or null while it is not set.
  const std::string* Get(const std::string& key) const;
  // What the store holds now (for tests and logs).
  int64_t kv_entries() const { return kv_entries_; }
  int64_t kv_bytes() const { return kv_bytes_; }

  // ---- what the ranks reported ----
  // Records rank `rank`'s successful result (its final model digest and
  // step, whether it stopped on request, and the step its plan ends at);
  // true once every rank sent one. A rank's second result replaces its
  // first.
  bool AddOkResult(int rank, const std::string& digest, int64_t steps,
                   bool stopped = false, int64_t planned_end = 0);
  // Once every rank reported: "" when all ended with one digest at one
  // step and one plan, else who ended where ("ranks 0, 2: step 40, digest
  // ab12...; rank 1: step 999999, digest forged...").
  std::string Disagreement() const;
  // Whether any rank said it stopped on request (no single rank, the last
  // to report, decides it).
  bool AnyStopped() const;
  // The plan's end the ranks agreed on (0: none reported one).
  int64_t PlannedEnd() const;
  // A rank's retryable error, which usually means a peer died: it waits for
  // a worker failure to explain it until `deadline`. Only the first counts.
  void Suspect(const std::string& cause, absl::Time deadline);
  // The suspect error went unexplained until its deadline.
  bool SuspectDue(absl::Time now) const;
  const std::string& suspect() const { return suspect_; }
  // A worker asked for a preemption (`reason`, e.g. "SIGTERM"): every rank
  // stops at an agreed, saved step. False if one is already under way.
  bool StartPreemption(const std::string& reason);
  // A rank reported that it stopped for a preemption.
  void MarkPreempted() { preempting_ = true; }
  bool preempting() const { return preempting_; }
  // The scheduler called its preemption off (Resume): another may start;
  // ranks that had already agreed to stop report it all the same.
  void CallOffPreemption() {
    preempting_ = false;
    called_off_ = true;
  }
  bool called_off() const { return called_off_; }
  const std::string& preempt_reason() const { return preempt_reason_; }

  CheckpointTally& checkpoints() { return checkpoints_; }
  const CheckpointTally& checkpoints() const { return checkpoints_; }

 private:
  const std::string job_id_;
  const int64_t number_;
  const std::vector<std::string> rank_workers_;
  const KvLimits limits_;
  const std::string data_plane_secret_;
  bool ended_ = false;
  std::map<std::string, std::vector<int>> ranks_by_identity_;

  // Refuses growing the store by `entries` and `bytes` past limits_.
  absl::Status Admit(int64_t entries, int64_t bytes) const;

  std::map<std::string, std::string> kv_;
  // Entries and bytes in kv_.
  int64_t kv_entries_ = 0;
  int64_t kv_bytes_ = 0;

  // rank -> (digest, step) of its successful result.
  struct OkResult {
    std::string digest;
    int64_t steps = 0;
    bool stopped = false;
    int64_t planned_end = 0;
  };
  std::map<int, OkResult> results_ok_;
  std::string suspect_;
  absl::Time suspect_deadline_ = absl::InfiniteFuture();
  bool preempting_ = false;
  bool called_off_ = false;
  std::string preempt_reason_;
  CheckpointTally checkpoints_;
};

}  // namespace lockstep::coordinator

#endif  // LOCKSTEP_COORDINATOR_GENERATION_H_
