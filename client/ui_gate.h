// Who may use the web console (`lockstep ui`, issue 55), decided from the
// request alone, before any call reaches the coordinator. The console acts
// with its user's own credentials, so a request is answered only when it
// comes from that user's browser tab:
//
// - Host must be the console's own address (127.0.0.1:PORT, localhost:PORT
//   or the --listen host): a page of another site that rebinds its DNS name
//   to 127.0.0.1 sends its own name, and is refused.
// - Origin, when the browser sends one, must be the console's: another
//   site's script is refused, and no CORS header is ever sent.
// - The page is served only with the token in its URL (?token=...), which
//   `lockstep ui` prints, as Jupyter does: another local user or a page that
//   guesses the port gets nothing. The API takes the token only in the
//   X-Lockstep-Token header, which no form and no cross-site request
//   without a CORS preflight (never answered) can send, so a write cannot
//   be forged (CSRF).
// - Writes are POSTs of application/json to the job actions only.
//
// Thread-safe (immutable).
#ifndef LOCKSTEP_CLIENT_UI_GATE_H_
#define LOCKSTEP_CLIENT_UI_GATE_H_

#include <string>
#include <utility>
#include <vector>

namespace lockstep::client {

struct UiRequest {
  std::string method;  // "GET", "POST", ...
  std::string path;    // without the query
  std::string query_token;
  std::string query_since;  // ?since=VERSION of GET /api/jobs/ID
  // Headers; empty when absent.
  std::string host;
  std::string origin;
  std::string token;  // X-Lockstep-Token
  std::string content_type;
};

// What the gate says: status 0 to serve, else the HTTP status and why.
struct UiVerdict {
  int status = 0;
  std::string why;
};

class UiGate {
 public:
  // `hosts`: the Host values that name the console ("127.0.0.1:8080",
  // "localhost:8080"); `token`: the secret in its URL.
  UiGate(std::string token, std::vector<std::string> hosts)
      : token_(std::move(token)), hosts_(std::move(hosts)) {}

  UiVerdict Check(const UiRequest& request) const;
  // Whether `path` is the page or one of its static files (served with
  // the token in the URL, or without it for the files).
  static bool IsPage(const std::string& path) { return path == "/"; }
  static bool IsAsset(const std::string& path);
  const std::string& token() const { return token_; }

 private:
  bool KnownHost(const std::string& host) const;
  bool TokenMatches(const std::string& given) const;

  const std::string token_;
  const std::vector<std::string> hosts_;
};

// 32 random bytes (OpenSSL's RAND_bytes) as 64 hex digits; empty if the
// generator fails.
std::string NewUiToken();

}  // namespace lockstep::client

#endif  // LOCKSTEP_CLIENT_UI_GATE_H_
