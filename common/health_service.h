// A minimal grpc.health.v1 Health service for a daemon that serves nothing
// else over gRPC (the worker): gRPC's built-in health service needs another
// synchronous service on the same server to be polled.
//
// With mutual TLS (`insecure` false) any caller with a certificate from the
// daemon's CA whose SPIFFE ID names a lockstep role may Check; any other call
// is UNAUTHENTICATED, as is a revoked identity on the coordinator. The
// answer says only SERVING or NOT_SERVING.
#ifndef LOCKSTEP_COMMON_HEALTH_SERVICE_H_
#define LOCKSTEP_COMMON_HEALTH_SERVICE_H_

#include <atomic>
#include <functional>
#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/tls.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace lockstep {

class HealthService final : public grpc::health::v1::Health::Service {
 public:
  // `denied`, when given, names revoked identities (the coordinator's
  // --deny-identities): they are refused like a caller without one.
  explicit HealthService(
      bool insecure,
      std::function<bool(const std::string& spiffe_id)> denied = nullptr)
      : insecure_(insecure), denied_(std::move(denied)) {}

  void SetServing(bool serving) { serving_ = serving; }

  grpc::Status Check(grpc::ServerContext* context,
                     const grpc::health::v1::HealthCheckRequest* request,
                     grpc::health::v1::HealthCheckResponse* response) override {
    Caller caller = CallerOfCall(*context, insecure_);
    if (caller.role != Role::kNone && caller.role != Role::kInsecure &&
        denied_ && denied_(caller.id)) {
      return grpc::Status(
          grpc::StatusCode::UNAUTHENTICATED,
          absl::StrCat("health check refused: ", caller.ToString(),
                       " is revoked by the coordinator's --deny-identities "
                       "list"));
    }
    if (caller.role == Role::kNone) {
      return grpc::Status(
          grpc::StatusCode::UNAUTHENTICATED,
          absl::StrCat("health check refused: ", caller.ToString(),
                       "; present a certificate from this daemon's CA"));
    }
    if (!request->service().empty()) {
      return grpc::Status(grpc::StatusCode::NOT_FOUND,
                          "only the server's overall health is served");
    }
    response->set_status(
        serving_ ? grpc::health::v1::HealthCheckResponse::SERVING
                 : grpc::health::v1::HealthCheckResponse::NOT_SERVING);
    return grpc::Status::OK;
  }

 private:
  const bool insecure_;
  const std::function<bool(const std::string&)> denied_;
  std::atomic<bool> serving_{true};
};

}  // namespace lockstep

#endif  // LOCKSTEP_COMMON_HEALTH_SERVICE_H_
