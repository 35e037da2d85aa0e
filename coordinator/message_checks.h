// Range checks of every request the coordinator serves (docs/PROTOCOL.md):
// what workers send up their sessions, their registrations, the key-value
// calls of a rendezvous, and the job calls of the CLI. Every
// number a coordinator uses (steps, counts, sizes, ranks, times) and every
// name that becomes a path or a map key is checked before any of it
// touches a job. A request is untrusted: a rank's bug or a hostile client
// must not crash the coordinator, make it allocate without bound, or move a
// file it did not mean to.
//
// Stateless and thread-safe; the Coordinator calls them on every request
// and refuses a failing one (INVALID_ARGUMENT, logged) before it changes
// anything.
#ifndef LOCKSTEP_COORDINATOR_MESSAGE_CHECKS_H_
#define LOCKSTEP_COORDINATOR_MESSAGE_CHECKS_H_

#include <cstdint>

#include "absl/status/status.h"
#include "lockstep/v1/coordinator.pb.h"

namespace lockstep::coordinator {

// No real job reaches these; a message beyond them is refused.
inline constexpr int64_t kMaxStep = int64_t{1} << 40;
inline constexpr int64_t kMaxGeneration = int64_t{1} << 40;
inline constexpr int kMaxRank = 1 << 20;
// Losses in one progress report (they come at least every few seconds).
inline constexpr int kMaxLossesPerReport = 1 << 20;
inline constexpr int kMaxWarningsPerReport = 64;
// A task's metrics in one report or result, and the length of a name.
inline constexpr int kMaxMetrics = 16;
inline constexpr size_t kMaxMetricNameBytes = 32;
inline constexpr int kMaxCheckpointFiles = 4096;
inline constexpr int64_t kMaxCheckpointFileBytes = int64_t{1} << 50;
// Records in one RecordsSkipped message (a worker sends at most 100).
inline constexpr int kMaxSkippedRecordsPerMessage = 100;
// Text that becomes part of a job's status (errors, reasons, notes).
inline constexpr size_t kMaxTextBytes = 64 << 10;

// Rendezvous requests: a key of printable ASCII without
// spaces, 1 to kMaxKeyBytes bytes; a value of at most kMaxKvValueBytes (a
// Gloo rank publishes one address per peer, about 136 bytes each); a wait of
// 0 to kMaxWaitMs.
inline constexpr size_t kMaxKeyBytes = 256;
inline constexpr size_t kMaxKvValueBytes = 4 << 20;
inline constexpr int64_t kMaxWaitMs = int64_t{24} * 3600 * 1000;
// A job id as the coordinator makes them: the job name's letters, digits
// and "-_." plus "-<sequence>".
inline constexpr size_t kMaxJobIdBytes = 300;
// A submitted job spec, serialized. Validation bounds each field far
// below this; the bound keeps what is stored and sent to every worker small.
inline constexpr size_t kMaxSpecBytes = 64 << 10;
// Job summaries in one GetJobStatus page without a job id.
inline constexpr int kDefaultStatusPage = 100;
inline constexpr int kMaxStatusPage = 1000;
// A page ends before its summaries pass this many bytes (one job always
// fits), far below gRPC's 4 MiB message limit.
inline constexpr size_t kMaxStatusPageBytes = 1 << 20;

// Losses in one page of a job's loss history (1 MiB of floats), and
// workers in one ListWorkers page (a WorkerInfo is at most ~1.5 KiB).
inline constexpr int kMaxHistoryPage = 1 << 18;
inline constexpr int kMaxWorkerPage = 1000;

// Errors: InvalidArgument naming the message, the field and its bound.
absl::Status CheckWorkerMessage(const v1::WorkerMessage& message);

// A registration: the host is a host name or address (printable, no
// spaces, at most 253 bytes), the device's names are printable and short,
// a task index is in range. Errors: InvalidArgument.
absl::Status CheckRegistration(const v1::RegisterWorkerRequest& request);

// Rendezvous calls (job id, generation >= 0, key or name, value size,
// timeout, rank). Errors: InvalidArgument.
absl::Status CheckKvSet(const v1::KvSetRequest& request);
absl::Status CheckKvGet(const v1::KvGetRequest& request);

// A job id naming an existing job: 1 to kMaxJobIdBytes of letters, digits
// and "-_.". With `may_be_empty`, "" (every job) passes. `call` names the
// request in the error. Errors: InvalidArgument.
absl::Status CheckJobId(absl::string_view call, const std::string& job_id,
                        bool may_be_empty = false);
// A submission: the serialized spec is at most kMaxSpecBytes. Errors:
// InvalidArgument.
absl::Status CheckSubmission(const v1::JobSpec& spec);
// A status request: a valid job id or none, a page size of 0 (the default)
// to kMaxStatusPage. Errors: InvalidArgument.
// A history page starts at 0 to kMaxStep and holds 0 (the default) to
// kMaxHistoryPage losses.
absl::Status CheckStatusRequest(const v1::GetJobStatusRequest& request);
// A worker list: a page size of 0 (the default) to kMaxWorkerPage, a token
// that could be a worker id. Errors: InvalidArgument.
absl::Status CheckListWorkers(const v1::ListWorkersRequest& request);

// Artifacts (issue 53): an upload's header (job id, generation, rank, a
// token of at most 64 bytes, the info's printable names and a size of 0
// to 2^50 bytes); a list or download request (job id, the name).
// Errors: InvalidArgument.
absl::Status CheckArtifactHeader(const v1::ArtifactUpload::Header& header);
absl::Status CheckArtifactRequest(absl::string_view call,
                                  const std::string& job_id,
                                  const std::string& name);

// Logs a refused request (which call, why) once and passes the refusal on,
// for the entry points above to return.
absl::Status Refused(absl::Status refusal);

}  // namespace lockstep::coordinator

#endif  // LOCKSTEP_COORDINATOR_MESSAGE_CHECKS_H_
