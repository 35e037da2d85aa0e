// The chaos soak's fault kinds, its options and their parsing
// (bench/chaos_soak.cc says what the soak does).
#ifndef LOCKSTEP_BENCH_CHAOS_FAULTS_H_
#define LOCKSTEP_BENCH_CHAOS_FAULTS_H_

#include <cstdint>
#include <iterator>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace lockstep::chaos {

enum class FaultKind {
  kKillWorker,
  kStopShort,
  kStopLong,
  kTermWorker,
  kKillCoordinator,
  kKillAll,
  // On the network test bed (--netbed) only:
  kCutShort,
  kCutLong,
  kCutCoordinator,
  kSlowLink
};
// The process faults, the default deck.
inline constexpr FaultKind kAllKinds[] = {
    FaultKind::kKillWorker, FaultKind::kStopShort,       FaultKind::kStopLong,
    FaultKind::kTermWorker, FaultKind::kKillCoordinator, FaultKind::kKillAll};
// The network faults, added to the deck with --netbed.
inline constexpr FaultKind kNetworkKinds[] = {
    FaultKind::kCutShort, FaultKind::kCutLong, FaultKind::kCutCoordinator,
    FaultKind::kSlowLink};

// Whether `kind` needs the network test bed.
bool IsNetworkKind(FaultKind kind);

// "kill-worker", "stop-short", ... as --kinds and the report spell them.
const char* KindName(FaultKind kind);

// What one soak does; see ParseOptions for the flags.
struct Options {
  std::string bin;
  std::string data;
  uint32_t seed = 0;
  int faults = 12;
  int steps = 2000;
  double budget_s = 900;
  double resume_budget_s = 45;
  double heartbeat_timeout_s = 2;
  double overlap = 0.25;  // the chance that a fault's recovery is hit too
  std::vector<FaultKind> kinds = {std::begin(kAllKinds), std::end(kAllKinds)};
  bool keep = false;
  // Every daemon in a network namespace of its own (tests/netbed/), so that
  // links can be cut, healed and slowed.
  bool netbed = false;
};

// The flags after argv[0]: BIN_DIR and the --flags of kUsage. An
// InvalidArgument status names a bad flag.
absl::StatusOr<Options> ParseOptions(int argc, char** argv);

extern const char kUsage[];

}  // namespace lockstep::chaos

#endif  // LOCKSTEP_BENCH_CHAOS_FAULTS_H_
