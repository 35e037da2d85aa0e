#include "worker/agent.h"

#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/log.h"
#include "common/status_macros.h"

namespace lockstep::worker {

absl::StatusOr<v1::RegisterWorkerResponse> Agent::RegisterWithRetry() {
  absl::Time deadline = absl::Now() + options_.connect_timeout;
  absl::Duration backoff = absl::Milliseconds(100);
  while (true) {
    auto response = control_->Register(options_.registration);
    if (response.ok()) return response;
    absl::StatusCode code = response.status().code();
    bool transient = code == absl::StatusCode::kUnavailable ||
                     code == absl::StatusCode::kDeadlineExceeded;
    if (!transient || absl::Now() + backoff > deadline) {
      return response.status();
    }
    LogWarning(response.status().message(), "; retrying in ",
               absl::FormatDuration(backoff));
    absl::SleepFor(backoff);
    backoff = std::min(backoff * 2, absl::Seconds(5));
  }
}

absl::Status Agent::Run() {
  ASSIGN_OR_RETURN(v1::RegisterWorkerResponse registered, RegisterWithRetry());
  const std::string& worker_id = registered.worker_id();
  SetLogTag(absl::StrCat("worker ", worker_id));
  const uint64_t incarnation = options_.registration.incarnation();
  ASSIGN_OR_RETURN(std::shared_ptr<Session> session,
                   control_->OpenSession(worker_id, incarnation));
  LogInfo("registered as ", worker_id, "; waiting for work");

  absl::Notification session_over;
  std::thread heartbeats([&] {
    while (!session_over.WaitForNotificationWithTimeout(
        options_.heartbeat_interval)) {
      v1::WorkerMessage message;
      message.mutable_heartbeat();
      if (!session->Send(message)) break;
    }
  });

  std::shared_ptr<TaskContext> task;
  std::thread task_thread;
  v1::CoordinatorCommand command;
  while (session->Receive(&command)) {
    switch (command.kind_case()) {
      case v1::CoordinatorCommand::kAssignment: {
        if (task_thread.joinable()) task_thread.join();
        task = std::make_shared<TaskContext>();
        task->assignment = command.assignment();
        task->kv = control_->KeyValue(task->assignment.job_id(),
                                      task->assignment.generation());
        task->host = options_.registration.host();
        // The task holds the session too: it may outlive this loop.
        task->report = [session](const v1::ProgressReport& report) {
          v1::WorkerMessage message;
          *message.mutable_progress() = report;
          session->Send(message);
        };
        task_thread = std::thread([this, task, session] {
          v1::TaskResult result = runner_(*task);
          v1::WorkerMessage message;
          *message.mutable_result() = std::move(result);
          session->Send(message);
        });
        break;
      }
      case v1::CoordinatorCommand::kStop:
        if (task && task->assignment.job_id() == command.stop().job_id()) {
          LogInfo("stop requested: ", command.stop().reason());
          task->stop_requested = true;
        }
        break;
      case v1::CoordinatorCommand::kAbort:
        if (task && task->assignment.job_id() == command.abort().job_id() &&
            task->assignment.generation() == command.abort().generation()) {
          LogWarning("generation ", command.abort().generation(),
                     " aborted: ", command.abort().reason());
          task->aborted = true;
        }
        break;
      default:
        break;
    }
  }
  session_over.Notify();
  heartbeats.join();
  if (task) task->aborted = true;
  // A task blocked in a collective cannot be joined promptly; the caller
  // exits the process.
  if (task_thread.joinable()) task_thread.detach();
  absl::Status finished = session->Finish();
  return absl::UnavailableError(absl::StrCat(
      "lost the session with the coordinator",
      finished.ok() ? "" : absl::StrCat(": ", finished.message())));
}

}  // namespace lockstep::worker
