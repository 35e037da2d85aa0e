// Range checks of what workers send up their sessions (docs/PROTOCOL.md):
// every number a coordinator uses (steps, counts, sizes, ranks, times)
// and every name that becomes a path, checked before any of it touches a
// job. A worker message is untrusted: a rank's bug or a hostile client must
// not crash the coordinator, make it allocate without bound, or move a
// file it did not mean to.
//
// Stateless and thread-safe; the Coordinator calls it on every message
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
inline constexpr int kMaxCheckpointFiles = 4096;
inline constexpr int64_t kMaxCheckpointFileBytes = int64_t{1} << 50;
// Text that becomes part of a job's status (errors, reasons, notes).
inline constexpr size_t kMaxTextBytes = 64 << 10;

// Errors: InvalidArgument naming the message, the field and its bound.
absl::Status CheckWorkerMessage(const v1::WorkerMessage& message);

// A registration: the host is a host name or address (printable, no
// spaces, at most 253 bytes), the device's names are printable and short,
// a task index is in range. Errors: InvalidArgument.
absl::Status CheckRegistration(const v1::RegisterWorkerRequest& request);

}  // namespace lockstep::coordinator

#endif  // LOCKSTEP_COORDINATOR_MESSAGE_CHECKS_H_
