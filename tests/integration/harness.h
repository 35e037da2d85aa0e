// The harness of the end-to-end tests: running the real lockstep binaries
// (RunCommand), a coordinator with a static cluster of worker processes
// (ClusterTest) and one that saves checkpoints (CheckpointTest), and the
// helpers that read what they print and write. Waits are on events (process
// exit, the WatchJob stream), never on fixed sleeps.
//
// Each test file holds one concern: recovery_test, spare_test, cli_test,
// equivalence_test, bad_input_test, checkpoint_test, failure_point_test.
#ifndef LOCKSTEP_TESTS_INTEGRATION_HARNESS_H_
#define LOCKSTEP_TESTS_INTEGRATION_HARNESS_H_

#include <google/protobuf/struct.pb.h>
#include <gtest/gtest.h>
#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "client/process.h"
#include "common/cert_maker.h"
#include "common/tls.h"
#include "grpc/health/v1/health.grpc.pb.h"
#include "lockstep/v1/coordinator.grpc.pb.h"

namespace lockstep::integration {

// The built binaries, the source tree, and the example job most tests run.
extern const std::string kBin;
extern const std::string kSource;
extern const std::string kMlp;

struct Result {
  int code = -1;
  std::string out;
  std::string err;
};

// A new folder under the test's temporary directory.
std::string TempDir(const std::string& name);

// ---- mutual TLS ------------------------------------------------------------
// Every daemon and CLI call of the tests runs with mutual TLS under one CA
// made once per test process (its key only in memory). Coordinators get
// spiffe://lockstep/coordinator, the worker of task TYPE:INDEX
// spiffe://lockstep/worker/TYPE/INDEX, and the CLI the operator
// spiffe://lockstep/operator/harness.

inline constexpr char kCoordinatorId[] = "spiffe://lockstep/coordinator";
inline constexpr char kOperatorId[] = "spiffe://lockstep/operator/harness";

// The files of a certificate for `spiffe_id` (with localhost and 127.0.0.1
// SANs) from the harness CA, or from a second, foreign CA that no daemon
// trusts (its -ca.crt file is then the foreign CA). Issued once per ID and
// CA, then the same files.
TlsOptions IssueTestCertificate(const std::string& spiffe_id,
                                bool foreign_ca = false);
// The harness CA, for tests that issue certificates of their own.
const KeyAndCertificate& HarnessCa();

// --tls-cert FILE --tls-key FILE --tls-ca FILE.
std::vector<std::string> TlsFlags(const TlsOptions& files);
// The daemon flags of `spiffe_id` from the harness CA.
std::vector<std::string> TlsFlagsFor(const std::string& spiffe_id);
// `argv` (a daemon's command line) with the TLS flags of `spiffe_id`.
std::vector<std::string> WithTls(std::vector<std::string> argv,
                                 const std::string& spiffe_id);
// LOCKSTEP_TLS_CERT=..., LOCKSTEP_TLS_KEY=..., LOCKSTEP_TLS_CA=... for the
// CLI.
std::vector<std::string> TlsEnv(const TlsOptions& files);
// The operator's certificate, which RunCommand gives the CLI.
const TlsOptions& OperatorTls();

// Channel credentials presenting `client` (null: no client certificate,
// still trusting the harness CA so the handshake succeeds), requiring the
// server `server` names (common/tls.h) when a certificate is presented.
std::shared_ptr<grpc::ChannelCredentials> TestCredentials(
    const TlsOptions* client, ServerCheck server = ServerCheck::kCoordinator);
// A stub to the coordinator at `address` calling with `client` (null: no
// client certificate).
std::unique_ptr<v1::Coordinator::Stub> CoordinatorStub(
    const std::string& address, const TlsOptions* client);

// Runs a command to completion; `env` entries are added to the environment,
// after the operator's LOCKSTEP_TLS_* (an entry of `env` replaces one).
Result RunCommand(const std::vector<std::string>& argv,
                  const std::vector<std::string>& env = {});

// `lockstep local --workers 2 --json` training 200 steps of the MLP
// (global batch 64, a progress report every step): the run the kill tests
// of local mode repeat.
std::vector<std::string> LocalMlpRun();

// Runs `lockstep local ... --json` (`argv`) and SIGKILLs its first
// lockstep-worker child once a progress line shows training; code is 0 only
// when the run exited 0 and a worker was killed.
Result RunAndKillAWorker(const std::vector<std::string>& argv);

// The JSON object on the last line of `text`.
google::protobuf::Struct LastJsonLine(const std::string& text);

// The losses of a `--metrics-out` CSV file (step,loss), in step order.
std::vector<double> ReadLosses(const std::string& csv_path);

// What the gRPC health service at `address` answers to the operator.
grpc::health::v1::HealthCheckResponse::ServingStatus Health(
    const std::string& address);

// Part of Fashion-MNIST converted to the npy layout: what a user who brings
// their own data writes with numpy.save. Returns the folder.
std::string WriteNpyDataSet(int train_count, int test_count);

// What `lockstep checkpoints JOB --json` says, by checkpoint name.
std::map<std::string, google::protobuf::Struct> ListCheckpoints(
    const std::string& address, const std::string& job);

// The first child of `parent` whose command name is `comm`, or -1.
pid_t FindChild(pid_t parent, const std::string& comm);

// A coordinator with a static cluster of N workers (and spares_ hot spares,
// TF_CONFIG task type "spare"), all started and killed by pid.
class ClusterTest : public ::testing::Test {
 protected:
  // `worker_env` adds variables to the first process of some workers.
  void StartCluster(int workers,
                    std::vector<std::string> coordinator_flags = {},
                    std::map<int, std::vector<std::string>> worker_env = {});
  void StartCoordinator(const std::string& listen);
  std::string ClusterJson() const;
  pid_t StartWorker(int index, std::vector<std::string> env = {});
  pid_t StartSpare(int index);
  // Starts task `type`:`index` of the cluster with its TF_CONFIG and the
  // certificate of its identity (spiffe://lockstep/worker/TYPE/INDEX). The n-th
  // process started (from 1, counting every task) logs to
  // dir_/<type>-<index>-<n>.log.
  pid_t StartTask(const std::string& type, int index,
                  std::vector<std::string> env = {});

  // Submits the MLP example with `sets`; returns the job id.
  std::string Submit(const std::vector<std::string>& sets);

  // Follows the job until `done` holds for a status; returns that status.
  v1::JobStatus WatchUntil(
      const std::string& job,
      const std::function<bool(const v1::JobStatus&)>& done);

  static bool Ended(const v1::JobStatus& s);

  // Submits `sets` and returns the job id once it trained `step` steps, or
  // "" (with a test failure) if it ended before.
  std::string SubmitAndTrainTo(const std::vector<std::string>& sets,
                               int64_t step);

  // The model digest of `sets` trained without interruption.
  std::string UninterruptedDigest(const std::vector<std::string>& sets);

  static void ExpectAllRanks(const v1::JobStatus& status,
                             const std::string& digest);

  // Every event of the job, one per line ("generation 3 worker_failed:
  // ..."), for failure messages.
  std::string History(const std::string& job);

  // The last event of `kind`, or null.
  static const v1::JobEvent* FindEvent(const v1::JobStatus& status,
                                       const std::string& kind);

  bool Alive(pid_t pid);

  void TearDown() override;

  client::ProcessGroup processes_;
  std::string dir_;
  std::string address_;
  int workers_ = 0;
  int spares_ = 0;  // set before StartCluster
  // Set before StartCluster: a pool of free workers (no --cluster, no
  // TF_CONFIG, identities spiffe://lockstep/worker/pool-I) that runs
  // several jobs at once; their ids are free:N in registration order.
  bool pool_ = false;
  int spawned_ = 0;
  int coordinators_ = 0;
  // Extra coordinator flags. With --insecure or --tls-cert among them the
  // harness adds no TLS flags of its own.
  std::vector<std::string> coordinator_flags_;
  pid_t coordinator_pid_ = -1;
  std::vector<pid_t> worker_pids_;
  std::vector<pid_t> spare_pids_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
};

// The job the checkpoint tests run: 60 steps of the MLP.
extern const std::vector<std::string> kCheckpointJob;
// 200 steps of the MLP whose chief reports progress only at a generation's
// first step: only the ranks' results say where a generation stopped.
extern const std::vector<std::string> kQuietJob;

// A cluster whose jobs save BackupAndRestore checkpoints (docs/DESIGN.md §6)
// into backup_.
class CheckpointTest : public ClusterTest {
 protected:
  void SetUp() override;

  // The job's settings with checkpoints every `every` steps, kept after
  // success so the test can inspect them.
  std::vector<std::string> WithCheckpoints(std::vector<std::string> sets,
                                           int every);

  // LATEST names a checkpoint that `lockstep checkpoints` verifies.
  void ExpectLatestVerifies(const std::string& job);

  static bool HasCheckpointAtLeast(const v1::JobStatus& s, int64_t step);

  // Submits `sets` (kCheckpointJob by default) saving every `every` steps
  // (10), waits for the checkpoint of step 2 * `every`, and SIGKILLs every
  // worker (reaped): no live state survives.
  std::string TrainThenKillEveryWorker(const std::vector<std::string>& sets,
                                       int every = 10);
  // Submits kQuietJob saving every 40 steps, SIGKILLs rank 1 (reaped) once
  // a checkpoint is committed, and returns the job once the surviving
  // chief's result says it stopped past *saved_step (the newest checkpoint
  // then); "" with a test failure otherwise.
  std::string KillRankOnePastACheckpoint(int64_t* saved_step);
  std::string TrainThenKillEveryWorker();

  std::string backup_;
};

}  // namespace lockstep::integration

#endif  // LOCKSTEP_TESTS_INTEGRATION_HARNESS_H_
