// Who is calling a lockstep daemon, from the client certificate of the
// call's mutual-TLS connection.
//
// An identity is the certificate's one SPIFFE ID (a URI subject alternative
// name), `spiffe://<trust domain>/<role>/<name...>`:
//
//   spiffe://lockstep/worker/chief/0     a worker that may be task chief:0
//   spiffe://lockstep/worker/pool-7      a worker without a task (it may
//                                        only register without one, and
//                                        not as a static cluster's spare)
//   spiffe://lockstep/spare/spare-0      a hot spare: registers only as
//                                        one (--spare, no task); the one
//                                        identity that may take another
//                                        task's rank in a static cluster
//   spiffe://lockstep/operator/alice     may submit, stop, delete, read
//   spiffe://lockstep/viewer/grafana     may only read
//   spiffe://lockstep/coordinator        the coordinator's own certificate
//
// The trust domain is not checked: the CA that signed the certificate is
// what the daemons trust (--tls-ca). A worker's task is `<type>/<index>`
// with a decimal index; it is compared with the task the worker claims.
#ifndef LOCKSTEP_COMMON_CALLER_H_
#define LOCKSTEP_COMMON_CALLER_H_

#include <string>

#include "absl/strings/string_view.h"

namespace grpc {
class AuthContext;
}  // namespace grpc

namespace lockstep {

enum class Role {
  // No client certificate, or one whose identity lockstep does not know.
  kNone,
  kCoordinator,
  kWorker,
  kOperator,
  kViewer,
  kSpare,
  // The daemon runs with --insecure: nobody is authenticated and every
  // call is allowed, as before TLS.
  kInsecure,
};

absl::string_view RoleName(Role role);

struct Caller {
  Role role = Role::kNone;
  // The SPIFFE ID, or why there is none ("no client certificate", "the
  // certificate has no SPIFFE ID", ...).
  std::string id;
  // For a worker whose identity names a task: "chief:0", "worker:3".
  std::string task;
  // The part after the role: "alice", "chief/0", "pool-7".
  std::string name;
  // The peer's address as gRPC gives it ("ipv4:127.0.0.1:43122").
  std::string peer;
  // Role kNone because its identity is on the coordinator's
  // --deny-identities list (`id` says so too).
  bool revoked = false;

  // For messages: `operator "alice" (spiffe://lockstep/operator/alice) at
  // ipv4:127.0.0.1:43122`.
  std::string ToString() const;
};

// Parses a SPIFFE ID into role, name and task (peer left empty). An ID
// lockstep does not know gives Role::kNone with `id` saying why.
Caller ParseIdentity(absl::string_view spiffe_id);

// Who owns what `spiffe_id` submits, for quotas and who may stop it: its
// role and name, "operator:alice" for spiffe://lockstep/operator/alice; the
// ID itself when lockstep does not know it; "" for "" (--insecure).
std::string OwnerOf(absl::string_view spiffe_id);

// Why the holder of a verified client certificate with `spiffe_id` ("" when
// it has none) may not read a daemon's /metrics under --metrics-tls; ""
// when it may. Viewers and operators may: Prometheus scrapes with a viewer
// certificate.
std::string WhyNotAScraper(absl::string_view spiffe_id);

// The caller of a call on a server with mutual TLS (`auth` from the call's
// context; null or unauthenticated: no certificate). With `insecure` set
// (the daemon runs --insecure) every caller is Role::kInsecure.
Caller CallerOf(const grpc::AuthContext* auth, absl::string_view peer,
                bool insecure);

}  // namespace lockstep

#endif  // LOCKSTEP_COMMON_CALLER_H_
