// Mutual TLS against real gRPC on 127.0.0.1: a health service whose handler
// records who called (common/tls.h's CallerOfCall, on both the synchronous
// and the callback API), called with certificates of each role, without
// one, with one from another CA and under a wrong host name; the TLS flags
// and their files; ParseIdentity.
#include "common/tls.h"

#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/caller.h"
#include "common/cert_maker.h"
#include "common/files.h"
#include "grpc/health/v1/health.grpc.pb.h"

namespace lockstep {
namespace {

using ::grpc::health::v1::Health;
using ::grpc::health::v1::HealthCheckRequest;
using ::grpc::health::v1::HealthCheckResponse;
using ::testing::HasSubstr;

std::string TempDir() {
  std::string tmpl = ::testing::TempDir() + "tls_test_XXXXXX";
  return mkdtemp(tmpl.data());
}

// The last caller a handler saw.
class CallerLog {
 public:
  void Record(Caller caller) {
    absl::MutexLock lock(&mu_);
    last_ = std::move(caller);
  }
  std::optional<Caller> Last() {
    absl::MutexLock lock(&mu_);
    return last_;
  }

 private:
  absl::Mutex mu_;
  std::optional<Caller> last_ ABSL_GUARDED_BY(mu_);
};

class SyncHealth final : public Health::Service {
 public:
  explicit SyncHealth(CallerLog* log) : log_(log) {}
  grpc::Status Check(grpc::ServerContext* context, const HealthCheckRequest*,
                     HealthCheckResponse* response) override {
    log_->Record(CallerOfCall(*context, /*insecure=*/false));
    response->set_status(HealthCheckResponse::SERVING);
    return grpc::Status::OK;
  }

 private:
  CallerLog* log_;
};

class CallbackHealth final : public Health::CallbackService {
 public:
  explicit CallbackHealth(CallerLog* log) : log_(log) {}
  grpc::ServerUnaryReactor* Check(grpc::CallbackServerContext* context,
                                  const HealthCheckRequest*,
                                  HealthCheckResponse* response) override {
    log_->Record(CallerOfCall(*context, /*insecure=*/false));
    response->set_status(HealthCheckResponse::SERVING);
    grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

 private:
  CallerLog* log_;
};

// One CA, its coordinator's server certificate, and a second, foreign CA,
// made once for the whole test (key generation is the slow part).
class TlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new std::string(TempDir());
    ca_ = new KeyAndCertificate(*MakeCertificateAuthority("tls_test CA"));
    foreign_ca_ =
        new KeyAndCertificate(*MakeCertificateAuthority("a foreign CA"));
  }
  static void TearDownTestSuite() {
    (void)RemoveRecursively(*dir_);
    delete dir_;
    delete ca_;
    delete foreign_ca_;
  }

  void TearDown() override {
    if (server_ != nullptr) {
      server_->Shutdown(std::chrono::system_clock::now() +
                        std::chrono::seconds(2));
    }
  }

  static TlsOptions Issue(const KeyAndCertificate& ca,
                          const CertificateSpec& spec, absl::string_view name) {
    absl::StatusOr<TlsOptions> files = IssueTlsFiles(ca, spec, *dir_, name);
    EXPECT_TRUE(files.ok()) << files.status();
    return files.value_or(TlsOptions());
  }
  static TlsOptions Issue(absl::string_view spiffe_id, absl::string_view name) {
    CertificateSpec spec;
    spec.spiffe_id = std::string(spiffe_id);
    return Issue(*ca_, spec, name);
  }

  // Serves `service` with mutual TLS under `server_files` on 127.0.0.1.
  void Serve(grpc::Service* service, const TlsOptions& server_files) {
    auto credentials = LoadServerCredentials(server_files);
    ASSERT_TRUE(credentials.ok()) << credentials.status();
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", *credentials, &port_);
    builder.RegisterService(service);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    ASSERT_NE(port_, 0);
  }
  void Serve(grpc::Service* service) {
    Serve(service, Issue("spiffe://lockstep/coordinator", "server"));
  }

  grpc::Status Check(std::shared_ptr<grpc::ChannelCredentials> credentials,
                     absl::string_view host = "127.0.0.1") {
    // A host name is checked against the server's certificate without
    // being resolved (c-ares leaks a few bytes per lookup under LSan): the
    // channel dials 127.0.0.1 and verifies the name given.
    grpc::ChannelArguments args;
    if (host != "127.0.0.1") {
      args.SetSslTargetNameOverride(std::string(host));
    }
    auto stub = Health::NewStub(grpc::CreateCustomChannel(
        absl::StrCat("127.0.0.1:", port_), std::move(credentials), args));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() +
                         std::chrono::seconds(10));
    HealthCheckRequest request;
    HealthCheckResponse response;
    return stub->Check(&context, request, &response);
  }
  grpc::Status CheckWith(const TlsOptions& client_files,
                         absl::string_view host = "127.0.0.1",
                         ServerCheck server = ServerCheck::kCoordinator) {
    auto credentials = LoadChannelCredentials(client_files, server);
    EXPECT_TRUE(credentials.ok()) << credentials.status();
    if (!credentials.ok()) return grpc::Status(grpc::StatusCode::INTERNAL, "");
    return Check(*credentials, host);
  }

  static std::string* dir_;
  static KeyAndCertificate* ca_;
  static KeyAndCertificate* foreign_ca_;
  CallerLog log_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

std::string* TlsTest::dir_ = nullptr;
KeyAndCertificate* TlsTest::ca_ = nullptr;
KeyAndCertificate* TlsTest::foreign_ca_ = nullptr;

TEST_F(TlsTest, EachRoleReachesTheHandlerAsItself) {
  SyncHealth service(&log_);
  Serve(&service);
  struct Case {
    std::string id;
    Role role;
    std::string name;
    std::string task;
  };
  const Case cases[] = {
      {"spiffe://lockstep/worker/chief/0", Role::kWorker, "chief/0", "chief:0"},
      {"spiffe://lockstep/worker/worker/3", Role::kWorker, "worker/3",
       "worker:3"},
      {"spiffe://lockstep/worker/pool-7", Role::kWorker, "pool-7", ""},
      {"spiffe://lockstep/operator/alice", Role::kOperator, "alice", ""},
      {"spiffe://lockstep/viewer/grafana", Role::kViewer, "grafana", ""},
      {"spiffe://lockstep/coordinator", Role::kCoordinator, "", ""},
  };
  int n = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.id);
    grpc::Status status = CheckWith(Issue(c.id, absl::StrCat("role", n++)));
    ASSERT_TRUE(status.ok()) << status.error_message();
    std::optional<Caller> caller = log_.Last();
    ASSERT_TRUE(caller.has_value());
    EXPECT_EQ(caller->role, c.role);
    EXPECT_EQ(caller->id, c.id);
    EXPECT_EQ(caller->name, c.name);
    EXPECT_EQ(caller->task, c.task);
    EXPECT_THAT(caller->peer, HasSubstr("127.0.0.1"));
  }
}

TEST_F(TlsTest, TheCallbackApiSeesTheCallerToo) {
  CallbackHealth service(&log_);
  Serve(&service);
  grpc::Status status =
      CheckWith(Issue("spiffe://lockstep/operator/bob", "callback"));
  ASSERT_TRUE(status.ok()) << status.error_message();
  std::optional<Caller> caller = log_.Last();
  ASSERT_TRUE(caller.has_value());
  EXPECT_EQ(caller->role, Role::kOperator);
  EXPECT_EQ(caller->name, "bob");
}

// caller.cc reads peer_spiffe_id and falls back to peer_uri; gRPC 1.51
// fills both on the server for a certificate with one URI SAN.
TEST_F(TlsTest, GrpcNamesTheSpiffeIdOfTheClientCertificate) {
  std::vector<std::string> spiffe, uri;
  class Probe final : public Health::Service {
   public:
    Probe(std::vector<std::string>* spiffe, std::vector<std::string>* uri)
        : spiffe_(spiffe), uri_(uri) {}
    grpc::Status Check(grpc::ServerContext* context, const HealthCheckRequest*,
                       HealthCheckResponse*) override {
      auto auth = context->auth_context();
      for (const auto& v : auth->FindPropertyValues("peer_spiffe_id"))
        spiffe_->emplace_back(v.data(), v.size());
      for (const auto& v : auth->FindPropertyValues("peer_uri"))
        uri_->emplace_back(v.data(), v.size());
      return grpc::Status::OK;
    }
    std::vector<std::string>* spiffe_;
    std::vector<std::string>* uri_;
  } service(&spiffe, &uri);
  Serve(&service);
  ASSERT_TRUE(CheckWith(Issue("spiffe://lockstep/viewer/v", "probe")).ok());
  EXPECT_THAT(spiffe, ::testing::ElementsAre("spiffe://lockstep/viewer/v"));
  EXPECT_THAT(uri, ::testing::ElementsAre("spiffe://lockstep/viewer/v"));
}

TEST_F(TlsTest, ACallWithoutACertificateReachesTheHandlerAsNobody) {
  SyncHealth service(&log_);
  Serve(&service);
  grpc::SslCredentialsOptions server_only;
  server_only.pem_root_certs = ca_->cert_pem;
  grpc::Status status = Check(grpc::SslCredentials(server_only));
  ASSERT_TRUE(status.ok()) << status.error_message();
  std::optional<Caller> caller = log_.Last();
  ASSERT_TRUE(caller.has_value());
  EXPECT_EQ(caller->role, Role::kNone);
  EXPECT_THAT(caller->ToString(), HasSubstr("no client certificate"));
}

TEST_F(TlsTest, ACertificateWithoutALockstepIdentityIsNobody) {
  SyncHealth service(&log_);
  Serve(&service);
  CertificateSpec spec;
  spec.spiffe_id = "https://example.com/alice";
  ASSERT_TRUE(CheckWith(Issue(*ca_, spec, "not-spiffe")).ok());
  std::optional<Caller> caller = log_.Last();
  ASSERT_TRUE(caller.has_value());
  EXPECT_EQ(caller->role, Role::kNone);
  EXPECT_THAT(caller->id, HasSubstr("not a spiffe:// ID"));
}

TEST_F(TlsTest, ACertificateFromAnotherCaFailsTheHandshake) {
  SyncHealth service(&log_);
  Serve(&service);
  CertificateSpec spec;
  spec.spiffe_id = "spiffe://lockstep/operator/mallory";
  grpc::Status status = CheckWith(Issue(*foreign_ca_, spec, "foreign-client"));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE)
      << status.error_message();
  EXPECT_FALSE(log_.Last().has_value());
}

TEST_F(TlsTest, AServerFromAnotherCaIsRefusedByTheClient) {
  SyncHealth service(&log_);
  CertificateSpec spec;
  spec.spiffe_id = "spiffe://lockstep/coordinator";
  TlsOptions server = Issue(*foreign_ca_, spec, "foreign-server");
  // It trusts our CA, so only the client's check can refuse.
  server.ca_file = Issue("spiffe://lockstep/coordinator", "trusting").ca_file;
  Serve(&service, server);
  grpc::Status status =
      CheckWith(Issue("spiffe://lockstep/operator/alice", "victim"));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_FALSE(log_.Last().has_value());
}

TEST_F(TlsTest, TheServerMustBeCertifiedForTheHostDialed) {
  SyncHealth service(&log_);
  CertificateSpec spec;
  spec.spiffe_id = "spiffe://lockstep/coordinator";
  spec.dns_names = {"coordinator.elsewhere.test"};
  spec.ip_addresses = {"10.9.8.7"};
  Serve(&service, Issue(*ca_, spec, "elsewhere"));
  TlsOptions client = Issue("spiffe://lockstep/operator/alice", "dialer");
  EXPECT_EQ(CheckWith(client, "127.0.0.1").error_code(),
            grpc::StatusCode::UNAVAILABLE);
  EXPECT_EQ(CheckWith(client, "localhost").error_code(),
            grpc::StatusCode::UNAVAILABLE);
  EXPECT_FALSE(log_.Last().has_value());
  // The name it is certified for is accepted.
  EXPECT_TRUE(CheckWith(client, "coordinator.elsewhere.test").ok());
}

// Issue 27 #5: any certificate of the CA that names the host (here every
// one names 127.0.0.1) used to pass for the coordinator's.
TEST_F(TlsTest, AServerWithAnotherRoleIsNotTheCoordinator) {
  SyncHealth service(&log_);
  Serve(&service, Issue("spiffe://lockstep/viewer/mallory", "viewer-server"));
  TlsOptions client = Issue("spiffe://lockstep/operator/alice", "alice");
  grpc::Status status = CheckWith(client);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAVAILABLE);
  EXPECT_THAT(status.error_message(),
              HasSubstr("presented viewer spiffe://lockstep/viewer/mallory, "
                        "not the coordinator's"));
  EXPECT_FALSE(log_.Last().has_value());
  // Nor is it a daemon a health probe may ask.
  EXPECT_EQ(
      CheckWith(client, "127.0.0.1", ServerCheck::kAnyDaemon).error_code(),
      grpc::StatusCode::UNAVAILABLE);
  EXPECT_FALSE(log_.Last().has_value());
}

TEST_F(TlsTest, AHealthProbeAcceptsAWorkerWhateverTheHostName) {
  SyncHealth service(&log_);
  CertificateSpec spec;
  spec.spiffe_id = "spiffe://lockstep/worker/worker/0";
  spec.dns_names = {};
  spec.ip_addresses = {};
  Serve(&service, Issue(*ca_, spec, "hostless-worker"));
  TlsOptions probe = Issue("spiffe://lockstep/viewer/probe", "probe");
  EXPECT_TRUE(CheckWith(probe, "127.0.0.1", ServerCheck::kAnyDaemon).ok());
  // A client of the coordinator refuses it: neither its role nor its host.
  EXPECT_EQ(CheckWith(probe).error_code(), grpc::StatusCode::UNAVAILABLE);
}

// A certificate rewritten on disk (cert-manager's renewal) is what the next
// handshakes present, without a restart.
TEST_F(TlsTest, ARotatedServerCertificateServesWithoutARestart) {
  SyncHealth service(&log_);
  TlsOptions server = Issue("spiffe://lockstep/coordinator", "rotating");
  absl::StatusOr<TlsMaterial> material = LoadTlsMaterial(server);
  ASSERT_TRUE(material.ok()) << material.status();
  material->reload_seconds = 1;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", ServerCredentials(*material), &port_);
  builder.RegisterService(&service);
  server_ = builder.BuildAndStart();
  ASSERT_NE(server_, nullptr);
  TlsOptions client = Issue("spiffe://lockstep/operator/alice", "rotator");
  ASSERT_TRUE(CheckWith(client).ok());

  // Renewed as a viewer's, which clients refuse: the refusal shows that the
  // new certificate is served.
  Issue("spiffe://lockstep/viewer/renewed", "rotating");
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  grpc::Status status;
  do {
    // A new channel each time: a connection made before keeps its session.
    status = CheckWith(client);
    if (status.ok()) absl::SleepFor(absl::Milliseconds(100));
  } while (status.ok() && absl::Now() < give_up);
  EXPECT_THAT(status.error_message(), HasSubstr("viewer"));
}

TEST_F(TlsTest, LocalCertificatesServeByNameAndByAddress) {
  SyncHealth service(&log_);
  Serve(&service);
  TlsOptions client = Issue("spiffe://lockstep/operator/alice", "local");
  EXPECT_TRUE(CheckWith(client, "localhost").ok());
  EXPECT_TRUE(CheckWith(client, "127.0.0.1").ok());
}

TEST_F(TlsTest, InsecureCallersAreAllInsecure) {
  CallerLog log;
  class Insecure final : public Health::Service {
   public:
    explicit Insecure(CallerLog* log) : log_(log) {}
    grpc::Status Check(grpc::ServerContext* context, const HealthCheckRequest*,
                       HealthCheckResponse*) override {
      log_->Record(CallerOfCall(*context, /*insecure=*/true));
      return grpc::Status::OK;
    }
    CallerLog* log_;
  } service(&log);
  TlsOptions insecure;
  insecure.insecure = true;
  Serve(&service, insecure);
  ASSERT_TRUE(CheckWith(insecure).ok());
  ASSERT_TRUE(log.Last().has_value());
  EXPECT_EQ(log.Last()->role, Role::kInsecure);
}

TEST_F(TlsTest, KeysAreWrittenForTheOwnerOnly) {
  TlsOptions files = Issue("spiffe://lockstep/operator/alice", "mode");
  struct stat st;
  ASSERT_EQ(stat(files.key_file.c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600);
  EXPECT_TRUE(LoadTlsMaterial(files).ok());
}

// ---- the flags and their files --------------------------------------------

absl::StatusOr<TlsOptions> FromFlags(std::vector<std::string> argv) {
  auto args = Args::Parse(argv, TlsValueFlags(), {kInsecureFlag});
  if (!args.ok()) return args.status();
  return TlsOptionsFromArgs(*args);
}

TEST(TlsFlagsTest, AllThreeFilesOrInsecure) {
  auto files = FromFlags({"--tls-cert=c", "--tls-key=k", "--tls-ca=a"});
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_EQ(files->cert_file, "c");
  EXPECT_EQ(files->key_file, "k");
  EXPECT_EQ(files->ca_file, "a");
  EXPECT_FALSE(files->insecure);
  auto insecure = FromFlags({"--insecure"});
  ASSERT_TRUE(insecure.ok());
  EXPECT_TRUE(insecure->insecure);
}

TEST(TlsFlagsTest, AnythingElseIsAUsageError) {
  auto neither = FromFlags({});
  EXPECT_EQ(neither.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(neither.status().message(), HasSubstr("--insecure"));
  auto partial = FromFlags({"--tls-cert=c", "--tls-ca=a"});
  EXPECT_EQ(partial.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(partial.status().message(), HasSubstr("missing: --tls-key"));
  auto both =
      FromFlags({"--tls-cert=c", "--tls-key=k", "--tls-ca=a", "--insecure"});
  EXPECT_EQ(both.status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TlsFlagsTest, TheCliFallsBackToTheEnvironment) {
  auto args = Args::Parse({}, TlsValueFlags(), {kInsecureFlag});
  ASSERT_TRUE(args.ok());
  setenv("LOCKSTEP_TLS_CERT", "env.crt", 1);
  setenv("LOCKSTEP_TLS_KEY", "env.key", 1);
  setenv("LOCKSTEP_TLS_CA", "env-ca.crt", 1);
  auto from_env = TlsOptionsFromArgsOrEnv(*args);
  ASSERT_TRUE(from_env.ok()) << from_env.status();
  EXPECT_EQ(from_env->key_file, "env.key");
  // A flag replaces the variables as a whole.
  auto flagged = Args::Parse({"--insecure"}, TlsValueFlags(), {kInsecureFlag});
  auto insecure = TlsOptionsFromArgsOrEnv(*flagged);
  ASSERT_TRUE(insecure.ok()) << insecure.status();
  EXPECT_TRUE(insecure->insecure);
  unsetenv("LOCKSTEP_TLS_KEY");
  auto partial = TlsOptionsFromArgsOrEnv(*args);
  EXPECT_THAT(partial.status().message(), HasSubstr("LOCKSTEP_TLS_KEY"));
  unsetenv("LOCKSTEP_TLS_CERT");
  unsetenv("LOCKSTEP_TLS_CA");
  setenv("LOCKSTEP_INSECURE", "1", 1);
  auto insecure_env = TlsOptionsFromArgsOrEnv(*args);
  ASSERT_TRUE(insecure_env.ok());
  EXPECT_TRUE(insecure_env->insecure);
  unsetenv("LOCKSTEP_INSECURE");
}

class TlsFilesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = TempDir();
    auto ca = MakeCertificateAuthority("files CA");
    ASSERT_TRUE(ca.ok()) << ca.status();
    ca_ = *ca;
    CertificateSpec spec;
    spec.spiffe_id = "spiffe://lockstep/operator/alice";
    auto files = IssueTlsFiles(ca_, spec, dir_, "alice");
    ASSERT_TRUE(files.ok()) << files.status();
    files_ = *files;
  }
  void TearDown() override { (void)RemoveRecursively(dir_); }

  std::string dir_;
  KeyAndCertificate ca_;
  TlsOptions files_;
};

TEST_F(TlsFilesTest, AMissingFileIsNamedWithItsFlag) {
  files_.ca_file = dir_ + "/nowhere.crt";
  auto loaded = LoadTlsMaterial(files_);
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(loaded.status().message(), HasSubstr("--tls-ca"));
  EXPECT_THAT(loaded.status().message(), HasSubstr("nowhere.crt"));
}

TEST_F(TlsFilesTest, AFileThatIsNotPemIsNamedWithItsFlag) {
  ASSERT_TRUE(WriteFileAtomically(dir_ + "/junk", "not a certificate").ok());
  files_.cert_file = dir_ + "/junk";
  auto loaded = LoadTlsMaterial(files_);
  EXPECT_THAT(loaded.status().message(), HasSubstr("--tls-cert"));
  EXPECT_THAT(loaded.status().message(), HasSubstr("no PEM certificate"));
  files_.cert_file = dir_ + "/alice.crt";
  files_.key_file = dir_ + "/junk";
  loaded = LoadTlsMaterial(files_);
  EXPECT_THAT(loaded.status().message(), HasSubstr("--tls-key"));
}

TEST_F(TlsFilesTest, AKeyOfAnotherCertificateIsRefused) {
  CertificateSpec spec;
  spec.spiffe_id = "spiffe://lockstep/operator/bob";
  auto bob = IssueTlsFiles(ca_, spec, dir_, "bob");
  ASSERT_TRUE(bob.ok());
  files_.key_file = bob->key_file;
  auto loaded = LoadTlsMaterial(files_);
  EXPECT_EQ(loaded.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(loaded.status().message(), HasSubstr("does not belong"));
}

TEST_F(TlsFilesTest, AnExpiredCertificateIsRefused) {
  CertificateSpec spec;
  spec.spiffe_id = "spiffe://lockstep/operator/old";
  spec.lifetime = -absl::Hours(1);
  auto old = IssueTlsFiles(ca_, spec, dir_, "old");
  ASSERT_TRUE(old.ok());
  auto loaded = LoadTlsMaterial(*old);
  EXPECT_THAT(loaded.status().message(), HasSubstr("expired"));
}

TEST_F(TlsFilesTest, IssuingNeedsAnIdAndRealAddresses) {
  CertificateSpec spec;
  EXPECT_EQ(IssueCertificate(ca_, spec).status().code(),
            absl::StatusCode::kInvalidArgument);
  spec.spiffe_id = "spiffe://lockstep/coordinator";
  spec.ip_addresses = {"300.1.1.1"};
  EXPECT_EQ(IssueCertificate(ca_, spec).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// ---- identities ------------------------------------------------------------

TEST(ParseIdentityTest, KnownRoles) {
  Caller chief = ParseIdentity("spiffe://lockstep/worker/chief/0");
  EXPECT_EQ(chief.role, Role::kWorker);
  EXPECT_EQ(chief.task, "chief:0");
  EXPECT_EQ(ParseIdentity("spiffe://prod.example/worker/worker/12").task,
            "worker:12");
  EXPECT_EQ(ParseIdentity("spiffe://lockstep/worker/pool-7").task, "");
  EXPECT_EQ(ParseIdentity("spiffe://lockstep/worker/worker/x").task, "");
  EXPECT_EQ(ParseIdentity("spiffe://lockstep/operator/alice").role,
            Role::kOperator);
  EXPECT_EQ(ParseIdentity("spiffe://lockstep/viewer/g").role, Role::kViewer);
  EXPECT_EQ(ParseIdentity("spiffe://lockstep/coordinator").role,
            Role::kCoordinator);
}

TEST(ParseIdentityTest, UnknownOrMalformedIdsAreNobody) {
  for (const char* id :
       {"", "spiffe://lockstep", "spiffe://lockstep/admin/root",
        "spiffe://lockstep/operator", "spiffe://lockstep/worker/../chief/0",
        "spiffe://lockstep//operator/a", "spiffe://lockstep/operator/a b",
        "http://lockstep/operator/alice"}) {
    SCOPED_TRACE(id);
    Caller caller = ParseIdentity(id);
    EXPECT_EQ(caller.role, Role::kNone);
    EXPECT_FALSE(caller.id.empty());
  }
  EXPECT_EQ(
      ParseIdentity("spiffe://lockstep/operator/" + std::string(3000, 'a'))
          .role,
      Role::kNone);
}

}  // namespace
}  // namespace lockstep
