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
  kKillAll
};
inline constexpr FaultKind kAllKinds[] = {
    FaultKind::kKillWorker, FaultKind::kStopShort,       FaultKind::kStopLong,
    FaultKind::kTermWorker, FaultKind::kKillCoordinator, FaultKind::kKillAll};

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
};

// The flags after argv[0]: BIN_DIR and the --flags of kUsage. An
// InvalidArgument status names a bad flag.
absl::StatusOr<Options> ParseOptions(int argc, char** argv);

extern const char kUsage[];

}  // namespace lockstep::chaos

#endif  // LOCKSTEP_BENCH_CHAOS_FAULTS_H_
