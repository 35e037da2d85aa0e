// One run of `lockstep local`: its flags, its coordinator and worker
// processes, the job, and its summary (local.cc, local_processes.cc).
#ifndef LOCKSTEP_CLIENT_LOCAL_H_
#define LOCKSTEP_CLIENT_LOCAL_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "client/process.h"
#include "client/ui_server.h"
#include "common/args.h"
#include "common/cert_maker.h"
#include "common/tls.h"
#include "lockstep/v1/coordinator.grpc.pb.h"

namespace lockstep::client {

// A coordinator and N workers on 127.0.0.1 running one job (or several at
// once, sharing the workers), then torn down. Run() does it all once:
// checks the flags and the job specs (Prepare), makes the run directory and
// its certificates, starts the coordinator and the workers, waits for every
// worker to register, submits the jobs, follows each, and ends every
// process before it prints the summaries (Finish).
//
// Thread-safety: Run() is called once, on the main thread. OnChildExit runs
// on the process group's reaper thread: it restarts a dead worker, or
// records why the run failed (mu_) and cancels the watch (watch_context_).
class LocalRun {
 public:
  LocalRun(const Args& args, std::string bin_dir)
      : args_(args), bin_dir_(std::move(bin_dir)) {}
  // The exit code of `lockstep local`.
  int Run();

 private:
  // ---- the run (local.cc) ----
  absl::Status Prepare();
  // The summary of every job (`finals`, in submission order) and the exit
  // code: 0 when each succeeded.
  int Finish(const std::vector<absl::StatusOr<v1::JobStatus>>& finals);
  // One job's summary line, --metrics-out and --json; whether it
  // succeeded with one model on every rank.
  bool Summarize(v1::JobStatus& status, double wall_seconds);
  // Submits every job at once, in order. Errors: the coordinator's.
  absl::StatusOr<std::vector<std::string>> SubmitAll();
  void PrintJson(const v1::JobStatus& status, double wall_seconds);
  // How to point another lockstep command at this run.
  void PrintCliHint();
  // --serve: the pool runs until SIGINT or SIGTERM (blocked by RunLocal),
  // or until a process fails for good; the exit code.
  int Serve();
  // --serve --json: the line that tells a program (Python's
  // lockstep.LocalCluster) where the pool is and which certificates reach it.
  void PrintServeJson();
  // The workers' --data-root/--backup-root/--export-root under --serve.
  absl::Status ServeRootFlags();
  std::ostream& progress() { return json_ ? std::cerr : std::cout; }

  // ---- the processes (local_processes.cc) ----
  // The run's CA, and the coordinator's and this command's certificates.
  absl::Status MakeCertificates();
  // The TLS flags of a daemon whose certificate is `<run>/tls/<name>.*`,
  // issued now when missing (a worker's, at its first start).
  absl::StatusOr<std::vector<std::string>> TlsFlags(const std::string& name,
                                                    const std::string& id);
  absl::Status StartProcesses();
  // Waits until every worker has registered with the coordinator; fails
  // early when a process dies for good.
  absl::Status WaitForWorkers(absl::Duration timeout);
  absl::Status SpawnWorker(int index);
  // Called for every child that exits before the run ends: a worker is
  // restarted (as Kubernetes would), up to kMaxWorkerRestarts times.
  void OnChildExit(const std::string& name, int status);

  const Args& args_;
  const std::string bin_dir_;
  bool json_ = false;
  bool serve_ = false;
  // --serve: the root flags every worker gets (absolute paths).
  std::vector<std::string> serve_root_flags_;
  int workers_ = 2;
  int spares_ = 0;  // worker indexes workers_.. are spares
  int threads_ = 1;
  // --metrics-port: the coordinator's /metrics port, the workers' after it;
  // 0 serves none.
  int metrics_port_ = 0;
  // --data-plane-encryption / --data-plane-transport, passed to each worker.
  std::vector<std::string> data_plane_flags_;
  // With --gpus: the CUDA_VISIBLE_DEVICES entries handed out round-robin.
  std::vector<std::string> gpus_;
  // The jobs, in the order given (one, or several sharing the workers).
  std::vector<v1::JobSpec> specs_;
  std::string run_dir_;
  // Without --insecure: the run's CA (its key only in memory) and the
  // operator's credentials this command calls the coordinator with.
  bool insecure_ = false;
  KeyAndCertificate ca_;
  TlsOptions operator_tls_;
  std::string address_;
  ProcessGroup processes_;
  std::unique_ptr<v1::Coordinator::Stub> stub_;
  // --serve --ui: the web console of the pool.
  std::unique_ptr<UiServer> console_;
  // The watch under way, cancelled when a process fails for good.
  absl::Mutex watch_mu_;
  grpc::ClientContext* watch_context_ ABSL_GUARDED_BY(watch_mu_) = nullptr;
  bool watch_cancelled_ ABSL_GUARDED_BY(watch_mu_) = false;
  std::atomic<bool> finishing_{false};
  absl::Mutex mu_;
  std::string child_failure_ ABSL_GUARDED_BY(mu_);
  std::map<int, int> worker_restarts_ ABSL_GUARDED_BY(mu_);
  absl::Time start_;
  // From starting the processes to every worker registered (their start:
  // mostly loading LibTorch).
  double startup_seconds_ = -1;
  // From submitting the job (every worker ready) to the chief's report of
  // its first step.
  double first_step_seconds_ = -1;
};

}  // namespace lockstep::client

#endif  // LOCKSTEP_CLIENT_LOCAL_H_
