// Ok(x): the value of a StatusOr a test expects to succeed; a failure is
// reported where the test uses it and yields a default value.
#ifndef LOCKSTEP_TESTS_UNIT_STATUS_VALUE_H_
#define LOCKSTEP_TESTS_UNIT_STATUS_VALUE_H_

#include <gtest/gtest.h>

#include <utility>

#include "absl/status/statusor.h"

namespace lockstep {

template <typename T>
T Ok(absl::StatusOr<T> value) {
  EXPECT_TRUE(value.ok()) << value.status();
  return value.ok() ? *std::move(value) : T();
}

}  // namespace lockstep

#endif  // LOCKSTEP_TESTS_UNIT_STATUS_VALUE_H_
