// Updates to a job's reported status (v1::JobStatus) from what its workers
// send: progress aggregation (steps, loss history, evaluations, the
// "resumed" event), rank results, committed checkpoints, events, and the
// account of a stopping generation's final save.
//
// These change only the record; the job's state machine is the
// Coordinator's. Plain functions of the status, called with the
// coordinator's lock held; `now` is Unix seconds from its injected clock.
#ifndef LOCKSTEP_COORDINATOR_JOB_STATUS_H_
#define LOCKSTEP_COORDINATOR_JOB_STATUS_H_

#include <cstdint>
#include <string>

#include "coordinator/worker_registry.h"
#include "lockstep/v1/coordinator.pb.h"

namespace lockstep::coordinator {

// Losses a job's loss history keeps (4 MiB of floats, and as much again
// for the learning rates beside them): every step's for the first 2^20
// steps; past that every second one, then every fourth, ...
// (JobStatus.loss_stride), so the curve always spans the whole job.
inline constexpr int kMaxLossHistory = 1 << 20;

// The steps between two losses of the history (JobStatus.loss_stride; 1 for
// a status that does not set it).
int64_t LossStride(const v1::JobStatus& status);

// Events a job keeps: the newest kMaxEvents, each message cut to
// kMaxEventMessageBytes, so one job's status stays far below gRPC's 4 MiB
// message limit whatever its workers report. JobStatus.dropped_events
// counts the events dropped from the front.
inline constexpr int kMaxEvents = 1000;
// Evaluations a job keeps (an EvalPoint is at most ~1 KiB): past this,
// every second one is dropped (JobStatus.dropped_evals counts them).
inline constexpr int kMaxEvals = 1000;
inline constexpr size_t kMaxEventMessageBytes = 2048;

// The restarts the job has used: its re-formations after a failure
// (generations past the first; preemptions and coordinator restarts not
// counted), what max_restarts bounds.
int RestartsUsed(const v1::JobStatus& status);

// Appends an event of the job's current generation; `worker`, when given,
// names who it concerns.
// Past kMaxEvents the oldest event is dropped (and counted).
void AddEvent(v1::JobStatus& status, double now, const std::string& kind,
              const Worker* worker, const std::string& message);

// Applies the chief's progress report of the running generation: step,
// epoch, throughput, the loss history (a report rewrites it from its
// first_step, so the history holds one loss per step trained, or per
// loss_stride steps, never more; a report that starts past its end leaves
// zeros between, thinning the history first if they would not fit), the
// learning rates beside the losses (JobStatus.step_lrs), evaluations, warnings
// and, in a generation's first report, where it resumed.
void ApplyProgress(v1::JobStatus& status, const v1::ProgressReport& report,
                   double now);

// Counts the records of the job's data that `worker`'s rank skipped
// (data.skip_corrupt) and that no rank reported before (by key:
// JobStatus.skipped_record_keys), each with a "record_skipped" event; once
// records_skipped is past the spec's limit nothing more is counted.
// Returns how many were new.
int NoteSkippedRecords(v1::JobStatus& status, const v1::RecordsSkipped& skipped,
                       const Worker& worker, double now);
// "train data FILE record R at byte B: REASON".
std::string DescribeSkippedRecord(const v1::SkippedRecord& record);

// Applies rank `rank`'s successful result; the chief's also sets the job's
// final step, loss, accuracy, throughput and step breakdown.
// A rank applied `step`: raises JobStatus.applied_step.
void NoteAppliedStep(v1::JobStatus& status, int64_t step);

void ApplyResult(v1::JobStatus& status, int rank, const v1::TaskResult& result);

// Records a checkpoint the chief committed (the newest 100 are kept) and
// its event; `worker` is the chief.
void AddCheckpoint(v1::JobStatus& status, const v1::CheckpointCommitted& c,
                   const Worker& worker, double now);

// Where a job placed again resumes, from its committed checkpoints: "it
// resumes from ckpt-000000120 (step 120), its newest checkpoint", or "it
// resumes from step 0 (no checkpoint of this job was committed)"; "" when
// it saves no checkpoints.
std::string ResumePoint(const v1::JobStatus& status);

// Where a preempted job placed again goes on (its resumed_after_preemption
// event): from the step it stopped at when that step was saved; otherwise
// (the final save failed, or the coordinator restarted before committing
// it) what ResumePoint says, unless its workers still hold the newer live
// state (issue 52: said, not claimed).
std::string ContinuesAfterPreemption(const v1::JobStatus& status);

// What became of the save a generation made when it stopped after `step`
// (a stop request or a preemption): "saved as ckpt-000000120", or that the
// save failed (`failure` says why, when a rank or the chief reported it) and
// which checkpoint is the newest instead. "" when the job has no
// checkpoints configured.
std::string FinalSave(const v1::JobStatus& status, int64_t step,
                      const std::string& failure);

// A job's summary, as listings send it (`lockstep status`, `lockstep
// queue`): without events, checkpoints and evaluations; a record over
// `max_bytes` (stored before the bounds) also without its spec, its error
// cut to `max_error_bytes`.
v1::JobStatus Summary(v1::JobStatus status, size_t max_bytes,
                      size_t max_error_bytes);

}  // namespace lockstep::coordinator

#endif  // LOCKSTEP_COORDINATOR_JOB_STATUS_H_
