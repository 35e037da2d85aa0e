// A minimal grpc.health.v1 Health service for a daemon that serves nothing
// else over gRPC (the worker): gRPC's built-in health service needs another
// synchronous service on the same server to be polled. The coordinator
// serves it too, instead of gRPC's built-in one, which answers anybody:
// constructed with `require_identity`, it answers only callers whose client
// certificate names a lockstep identity (any role), and others
// UNAUTHENTICATED.
#ifndef LOCKSTEP_COMMON_HEALTH_SERVICE_H_
#define LOCKSTEP_COMMON_HEALTH_SERVICE_H_

#include <atomic>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/caller.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace lockstep {

class HealthService final : public grpc::health::v1::Health::Service {
 public:
  HealthService() = default;
  explicit HealthService(bool require_identity)
      : require_identity_(require_identity) {}

  void SetServing(bool serving) { serving_ = serving; }

  grpc::Status Check(grpc::ServerContext* context,
                     const grpc::health::v1::HealthCheckRequest* request,
                     grpc::health::v1::HealthCheckResponse* response) override {
    if (require_identity_) {
      Caller caller = CallerOf(context->auth_context().get(), context->peer(),
                               /*insecure=*/false);
      if (caller.role == Role::kNone) {
        return grpc::Status(
            grpc::StatusCode::UNAUTHENTICATED,
            absl::StrCat(caller.ToString(),
                         " may not call grpc.health.v1.Health/Check: it "
                         "needs a client certificate signed by the "
                         "cluster's CA that names a lockstep identity"));
      }
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
  const bool require_identity_ = false;
  std::atomic<bool> serving_{true};
};

}  // namespace lockstep

#endif  // LOCKSTEP_COMMON_HEALTH_SERVICE_H_
