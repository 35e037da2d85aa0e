// Reading Prometheus' text format in tests: one sample's value, and
// `promtool check metrics` (Debian's prometheus package) over a whole page.
#ifndef LOCKSTEP_TESTS_UNIT_METRICS_TEXT_H_
#define LOCKSTEP_TESTS_UNIT_METRICS_TEXT_H_

#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>

namespace lockstep::testing {

// The value of the sample written exactly as `series` (name and labels, as
// rendered), or nullopt when the page has no such line.
inline std::optional<std::string> SampleValue(const std::string& page,
                                              const std::string& series) {
  std::istringstream lines(page);
  for (std::string line; std::getline(lines, line);) {
    if (line.rfind(series + " ", 0) == 0) return line.substr(series.size() + 1);
  }
  return std::nullopt;
}

inline bool HavePromtool() {
  return system("command -v promtool >/dev/null 2>&1") == 0;
}

// promtool's verdict on `page`: empty when it finds nothing, else what it
// printed (and its exit status).
inline std::string PromtoolProblems(const std::string& page) {
  char path[] = "/tmp/lockstep-metrics-XXXXXX";
  const int fd = mkstemp(path);
  if (fd < 0) return "cannot create a temporary file";
  close(fd);
  std::ofstream(path) << page;
  const std::string command =
      std::string("promtool check metrics < ") + path + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  std::string output;
  char buffer[512];
  while (pipe != nullptr && fgets(buffer, sizeof(buffer), pipe) != nullptr) {
    output += buffer;
  }
  const int status = pipe == nullptr ? -1 : pclose(pipe);
  unlink(path);
  if (status == 0 && output.empty()) return "";
  return output + "(promtool exit status " + std::to_string(status) + ")";
}

}  // namespace lockstep::testing

#endif  // LOCKSTEP_TESTS_UNIT_METRICS_TEXT_H_
