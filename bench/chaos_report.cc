// What bench/chaos_soak prints (chaos_report.h).
#include "bench/chaos_report.h"

#include <algorithm>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace lockstep::chaos {
namespace {

void PrintHeader() {
  std::printf("%3s %8s %-12s %-10s %7s %10s %9s %8s  %s\n", "#", "at s",
              "fault", "target", "held s", "detected s", "resumed s",
              "repeated", "resumed from");
}

}  // namespace

void PrintFault(const Fault& fault, size_t number) {
  if (number == 1) PrintHeader();
  const std::string target = fault.kind == FaultKind::kKillAll ? "workers"
                             : fault.worker < 0
                                 ? "coord"
                                 : absl::StrCat("worker ", fault.worker);
  const std::string resumed =
      fault.resumed_s < 0 ? "-" : absl::StrFormat("%.2f", fault.resumed_s);
  const std::string repeated =
      fault.repeated < 0 ? "-" : absl::StrCat(fault.repeated);
  const std::string detected =
      fault.detected_s < 0 ? "-" : absl::StrFormat("%.2f", fault.detected_s);
  std::printf(
      "%3zu %8.2f %-12s %-10s %7.2f %10s %9s %8s  %s%s%s\n", number, fault.at_s,
      KindName(fault.kind), target.c_str(), fault.held_s, detected.c_str(),
      resumed.c_str(), repeated.c_str(), fault.resumed_from.c_str(),
      fault.problem.empty() ? "" : "  PROBLEM: ", fault.problem.c_str());
  std::fflush(stdout);
}

void PrintEvents(const v1::JobStatus& status, absl::Time start) {
  const double start_s = absl::ToDoubleSeconds(start - absl::UnixEpoch());
  std::printf("the faulted job's events (checkpoint commits left out):\n");
  for (const v1::JobEvent& event : status.events()) {
    if (event.kind() == "checkpoint_committed") continue;
    std::printf("  %8.2f gen %-3lld %-20s %s\n", event.time() - start_s,
                static_cast<long long>(event.generation()),
                event.kind().c_str(), event.message().c_str());
  }
}

void PrintKinds(const std::deque<Fault>& faults) {
  std::printf("%-12s %6s %9s %13s %13s %13s\n", "fault", "count", "detected",
              "detect mean s", "resume mean s", "resume max s");
  for (int k = 0; k <= static_cast<int>(FaultKind::kSlowLink); ++k) {
    const FaultKind kind = static_cast<FaultKind>(k);
    int count = 0, detected = 0, resumed = 0;
    double detect_total = 0, resume_total = 0, resume_max = 0;
    for (const Fault& fault : faults) {
      if (fault.kind != kind) continue;
      ++count;
      if (fault.detected_s >= 0) {
        ++detected;
        detect_total += fault.detected_s;
      }
      if (fault.resumed_s >= 0) {
        ++resumed;
        resume_total += fault.resumed_s;
        resume_max = std::max(resume_max, fault.resumed_s);
      }
    }
    if (count == 0) continue;
    std::printf(
        "%-12s %6d %9d %13s %13s %13s\n", KindName(kind), count, detected,
        detected ? absl::StrFormat("%.2f", detect_total / detected).c_str()
                 : "-",
        resumed ? absl::StrFormat("%.2f", resume_total / resumed).c_str() : "-",
        resumed ? absl::StrFormat("%.2f", resume_max).c_str() : "-");
  }
}

void PrintSummary(uint32_t seed, const std::deque<Fault>& faults,
                  const std::string& job,
                  const std::optional<v1::JobStatus>& last, double elapsed_s,
                  double reference_s) {
  double longest = 0, total = 0;
  int64_t repeated = 0;
  int resumed = 0;
  for (const Fault& fault : faults) {
    if (fault.resumed_s < 0) continue;
    ++resumed;
    longest = std::max(longest, fault.resumed_s);
    total += fault.resumed_s;
    repeated += std::max<int64_t>(0, fault.repeated);
  }
  std::printf(
      "seed %u: %zu faults, %d resumed (mean %.2f s, longest %.2f s), "
      "%lld steps repeated; job %s %s after %.1f s (reference %.1f s), "
      "%d generations, %d preemptions\n",
      seed, faults.size(), resumed, resumed > 0 ? total / resumed : 0.0,
      longest, static_cast<long long>(repeated), job.c_str(),
      last ? v1::JobState_Name(last->state()).c_str() : "unknown", elapsed_s,
      reference_s, last ? last->generations() : 0,
      last ? last->preemptions() : 0);
}

}  // namespace lockstep::chaos
