// A job spec as the coordinator holds it: parsed, with defaults applied.
#ifndef LOCKSTEP_TESTS_UNIT_PARSED_SPEC_H_
#define LOCKSTEP_TESTS_UNIT_PARSED_SPEC_H_

#include <gtest/gtest.h>

#include "common/job_spec.h"

namespace lockstep {

// `json` parsed with its defaults applied; a parse error fails the test
// and gives the empty spec with defaults.
inline v1::JobSpec Parse(const char* json) {
  auto spec = ParseJobSpec(json);
  EXPECT_TRUE(spec.ok()) << spec.status();
  v1::JobSpec result = spec.ok() ? *spec : v1::JobSpec();
  ApplyDefaults(&result);
  return result;
}

}  // namespace lockstep

#endif  // LOCKSTEP_TESTS_UNIT_PARSED_SPEC_H_
