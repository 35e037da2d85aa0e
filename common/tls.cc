#include "common/tls.h"

#include <grpcpp/security/auth_context.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <cstdlib>
#include <memory>

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
  return material;
}

std::shared_ptr<grpc::ServerCredentials> ServerCredentials(
    const TlsMaterial& material) {
  if (material.insecure) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions options(
      GRPC_SSL_REQUEST_CLIENT_CERTIFICATE_AND_VERIFY);
  options.pem_root_certs = material.ca_pem;
  options.pem_key_cert_pairs.push_back({material.key_pem, material.cert_pem});
  return grpc::SslServerCredentials(options);
}

std::shared_ptr<grpc::ChannelCredentials> ChannelCredentials(
    const TlsMaterial& material) {
  if (material.insecure) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = material.ca_pem;
  options.pem_private_key = material.key_pem;
  options.pem_cert_chain = material.cert_pem;
  return grpc::SslCredentials(options);
}

absl::StatusOr<std::shared_ptr<grpc::ServerCredentials>> LoadServerCredentials(
    const TlsOptions& options) {
  ASSIGN_OR_RETURN(TlsMaterial material, LoadTlsMaterial(options));
  return ServerCredentials(material);
}

absl::StatusOr<std::shared_ptr<grpc::ChannelCredentials>>
LoadChannelCredentials(const TlsOptions& options) {
  ASSIGN_OR_RETURN(TlsMaterial material, LoadTlsMaterial(options));
  return ChannelCredentials(material);
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
