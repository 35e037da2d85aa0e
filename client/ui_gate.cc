#include "client/ui_gate.h"

#include <openssl/crypto.h>
#include <openssl/rand.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace lockstep::client {

bool UiGate::IsAsset(const std::string& path) {
  return path == "/app.js" || path == "/app.css";
}

bool UiGate::KnownHost(const std::string& host) const {
  for (const std::string& known : hosts_) {
    if (absl::EqualsIgnoreCase(host, known)) return true;
  }
  return false;
}

bool UiGate::TokenMatches(const std::string& given) const {
  return !token_.empty() && given.size() == token_.size() &&
         CRYPTO_memcmp(given.data(), token_.data(), token_.size()) == 0;
}

UiVerdict UiGate::Check(const UiRequest& request) const {
  if (!KnownHost(request.host)) {
    return {403, absl::StrCat("Host \"", request.host,
                              "\" is not this console's address; open the "
                              "URL `lockstep ui` printed")};
  }
  if (!request.origin.empty() &&
      !(absl::StartsWith(request.origin, "http://") &&
        KnownHost(request.origin.substr(7)))) {
    return {403, absl::StrCat("requests from ", request.origin,
                              " are not served: only the console's own page "
                              "may call it")};
  }
  const bool read = request.method == "GET" || request.method == "HEAD";
  if (!read && request.method != "POST") {
    return {405, absl::StrCat(request.method, " is not served")};
  }
  if (IsAsset(request.path)) {
    if (!read) return {405, "a static file is only read"};
    return {};
  }
  if (IsPage(request.path)) {
    if (!read) return {405, "the page is only read"};
    if (!TokenMatches(request.query_token)) {
      return {403,
              "this console needs the token in its URL: open the URL "
              "`lockstep ui` printed (http://HOST:PORT/?token=...)"};
    }
    return {};
  }
  if (!absl::StartsWith(request.path, "/api/")) return {404, "not found"};
  if (!TokenMatches(request.token)) {
    return {403, "the API needs the console's token in X-Lockstep-Token"};
  }
  if (!read) {
    if (!absl::EndsWith(request.path, "/stop") &&
        !absl::EndsWith(request.path, "/delete")) {
      return {405, absl::StrCat(request.path, " is only read")};
    }
    if (!absl::StartsWith(absl::AsciiStrToLower(request.content_type),
                          "application/json")) {
      return {415, "a write is a POST of application/json"};
    }
  }
  return {};
}

std::string NewUiToken() {
  unsigned char bytes[32];
  if (RAND_bytes(bytes, sizeof(bytes)) != 1) return "";
  std::string hex;
  for (unsigned char byte : bytes) {
    absl::StrAppend(&hex, absl::Hex(byte, absl::kZeroPad2));
  }
  return hex;
}

}  // namespace lockstep::client
