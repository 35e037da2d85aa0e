#include "common/cert_maker.h"

#include <arpa/inet.h>
#include <openssl/bio.h>
#include <openssl/bn.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <memory>

#include "absl/strings/str_cat.h"
#include "common/files.h"
#include "common/status_macros.h"

namespace lockstep {
namespace {

template <typename T, void (*Free)(T*)>
struct Deleter {
  void operator()(T* p) const { Free(p); }
};
using Key = std::unique_ptr<EVP_PKEY, Deleter<EVP_PKEY, EVP_PKEY_free>>;
using Cert = std::unique_ptr<X509, Deleter<X509, X509_free>>;
using Bio = std::unique_ptr<BIO, Deleter<BIO, BIO_free_all>>;
using Names =
    std::unique_ptr<GENERAL_NAMES, Deleter<GENERAL_NAMES, GENERAL_NAMES_free>>;

// OpenSSL's queued error, for a message.
absl::Status OpenSslError(absl::string_view what) {
  char reason[256] = "no detail";
  unsigned long code = ERR_get_error();
  if (code != 0) ERR_error_string_n(code, reason, sizeof(reason));
  ERR_clear_error();
  return absl::InternalError(
      absl::StrCat("cannot ", what, " (OpenSSL: ", reason, ")"));
}

absl::StatusOr<Key> NewKey() {
  Key key(EVP_EC_gen("P-256"));
  if (key == nullptr) return OpenSslError("make an EC P-256 key");
  return key;
}

absl::StatusOr<std::string> BioText(BIO* bio) {
  char* data = nullptr;
  long size = BIO_get_mem_data(bio, &data);
  if (size < 0) return OpenSslError("read PEM text");
  return std::string(data, static_cast<size_t>(size));
}

absl::StatusOr<KeyAndCertificate> ToPem(EVP_PKEY* key, X509* cert) {
  Bio key_bio(BIO_new(BIO_s_mem()));
  Bio cert_bio(BIO_new(BIO_s_mem()));
  if (key_bio == nullptr || cert_bio == nullptr ||
      !PEM_write_bio_PrivateKey(key_bio.get(), key, nullptr, nullptr, 0,
                                nullptr, nullptr) ||
      !PEM_write_bio_X509(cert_bio.get(), cert)) {
    return OpenSslError("write a key and certificate as PEM");
  }
  KeyAndCertificate pem;
  ASSIGN_OR_RETURN(pem.key_pem, BioText(key_bio.get()));
  ASSIGN_OR_RETURN(pem.cert_pem, BioText(cert_bio.get()));
  return pem;
}

absl::StatusOr<std::pair<Key, Cert>> ParseCa(const KeyAndCertificate& ca) {
  Bio key_bio(BIO_new_mem_buf(ca.key_pem.data(), ca.key_pem.size()));
  Bio cert_bio(BIO_new_mem_buf(ca.cert_pem.data(), ca.cert_pem.size()));
  Key key(PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr));
  Cert cert(PEM_read_bio_X509(cert_bio.get(), nullptr, nullptr, nullptr));
  if (key == nullptr || cert == nullptr) {
    return OpenSslError("read the CA's key and certificate");
  }
  return std::make_pair(std::move(key), std::move(cert));
}

// Adds extension `nid` with OpenSSL's config-string syntax ("CA:FALSE").
bool AddExtension(X509* cert, X509* issuer, int nid, const char* value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, issuer, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
  if (ext == nullptr) return false;
  const bool added = X509_add_ext(cert, ext, -1) == 1;
  X509_EXTENSION_free(ext);
  return added;
}

// A certificate for `key` with a random serial, subject CN `name`, valid
// from five minutes ago for `lifetime`; the issuer name and extensions are
// the caller's.
absl::StatusOr<Cert> NewCertificate(EVP_PKEY* key, absl::string_view name,
                                    absl::Duration lifetime) {
  Cert cert(X509_new());
  unsigned char serial[16];
  std::unique_ptr<BIGNUM, Deleter<BIGNUM, BN_free>> number(BN_new());
  if (cert == nullptr || number == nullptr ||
      RAND_bytes(serial, sizeof(serial)) != 1) {
    return OpenSslError("start a certificate");
  }
  serial[0] &= 0x7f;                         // a positive serial number
  const std::string cn(name.substr(0, 64));  // X.509's bound on a CN
  X509_NAME* subject = X509_get_subject_name(cert.get());
  if (!X509_set_version(cert.get(), 2) ||
      BN_bin2bn(serial, sizeof(serial), number.get()) == nullptr ||
      !BN_to_ASN1_INTEGER(number.get(), X509_get_serialNumber(cert.get())) ||
      !X509_gmtime_adj(X509_getm_notBefore(cert.get()), -300) ||
      !X509_gmtime_adj(X509_getm_notAfter(cert.get()),
                       absl::ToInt64Seconds(lifetime)) ||
      !X509_NAME_add_entry_by_txt(
          subject, "CN", MBSTRING_UTF8,
          reinterpret_cast<const unsigned char*>(cn.data()),
          static_cast<int>(cn.size()), -1, 0) ||
      !X509_set_pubkey(cert.get(), key)) {
    return OpenSslError("fill in a certificate");
  }
  return cert;
}

// The subject alternative names of `spec`: its URI, DNS names and IPs.
absl::StatusOr<Names> AltNames(const CertificateSpec& spec) {
  Names names(GENERAL_NAMES_new());
  auto add = [&](int type, const std::string& value) {
    GENERAL_NAME* name = GENERAL_NAME_new();
    ASN1_IA5STRING* text = ASN1_IA5STRING_new();
    if (name == nullptr || text == nullptr ||
        !ASN1_STRING_set(text, value.data(), static_cast<int>(value.size()))) {
      GENERAL_NAME_free(name);
      ASN1_IA5STRING_free(text);
      return false;
    }
    GENERAL_NAME_set0_value(name, type, text);
    return sk_GENERAL_NAME_push(names.get(), name) > 0;
  };
  bool ok = names != nullptr && add(GEN_URI, spec.spiffe_id);
  for (const std::string& dns : spec.dns_names) ok = ok && add(GEN_DNS, dns);
  if (!ok) return OpenSslError("fill in subject alternative names");
  for (const std::string& ip : spec.ip_addresses) {
    ASN1_OCTET_STRING* octets = a2i_IPADDRESS(ip.c_str());
    if (octets == nullptr) {
      ERR_clear_error();
      return absl::InvalidArgumentError(absl::StrCat(
          "\"", ip, "\" is not an IP address; give one like 127.0.0.1"));
    }
    GENERAL_NAME* name = GENERAL_NAME_new();
    if (name == nullptr) {
      ASN1_OCTET_STRING_free(octets);
      return OpenSslError("fill in an IP address");
    }
    GENERAL_NAME_set0_value(name, GEN_IPADD, octets);
    if (sk_GENERAL_NAME_push(names.get(), name) <= 0) {
      GENERAL_NAME_free(name);
      return OpenSslError("fill in an IP address");
    }
  }
  return names;
}

}  // namespace

absl::StatusOr<KeyAndCertificate> MakeCertificateAuthority(
    absl::string_view name, absl::Duration lifetime) {
  ASSIGN_OR_RETURN(Key key, NewKey());
  ASSIGN_OR_RETURN(Cert cert, NewCertificate(key.get(), name, lifetime));
  X509* ca = cert.get();
  if (!X509_set_issuer_name(ca, X509_get_subject_name(ca)) ||
      !AddExtension(ca, ca, NID_basic_constraints, "critical,CA:TRUE") ||
      !AddExtension(ca, ca, NID_key_usage, "critical,keyCertSign,cRLSign") ||
      !AddExtension(ca, ca, NID_subject_key_identifier, "hash") ||
      !X509_sign(ca, key.get(), EVP_sha256())) {
    return OpenSslError("make a CA certificate");
  }
  return ToPem(key.get(), ca);
}

absl::StatusOr<KeyAndCertificate> IssueCertificate(
    const KeyAndCertificate& ca, const CertificateSpec& spec) {
  if (spec.spiffe_id.empty()) {
    return absl::InvalidArgumentError(
        "a certificate needs a SPIFFE ID (spiffe://lockstep/ROLE/NAME)");
  }
  ASSIGN_OR_RETURN(auto issuer, ParseCa(ca));
  ASSIGN_OR_RETURN(Names names, AltNames(spec));
  ASSIGN_OR_RETURN(Key key, NewKey());
  ASSIGN_OR_RETURN(Cert cert,
                   NewCertificate(key.get(), spec.spiffe_id, spec.lifetime));
  X509* leaf = cert.get();
  X509* signer = issuer.second.get();
  if (!X509_set_issuer_name(leaf, X509_get_subject_name(signer)) ||
      !AddExtension(leaf, signer, NID_basic_constraints, "critical,CA:FALSE") ||
      !AddExtension(leaf, signer, NID_key_usage,
                    "critical,digitalSignature,keyEncipherment") ||
      !AddExtension(leaf, signer, NID_ext_key_usage, "serverAuth,clientAuth") ||
      !AddExtension(leaf, signer, NID_authority_key_identifier,
                    "keyid:always") ||
      !X509_add1_ext_i2d(leaf, NID_subject_alt_name, names.get(), 0, 0) ||
      !X509_sign(leaf, issuer.first.get(), EVP_sha256())) {
    return OpenSslError(
        absl::StrCat("issue a certificate for ", spec.spiffe_id));
  }
  return ToPem(key.get(), leaf);
}

absl::StatusOr<TlsOptions> WriteTlsFiles(const std::string& dir,
                                         absl::string_view name,
                                         const KeyAndCertificate& issued,
                                         absl::string_view ca_cert_pem) {
  TlsOptions options;
  const std::string base = absl::StrCat(dir, "/", name);
  options.cert_file = absl::StrCat(base, ".crt");
  options.key_file = absl::StrCat(base, ".key");
  options.ca_file = absl::StrCat(base, "-ca.crt");
  RETURN_IF_ERROR(WriteFileAtomically(options.key_file, issued.key_pem, 0600));
  RETURN_IF_ERROR(WriteFileAtomically(options.cert_file, issued.cert_pem));
  RETURN_IF_ERROR(WriteFileAtomically(options.ca_file, ca_cert_pem));
  return options;
}

absl::StatusOr<TlsOptions> IssueTlsFiles(const KeyAndCertificate& ca,
                                         const CertificateSpec& spec,
                                         const std::string& dir,
                                         absl::string_view name) {
  ASSIGN_OR_RETURN(KeyAndCertificate issued, IssueCertificate(ca, spec));
  return WriteTlsFiles(dir, name, issued, ca.cert_pem);
}

}  // namespace lockstep
