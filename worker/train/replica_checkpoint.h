// A replica in and out of files: the snapshot a rank hands its checkpointer
// (model, optimizer and trainer state on the chief, the rank's data position
// on every rank; docs/DESIGN.md §6, docs/CHECKPOINTS.md), the restore of a
// verified checkpoint, and the export of the final model.
//
// Thread-compatible: the training thread calls these.
#ifndef LOCKSTEP_WORKER_TRAIN_REPLICA_CHECKPOINT_H_
#define LOCKSTEP_WORKER_TRAIN_REPLICA_CHECKPOINT_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "checkpoint/store.h"
#include "common/export_file.h"
#include "common/job_spec.h"
#include "lockstep/v1/job.pb.h"
#include "worker/checkpoint/checkpointer.h"
#include "worker/train/replica.h"

namespace lockstep::worker {

// Where a replica stands in its job, for the files that describe it.
struct ReplicaPosition {
  std::string job_id;
  int64_t generation = 0;
  int rank = 0;
  int world_size = 1;
  BatchPlan plan;
  int64_t steps_per_epoch = 1;
  double next_lr = 0;
  // The label checkpoints carry, to refuse restoring another model.
  std::string model_label;
};

// The model's parameters and buffers as a LibTorch archive of host tensors
// (torch::load reads it into the same architecture on any device).
std::string SerializeModelOnHost(const Replica& replica);

// What a replica on a GPU writes: the archive Module::save would write, and
// the optimizer's, with every tensor copied to the host first (the
// optimizer's state through a twin optimizer over host copies of the
// parameters). For a replica on the CPU, the same bytes as the direct path.
std::string SerializeModelThroughHost(const torch::nn::Module& model);
std::string SerializeOptimizerThroughHost(const v1::JobSpec& spec,
                                          const Replica& replica);

// The state at the replica's current step boundary, serialized to host
// memory: this rank's data position, and on rank 0 the model, optimizer,
// trainer state and manifest.
Snapshot MakeSnapshot(const v1::JobSpec& spec, const Replica& replica,
                      const ReplicaPosition& position);

// Loads a verified checkpoint into the replica. Errors: FailedPrecondition
// when it holds another model or seed, or does not load into this model and
// optimizer; the file's own error when it cannot be read.
absl::Status LoadCheckpoint(const checkpoint::Found& found,
                            const v1::JobSpec& spec,
                            const std::string& model_label, Replica& replica);

// Verifies the checkpoints in `backup_dir` newer than `newer_than`, newest
// first, loads the first that verifies and returns its step; 0 when none
// does (each one skipped is logged). Errors: those of LoadCheckpoint.
absl::StatusOr<int64_t> RestoreNewestCheckpoint(const std::string& backup_dir,
                                                int64_t newer_than,
                                                const v1::JobSpec& spec,
                                                const std::string& model_label,
                                                Replica& replica);

// Writes the trained model to the job's export_path, atomically, with a
// marker naming `owner` (common/export_file.h). Errors: FailedPrecondition
// saying what failed.
absl::Status ExportModel(const ExportOwner& owner, const v1::JobSpec& spec,
                         const Replica& replica);

}  // namespace lockstep::worker

#endif  // LOCKSTEP_WORKER_TRAIN_REPLICA_CHECKPOINT_H_
