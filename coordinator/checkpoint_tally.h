// The coordinator's side of the two-phase checkpoint commit (docs/DESIGN.md
// §6), for one generation: it tallies the ranks' prepares of each step and says
// when the chief may commit one (every rank prepared it) or must abandon it (a
// rank could not), and remembers why the generation's latest failed save
// failed, so a stop whose final save was not committed can say why, and
// how long each commit took from its first prepare (for the metrics).
//
// Thread-compatible: the Coordinator calls it with its lock held.
#ifndef LOCKSTEP_COORDINATOR_CHECKPOINT_TALLY_H_
#define LOCKSTEP_COORDINATOR_CHECKPOINT_TALLY_H_

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <string>

#include "absl/time/time.h"
#include "lockstep/v1/coordinator.pb.h"

namespace lockstep::coordinator {

class CheckpointTally {
 public:
  explicit CheckpointTally(int world_size) : world_size_(world_size) {}

  // Records a rank's prepare (the caller checked that the rank is who it
  // says). Returns the command for the chief: a commit listing every rank's
  // files once all `world_size` ranks prepared the step, or an abandonment
  // when this prepare failed. Returns nullopt while ranks are missing, and
  // for a step already abandoned (it is never committed). `now`: when the
  // prepare arrived; the first rank's starts the step's commit latency.
  std::optional<v1::CommitCheckpoint> Prepare(
      const v1::CheckpointPrepared& p, absl::Time now = absl::UnixEpoch());
  // Whether every rank prepared `step` in this generation, so the chief was
  // told to commit it: a commit reported for any other step is forged.
  bool CommitSent(int64_t step) const { return sent_.count(step) > 0; }
  // Records the chief's report of a commit, arrived at `now`: a failed one
  // is the latest failure. Returns a successful commit's latency from its
  // step's first prepare, when that prepare was seen in this generation.
  std::optional<absl::Duration> Committed(
      const v1::CheckpointCommitted& committed,
      absl::Time now = absl::UnixEpoch());
  // A rank's result says the save of its stop step failed (`why` names the
  // rank). A prepare or commit failure of the same step, reported first,
  // is more precise and is kept.
  void StopSaveFailed(int64_t step, const std::string& why);

  // Forgets the prepares of incomplete steps (the generation ended); the
  // latest failure is kept for the account of the final save.
  void DropPending() { prepares_.clear(); }

  // Why the save of `step` failed ("rank 1 could not prepare it: disk
  // full"), or "" when no failure of that step was reported.
  std::string FailureOf(int64_t step) const;

 private:
  const int world_size_;
  // step -> rank -> its prepare, for steps not yet complete.
  std::map<int64_t, std::map<int, v1::CheckpointPrepared>> prepares_;
  std::set<int64_t> abandoned_;
  // The latest kKeptCommits steps the chief was told to commit.
  static constexpr size_t kKeptCommits = 64;
  std::set<int64_t> sent_;
  // When the first rank prepared each step not yet committed or abandoned
  // (the latest kKeptCommits).
  std::map<int64_t, absl::Time> first_prepared_;
  // The generation's latest failed save. A stop saves last, so this is
  // what it needs; keeping only the latest bounds it.
  int64_t last_failed_ = -1;
  std::string last_failure_;
};

}  // namespace lockstep::coordinator

#endif  // LOCKSTEP_COORDINATOR_CHECKPOINT_TALLY_H_
