// Early-return helpers for absl::Status. Debian's Abseil (20220623) ships no
// RETURN_IF_ERROR, so lockstep keeps this one small header.
#ifndef LOCKSTEP_COMMON_STATUS_MACROS_H_
#define LOCKSTEP_COMMON_STATUS_MACROS_H_

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define LOCKSTEP_CONCAT_INNER_(a, b) a##b
#define LOCKSTEP_CONCAT_(a, b) LOCKSTEP_CONCAT_INNER_(a, b)

// Returns the status from the enclosing function if `expr` is not OK.
#define RETURN_IF_ERROR(expr)                            \
  do {                                                   \
    ::absl::Status lockstep_status_ = (expr);            \
    if (!lockstep_status_.ok()) return lockstep_status_; \
  } while (0)

// `ASSIGN_OR_RETURN(auto x, Foo());` declares x from an OK StatusOr, or
// returns its status.
#define ASSIGN_OR_RETURN(lhs, expr)                                           \
  ASSIGN_OR_RETURN_IMPL_(LOCKSTEP_CONCAT_(lockstep_statusor_, __LINE__), lhs, \
                         expr)

#define ASSIGN_OR_RETURN_IMPL_(statusor, lhs, expr) \
  auto statusor = (expr);                           \
  if (!statusor.ok()) return statusor.status();     \
  lhs = std::move(statusor).value()

#endif  // LOCKSTEP_COMMON_STATUS_MACROS_H_
