#include "common/metrics_http.h"

#include <microhttpd.h>
#include <netdb.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace lockstep::metrics {

struct HttpServerAccess {
  static const HttpServer::Render& render(const HttpServer& server) {
    return server.render_;
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

MHD_Result Handle(void* cls, MHD_Connection* connection, const char* url,
                  const char* method, const char* /*version*/,
                  const char* /*upload_data*/, size_t* upload_data_size,
                  void** /*con_cls*/) {
  const auto& server = *static_cast<const HttpServer*>(cls);
  // A body (there should be none) is read and dropped.
  *upload_data_size = 0;
  const bool get = std::strcmp(method, MHD_HTTP_METHOD_GET) == 0 ||
                   std::strcmp(method, MHD_HTTP_METHOD_HEAD) == 0;
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

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(
    const std::string& listen, Render render) {
  std::string host;
  int port = 0;
  if (absl::Status bad = SplitListen(listen, &host, &port); !bad.ok()) {
    return bad;
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
  std::unique_ptr<HttpServer> server(new HttpServer(std::move(render)));
  unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO;
  if (found->ai_family == AF_INET6) flags |= MHD_USE_IPv6;
  errno = 0;
  server->daemon_ = MHD_start_daemon(
      flags, static_cast<uint16_t>(port), nullptr, nullptr, &Handle,
      server.get(), MHD_OPTION_SOCK_ADDR, found->ai_addr,
      MHD_OPTION_CONNECTION_LIMIT, kMaxConnections,
      MHD_OPTION_PER_IP_CONNECTION_LIMIT, kMaxConnectionsPerAddress,
      MHD_OPTION_CONNECTION_TIMEOUT, kConnectionTimeoutSeconds, MHD_OPTION_END);
  const int start_errno = errno;
  freeaddrinfo(found);
  if (server->daemon_ == nullptr) {
    return absl::UnavailableError(absl::StrCat(
        "cannot serve metrics on ", listen, ": ",
        start_errno != 0 ? std::strerror(start_errno) : "libmicrohttpd failed",
        "; is the port taken, or the address not this machine's?"));
  }
  const MHD_DaemonInfo* info =
      MHD_get_daemon_info(server->daemon_, MHD_DAEMON_INFO_BIND_PORT);
  server->port_ = info != nullptr && info->port != 0 ? info->port : port;
  server->address_ = absl::StrCat(
      host.find(':') != std::string::npos ? absl::StrCat("[", host, "]") : host,
      ":", server->port_);
  return server;
}

HttpServer::~HttpServer() {
  if (daemon_ != nullptr) MHD_stop_daemon(daemon_);
}

}  // namespace lockstep::metrics
