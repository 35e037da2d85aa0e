// Who may make which call of the coordinator (docs/DESIGN.md, "Roles and
// authorization"). The role check here is the first thing every call
// passes; what depends on the coordinator's state (which identity registered
// a worker, which ranks a generation has) the Coordinator checks itself.
//
//   call                              roles allowed
//   RegisterWorker, WorkerSession,    worker
//   KvSet, KvGet, UploadArtifact
//   SubmitJob, StopJob, DeleteJob     operator
//   GetJobStatus, WatchJob,           operator, viewer
//   ListWorkers, ListQueue,
//   ListArtifacts, DownloadArtifact,
//   CompareJobs
//   grpc.health.v1 Check              any known identity
//
// A daemon running --insecure authenticates nobody: Role::kInsecure may make
// every call, as before TLS.
//
// An operator stops and deletes only the jobs it submitted, unless the
// coordinator names its owner with --admin (Coordinator::StopJob); it
// lists and downloads the artifacts of those only, a viewer of every job.
// A worker uploads only as rank 0 of its job's live generation.
//
// Refusals: a caller without a known identity gets UNAUTHENTICATED, a known
// identity whose role may not make the call PERMISSION_DENIED. The message
// names the caller (Caller::ToString, with its address), the call and what
// it would need; each refusal is logged, at most kRefusalsLogged per
// kRefusalLogWindow (a flood of refused calls must not fill the log; the
// number left out is logged with the next window).
//
// Stateless apart from the log's rate limit; thread-safe.
#ifndef LOCKSTEP_COORDINATOR_AUTHORIZATION_H_
#define LOCKSTEP_COORDINATOR_AUTHORIZATION_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/caller.h"

namespace lockstep::coordinator {

// Every call the coordinator's server serves.
enum class Call {
  kRegisterWorker,
  kWorkerSession,
  kKvSet,
  kKvGet,
  kSubmitJob,
  kGetJobStatus,
  kWatchJob,
  kStopJob,
  kDeleteJob,
  kListWorkers,
  kListQueue,
  kUploadArtifact,
  kListArtifacts,
  kDownloadArtifact,
  kCompareJobs,
  kHealthCheck,
};

inline constexpr int kRefusalsLogged = 20;
inline constexpr absl::Duration kRefusalLogWindow = absl::Seconds(10);

// "RegisterWorker", "grpc.health.v1.Health/Check".
absl::string_view CallName(Call call);

// Whether `caller`'s role may make `call` at all. Errors (logged):
// Unauthenticated, PermissionDenied.
absl::Status AuthorizeRole(const Caller& caller, Call call);

// PermissionDenied (logged) for a caller whose role may make `call` but not
// this one: `why` says what it lacks ("it holds no rank of job mnist-3
// generation 2").
absl::Status Denied(const Caller& caller, Call call, absl::string_view why);

// Logs `refusal` under the rate limit and returns it.
absl::Status LogRefusal(absl::Status refusal);

}  // namespace lockstep::coordinator

#endif  // LOCKSTEP_COORDINATOR_AUTHORIZATION_H_
