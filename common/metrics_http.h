// The daemons' /metrics endpoint: Prometheus' text format over HTTP, or
// HTTPS with client certificates, served by libmicrohttpd (one internal
// thread; this file writes no HTTP). Only GET or HEAD of /metrics is
// answered (200); any other path is 404 and any other method 405. A scrape
// calls `render` on the server's thread, so a slow render delays only the
// scrapes.
//
// Plain HTTP by default, like every Prometheus exporter: the numbers are
// not secrets, but job names and hosts are visible to whoever can connect,
// so bind it where only the scraper reaches (deploy/k8s limits the port to
// Prometheus with a NetworkPolicy; `lockstep local` binds 127.0.0.1).
// With HttpsOptions (the daemons' --metrics-tls) it serves TLS with the
// daemon's own certificate (GnuTLS, under libmicrohttpd), asks for a client
// certificate and answers /metrics only to one the CA verifies whose
// SPIFFE ID `authorize` accepts; any other gets 403 with the reason in the
// body. The files are read again every
// `reload_seconds`; a changed, valid set serves the next connections.
//
// Thread-safe; stopping (the destructor) waits for a scrape under way. A
// process serving HTTPS should ignore SIGPIPE (both daemons do): a client
// gone mid-write is then an error on that connection only.
#ifndef LOCKSTEP_COMMON_METRICS_HTTP_H_
#define LOCKSTEP_COMMON_METRICS_HTTP_H_

#include <atomic>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "absl/status/statusor.h"

struct MHD_Daemon;

namespace lockstep::metrics {

// What HTTPS needs: PEM files, and who may scrape.
struct HttpsOptions {
  std::string cert_file;  // this daemon's certificate (chain allowed)
  std::string key_file;   // its private key
  std::string ca_file;    // the CA a scraper's certificate must chain to
  // Given a verified client certificate's SPIFFE ID ("" when it has not
  // exactly one), returns "" to serve it, or why not.
  std::function<std::string(const std::string& spiffe_id)> authorize;
  int reload_seconds = 60;
};

// A daemon's --metrics-tls: its own certificate, key and CA files; viewers
// and operators may scrape (WhyNotAScraper, common/caller.h), unless
// `refuse` (the coordinator's deny list) says why not.
HttpsOptions MetricsHttps(
    const std::string& cert_file, const std::string& key_file,
    const std::string& ca_file,
    std::function<std::string(const std::string& spiffe_id)> refuse = nullptr);

class HttpServer {
 public:
  using Render = std::function<std::string()>;

  // Listens on `listen` ("HOST:PORT", "[V6]:PORT", or ":PORT" for every
  // IPv4 interface; port 0 picks a free one), with TLS when `https` is
  // given. Errors: InvalidArgument for a malformed address;
  // FailedPrecondition for TLS files that cannot be read, do not parse or
  // do not belong together (naming the file); Unavailable when it cannot
  // be bound (the port is taken, or the host is not this machine's).
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(
      const std::string& listen, Render render,
      std::optional<HttpsOptions> https = std::nullopt);
  ~HttpServer();

  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // The port bound (the chosen one when 0 was asked for).
  int port() const { return port_; }
  // What a scraper puts in its target: HOST:PORT with the bound port.
  const std::string& address() const { return address_; }
  // "https" with HttpsOptions, else "http".
  const char* scheme() const { return https_ ? "https" : "http"; }
  // How many times the TLS files were read again so far, whatever came of
  // it (for tests to wait on).
  int reload_checks() const { return reload_checks_.load(); }

 private:
  // The three PEMs a TLS daemon serves (libmicrohttpd keeps pointers to
  // them for the daemon's life).
  struct Pems {
    std::string cert, key, ca;
    bool operator==(const Pems& other) const {
      return cert == other.cert && key == other.key && ca == other.ca;
    }
  };

  HttpServer(Render render, std::optional<HttpsOptions> https)
      : render_(std::move(render)), https_(std::move(https)) {}

  // A daemon on `listen_fd` (or bound to `address` when it is -1) serving
  // `pems` when TLS is on; null on failure.
  MHD_Daemon* StartDaemon(const void* address, bool ipv6, int port,
                          int listen_fd, const Pems* pems);
  // Every reload_seconds: reads the files; a changed, valid set replaces
  // the daemon on the same listening socket.
  void ReloadLoop();

  const Render render_;
  const std::optional<HttpsOptions> https_;
  int port_ = 0;
  std::string address_;
  bool ipv6_ = false;

  std::mutex mu_;
  std::condition_variable stop_cv_;
  bool stopping_ = false;         // guarded by mu_
  MHD_Daemon* daemon_ = nullptr;  // guarded by mu_ after Start
  std::unique_ptr<Pems> pems_;    // what daemon_ serves; guarded by mu_
  std::thread reloader_;
  std::atomic<int> reload_checks_{0};

  friend struct HttpServerAccess;
};

}  // namespace lockstep::metrics

#endif  // LOCKSTEP_COMMON_METRICS_HTTP_H_
