#include "common/caller.h"

#include <grpc/grpc_security_constants.h>
#include <grpcpp/security/auth_context.h>

#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace lockstep {
namespace {

constexpr absl::string_view kScheme = "spiffe://";
// SPIFFE's limit on an ID's length.
constexpr size_t kMaxIdBytes = 2048;

// SPIFFE path segments: letters, digits, '.', '-', '_'.
bool ValidSegment(absl::string_view segment) {
  if (segment.empty() || segment == "." || segment == "..") return false;
  for (char c : segment) {
    if (!absl::ascii_isalnum(c) && c != '.' && c != '-' && c != '_') {
      return false;
    }
  }
  return true;
}

bool AllDigits(absl::string_view s) {
  if (s.empty() || s.size() > 9) return false;
  for (char c : s) {
    if (!absl::ascii_isdigit(c)) return false;
  }
  return true;
}

Caller Unknown(absl::string_view why) {
  Caller caller;
  caller.id = std::string(why);
  return caller;
}

}  // namespace

absl::string_view RoleName(Role role) {
  switch (role) {
    case Role::kNone:
      return "unauthenticated";
    case Role::kCoordinator:
      return "coordinator";
    case Role::kWorker:
      return "worker";
    case Role::kOperator:
      return "operator";
    case Role::kViewer:
      return "viewer";
    case Role::kSpare:
      return "spare";
    case Role::kInsecure:
      return "insecure";
  }
  return "unknown";
}

std::string Caller::ToString() const {
  std::string text;
  switch (role) {
    case Role::kNone:
      text = absl::StrCat("an unauthenticated caller (", id, ")");
      break;
    case Role::kInsecure:
      text = "a caller without TLS (--insecure)";
      break;
    case Role::kCoordinator:
      text = absl::StrCat("the coordinator (", id, ")");
      break;
    default:
      text = absl::StrCat(RoleName(role), " \"", name, "\" (", id, ")");
  }
  if (!peer.empty()) absl::StrAppend(&text, " at ", peer);
  return text;
}

Caller ParseIdentity(absl::string_view spiffe_id) {
  if (spiffe_id.size() > kMaxIdBytes) {
    return Unknown("the certificate's SPIFFE ID is over 2048 bytes");
  }
  if (!absl::StartsWith(spiffe_id, kScheme)) {
    return Unknown(absl::StrCat("the certificate's URI \"", spiffe_id,
                                "\" is not a spiffe:// ID"));
  }
  std::vector<absl::string_view> parts =
      absl::StrSplit(spiffe_id.substr(kScheme.size()), '/');
  // parts[0] is the trust domain, parts[1] the role, the rest the name.
  for (absl::string_view part : parts) {
    if (!ValidSegment(part)) {
      return Unknown(absl::StrCat("the certificate's SPIFFE ID \"", spiffe_id,
                                  "\" is malformed (empty or unusual path "
                                  "segment)"));
    }
  }
  if (parts.size() < 2) {
    return Unknown(absl::StrCat("the certificate's SPIFFE ID \"", spiffe_id,
                                "\" names no role"));
  }
  Caller caller;
  caller.id = std::string(spiffe_id);
  caller.name = absl::StrJoin(parts.begin() + 2, parts.end(), "/");
  const absl::string_view role = parts[1];
  const size_t names = parts.size() - 2;
  if (role == "coordinator") {
    caller.role = Role::kCoordinator;
  } else if (role == "worker" && names >= 1) {
    caller.role = Role::kWorker;
    if (names == 2 && AllDigits(parts[3])) {
      caller.task = absl::StrCat(parts[2], ":", parts[3]);
    }
  } else if (role == "operator" && names >= 1) {
    caller.role = Role::kOperator;
  } else if (role == "viewer" && names >= 1) {
    caller.role = Role::kViewer;
  } else if (role == "spare" && names >= 1) {
    caller.role = Role::kSpare;
  } else {
    return Unknown(absl::StrCat(
        "the certificate's SPIFFE ID \"", spiffe_id,
        "\" names no lockstep role (coordinator, worker/NAME, spare/NAME, "
        "operator/NAME or viewer/NAME)"));
  }
  return caller;
}

std::string OwnerOf(absl::string_view spiffe_id) {
  if (spiffe_id.empty()) return "";
  const Caller caller = ParseIdentity(spiffe_id);
  if (caller.role == Role::kNone) return std::string(spiffe_id);
  return absl::StrCat(RoleName(caller.role), ":", caller.name);
}

std::string WhyNotAScraper(absl::string_view spiffe_id) {
  const Caller caller = spiffe_id.empty()
                            ? Unknown("the certificate has no single SPIFFE ID")
                            : ParseIdentity(spiffe_id);
  if (caller.role == Role::kViewer || caller.role == Role::kOperator) {
    return "";
  }
  return absl::StrCat(caller.ToString(),
                      " may not read /metrics: it needs a viewer or operator "
                      "identity (spiffe://lockstep/viewer/NAME, e.g. from "
                      "`lockstep-certs viewer prometheus`)");
}

Caller CallerOf(const grpc::AuthContext* auth, absl::string_view peer,
                bool insecure) {
  Caller caller;
  if (insecure) {
    caller.role = Role::kInsecure;
    caller.id = "--insecure";
  } else if (auth == nullptr || !auth->IsPeerAuthenticated()) {
    caller = Unknown("no client certificate");
  } else {
    std::vector<grpc::string_ref> uris =
        auth->FindPropertyValues(GRPC_PEER_SPIFFE_ID_PROPERTY_NAME);
    if (uris.empty())
      uris = auth->FindPropertyValues(GRPC_PEER_URI_PROPERTY_NAME);
    if (uris.size() != 1) {
      caller =
          Unknown(uris.empty() ? "the certificate has no SPIFFE ID (URI SAN)"
                               : "the certificate has more than one URI SAN");
    } else {
      caller = ParseIdentity(absl::string_view(uris[0].data(), uris[0].size()));
    }
  }
  caller.peer = std::string(peer);
  return caller;
}

}  // namespace lockstep
