#include "common/tls.h"

#include <grpcpp/security/auth_context.h>
#include <grpcpp/security/tls_certificate_provider.h>
#include <grpcpp/security/tls_certificate_verifier.h>
#include <grpcpp/security/tls_credentials_options.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <cstdlib>
#include <functional>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/files.h"
#include "common/status_macros.h"

namespace lockstep {
namespace {

// A PEM file is a few kilobytes; a CA bundle may hold a few hundred.
constexpr int64_t kMaxPemBytes = 1 << 20;

template <typename T, void (*Free)(T*)>
struct Deleter {
  void operator()(T* p) const { Free(p); }
};
using Bio = std::unique_ptr<BIO, Deleter<BIO, BIO_free_all>>;
using Cert = std::unique_ptr<X509, Deleter<X509, X509_free>>;
using Key = std::unique_ptr<EVP_PKEY, Deleter<EVP_PKEY, EVP_PKEY_free>>;

Bio ReadBio(const std::string& pem) {
  return Bio(BIO_new_mem_buf(pem.data(), static_cast<int>(pem.size())));
}

absl::Status FileError(const std::string& flag, const std::string& path,
                       absl::string_view what) {
  ERR_clear_error();
  return absl::FailedPreconditionError(
      absl::StrCat("--", flag, " ", path, ": ", what));
}

absl::StatusOr<std::string> ReadPem(const std::string& flag,
                                    const std::string& path) {
  absl::StatusOr<std::string> text = ReadRegularFile(path, kMaxPemBytes);
  if (!text.ok()) {
    return FileError(flag, path,
                     absl::StrCat("cannot read it (", text.status().message(),
                                  "); give a readable PEM file"));
  }
  return text;
}

// The first certificate of `pem`, checked to be within its validity period.
absl::StatusOr<Cert> ParseCertificate(const std::string& flag,
                                      const std::string& path,
                                      const std::string& pem) {
  Bio bio = ReadBio(pem);
  Cert cert(PEM_read_bio_X509(bio.get(), nullptr, nullptr, nullptr));
  if (cert == nullptr) {
    return FileError(flag, path, "holds no PEM certificate");
  }
  if (X509_cmp_current_time(X509_get0_notBefore(cert.get())) > 0) {
    return FileError(flag, path,
                     "the certificate is not valid yet; check the clock");
  }
  if (X509_cmp_current_time(X509_get0_notAfter(cert.get())) < 0) {
    return FileError(flag, path,
                     "the certificate has expired; issue a new one");
  }
  return cert;
}

// Checks the three files' contents: see LoadTlsMaterial.
absl::Status CheckMaterial(const TlsOptions& options,
                           const TlsMaterial& material) {
  ASSIGN_OR_RETURN(Cert cert, ParseCertificate("tls-cert", options.cert_file,
                                               material.cert_pem));
  Bio key_bio = ReadBio(material.key_pem);
  Key key(PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr));
  if (key == nullptr) {
    return FileError("tls-key", options.key_file,
                     "holds no PEM private key (or it is encrypted; give an "
                     "unencrypted key)");
  }
  if (X509_check_private_key(cert.get(), key.get()) != 1) {
    return FileError("tls-key", options.key_file,
                     absl::StrCat("the key does not belong to the certificate "
                                  "in --tls-cert ",
                                  options.cert_file));
  }
  ASSIGN_OR_RETURN(
      Cert ca, ParseCertificate("tls-ca", options.ca_file, material.ca_pem));
  return absl::OkStatus();
}

// Checks the server's SPIFFE ID during the client's handshake, before any
// call is sent (gRPC's TLS credentials call it after verifying the chain).
class ServerIdentityVerifier
    : public grpc::experimental::ExternalCertificateVerifier {
 public:
  explicit ServerIdentityVerifier(ServerCheck check) : check_(check) {}

  bool Verify(grpc::experimental::TlsCustomVerificationCheckRequest* request,
              std::function<void(grpc::Status)> callback,
              grpc::Status* sync_status) override {
    // The host name first, as gRPC's default verifier does (it is
    // synchronous); a health probe skips it.
    if (check_ == ServerCheck::kCoordinator) {
      if (!host_names_.Verify(request, callback, sync_status)) {
        *sync_status = grpc::Status(grpc::StatusCode::UNAUTHENTICATED,
                                    "the host name check did not complete");
      }
      if (!sync_status->ok()) return true;
    }
    std::vector<std::string> uris;
    for (const grpc::string_ref& uri : request->uri_names()) {
      uris.emplace_back(uri.data(), uri.size());
    }
    const std::string wrong = WrongServerIdentity(uris, check_);
    *sync_status =
        wrong.empty()
            ? grpc::Status::OK
            : grpc::Status(
                  grpc::StatusCode::UNAUTHENTICATED,
                  absl::StrCat("the server at ",
                               std::string(request->target_name().data(),
                                           request->target_name().size()),
                               " ", wrong));
    return true;  // synchronous
  }

  void Cancel(grpc::experimental::TlsCustomVerificationCheckRequest*) override {
  }

 private:
  const ServerCheck check_;
  grpc::experimental::HostNameCertificateVerifier host_names_;
};

// The certificates a credential presents and trusts: watched files, or the
// PEMs in memory.
std::shared_ptr<grpc::experimental::CertificateProviderInterface> Provider(
    const TlsMaterial& material) {
  if (!material.files.cert_file.empty()) {
    return std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
        material.files.key_file, material.files.cert_file,
        material.files.ca_file, material.reload_seconds);
  }
  return std::make_shared<grpc::experimental::StaticDataCertificateProvider>(
      material.ca_pem, std::vector<grpc::experimental::IdentityKeyCertPair>{
                           {material.key_pem, material.cert_pem}});
}

std::string Env(const char* name) {
  const char* value = std::getenv(name);
  return value == nullptr ? "" : value;
}

}  // namespace

const char kTlsUsage[] =
    R"(  --tls-cert FILE      this process's certificate (PEM)
  --tls-key FILE       its private key (PEM)
  --tls-ca FILE        the CA certificate peers must be signed by (PEM);
                       the three together turn on mutual TLS
  --insecure           no TLS: every endpoint is open to anyone who can
                       reach it; for a trusted single-user machine only
)";

const std::set<std::string>& TlsValueFlags() {
  static const auto* flags =
      new std::set<std::string>{"tls-cert", "tls-key", "tls-ca"};
  return *flags;
}

absl::Status ValidateTlsOptions(const TlsOptions& options) {
  const int files = !options.cert_file.empty() + !options.key_file.empty() +
                    !options.ca_file.empty();
  if (options.insecure && files > 0) {
    return absl::InvalidArgumentError(
        "--insecure and --tls-cert/--tls-key/--tls-ca exclude each other; "
        "give the three TLS files or --insecure");
  }
  if (options.insecure || files == 3) return absl::OkStatus();
  if (files == 0) {
    return absl::InvalidArgumentError(
        "TLS is required: give --tls-cert FILE --tls-key FILE --tls-ca FILE "
        "(PEM), or --insecure to run without TLS");
  }
  std::string missing;
  if (options.cert_file.empty()) absl::StrAppend(&missing, " --tls-cert");
  if (options.key_file.empty()) absl::StrAppend(&missing, " --tls-key");
  if (options.ca_file.empty()) absl::StrAppend(&missing, " --tls-ca");
  return absl::InvalidArgumentError(absl::StrCat(
      "TLS needs all three of --tls-cert, --tls-key and --tls-ca; missing:",
      missing));
}

absl::StatusOr<TlsOptions> TlsOptionsFromArgs(const Args& args) {
  TlsOptions options;
  options.cert_file = args.Get("tls-cert");
  options.key_file = args.Get("tls-key");
  options.ca_file = args.Get("tls-ca");
  options.insecure = args.Has(kInsecureFlag);
  RETURN_IF_ERROR(ValidateTlsOptions(options));
  return options;
}

absl::StatusOr<TlsOptions> TlsOptionsFromArgsOrEnv(const Args& args) {
  const bool flags_given = args.Has("tls-cert") || args.Has("tls-key") ||
                           args.Has("tls-ca") || args.Has(kInsecureFlag);
  if (flags_given) return TlsOptionsFromArgs(args);
  TlsOptions options;
  options.cert_file = Env("LOCKSTEP_TLS_CERT");
  options.key_file = Env("LOCKSTEP_TLS_KEY");
  options.ca_file = Env("LOCKSTEP_TLS_CA");
  const std::string insecure = Env("LOCKSTEP_INSECURE");
  options.insecure = !insecure.empty() && insecure != "0";
  absl::Status valid = ValidateTlsOptions(options);
  if (!valid.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        valid.message(),
        " (the flags may also come from LOCKSTEP_TLS_CERT, LOCKSTEP_TLS_KEY, "
        "LOCKSTEP_TLS_CA, or LOCKSTEP_INSECURE=1)"));
  }
  return options;
}

absl::StatusOr<TlsMaterial> LoadTlsMaterial(const TlsOptions& options) {
  RETURN_IF_ERROR(ValidateTlsOptions(options));
  TlsMaterial material;
  material.insecure = options.insecure;
  if (options.insecure) return material;
  ASSIGN_OR_RETURN(material.cert_pem, ReadPem("tls-cert", options.cert_file));
  ASSIGN_OR_RETURN(material.key_pem, ReadPem("tls-key", options.key_file));
  ASSIGN_OR_RETURN(material.ca_pem, ReadPem("tls-ca", options.ca_file));
  RETURN_IF_ERROR(CheckMaterial(options, material));
  material.files = options;
  return material;
}

std::string WrongServerIdentity(const std::vector<std::string>& uri_names,
                                ServerCheck check) {
  const char* wanted = check == ServerCheck::kCoordinator
                           ? "the coordinator's (spiffe://DOMAIN/coordinator)"
                           : "a lockstep coordinator's, worker's or spare's";
  if (uri_names.size() != 1) {
    return absl::StrCat("presented a certificate with ", uri_names.size(),
                        " URI names, not one SPIFFE ID; expected ", wanted,
                        ". Is this address a lockstep daemon?");
  }
  const Caller server = ParseIdentity(uri_names[0]);
  const bool accepted =
      server.role == Role::kCoordinator ||
      (check == ServerCheck::kAnyDaemon &&
       (server.role == Role::kWorker || server.role == Role::kSpare));
  if (accepted) return "";
  return absl::StrCat(
      "presented ",
      server.role == Role::kNone
          ? server.id
          : absl::StrCat(RoleName(server.role), " ", uri_names[0]),
      ", not ", wanted,
      " identity: refusing to talk to it. Check the address, or that the "
      "server runs with a certificate made for its role (lockstep-certs)");
}

std::shared_ptr<grpc::ServerCredentials> ServerCredentials(
    const TlsMaterial& material) {
  if (material.insecure) return grpc::InsecureServerCredentials();
  grpc::experimental::TlsServerCredentialsOptions options(Provider(material));
  options.watch_root_certs();
  options.watch_identity_key_cert_pairs();
  options.set_cert_request_type(GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
  return grpc::experimental::TlsServerCredentials(options);
}

std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials(
    const TlsMaterial& material, ServerCheck check) {
  if (material.insecure) return grpc::InsecureChannelCredentials();
  grpc::experimental::TlsChannelCredentialsOptions options;
  options.set_certificate_provider(Provider(material));
  options.watch_root_certs();
  options.watch_identity_key_cert_pairs();
  options.set_verify_server_certs(true);
  options.set_certificate_verifier(
      grpc::experimental::ExternalCertificateVerifier::Create<
          ServerIdentityVerifier>(check));
  // The host name: each call's host must be named by the certificate
  // (gRPC's per-call check, the same as its default verifier's), except
  // for a health probe, which dials 127.0.0.1 inside the pod.
  options.set_check_call_host(check == ServerCheck::kCoordinator);
  return grpc::experimental::TlsCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> LoadServerCredentials(
    const TlsOptions& options) {
  ASSIGN_OR_RETURN(TlsMaterial material, LoadTlsMaterial(options));
  return ServerCredentials(material);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>>
LoadChannelCredentials(const TlsOptions& options, ServerCheck check) {
  ASSIGN_OR_RETURN(TlsMaterial material, LoadTlsMaterial(options));
  return ChannelCredentials(material, check);
}

Caller CallerOfCall(const grpc::ServerContextBase& context, bool insecure) {
  if (insecure) return CallerOf(nullptr, context.peer(), true);
  std::shared_ptr<const grpc::AuthContext> auth = context.auth_context();
  return CallerOf(auth.get(), context.peer(), false);
}

std::string InsecureWarning(absl::string_view daemon) {
  return absl::StrCat(
      "WARNING: ", daemon,
      " runs with --insecure: no TLS, no authentication. Every endpoint is "
      "open to anyone who can reach it on the network, who can submit, stop "
      "or sabotage jobs and pose as workers. Use --tls-cert, --tls-key and "
      "--tls-ca on any shared network.");
}

}  // namespace lockstep
