// Throwaway certificates for `lockstep local`, the tests and the
// integration harness: a CA made on the spot and certificates it signs for
// lockstep identities (a SPIFFE ID, see common/caller.h), usable both as a
// server and as a client certificate.
//
// Keys are EC P-256, made by OpenSSL; the certificates are built and signed
// by OpenSSL's X509 functions (SHA-256); this file only fills in fields.
// For a real cluster, make certificates with scripts/lockstep-certs or
// cert-manager instead: these CAs live as long as a run.
#ifndef LOCKSTEP_COMMON_CERT_MAKER_H_
#define LOCKSTEP_COMMON_CERT_MAKER_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "common/tls.h"

namespace lockstep {

// A certificate and its private key, both PEM.
struct KeyAndCertificate {
  std::string cert_pem;
  std::string key_pem;
};

// What a certificate says about its holder.
struct CertificateSpec {
  // The one URI SAN, e.g. "spiffe://lockstep/worker/chief/0". Required.
  std::string spiffe_id;
  // DNS and IP SANs, for a certificate a server presents: a client checks
  // the host it dials against them.
  std::vector<std::string> dns_names = {"localhost"};
  std::vector<std::string> ip_addresses = {"127.0.0.1", "::1"};
  // Valid from five minutes ago (clock skew) for this long.
  absl::Duration lifetime = absl::Hours(24);
};

// A new self-signed CA named `name` (its subject's common name), valid for
// `lifetime`. Errors: Internal when OpenSSL fails.
absl::StatusOr<KeyAndCertificate> MakeCertificateAuthority(
    absl::string_view name, absl::Duration lifetime = absl::Hours(24));

// A new key and a certificate for `spec`, signed by `ca`, for both server
// and client authentication. Errors: InvalidArgument for an empty SPIFFE
// ID or a malformed IP address; Internal when OpenSSL fails (`ca` not a
// certificate and key, say).
absl::StatusOr<KeyAndCertificate> IssueCertificate(const KeyAndCertificate& ca,
                                                   const CertificateSpec& spec);

// Writes `<dir>/<name>.crt`, `<dir>/<name>.key` (mode 0600) and
// `<dir>/<name>-ca.crt` (the CA's certificate, `ca_cert_pem`), each
// atomically, and returns the options that name them. `dir` must exist.
// Errors: those of WriteFileAtomically.
absl::StatusOr<TlsOptions> WriteTlsFiles(const std::string& dir,
                                         absl::string_view name,
                                         const KeyAndCertificate& issued,
                                         absl::string_view ca_cert_pem);

// Issues a certificate for `spec` from `ca` and writes it as WriteTlsFiles
// does: the one call `lockstep local`, the tests and the harness need.
absl::StatusOr<TlsOptions> IssueTlsFiles(const KeyAndCertificate& ca,
                                         const CertificateSpec& spec,
                                         const std::string& dir,
                                         absl::string_view name);

}  // namespace lockstep

#endif  // LOCKSTEP_COMMON_CERT_MAKER_H_
