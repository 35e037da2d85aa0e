// A small command-line parser shared by the three binaries: `--name=value`,
// `--name value`, boolean `--name`, repeated flags, and positional arguments.
// Every problem is an InvalidArgument status naming the flag, so each binary
// can print one line and exit 2.
#ifndef LOCKSTEP_COMMON_ARGS_H_
#define LOCKSTEP_COMMON_ARGS_H_

#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace lockstep {

class Args {
 public:
  // `value_flags` take a value, `bool_flags` do not. Anything else starting
  // with "--" is an error.
  static absl::StatusOr<Args> Parse(const std::vector<std::string>& argv,
                                    const std::set<std::string>& value_flags,
                                    const std::set<std::string>& bool_flags);

  bool Has(const std::string& name) const { return values_.count(name) > 0; }
  // The last value of a flag, or `fallback`.
  std::string Get(const std::string& name,
                  const std::string& fallback = "") const;
  absl::StatusOr<int> GetInt(const std::string& name, int fallback) const;
  absl::StatusOr<double> GetDouble(const std::string& name,
                                   double fallback) const;
  // Every value of a repeated flag, in order.
  std::vector<std::string> GetAll(const std::string& name) const;
  const std::vector<std::string>& positional() const { return positional_; }

 private:
  std::map<std::string, std::vector<std::string>> values_;
  std::vector<std::string> positional_;
};

}  // namespace lockstep

#endif  // LOCKSTEP_COMMON_ARGS_H_
