#include "common/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace lockstep::metrics {
namespace {

bool IsNameChar(char c, bool first, bool colon) {
  if (absl::ascii_isalpha(static_cast<unsigned char>(c)) || c == '_') {
    return true;
  }
  if (c == ':') return colon;
  return !first && absl::ascii_isdigit(static_cast<unsigned char>(c));
}

bool IsName(absl::string_view name, bool colon) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    if (!IsNameChar(name[i], i == 0, colon)) return false;
  }
  return true;
}

// HELP text escapes only backslash and newline.
std::string EscapeHelp(absl::string_view help) {
  std::string out;
  for (char c : help) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

const char* TypeName(Type type) {
  switch (type) {
    case kCounter:
      return "counter";
    case kGauge:
      return "gauge";
    case kHistogram:
      return "histogram";
  }
  return "untyped";
}

}  // namespace

Histogram::Histogram(std::vector<double> bounds) : bounds_(std::move(bounds)) {
  std::sort(bounds_.begin(), bounds_.end());
  bounds_.erase(std::unique(bounds_.begin(), bounds_.end()), bounds_.end());
  counts_.assign(bounds_.size() + 1, 0);
}

void Histogram::Observe(double value) {
  if (std::isnan(value)) return;
  const size_t bucket =
      std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  ++counts_[bucket];
  sum_ += value;
  ++count_;
}

bool Exposition::Family(absl::string_view name, Type type,
                        absl::string_view help) {
  if (!IsMetricName(name) || families_.count(name) > 0) return false;
  families_.emplace(name);
  absl::StrAppend(&text_, "# HELP ", name, " ", EscapeHelp(help), "\n",
                  "# TYPE ", name, " ", TypeName(type), "\n");
  return true;
}

void Exposition::Sample(absl::string_view name, const Labels& labels,
                        double value) {
  Line(name, labels, nullptr, value);
}

void Exposition::Observations(absl::string_view name, const Labels& labels,
                              const Histogram& histogram) {
  const std::string bucket = absl::StrCat(name, "_bucket");
  uint64_t cumulative = 0;
  for (size_t i = 0; i <= histogram.bounds().size(); ++i) {
    cumulative += histogram.counts()[i];
    const std::pair<std::string, std::string> le(
        "le", i < histogram.bounds().size() ? FormatValue(histogram.bounds()[i])
                                            : std::string("+Inf"));
    Line(bucket, labels, &le, static_cast<double>(cumulative));
  }
  Line(absl::StrCat(name, "_sum"), labels, nullptr, histogram.sum());
  Line(absl::StrCat(name, "_count"), labels, nullptr,
       static_cast<double>(histogram.count()));
}

void Exposition::Line(absl::string_view name, const Labels& labels,
                      const std::pair<std::string, std::string>* extra,
                      double value) {
  if (!IsMetricName(name)) return;
  absl::StrAppend(&text_, name);
  bool first = true;
  auto label = [&](const std::pair<std::string, std::string>& l) {
    if (!IsLabelName(l.first)) return;
    absl::StrAppend(&text_, first ? "{" : ",", l.first, "=\"",
                    EscapeLabelValue(l.second), "\"");
    first = false;
  };
  for (const auto& l : labels) label(l);
  if (extra != nullptr) label(*extra);
  absl::StrAppend(&text_, first ? "" : "}", " ", FormatValue(value), "\n");
}

std::string Exposition::Take() {
  families_.clear();
  return std::exchange(text_, std::string());
}

std::string FormatValue(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  // Integers below 2^53 are exact in a double: print them whole, so a byte
  // counter reads as bytes rather than 1.23457e+09.
  if (value == std::trunc(value) && std::fabs(value) < 9007199254740992.0) {
    return absl::StrFormat("%.0f", value);
  }
  // The shortest of 15 or 17 digits that reads back as the same double.
  std::string text = absl::StrFormat("%.15g", value);
  if (std::strtod(text.c_str(), nullptr) != value) {
    text = absl::StrFormat("%.17g", value);
  }
  return text;
}

std::string EscapeLabelValue(absl::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    switch (c) {
      case '\\':
        out += "\\\\";
        break;
      case '"':
        out += "\\\"";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        out += c;
    }
  }
  return out;
}

bool IsMetricName(absl::string_view name) { return IsName(name, true); }
bool IsLabelName(absl::string_view name) { return IsName(name, false); }

}  // namespace lockstep::metrics
