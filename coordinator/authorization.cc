// The role table of the coordinator's calls and the rate-limited log of
// refusals (authorization.h).
#include "coordinator/authorization.h"

#include <cstdint>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/log.h"

namespace lockstep::coordinator {
namespace {

// The roles allowed a call, as a mask of Role values.
constexpr unsigned Bit(Role role) { return 1u << static_cast<unsigned>(role); }

unsigned AllowedRoles(Call call) {
  switch (call) {
    case Call::kRegisterWorker:
    case Call::kWorkerSession:
    case Call::kKvSet:
    case Call::kKvGet:
    case Call::kUploadArtifact:
      return Bit(Role::kWorker) | Bit(Role::kSpare);
    case Call::kSubmitJob:
    case Call::kStopJob:
    case Call::kDeleteJob:
      return Bit(Role::kOperator);
    case Call::kGetJobStatus:
    case Call::kWatchJob:
    case Call::kListWorkers:
    case Call::kListQueue:
    case Call::kListArtifacts:
    case Call::kDownloadArtifact:
    case Call::kCompareJobs:
      return Bit(Role::kOperator) | Bit(Role::kViewer);
    case Call::kHealthCheck:
      return Bit(Role::kWorker) | Bit(Role::kSpare) | Bit(Role::kOperator) |
             Bit(Role::kViewer) | Bit(Role::kCoordinator);
  }
  return 0;
}

// What a caller needs to make `call`, for the refusal's message.
std::string Needed(Call call) {
  switch (AllowedRoles(call)) {
    case Bit(Role::kWorker) | Bit(Role::kSpare):
      return "a worker or spare identity (spiffe://<trust domain>/worker/... "
             "or .../spare/NAME)";
    case Bit(Role::kOperator):
      return "an operator identity (spiffe://<trust domain>/operator/NAME)";
    case Bit(Role::kOperator) | Bit(Role::kViewer):
      return "an operator or viewer identity (spiffe://<trust "
             "domain>/operator/NAME or .../viewer/NAME)";
    default:
      return "any identity lockstep knows";
  }
}

// At most kRefusalsLogged lines per kRefusalLogWindow of real time.
class RefusalLimiter {
 public:
  void Log(absl::string_view message) {
    std::string left_out;
    bool log = false;
    {
      absl::MutexLock lock(&mu_);
      absl::Time now = absl::Now();
      if (now - window_start_ >= kRefusalLogWindow) {
        if (dropped_ > 0) {
          left_out = absl::StrCat(dropped_, " more refusals in the previous ",
                                  absl::FormatDuration(kRefusalLogWindow),
                                  " were not logged");
        }
        window_start_ = now;
        logged_ = 0;
        dropped_ = 0;
      }
      if (logged_ < kRefusalsLogged) {
        ++logged_;
        log = true;
      } else {
        ++dropped_;
      }
    }
    if (!left_out.empty()) LogWarning(left_out);
    if (log) LogWarning("refusing a call: ", message);
  }

 private:
  absl::Mutex mu_;
  absl::Time window_start_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  int logged_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace

absl::string_view CallName(Call call) {
  switch (call) {
    case Call::kRegisterWorker:
      return "RegisterWorker";
    case Call::kWorkerSession:
      return "WorkerSession";
    case Call::kKvSet:
      return "KvSet";
    case Call::kKvGet:
      return "KvGet";
    case Call::kSubmitJob:
      return "SubmitJob";
    case Call::kGetJobStatus:
      return "GetJobStatus";
    case Call::kWatchJob:
      return "WatchJob";
    case Call::kStopJob:
      return "StopJob";
    case Call::kDeleteJob:
      return "DeleteJob";
    case Call::kListWorkers:
      return "ListWorkers";
    case Call::kListQueue:
      return "ListQueue";
    case Call::kUploadArtifact:
      return "UploadArtifact";
    case Call::kListArtifacts:
      return "ListArtifacts";
    case Call::kDownloadArtifact:
      return "DownloadArtifact";
    case Call::kCompareJobs:
      return "CompareJobs";
    case Call::kHealthCheck:
      return "grpc.health.v1.Health/Check";
  }
  return "an unknown call";
}

absl::Status LogRefusal(absl::Status refusal) {
  static RefusalLimiter* const limiter = new RefusalLimiter();
  limiter->Log(refusal.message());
  return refusal;
}

absl::Status AuthorizeRole(const Caller& caller, Call call) {
  if (caller.role == Role::kInsecure) return absl::OkStatus();
  if (caller.revoked) {
    return LogRefusal(absl::UnauthenticatedError(absl::StrCat(
        caller.ToString(), " may not call ", CallName(call),
        ": the coordinator's --deny-identities list revokes it; it may call "
        "again once taken off the list, or with a certificate for another "
        "identity")));
  }
  if (caller.role == Role::kNone) {
    return LogRefusal(absl::UnauthenticatedError(absl::StrCat(
        caller.ToString(), " may not call ", CallName(call), ": it needs ",
        Needed(call),
        " in a client certificate signed by the cluster's CA (--tls-cert, "
        "--tls-key, --tls-ca)")));
  }
  if ((AllowedRoles(call) & Bit(caller.role)) != 0) return absl::OkStatus();
  return LogRefusal(absl::PermissionDeniedError(
      absl::StrCat(caller.ToString(), " may not call ", CallName(call),
                   ": it needs ", Needed(call))));
}

absl::Status Denied(const Caller& caller, Call call, absl::string_view why) {
  return LogRefusal(absl::PermissionDeniedError(absl::StrCat(
      caller.ToString(), " may not call ", CallName(call), ": ", why)));
}

}  // namespace lockstep::coordinator
