// Fault kinds and the chaos soak's flags (chaos_faults.h).
#include "bench/chaos_faults.h"

#include <algorithm>
#include <cstdlib>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/args.h"

namespace lockstep::chaos {

const char* KindName(FaultKind kind) {
  switch (kind) {
    case FaultKind::kKillWorker:
      return "kill-worker";
    case FaultKind::kStopShort:
      return "stop-short";
    case FaultKind::kStopLong:
      return "stop-long";
    case FaultKind::kTermWorker:
      return "term-worker";
    case FaultKind::kKillCoordinator:
      return "kill-coord";
    case FaultKind::kKillAll:
      return "kill-all";
    case FaultKind::kCutShort:
      return "cut-short";
    case FaultKind::kCutLong:
      return "cut-long";
    case FaultKind::kCutCoordinator:
      return "cut-coord";
    case FaultKind::kSlowLink:
      return "slow-link";
  }
  return "?";
}

bool IsNetworkKind(FaultKind kind) {
  return std::find(std::begin(kNetworkKinds), std::end(kNetworkKinds), kind) !=
         std::end(kNetworkKinds);
}

const char kUsage[] =
    "usage: chaos_soak BIN_DIR [--seed N] [--faults N] [--steps N] "
    "[--data DIR] [--budget SECS] [--resume-budget SECS] "
    "[--heartbeat-timeout SECS] [--overlap P] [--kinds K,K..] [--netbed] "
    "[--keep]\n";

absl::StatusOr<Options> ParseOptions(int argc, char** argv) {
  absl::StatusOr<Args> args =
      Args::Parse(std::vector<std::string>(argv + 1, argv + argc),
                  {"seed", "faults", "steps", "data", "budget", "resume-budget",
                   "heartbeat-timeout", "overlap", "kinds"},
                  {"keep", "netbed"});
  if (!args.ok()) return args.status();
  if (args->positional().size() != 1) {
    return absl::InvalidArgumentError("expected one BIN_DIR");
  }
  Options options;
  options.bin = args->positional()[0];
  const char* bench_data = getenv("BENCH_DATA_DIR");
  options.data = args->Get("data", bench_data != nullptr ? bench_data : "");
  options.keep = args->Has("keep");
  options.netbed = args->Has("netbed");
  if (options.netbed) {
    options.kinds.insert(options.kinds.end(), std::begin(kNetworkKinds),
                         std::end(kNetworkKinds));
  }
  const int random_seed = static_cast<int>(std::random_device()() >> 1);
  absl::StatusOr<int> seed = args->GetInt("seed", random_seed);
  absl::StatusOr<int> faults = args->GetInt("faults", options.faults);
  absl::StatusOr<int> steps = args->GetInt("steps", options.steps);
  absl::StatusOr<double> budget = args->GetDouble("budget", options.budget_s);
  absl::StatusOr<double> resume =
      args->GetDouble("resume-budget", options.resume_budget_s);
  absl::StatusOr<double> heartbeat =
      args->GetDouble("heartbeat-timeout", options.heartbeat_timeout_s);
  absl::StatusOr<double> overlap = args->GetDouble("overlap", options.overlap);
  for (const absl::Status& status :
       {seed.status(), faults.status(), steps.status(), budget.status(),
        resume.status(), heartbeat.status(), overlap.status()}) {
    if (!status.ok()) return status;
  }
  if (*faults < 0 || *steps < 1 || *budget <= 0 || *resume <= 0 ||
      *heartbeat <= 0 || *overlap < 0 || *overlap > 1) {
    return absl::InvalidArgumentError(
        "--faults must be >= 0; --steps, --budget, --resume-budget and "
        "--heartbeat-timeout > 0; --overlap a probability from 0 to 1");
  }
  options.seed = static_cast<uint32_t>(*seed);
  options.faults = *faults;
  options.steps = *steps;
  options.budget_s = *budget;
  options.resume_budget_s = *resume;
  options.heartbeat_timeout_s = *heartbeat;
  options.overlap = *overlap;
  if (args->Has("kinds")) {
    options.kinds.clear();
    std::vector<FaultKind> every(std::begin(kAllKinds), std::end(kAllKinds));
    every.insert(every.end(), std::begin(kNetworkKinds),
                 std::end(kNetworkKinds));
    for (absl::string_view name : absl::StrSplit(args->Get("kinds"), ',')) {
      auto kind = std::find_if(every.begin(), every.end(), [&](FaultKind k) {
        return name == KindName(k);
      });
      if (kind == every.end()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--kinds: unknown fault '", name,
            "'; the kinds are kill-worker, stop-short, stop-long, "
            "term-worker, kill-coord, kill-all and, with --netbed, "
            "cut-short, cut-long, cut-coord and slow-link"));
      }
      if (IsNetworkKind(*kind) && !options.netbed) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--kinds: '", name, "' cuts or slows a link: it needs --netbed"));
      }
      options.kinds.push_back(*kind);
    }
  }
  return options;
}

}  // namespace lockstep::chaos
