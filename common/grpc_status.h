// Conversions between absl::Status and grpc::Status. The canonical codes are
// the same numbers in both.
#ifndef LOCKSTEP_COMMON_GRPC_STATUS_H_
#define LOCKSTEP_COMMON_GRPC_STATUS_H_

#include <grpcpp/support/status.h>

#include <string>

#include "absl/status/status.h"

namespace lockstep {

inline grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()),
                      std::string(status.message()));
}

inline absl::Status FromGrpcStatus(const grpc::Status& status) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      status.error_message());
}

}  // namespace lockstep

#endif  // LOCKSTEP_COMMON_GRPC_STATUS_H_
