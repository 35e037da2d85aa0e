// A minimal grpc.health.v1 Health service for a daemon that serves nothing
// else over gRPC (the worker): gRPC's built-in health service needs another
// synchronous service on the same server to be polled.
#ifndef LOCKSTEP_COMMON_HEALTH_SERVICE_H_
#define LOCKSTEP_COMMON_HEALTH_SERVICE_H_

#include <atomic>

#include "grpc/health/v1/health.grpc.pb.h"

namespace lockstep {

class HealthService final : public grpc::health::v1::Health::Service {
 public:
  void SetServing(bool serving) { serving_ = serving; }

  grpc::Status Check(grpc::ServerContext*,
                     const grpc::health::v1::HealthCheckRequest* request,
                     grpc::health::v1::HealthCheckResponse* response) override {
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
  std::atomic<bool> serving_{true};
};

}  // namespace lockstep

#endif  // LOCKSTEP_COMMON_HEALTH_SERVICE_H_
