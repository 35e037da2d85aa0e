// Mutual TLS for every lockstep gRPC endpoint: the flags, the files they
// name, and gRPC's own SSL credentials made from them (OpenSSL underneath;
// lockstep writes no crypto).
//
// Every daemon and the CLI take either all three of
//
//   --tls-cert FILE   this process's certificate (PEM; chain allowed)
//   --tls-key FILE    its private key (PEM)
//   --tls-ca FILE     the CA certificate(s) that peers must be signed by
//
// or an explicit --insecure (no TLS at all, every caller allowed). Anything
// else is a usage error. The CLI also reads LOCKSTEP_TLS_CERT,
// LOCKSTEP_TLS_KEY, LOCKSTEP_TLS_CA and LOCKSTEP_INSECURE=1; flags win.
//
// Servers ask for a client certificate and verify one that is presented
// (GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY): a certificate from
// another CA fails the handshake (the client sees UNAVAILABLE), while a call
// without a certificate reaches the handler as Role::kNone, which refuses it
// with UNAUTHENTICATED naming the caller. Clients verify the server's
// certificate against --tls-ca and check whom they reached by its SPIFFE ID
// (common/caller.h): a channel to the coordinator needs the coordinator's
// identity and a certificate naming the host dialled, so that no other
// certificate of the same CA (a worker's, a viewer's) can pose as the
// coordinator and receive jobs or data-plane secrets; a health probe needs
// a lockstep daemon's identity (coordinator, worker, spare), whatever the
// host.
//
// The files are read when the credentials are made, and again every
// TlsMaterial::reload_seconds by gRPC's file watcher: a certificate rotated
// on disk (cert-manager renews them in place) serves the next handshakes
// without a restart. A pair that does not match (half rotated) is ignored
// until it does.
#ifndef LOCKSTEP_COMMON_TLS_H_
#define LOCKSTEP_COMMON_TLS_H_

#include <grpcpp/security/credentials.h>
#include <grpcpp/security/server_credentials.h>
#include <grpcpp/server_context.h>

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/args.h"
#include "common/caller.h"

namespace lockstep {

// What the TLS flags say: three file paths, or insecure.
struct TlsOptions {
  std::string cert_file;
  std::string key_file;
  std::string ca_file;
  bool insecure = false;
};

// The contents of the three files, checked: the certificate and key parse
// and belong together, the certificate is within its validity period, the
// CA file holds at least one certificate.
struct TlsMaterial {
  std::string cert_pem;
  std::string key_pem;
  std::string ca_pem;
  bool insecure = false;
  // Where the PEMs came from. When set, the credentials watch the files
  // and reload them every `reload_seconds`; when empty (material made in
  // memory) the PEMs above are served as they are.
  TlsOptions files;
  unsigned int reload_seconds = 60;
};

// Whom a client expects at the other end of a channel.
enum class ServerCheck {
  // The coordinator: the certificate carries spiffe://<domain>/coordinator
  // and names the host that was dialled.
  kCoordinator,
  // A lockstep daemon (coordinator, worker or spare), any host name: what
  // `lockstep health` probes, often as 127.0.0.1 inside the pod.
  kAnyDaemon,
};

// Why a server certificate whose SPIFFE IDs are `uri_names` is not what
// `check` expects; empty when it is. For the client's handshake, and tests.
std::string WrongServerIdentity(const std::vector<std::string>& uri_names,
                                ServerCheck check);

// The flag names, for Args::Parse's value and boolean flag sets.
const std::set<std::string>& TlsValueFlags();  // tls-cert, tls-key, tls-ca
inline constexpr char kInsecureFlag[] = "insecure";

// The usage text of the four flags, for a binary's --help.
extern const char kTlsUsage[];

// The TLS options from a daemon's flags. Errors: InvalidArgument (a usage
// error: some but not all files, files and --insecure, or neither).
absl::StatusOr<TlsOptions> TlsOptionsFromArgs(const Args& args);

// The same for the CLI: each flag falls back to its LOCKSTEP_TLS_*
// variable, --insecure to LOCKSTEP_INSECURE=1. Files given as flags replace
// the variables as a whole, so a flag never mixes with an exported file.
absl::StatusOr<TlsOptions> TlsOptionsFromArgsOrEnv(const Args& args);

// Checks the combination (see TlsOptionsFromArgs). Errors: InvalidArgument.
absl::Status ValidateTlsOptions(const TlsOptions& options);

// Reads and checks the three files. Errors: InvalidArgument from
// ValidateTlsOptions; FailedPrecondition naming the file and its flag when
// a file is missing, unreadable, not PEM, expired, or the key does not
// match the certificate.
absl::StatusOr<TlsMaterial> LoadTlsMaterial(const TlsOptions& options);

// Server credentials: mutual TLS with `material`, or insecure ones when
// material.insecure.
std::shared_ptr<grpc::ServerCredentials> ServerCredentials(
    const TlsMaterial& material);

// Channel credentials presenting `material`'s certificate, trusting its CA
// and requiring the server `check` names (see ServerCheck); insecure ones
// when material.insecure.
std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials(
    const TlsMaterial& material, ServerCheck check = ServerCheck::kCoordinator);

// Both in one step, from the options. Errors: those of LoadTlsMaterial.
absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> LoadServerCredentials(
    const TlsOptions& options);
absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>>
LoadChannelCredentials(const TlsOptions& options,
                       ServerCheck check = ServerCheck::kCoordinator);

// The caller of a server call (a grpc::ServerContext or a
// grpc::CallbackServerContext), from its client certificate; every caller
// is Role::kInsecure when the server runs with `insecure`.
Caller CallerOfCall(const grpc::ServerContextBase& context, bool insecure);

// The loud warning a daemon logs at start with --insecure.
std::string InsecureWarning(absl::string_view daemon);

}  // namespace lockstep

#endif  // LOCKSTEP_COMMON_TLS_H_
