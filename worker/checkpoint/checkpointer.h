// One rank's side of BackupAndRestore saves (docs/DESIGN.md §6). The trainer
// hands it a snapshot (the state serialized to host memory at a step boundary);
// a background thread writes the rank's files into its temporary folder
// (prepare) and reports them to the coordinator. On the chief it then waits
// for the coordinator's word that every rank prepared the step, commits the
// checkpoint, prunes old ones and reports the commit. At most one save is in
// flight: the next one waits for it, so every rank saves the same steps.
//
// A save that fails (disk full, permission, a rank that could not prepare)
// is reported to the coordinator as an event and logged; training goes on
// and the previous checkpoint stays the newest.
//
// Thread-compatible: one training thread calls it.
#ifndef LOCKSTEP_WORKER_CHECKPOINT_CHECKPOINTER_H_
#define LOCKSTEP_WORKER_CHECKPOINT_CHECKPOINTER_H_

#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "lockstep/v1/checkpoint.pb.h"
#include "checkpoint/store.h"
#include "worker/task_context.h"

namespace lockstep::worker {

struct Snapshot {
  int64_t step = 0;
  int32_t epoch = 0;
  // This rank's files; on the chief also the replicated state.
  std::vector<checkpoint::NamedFile> files;
  // Chief only: the manifest to commit (files are filled in by the commit).
  v1::Manifest manifest;
};

class Checkpointer {
 public:
  Checkpointer(TaskContext& task, std::string backup_dir, int keep);
  // Waits for the save in flight; a chief still waiting for its commit gives
  // it up (the generation is ending on this rank).
  ~Checkpointer();

  // Starts saving `snapshot` in the background, after the save in flight.
  void SaveAsync(Snapshot snapshot);
  // Waits for the save in flight and returns how it went: prepared on a
  // rank, committed on the chief.
  absl::Status Wait();

  const std::string& backup_dir() const { return backup_dir_; }

 private:
  absl::Status Save(const Snapshot& snapshot);
  absl::Status CommitOnChief(const Snapshot& snapshot);
  void Send(const v1::WorkerMessage& message);

  TaskContext& task_;
  const std::string backup_dir_;
  const int keep_;
  const int rank_;
  std::thread thread_;
  absl::Status last_;  // written by thread_, read after join
};

}  // namespace lockstep::worker

#endif  // LOCKSTEP_WORKER_CHECKPOINT_CHECKPOINTER_H_
