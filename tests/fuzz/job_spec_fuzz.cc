// Fuzz target: job-spec text as the CLI and the coordinator take it. The
// input is up to three `--set field=value` overrides, one per line, a line
// "---", then the JSON document (inputs without "---" are all JSON). The
// spec goes through parse, overrides, defaults, validation and the batch
// split; one that validates must print as JSON that parses back to itself.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/job_spec.h"
#include "google/protobuf/util/message_differencer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::string_view input(reinterpret_cast<const char*>(data), size);
  std::vector<absl::string_view> overrides;
  absl::string_view json = input;
  if (size_t cut = input.find("\n---\n"); cut != absl::string_view::npos) {
    overrides = absl::StrSplit(input.substr(0, cut), '\n');
    json = input.substr(cut + 5);
    if (overrides.size() > 3) overrides.resize(3);
  }
  auto parsed = lockstep::ParseJobSpec(json, "fuzz");
  if (!parsed.ok()) return 0;
  lockstep::v1::JobSpec spec = *std::move(parsed);
  for (absl::string_view assignment : overrides) {
    // Every override is applied or refused; refusal leaves a usable spec.
    (void)lockstep::ApplyOverride(assignment, &spec);
  }
  lockstep::ApplyDefaults(&spec);
  for (int replicas : {0, 1, 3, spec.num_workers()}) {
    if (!lockstep::ValidateJobSpec(spec, replicas).ok()) return 0;
    if (replicas > 0) (void)lockstep::ResolveBatch(spec, replicas);
  }
  const std::string printed = lockstep::JobSpecToJson(spec);
  auto again = lockstep::ParseJobSpec(printed, "printed");
  if (!again.ok() ||
      !google::protobuf::util::MessageDifferencer::Equals(*again, spec)) {
    std::fprintf(stderr, "a valid spec does not survive JSON: %s\n%s\n",
                 printed.c_str(), again.status().ToString().c_str());
    std::abort();
  }
  return 0;
}
