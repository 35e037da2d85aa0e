// Prometheus' text exposition format (version 0.0.4), written by hand: the
// daemons gather their numbers when a scrape comes (coordinator/
// coordinator_metrics.cc, worker/worker_metrics.cc) and write them here.
// Served over HTTP by common/metrics_http.h.
//
//   metrics::Exposition out;
//   out.Family("lockstep_jobs", metrics::kGauge, "Jobs by state.");
//   out.Sample("lockstep_jobs", {{"state", "running"}}, 1);
//   std::string text = out.Take();
//
// Names follow Prometheus' conventions: the lockstep_ prefix, base units
// (seconds, bytes) and _total on counters. A family's samples must follow
// its Family line, each family once (Family returns false for a second
// one; promtool rejects duplicates). Label values are escaped, so any
// string (a job name, a host) is safe to pass.
//
// Thread-compatible. Histogram is thread-compatible too: its owner
// guards it (the coordinator under its lock).
#ifndef LOCKSTEP_COMMON_METRICS_H_
#define LOCKSTEP_COMMON_METRICS_H_

#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"

namespace lockstep::metrics {

enum Type { kCounter, kGauge, kHistogram };

using Labels = std::vector<std::pair<std::string, std::string>>;

// Observations counted into fixed buckets (upper bounds, ascending), as a
// Prometheus histogram: cumulative counts, a sum and a count.
class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds);
  void Observe(double value);

  const std::vector<double>& bounds() const { return bounds_; }
  // counts()[i]: observations <= bounds()[i], not cumulative; the last
  // entry counts those above every bound.
  const std::vector<uint64_t>& counts() const { return counts_; }
  double sum() const { return sum_; }
  uint64_t count() const { return count_; }

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;
  double sum_ = 0;
  uint64_t count_ = 0;
};

class Exposition {
 public:
  // Starts a family: its # HELP and # TYPE lines. False (and nothing
  // written) when the family was already started; a programming error the
  // tests catch.
  bool Family(absl::string_view name, Type type, absl::string_view help);
  // One sample of the family started last (a histogram's are written by
  // Observations).
  void Sample(absl::string_view name, const Labels& labels, double value);
  // A histogram's _bucket (with le), _sum and _count lines.
  void Observations(absl::string_view name, const Labels& labels,
                    const Histogram& histogram);
  // The text so far; the exposition is empty after.
  std::string Take();

 private:
  void Line(absl::string_view name, const Labels& labels,
            const std::pair<std::string, std::string>* extra, double value);

  std::string text_;
  std::set<std::string, std::less<>> families_;
};

// The value as Prometheus reads it: integers exactly, NaN, +Inf, -Inf.
std::string FormatValue(double value);
// A label value with \, " and newline escaped.
std::string EscapeLabelValue(absl::string_view value);
// Valid metric and label names ([a-zA-Z_:][a-zA-Z0-9_:]*, no colon in
// label names).
bool IsMetricName(absl::string_view name);
bool IsLabelName(absl::string_view name);

}  // namespace lockstep::metrics

#endif  // LOCKSTEP_COMMON_METRICS_H_
