// One job as the coordinator keeps it: its status (what clients see and the
// store holds), the generation running now, and the scheduler's sub-states.
//
// The preemption sub-state lives in the status (JobStatus.preemption,
// keep_ranks, queued_time), so that the store holds it and a coordinator
// restarted in the middle of a preemption finishes it (issue 52):
//
//   settled ── the scheduler preempts it for a queued job ──▶ yielding
//   yielding ── every rank stopped at the agreed step ──────▶ queued again,
//               or (shrink_to > 0) re-forming on its first keep_ranks ranks
//   yielding ── a rank failed, or the coordinator restarted ─▶ the same: the
//               preemption stands, and the job resumes from what it saved
//   yielding ── a stop on request ──────────────────────────▶ stopped
//
// Thread-compatible: the coordinator's lock guards every record.
#ifndef LOCKSTEP_COORDINATOR_JOB_RECORD_H_
#define LOCKSTEP_COORDINATOR_JOB_RECORD_H_

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/time/time.h"
#include "coordinator/generation.h"
#include "lockstep/v1/coordinator.pb.h"

namespace lockstep::coordinator {

// Seconds since the Unix epoch (JobStatus' times).
inline double EpochSeconds(absl::Time t) {
  return absl::ToDoubleSeconds(t - absl::UnixEpoch());
}

struct JobRecord {
  // Submission order: the number that ends the job id ("name-<seq>").
  int64_t seq = 0;
  v1::JobStatus status;
  // StopJob, or the job's time limit, asked the running generation to stop
  // (it wins over a preemption under way); why, for its final event.
  bool stop_requested = false;
  std::string stop_cause;
  // When its current generation started (on this coordinator's clock):
  // it is not preempted for another job before min_run_time from there.
  absl::Time started = absl::InfinitePast();
  // When it last entered the queue, for --age-after (status.queued_time on
  // the clock's scale, restored from the store).
  absl::Time queued_at = absl::InfinitePast();
  // When the job was last written to the store: progress reports are
  // written at most once per kPersistProgressEvery (worker_reports.cc).
  absl::Time last_persisted = absl::InfinitePast();
  // The job's current generation, replaced whole at each start; between
  // generations the ended one stays for its rank order. Null until the
  // job first starts in this coordinator process.
  std::unique_ptr<Generation> generation;

  // ---- the preemption sub-state (in status, see above) ----
  // The scheduler preempted it for the queued job yield_for(): its ranks
  // are stopping at an agreed step.
  bool yielding() const { return !status.preemption().for_job().empty(); }
  const std::string& yield_for() const { return status.preemption().for_job(); }
  // > 0 while yielding: an elastic job shrinks to its first shrink_to()
  // ranks instead of stopping.
  int shrink_to() const { return status.preemption().shrink_to(); }
  // > 0 after it shrank: its next generation re-forms on those first ranks
  // only, and the rest went to the job it yielded for.
  int keep_ranks() const { return status.keep_ranks(); }

  // The scheduler asks it to yield its workers (all, or those past `keep`)
  // to `for_job`.
  void BeginYield(const std::string& for_job, int keep, double now) {
    v1::Preemption& preemption = *status.mutable_preemption();
    preemption.set_for_job(for_job);
    preemption.set_shrink_to(keep);
    preemption.set_requested_time(now);
  }
  // The preemption is over (done, cut short or overtaken by a stop).
  void EndYield() { status.clear_preemption(); }
  // It shrank: it re-forms on its first `ranks` ranks (0: no longer).
  void KeepRanks(int ranks) { status.set_keep_ranks(ranks); }
  // It enters the queue at `now`: a run it was in ends, for its time limit.
  void Queued(absl::Time now) {
    queued_at = now;
    status.set_queued_time(EpochSeconds(now));
    if (status.has_run_start_time()) {
      status.set_run_seconds(
          status.run_seconds() +
          std::max(0.0, EpochSeconds(now) - status.run_start_time()));
      status.clear_run_start_time();
    }
  }
  // The scheduler placed it from the queue at `now`: a run starts, and
  // this wait joins its earlier ones.
  void Placed(absl::Time now) {
    status.set_run_start_time(EpochSeconds(now));
    status.set_queued_seconds(status.queued_seconds() +
                              absl::ToDoubleSeconds(QueuedFor(now)));
  }
  // ---- the starvation bound (--starvation-bound) ----
  // How long its current wait in the queue has lasted at `now`.
  absl::Duration QueuedFor(absl::Time now) const {
    if (queued_at == absl::InfinitePast() || now < queued_at) {
      return absl::ZeroDuration();
    }
    return now - queued_at;
  }
  // The time it has waited in the queue in all at `now`: its earlier
  // waits, and the current one while it is queued.
  absl::Duration Waited(absl::Time now) const {
    absl::Duration waited = absl::Seconds(status.queued_seconds());
    if (status.state() == v1::JOB_STATE_QUEUED) waited += QueuedFor(now);
    return waited;
  }
  bool promoted() const { return status.has_promoted_from(); }
  // It starved: it is scheduled at `top` from now on.
  void Promote(int top) {
    status.set_promoted_from(status.priority());
    status.set_priority(top);
  }

  // ---- the time limit (spec.time_limit_seconds; 0: none) ----
  bool has_time_limit() const { return status.spec().time_limit_seconds() > 0; }
  // What is left of it for the next run (queued).
  absl::Duration TimeLimitLeft() const {
    if (!has_time_limit()) return absl::InfiniteDuration();
    return absl::Seconds(
        std::max(0.0, static_cast<double>(status.spec().time_limit_seconds()) -
                          status.run_seconds()));
  }
  // When it is reached in the current run (placed on workers); infinite
  // future without a limit or a run.
  absl::Time TimeLimitEnds() const {
    if (!has_time_limit() || !status.has_run_start_time()) {
      return absl::InfiniteFuture();
    }
    return absl::UnixEpoch() + absl::Seconds(status.run_start_time()) +
           TimeLimitLeft();
  }
};

}  // namespace lockstep::coordinator

#endif  // LOCKSTEP_COORDINATOR_JOB_RECORD_H_
