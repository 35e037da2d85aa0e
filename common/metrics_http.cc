#include "common/metrics_http.h"

#include <gnutls/gnutls.h>
#include <gnutls/x509.h>
#include <microhttpd.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <sstream>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "common/caller.h"
#include "common/log.h"

namespace lockstep::metrics {

struct HttpServerAccess {
  static const HttpServer::Render& render(const HttpServer& server) {
    return server.render_;
  }
  static const std::optional<HttpsOptions>& https(const HttpServer& server) {
    return server.https_;
  }
};

namespace {

constexpr char kContentType[] = "text/plain; version=0.0.4; charset=utf-8";
// A scraper or two, and room for curls: more connections are accepted and
// closed at once rather than queued without bound.
constexpr unsigned kMaxConnections = 32;
// What one address may hold: a Prometheus server needs one or two, so one
// client that opens hundreds of idle or trickling connections takes only
// these and the others are closed as they arrive (issue 27: 300 idle
// connections from one address blocked every scrape).
constexpr unsigned kMaxConnectionsPerAddress = 4;
// An idle or trickling connection is closed after this long; a scrape
// sends its request at once.
constexpr unsigned kConnectionTimeoutSeconds = 5;

MHD_Result Reply(MHD_Connection* connection, unsigned status,
                 const std::string& body, const char* allow) {
  MHD_Response* response = MHD_create_response_from_buffer(
      body.size(), const_cast<char*>(body.data()), MHD_RESPMEM_MUST_COPY);
  if (response == nullptr) return MHD_NO;
  MHD_add_response_header(
      response, MHD_HTTP_HEADER_CONTENT_TYPE,
      status == MHD_HTTP_OK ? kContentType : "text/plain; charset=utf-8");
  if (allow != nullptr) {
    MHD_add_response_header(response, MHD_HTTP_HEADER_ALLOW, allow);
  }
  const MHD_Result queued = MHD_queue_response(connection, status, response);
  MHD_destroy_response(response);
  return queued;
}

// TLS 1.2 and 1.3 only, GnuTLS' normal ciphers.
constexpr char kTlsPriorities[] = "NORMAL:-VERS-ALL:+VERS-TLS1.3:+VERS-TLS1.2";
// A PEM file larger than this is not a certificate, key or CA bundle.
constexpr std::streamoff kMaxPemBytes = 1 << 20;

// Why the connection's client may not scrape, with the HTTP status to say
// it with; status 0 when it may.
struct Refusal {
  unsigned status = 0;
  std::string why;
};

// The certificate's SPIFFE ID: its one URI name when that is spiffe://,
// else "" (no URI, another scheme, or several URIs, as gRPC's side of
// lockstep has it: common/caller.h). A name of any kind over 4 KiB counts
// as a URI that is no SPIFFE ID (gRPC refuses IDs that long too).
std::string SpiffeId(const gnutls_datum_t& der) {
  std::vector<std::string> uris;
  gnutls_x509_crt_t cert = nullptr;
  if (gnutls_x509_crt_init(&cert) < 0) return "";
  if (gnutls_x509_crt_import(cert, &der, GNUTLS_X509_FMT_DER) >= 0) {
    for (unsigned i = 0; i < 64; ++i) {
      char name[4096];
      size_t size = sizeof(name);
      unsigned int type = 0;
      const int got = gnutls_x509_crt_get_subject_alt_name2(
          cert, i, name, &size, &type, nullptr);
      if (got == GNUTLS_E_SHORT_MEMORY_BUFFER) {
        uris.emplace_back();
        continue;
      }
      if (got < 0) break;
      if (got == GNUTLS_SAN_URI) uris.emplace_back(name, size);
    }
  }
  gnutls_x509_crt_deinit(cert);
  return uris.size() == 1 && absl::StartsWith(uris[0], "spiffe://") ? uris[0]
                                                                    : "";
}

Refusal CheckClient(MHD_Connection* connection, const HttpsOptions& https) {
  const MHD_ConnectionInfo* info =
      MHD_get_connection_info(connection, MHD_CONNECTION_INFO_GNUTLS_SESSION);
  auto session = static_cast<gnutls_session_t>(
      info != nullptr ? info->tls_session : nullptr);
  if (session == nullptr) return {MHD_HTTP_FORBIDDEN, "no TLS session"};
  unsigned count = 0;
  const gnutls_datum_t* chain = gnutls_certificate_get_peers(session, &count);
  // 403, not 401: HTTP's 401 asks for an authentication scheme of its own.
  if (chain == nullptr || count == 0) {
    return {MHD_HTTP_FORBIDDEN,
            "no client certificate: this /metrics (--metrics-tls) answers "
            "only a certificate signed by the cluster's CA, e.g. a viewer's "
            "from `lockstep-certs viewer prometheus`"};
  }
  unsigned verdict = 0;
  const int verified = gnutls_certificate_verify_peers2(session, &verdict);
  if (verified < 0 || verdict != 0) {
    std::string reason = verified < 0 ? gnutls_strerror(verified) : "";
    gnutls_datum_t text{};
    if (verified >= 0 && gnutls_certificate_verification_status_print(
                             verdict, GNUTLS_CRT_X509, &text, 0) >= 0) {
      reason.assign(reinterpret_cast<const char*>(text.data), text.size);
      gnutls_free(text.data);
    }
    return {MHD_HTTP_FORBIDDEN,
            absl::StrCat("the client certificate does not verify against "
                         "the cluster's CA: ",
                         reason)};
  }
  const std::string why =
      https.authorize ? https.authorize(SpiffeId(chain[0])) : "";
  if (!why.empty()) return {MHD_HTTP_FORBIDDEN, why};
  return {};
}

MHD_Result Handle(void* cls, MHD_Connection* connection, const char* url,
                  const char* method, const char* /*version*/,
                  const char* /*upload_data*/, size_t* upload_data_size,
                  void** /*con_cls*/) {
  const auto& server = *static_cast<const HttpServer*>(cls);
  // A body (there should be none) is read and dropped.
  *upload_data_size = 0;
  const bool get = std::strcmp(method, MHD_HTTP_METHOD_GET) == 0 ||
                   std::strcmp(method, MHD_HTTP_METHOD_HEAD) == 0;
  if (const auto& https = HttpServerAccess::https(server); https) {
    const Refusal refusal = CheckClient(connection, *https);
    if (refusal.status != 0) {
      return Reply(connection, refusal.status, refusal.why + "\n", nullptr);
    }
  }
  if (std::strcmp(url, "/metrics") != 0) {
    return Reply(connection, MHD_HTTP_NOT_FOUND,
                 "only /metrics is served here\n", nullptr);
  }
  if (!get) {
    return Reply(connection, MHD_HTTP_METHOD_NOT_ALLOWED,
                 "/metrics answers GET and HEAD\n", "GET, HEAD");
  }
  return Reply(connection, MHD_HTTP_OK, HttpServerAccess::render(server)(),
               nullptr);
}

// "HOST:PORT", "[V6]:PORT" or ":PORT" into its parts.
absl::Status SplitListen(const std::string& listen, std::string* host,
                         int* port) {
  const size_t colon = listen.rfind(':');
  int parsed = -1;
  if (colon == std::string::npos ||
      !absl::SimpleAtoi(listen.substr(colon + 1), &parsed) || parsed < 0 ||
      parsed > 65535) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--metrics-listen \"", listen,
        "\" is not HOST:PORT (e.g. 127.0.0.1:9464, [::1]:9464, :9464)"));
  }
  *host = listen.substr(0, colon);
  if (host->size() >= 2 && host->front() == '[' && host->back() == ']') {
    *host = host->substr(1, host->size() - 2);
  }
  if (host->empty()) *host = "0.0.0.0";
  *port = parsed;
  return absl::OkStatus();
}

}  // namespace

HttpsOptions MetricsHttps(
    const std::string& cert_file, const std::string& key_file,
    const std::string& ca_file,
    std::function<std::string(const std::string& spiffe_id)> refuse) {
  HttpsOptions https;
  https.cert_file = cert_file;
  https.key_file = key_file;
  https.ca_file = ca_file;
  https.authorize = [refuse = std::move(refuse)](const std::string& id) {
    std::string why = WhyNotAScraper(id);
    if (why.empty() && refuse) why = refuse(id);
    return why;
  };
  return https;
}

MHD_Daemon* HttpServer::StartDaemon(const void* address, bool ipv6, int port,
                                    int listen_fd, const Pems* pems) {
  std::vector<MHD_OptionItem> options;
  if (listen_fd >= 0) {
    options.push_back({MHD_OPTION_LISTEN_SOCKET, listen_fd, nullptr});
  } else {
    options.push_back({MHD_OPTION_SOCK_ADDR, 0, const_cast<void*>(address)});
  }
  options.push_back({MHD_OPTION_CONNECTION_LIMIT, kMaxConnections, nullptr});
  options.push_back(
      {MHD_OPTION_PER_IP_CONNECTION_LIMIT, kMaxConnectionsPerAddress, nullptr});
  options.push_back(
      {MHD_OPTION_CONNECTION_TIMEOUT, kConnectionTimeoutSeconds, nullptr});
  unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO;
  if (ipv6) flags |= MHD_USE_IPv6;
  if (pems != nullptr) {
    // The ITC lets a reload quiesce this daemon and hand its socket on.
    flags |= MHD_USE_TLS | MHD_USE_ITC;
    options.push_back(
        {MHD_OPTION_HTTPS_MEM_CERT, 0, const_cast<char*>(pems->cert.c_str())});
    options.push_back(
        {MHD_OPTION_HTTPS_MEM_KEY, 0, const_cast<char*>(pems->key.c_str())});
    // With a trust list libmicrohttpd asks every client for a certificate;
    // CheckClient decides on it.
    options.push_back(
        {MHD_OPTION_HTTPS_MEM_TRUST, 0, const_cast<char*>(pems->ca.c_str())});
    options.push_back(
        {MHD_OPTION_HTTPS_PRIORITIES, 0, const_cast<char*>(kTlsPriorities)});
  }
  options.push_back({MHD_OPTION_END, 0, nullptr});
  return MHD_start_daemon(flags, static_cast<uint16_t>(port), nullptr, nullptr,
                          &Handle, this, MHD_OPTION_ARRAY, options.data(),
                          MHD_OPTION_END);
}

namespace {

absl::StatusOr<std::string> ReadPem(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream text;
  if (in) text << in.rdbuf();
  if (!in || text.str().empty() ||
      static_cast<std::streamoff>(text.str().size()) > kMaxPemBytes) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--metrics-tls: cannot read ", what, " ", path,
        " (missing, empty or over 1 MiB); it is the --tls-cert, --tls-key "
        "or --tls-ca file the daemon serves gRPC with"));
  }
  return text.str();
}

// Whether GnuTLS takes the PEMs: a certificate and its key, and at least
// one CA certificate. Errors: FailedPrecondition naming the file.
absl::Status CheckPems(const std::string& cert, const std::string& key,
                       const std::string& ca, const HttpsOptions& https) {
  gnutls_certificate_credentials_t credentials = nullptr;
  if (gnutls_certificate_allocate_credentials(&credentials) < 0) {
    return absl::ResourceExhaustedError("GnuTLS cannot allocate credentials");
  }
  auto datum = [](const std::string& text) {
    return gnutls_datum_t{
        reinterpret_cast<unsigned char*>(const_cast<char*>(text.data())),
        static_cast<unsigned>(text.size())};
  };
  const gnutls_datum_t cert_datum = datum(cert), key_datum = datum(key),
                       ca_datum = datum(ca);
  absl::Status status;
  const int pair = gnutls_certificate_set_x509_key_mem(
      credentials, &cert_datum, &key_datum, GNUTLS_X509_FMT_PEM);
  if (pair < 0) {
    status = absl::FailedPreconditionError(absl::StrCat(
        "--metrics-tls: ", https.cert_file, " and ", https.key_file,
        " are not a certificate and its key: ", gnutls_strerror(pair)));
  } else if (const int cas = gnutls_certificate_set_x509_trust_mem(
                 credentials, &ca_datum, GNUTLS_X509_FMT_PEM);
             cas <= 0) {
    status = absl::FailedPreconditionError(
        absl::StrCat("--metrics-tls: ", https.ca_file,
                     " holds no CA certificate GnuTLS can read",
                     cas < 0 ? absl::StrCat(": ", gnutls_strerror(cas)) : ""));
  }
  gnutls_certificate_free_credentials(credentials);
  return status;
}

}  // namespace

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(
    const std::string& listen, Render render,
    std::optional<HttpsOptions> https) {
  std::string host;
  int port = 0;
  if (absl::Status bad = SplitListen(listen, &host, &port); !bad.ok()) {
    return bad;
  }
  std::unique_ptr<Pems> pems;
  if (https.has_value()) {
    pems = std::make_unique<Pems>();
    auto cert = ReadPem(https->cert_file, "the certificate");
    if (!cert.ok()) return cert.status();
    auto key = ReadPem(https->key_file, "the key");
    if (!key.ok()) return key.status();
    auto ca = ReadPem(https->ca_file, "the CA");
    if (!ca.ok()) return ca.status();
    if (absl::Status bad = CheckPems(*cert, *key, *ca, *https); !bad.ok()) {
      return bad;
    }
    *pems = {*std::move(cert), *std::move(key), *std::move(ca)};
  }
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string port_text = absl::StrCat(port);
  if (int err = getaddrinfo(host.c_str(), port_text.c_str(), &hints, &found);
      err != 0) {
    return absl::InvalidArgumentError(absl::StrCat("--metrics-listen ", listen,
                                                   ": cannot resolve \"", host,
                                                   "\": ", gai_strerror(err)));
  }
  std::unique_ptr<HttpServer> server(
      new HttpServer(std::move(render), std::move(https)));
  server->ipv6_ = found->ai_family == AF_INET6;
  errno = 0;
  MHD_Daemon* daemon =
      server->StartDaemon(found->ai_addr, server->ipv6_, port, -1, pems.get());
  const int start_errno = errno;
  freeaddrinfo(found);
  if (daemon == nullptr) {
    return absl::UnavailableError(absl::StrCat(
        "cannot serve metrics on ", listen, ": ",
        start_errno != 0 ? std::strerror(start_errno) : "libmicrohttpd failed",
        "; is the port taken, or the address not this machine's?"));
  }
  const MHD_DaemonInfo* info =
      MHD_get_daemon_info(daemon, MHD_DAEMON_INFO_BIND_PORT);
  server->port_ = info != nullptr && info->port != 0 ? info->port : port;
  server->address_ = absl::StrCat(
      host.find(':') != std::string::npos ? absl::StrCat("[", host, "]") : host,
      ":", server->port_);
  {
    std::lock_guard<std::mutex> lock(server->mu_);
    server->daemon_ = daemon;
    server->pems_ = std::move(pems);
  }
  if (server->https_.has_value()) {
    HttpServer* self = server.get();
    server->reloader_ = std::thread([self] { self->ReloadLoop(); });
  }
  return server;
}

void HttpServer::ReloadLoop() {
  const HttpsOptions& https = *https_;
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_cv_.wait_for(lock, std::chrono::seconds(https.reload_seconds),
                            [this] { return stopping_; })) {
    lock.unlock();
    auto cert = ReadPem(https.cert_file, "the certificate");
    auto key = ReadPem(https.key_file, "the key");
    auto ca = ReadPem(https.ca_file, "the CA");
    absl::Status read = !cert.ok()  ? cert.status()
                        : !key.ok() ? key.status()
                        : !ca.ok()  ? ca.status()
                                    : CheckPems(*cert, *key, *ca, https);
    lock.lock();
    if (stopping_) break;
    ++reload_checks_;
    if (!read.ok()) {
      // Half rotated, or broken: the last good set keeps serving.
      LogWarning("/metrics keeps its TLS files: ", read.message());
      continue;
    }
    auto fresh = std::make_unique<Pems>(
        Pems{*std::move(cert), *std::move(key), *std::move(ca)});
    if (*fresh == *pems_) continue;
    // The new daemon starts on a copy of the listening socket while the
    // old one still serves it, so that a failure leaves the old one as it
    // was. (A copy libmicrohttpd failed on is not closed here: it may
    // have closed it itself, and the number may be another's by now.)
    const MHD_DaemonInfo* info =
        MHD_get_daemon_info(daemon_, MHD_DAEMON_INFO_LISTEN_FD);
    const int copy = info != nullptr ? dup(info->listen_fd) : -1;
    errno = 0;
    MHD_Daemon* next =
        copy >= 0 ? StartDaemon(nullptr, ipv6_, port_, copy, fresh.get())
                  : nullptr;
    if (next == nullptr) {
      LogWarning(
          "/metrics keeps its TLS files: libmicrohttpd cannot start on "
          "the new ones (",
          errno != 0 ? std::strerror(errno) : "no reason given",
          "); trying again in ", https.reload_seconds, " s");
      continue;
    }
    // The old daemon stops accepting and ends its connections (a scrape
    // takes milliseconds); its descriptor, handed back by the quiesce, is
    // closed once it is stopped, and its PEMs go with it.
    const MHD_socket old_fd = MHD_quiesce_daemon(daemon_);
    MHD_stop_daemon(daemon_);
    if (old_fd != MHD_INVALID_SOCKET) close(old_fd);
    daemon_ = next;
    pems_ = std::move(fresh);
    LogInfo("/metrics serves the renewed TLS files ", https.cert_file);
  }
}

HttpServer::~HttpServer() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  stop_cv_.notify_all();
  if (reloader_.joinable()) reloader_.join();
  if (daemon_ != nullptr) MHD_stop_daemon(daemon_);
}

}  // namespace lockstep::metrics
