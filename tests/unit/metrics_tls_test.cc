// /metrics over HTTPS with client certificates (--metrics-tls, issue 27
// #9): real TLS on 127.0.0.1 with OpenSSL as the scraper, certificates of a
// CA made for the test. Only a viewer's or an operator's certificate of the
// cluster's CA is served; renewed files serve without a restart.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/caller.h"
#include "common/cert_maker.h"
#include "common/files.h"
#include "common/metrics_http.h"
#include "tests/unit/loopback_http.h"

namespace lockstep::metrics {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;
using ::testing::StartsWith;

// What a TLS scrape got: whether the handshake succeeded, the server's
// certificate (PEM) and the whole HTTP response.
struct Scrape {
  bool handshake = false;
  std::string server_cert;
  std::string response;
};

// One HTTP/1.0 GET of /metrics over TLS to 127.0.0.1:port, verifying the
// server against `ca_file` and presenting `client` when given.
Scrape FetchTls(int port, const std::string& ca_file,
                const std::optional<TlsOptions>& client) {
  Scrape scrape;
  std::unique_ptr<SSL_CTX, decltype(&SSL_CTX_free)> context(
      SSL_CTX_new(TLS_client_method()), &SSL_CTX_free);
  SSL_CTX_load_verify_locations(context.get(), ca_file.c_str(), nullptr);
  SSL_CTX_set_verify(context.get(), SSL_VERIFY_PEER, nullptr);
  if (client.has_value()) {
    SSL_CTX_use_certificate_chain_file(context.get(),
                                       client->cert_file.c_str());
    SSL_CTX_use_PrivateKey_file(context.get(), client->key_file.c_str(),
                                SSL_FILETYPE_PEM);
  }
  const int fd = ::lockstep::testing::ConnectLoopback(port);
  if (fd < 0) return scrape;
  SSL* ssl = SSL_new(context.get());
  SSL_set_fd(ssl, fd);
  if (SSL_connect(ssl) == 1) {
    scrape.handshake = true;
    if (X509* peer = SSL_get1_peer_certificate(ssl); peer != nullptr) {
      BIO* pem = BIO_new(BIO_s_mem());
      PEM_write_bio_X509(pem, peer);
      char* data = nullptr;
      const long size = BIO_get_mem_data(pem, &data);
      scrape.server_cert.assign(data, static_cast<size_t>(size));
      BIO_free(pem);
      X509_free(peer);
    }
    const std::string request = "GET /metrics HTTP/1.0\r\n\r\n";
    SSL_write(ssl, request.data(), static_cast<int>(request.size()));
    char buffer[4096];
    for (int n; (n = SSL_read(ssl, buffer, sizeof(buffer))) > 0;) {
      scrape.response.append(buffer, static_cast<size_t>(n));
    }
  }
  ERR_clear_error();
  SSL_free(ssl);
  close(fd);
  return scrape;
}

class MetricsTlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    // OpenSSL writes with write(2): a server that closes a connection
    // under it (a daemon swapped by a reload) must be EPIPE, not the death
    // of the test. The daemons ignore SIGPIPE too.
    signal(SIGPIPE, SIG_IGN);
    ca_ = new KeyAndCertificate(*MakeCertificateAuthority("metrics CA"));
    foreign_ca_ = new KeyAndCertificate(*MakeCertificateAuthority("foreign"));
    char pattern[] = "/tmp/metrics_tls_test.XXXXXX";
    dir_ = new std::string(mkdtemp(pattern));
  }
  static void TearDownTestSuite() {
    (void)RemoveRecursively(*dir_);
    delete dir_;
    delete ca_;
    delete foreign_ca_;
  }

  static TlsOptions Issue(const std::string& spiffe_id, const std::string& name,
                          const KeyAndCertificate& ca = *ca_) {
    CertificateSpec spec;
    spec.spiffe_id = spiffe_id;
    auto files = IssueTlsFiles(ca, spec, *dir_, name);
    EXPECT_TRUE(files.ok()) << files.status();
    return files.value_or(TlsOptions());
  }

  // A /metrics server with TLS under `files`, rereading them every
  // `reload_seconds`.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Serve(
      const TlsOptions& files, int reload_seconds = 60) {
    HttpsOptions https =
        MetricsHttps(files.cert_file, files.key_file, files.ca_file,
                     [](const std::string& id) {
                       return id == "spiffe://lockstep/viewer/revoked"
                                  ? std::string("revoked")
                                  : std::string();
                     });
    https.reload_seconds = reload_seconds;
    return HttpServer::Start(
        "127.0.0.1:0", [] { return std::string("up 1\n"); }, https);
  }

  static KeyAndCertificate* ca_;
  static KeyAndCertificate* foreign_ca_;
  static std::string* dir_;
};

KeyAndCertificate* MetricsTlsTest::ca_ = nullptr;
KeyAndCertificate* MetricsTlsTest::foreign_ca_ = nullptr;
std::string* MetricsTlsTest::dir_ = nullptr;

TEST_F(MetricsTlsTest, OnlyAViewerOrAnOperatorOfTheClusterScrapes) {
  const TlsOptions server_files =
      Issue("spiffe://lockstep/coordinator", "coordinator");
  auto server = Serve(server_files);
  ASSERT_TRUE(server.ok()) << server.status();
  EXPECT_STREQ((*server)->scheme(), "https");
  const int port = (*server)->port();
  const std::string& ca = server_files.ca_file;

  for (const char* id : {"spiffe://lockstep/viewer/prometheus",
                         "spiffe://lockstep/operator/ann"}) {
    const Scrape ok = FetchTls(port, ca, Issue(id, "scraper"));
    EXPECT_TRUE(ok.handshake) << id;
    EXPECT_THAT(ok.response, StartsWith("HTTP/1.1 200")) << id;
    EXPECT_THAT(ok.response, HasSubstr("\r\n\r\nup 1\n")) << id;
  }

  const Scrape anonymous = FetchTls(port, ca, std::nullopt);
  EXPECT_THAT(anonymous.response, StartsWith("HTTP/1.1 403"));
  EXPECT_THAT(anonymous.response, HasSubstr("no client certificate"));
  EXPECT_THAT(anonymous.response, Not(HasSubstr("up 1")));

  const Scrape worker =
      FetchTls(port, ca, Issue("spiffe://lockstep/worker/worker/0", "worker"));
  EXPECT_THAT(worker.response, StartsWith("HTTP/1.1 403"));
  EXPECT_THAT(worker.response,
              HasSubstr("spiffe://lockstep/worker/worker/0) may not read "
                        "/metrics: it needs a viewer or operator identity"));

  const Scrape foreign = FetchTls(
      port, ca,
      Issue("spiffe://lockstep/viewer/prometheus", "foreign", *foreign_ca_));
  EXPECT_THAT(foreign.response, StartsWith("HTTP/1.1 403"));
  EXPECT_THAT(foreign.response, HasSubstr("does not verify"));
  EXPECT_THAT(foreign.response, Not(HasSubstr("up 1")));

  const Scrape revoked =
      FetchTls(port, ca, Issue("spiffe://lockstep/viewer/revoked", "revoked"));
  EXPECT_THAT(revoked.response, StartsWith("HTTP/1.1 403"));
  EXPECT_THAT(revoked.response, HasSubstr("revoked"));

  // Plain HTTP to the TLS port gets no metrics.
  EXPECT_THAT(
      ::lockstep::testing::FetchHttp(port, "GET /metrics HTTP/1.0\r\n\r\n"),
      Not(HasSubstr("up 1")));
}

// cert-manager renews certificates in place: the next connections get the
// new one without a restart, and a broken rewrite keeps the last good one.
TEST_F(MetricsTlsTest, RenewedFilesServeWithoutARestart) {
  const TlsOptions files = Issue("spiffe://lockstep/coordinator", "renewed");
  const TlsOptions viewer =
      Issue("spiffe://lockstep/viewer/prometheus", "viewer");
  auto server = Serve(files, /*reload_seconds=*/1);
  ASSERT_TRUE(server.ok()) << server.status();
  const int port = (*server)->port();
  const std::string before = FetchTls(port, files.ca_file, viewer).server_cert;
  ASSERT_FALSE(before.empty());

  // A broken key first: served on as before.
  ASSERT_TRUE(WriteFileAtomically(files.key_file, "not a key\n").ok());
  CertificateSpec spec;
  spec.spiffe_id = "spiffe://lockstep/coordinator";
  auto renewed = IssueCertificate(*ca_, spec);
  ASSERT_TRUE(renewed.ok());
  ASSERT_TRUE(WriteFileAtomically(files.cert_file, renewed->cert_pem).ok());
  // Two reloads read the broken pair; scrapes are served as before.
  const int checks = (*server)->reload_checks();
  while ((*server)->reload_checks() < checks + 2) {
    const Scrape scrape = FetchTls(port, files.ca_file, viewer);
    ASSERT_THAT(scrape.response, StartsWith("HTTP/1.1 200"));
    ASSERT_EQ(scrape.server_cert, before);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  ASSERT_TRUE(WriteFileAtomically(files.key_file, renewed->key_pem).ok());

  // The renewed pair serves within a few reloads.
  Scrape after;
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (std::chrono::steady_clock::now() < deadline) {
    after = FetchTls(port, files.ca_file, viewer);
    // A connection the old daemon held as it stopped may fail: only a
    // served scrape counts.
    if (!after.server_cert.empty() && after.server_cert != before &&
        absl::StartsWith(after.response, "HTTP/1.1 200")) {
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(after.server_cert, renewed->cert_pem);
  EXPECT_THAT(after.response, StartsWith("HTTP/1.1 200"));
  EXPECT_EQ((*server)->port(), port);
}

TEST_F(MetricsTlsTest, FilesThatDoNotServeAreRefusedNamingThem) {
  const TlsOptions files = Issue("spiffe://lockstep/coordinator", "bad");
  TlsOptions missing = files;
  missing.key_file = *dir_ + "/no-such.key";
  auto server = Serve(missing);
  EXPECT_EQ(server.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(server.status().message()), HasSubstr("no-such.key"));

  TlsOptions mismatched = files;
  mismatched.key_file = Issue("spiffe://lockstep/viewer/x", "other").key_file;
  server = Serve(mismatched);
  EXPECT_EQ(server.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(server.status().message()),
              HasSubstr("are not a certificate and its key"));

  TlsOptions no_ca = files;
  no_ca.ca_file = files.key_file;
  server = Serve(no_ca);
  EXPECT_EQ(server.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(server.status().message()),
              HasSubstr("holds no CA certificate"));
}

TEST(WhyNotAScraperTest, ViewersAndOperatorsMayScrape) {
  EXPECT_EQ(WhyNotAScraper("spiffe://lockstep/viewer/prometheus"), "");
  EXPECT_EQ(WhyNotAScraper("spiffe://lockstep/operator/ann"), "");
  for (const char* id :
       {"spiffe://lockstep/worker/chief/0", "spiffe://lockstep/coordinator",
        "spiffe://lockstep/spare/s", "https://example.com", ""}) {
    EXPECT_THAT(WhyNotAScraper(id), HasSubstr("may not read /metrics")) << id;
  }
}

}  // namespace
}  // namespace lockstep::metrics
