// Parsing command-line flags and reading their values (args.h).
#include "common/args.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace lockstep {

absl::StatusOr<Args> Args::Parse(const std::vector<std::string>& argv,
                                 const std::set<std::string>& value_flags,
                                 const std::set<std::string>& bool_flags) {
  Args args;
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& arg = argv[i];
    if (arg == "--") {
      args.positional_.insert(args.positional_.end(), argv.begin() + i + 1,
                              argv.end());
      break;
    }
    if (arg.rfind("--", 0) != 0 || arg.size() == 2) {
      args.positional_.push_back(arg);
      continue;
    }
    std::string name = arg.substr(2);
    std::string value;
    bool has_value = false;
    if (size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    if (bool_flags.count(name)) {
      if (has_value && value != "true" && value != "false") {
        return absl::InvalidArgumentError(absl::StrCat(
            "flag --", name, " takes no value (got '", value, "')"));
      }
      args.values_[name].push_back(has_value ? value : "true");
      continue;
    }
    if (!value_flags.count(name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown flag --", name, "; see --help"));
    }
    if (!has_value) {
      if (i + 1 >= argv.size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("flag --", name, " needs a value"));
      }
      value = argv[++i];
    }
    args.values_[name].push_back(value);
  }
  return args;
}

std::string Args::Get(const std::string& name,
                      const std::string& fallback) const {
  auto it = values_.find(name);
  return it == values_.end() ? fallback : it->second.back();
}

absl::StatusOr<int> Args::GetInt(const std::string& name, int fallback) const {
  if (!Has(name)) return fallback;
  int value;
  if (!absl::SimpleAtoi(Get(name), &value)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "flag --", name, " wants an integer, got '", Get(name), "'"));
  }
  return value;
}

absl::StatusOr<double> Args::GetDouble(const std::string& name,
                                       double fallback) const {
  if (!Has(name)) return fallback;
  double value;
  if (!absl::SimpleAtod(Get(name), &value)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "flag --", name, " wants a number, got '", Get(name), "'"));
  }
  return value;
}

std::vector<std::string> Args::GetAll(const std::string& name) const {
  auto it = values_.find(name);
  return it == values_.end() ? std::vector<std::string>{} : it->second;
}

}  // namespace lockstep
