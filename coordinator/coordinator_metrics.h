// What the coordinator counts for its metrics beside its state: the job
// events that are failures (lockstep_failures_total{cause}). The metrics
// themselves are written by Coordinator::CollectMetrics
// (coordinator_metrics.cc).
#ifndef LOCKSTEP_COORDINATOR_COORDINATOR_METRICS_H_
#define LOCKSTEP_COORDINATOR_COORDINATOR_METRICS_H_

#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace lockstep::coordinator {

// The event kinds (JobEvent.kind) that count as failures, in the order the
// metrics list them: a worker lost, restarted or reconnected, a rank's error,
// a generation ended by an unexplained error, a checkpoint save or commit
// that failed. (A job that failed for good is in lockstep_jobs{state}.)
const std::vector<std::string>& FailureEventKinds();
bool IsFailureEvent(absl::string_view kind);

}  // namespace lockstep::coordinator

#endif  // LOCKSTEP_COORDINATOR_COORDINATOR_METRICS_H_
