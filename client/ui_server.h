// `lockstep ui` (issue 55): the web console, served on this machine and
// answering its page's API from the coordinator with the caller's own
// credentials, as `kubectl proxy` does: a viewer certificate gives a
// read-only console, and a refused action shows the coordinator's reason.
// Everything it serves is inside the binary (client/ui_page.cc): it works
// offline. Who may use it: client/ui_gate.h.
//
// The API (JSON; proto field names, int64 as strings, as protobuf's JSON
// mapping writes them):
//   GET  /api/jobs           the newest 1000 jobs, each as the jobs page
//                            shows it (JobRow: about a tenth of a summary)
//   GET  /api/jobs/ID        one job's status without its raw histories,
//                            and "curve": at most 2000 points of its loss
//                            and learning rate by step (each point the
//                            mean of the steps it stands for);
//                            ?since=VERSION answers {"unchanged": true}
//                            while the job's version is still VERSION
//   GET  /api/queue          the scheduler's order and why each job waits
//   GET  /api/workers        every worker
//   GET  /api/compare/A,B    CompareJobs: whether they computed the same
//                            function, as `lockstep compare` says it
//   POST /api/jobs/ID/stop   StopJob as the caller
//   POST /api/jobs/ID/delete DeleteJob as the caller (a finished job)
// An error is {"error": "..."}: 503 when the coordinator cannot be reached
// (the page shows "reconnecting"), the coordinator's refusal otherwise.
//
// Thread-safe: libmicrohttpd's threads answer requests concurrently.
#ifndef LOCKSTEP_CLIENT_UI_SERVER_H_
#define LOCKSTEP_CLIENT_UI_SERVER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/ui_gate.h"
#include "lockstep/v1/coordinator.grpc.pb.h"

struct MHD_Daemon;

namespace lockstep::client {

struct UiResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
};

// Points of a curve the API sends at most.
inline constexpr int kUiCurvePoints = 2000;

class UiServer {
 public:
  // Listens on `listen` (an IPv4 "HOST:PORT"; port 0 picks one) and talks
  // to the coordinator at `address` through `stub`. Errors: InvalidArgument
  // for a malformed address, Unavailable when it cannot be bound.
  static absl::StatusOr<std::unique_ptr<UiServer>> Start(
      const std::string& listen, std::unique_ptr<v1::Coordinator::Stub> stub,
      std::string address);
  ~UiServer();
  UiServer(const UiServer&) = delete;
  UiServer& operator=(const UiServer&) = delete;

  // http://HOST:PORT/?token=... : what to open.
  std::string Url() const;

  // One request, past libmicrohttpd (for the server's handler and tests).
  UiResponse Serve(const UiRequest& request);

 private:
  UiServer(std::unique_ptr<v1::Coordinator::Stub> stub, std::string address,
           std::string host, int port);
  UiResponse Api(const UiRequest& request);

  const std::unique_ptr<v1::Coordinator::Stub> stub_;
  const std::string address_;  // the coordinator's
  const std::string host_;
  int port_ = 0;
  std::unique_ptr<UiGate> gate_;
  MHD_Daemon* daemon_ = nullptr;
};

// A job as the jobs page lists it: id, state, owner, priority, workers,
// step, loss, throughput, submit time, its spec's name and workers, and
// the first kUiRowErrorBytes of its error.
inline constexpr size_t kUiRowErrorBytes = 200;
v1::JobStatus JobRow(const v1::JobStatus& job);

// The job's status as /api/jobs/ID sends it: the histories replaced by at
// most `points` points of (step, loss, learning rate), each the mean of
// the steps it stands for. `status` has its whole history.
std::string JobWithCurve(v1::JobStatus status, int points);

int RunUi(const std::vector<std::string>& argv);

}  // namespace lockstep::client

#endif  // LOCKSTEP_CLIENT_UI_SERVER_H_
