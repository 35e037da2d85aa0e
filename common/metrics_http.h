// The daemons' /metrics endpoint: Prometheus' text format over plain HTTP,
// served by libmicrohttpd (one internal thread; this file writes no HTTP).
// Only GET or HEAD of /metrics is answered (200); any other path is 404 and
// any other method 405. A scrape calls `render` on the server's thread,
// so a slow render delays only the scrapes.
//
// Plain HTTP, like every Prometheus exporter by default: the numbers are
// not secrets, but job names and hosts are visible to whoever can connect,
// so bind it where only the scraper reaches (deploy/k8s limits the port to
// Prometheus with a NetworkPolicy; `lockstep local` binds 127.0.0.1).
//
// Thread-safe; stopping (the destructor) waits for a scrape under way.
#ifndef LOCKSTEP_COMMON_METRICS_HTTP_H_
#define LOCKSTEP_COMMON_METRICS_HTTP_H_

#include <functional>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/statusor.h"

struct MHD_Daemon;

namespace lockstep::metrics {

class HttpServer {
 public:
  using Render = std::function<std::string()>;

  // Listens on `listen` ("HOST:PORT", "[V6]:PORT", or ":PORT" for every
  // IPv4 interface; port 0 picks a free one). Errors: InvalidArgument for
  // a malformed address, Unavailable when it cannot be bound (the port is
  // taken, or the host is not this machine's).
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(
      const std::string& listen, Render render);
  ~HttpServer();

  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // The port bound (the chosen one when 0 was asked for).
  int port() const { return port_; }
  // What a scraper puts in its target: HOST:PORT with the bound port.
  const std::string& address() const { return address_; }

 private:
  explicit HttpServer(Render render) : render_(std::move(render)) {}

  const Render render_;
  MHD_Daemon* daemon_ = nullptr;
  int port_ = 0;
  std::string address_;

  friend struct HttpServerAccess;
};

}  // namespace lockstep::metrics

#endif  // LOCKSTEP_COMMON_METRICS_HTTP_H_
