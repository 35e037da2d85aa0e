// The worker agent: registration with retry, the session loop that turns
// commands into TaskContext signals, heartbeats, and the task thread.
#include "worker/agent.h"

#include <algorithm>
#include <cstdio>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "checkpoint/archive.h"
#include "checkpoint/store.h"
#include "common/files.h"
#include "common/log.h"
#include "common/status_macros.h"

namespace lockstep::worker {
namespace {

// The most an export's upload may take (a model of 1 GiB over a slow link).
constexpr absl::Duration kUploadTimeout = absl::Minutes(10);

// Registration retries back off to this at most. Besides an unreachable
// coordinator, Unavailable is how a coordinator refuses a restarted worker
// while its old process's session is still live (docs/DESIGN.md, "Roles and
// authorization"): that session ends when its stream breaks or at the
// heartbeat timeout, and the worker should get in right after.
constexpr absl::Duration kMaxRegisterBackoff = absl::Milliseconds(500);

// Who uploads: this rank of its generation, proven by its token.
v1::ArtifactUpload::Header UploadHeader(const v1::Assignment& assignment) {
  v1::ArtifactUpload::Header header;
  header.set_job_id(assignment.job_id());
  header.set_generation(assignment.generation());
  header.set_rank(assignment.rank());
  header.set_rank_token(assignment.rank_token());
  return header;
}

}  // namespace

Agent::~Agent() {
  AbortTask("the agent is shutting down");
  if (task_thread_.joinable()) task_thread_.join();
}

absl::StatusOr<v1::RegisterWorkerResponse> Agent::RegisterWithRetry() {
  absl::Time deadline = absl::Now() + options_.connect_timeout;
  absl::Duration backoff = absl::Milliseconds(50);
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
    backoff = std::min(backoff * 2, kMaxRegisterBackoff);
  }
}

absl::Status Agent::Run() {
  const uint64_t incarnation = options_.registration.incarnation();
  while (true) {
    auto registered = RegisterWithRetry();
    if (!registered.ok()) {
      AbortTask("the coordinator is unreachable");
      if (task_thread_.joinable()) task_thread_.detach();
      return registered.status();
    }
    const std::string& worker_id = registered->worker_id();
    SetLogTag(absl::StrCat("worker ", worker_id));
    auto session = control_->OpenSession(worker_id, incarnation);
    if (!session.ok()) {
      LogWarning("cannot open the session: ", session.status().message());
      absl::SleepFor(absl::Milliseconds(200));
      continue;
    }
    LogInfo("registered as ", worker_id, "; waiting for work");
    absl::Duration interval =
        absl::Milliseconds(registered->heartbeat_interval_ms());
    if (interval <= absl::ZeroDuration()) interval = absl::Seconds(5);
    std::shared_ptr<Session> shared(std::move(*session));
    {
      absl::MutexLock lock(&mu_);
      session_ = shared;
    }
    Serve(shared, interval);
    {
      absl::MutexLock lock(&mu_);
      session_.reset();
      if (preempted_) {
        // Preempt() closed the session on purpose; the process is exiting.
        return absl::CancelledError("preempted");
      }
    }
    // The coordinator went away or declared this worker failed. Whatever
    // generation was running is over; the training state stays in this
    // process for the next one.
    AbortTask("lost the session with the coordinator");
    LogWarning("lost the session with the coordinator; reconnecting");
  }
}

void Agent::Serve(std::shared_ptr<Session> session,
                  absl::Duration heartbeat_interval) {
  absl::Notification session_over;
  std::thread heartbeats([&] {
    do {
      v1::WorkerMessage message;
      v1::Heartbeat* beat = message.mutable_heartbeat();
      {
        absl::MutexLock lock(&mu_);
        if (task_ != nullptr) {
          beat->set_job_id(task_->assignment.job_id());
          beat->set_generation(task_->assignment.generation());
          beat->set_collective_seq(task_->collective_seq);
          for (double rate : task_->links.Rates()) beat->add_link_mbps(rate);
        }
      }
      if (!session->Send(message)) break;
    } while (!session_over.WaitForNotificationWithTimeout(heartbeat_interval));
  });

  v1::CoordinatorCommand command;
  while (session->Receive(&command)) {
    switch (command.kind_case()) {
      case v1::CoordinatorCommand::kAssignment:
        StartTask(command.assignment(), session);
        break;
      case v1::CoordinatorCommand::kStop: {
        absl::MutexLock lock(&mu_);
        if (task_ && task_->assignment.job_id() == command.stop().job_id()) {
          LogInfo(command.stop().preempt() ? "preemption" : "stop",
                  " requested: ", command.stop().reason());
          if (command.stop().preempt()) {
            task_->preempt_requested = true;
            task_->scheduler_preempt = true;
          } else {
            task_->stop_on_request = true;
          }
          task_->stop_requested = true;
        }
        break;
      }
      case v1::CoordinatorCommand::kResume: {
        absl::MutexLock lock(&mu_);
        const v1::Resume& resume = command.resume();
        if (task_ && task_->assignment.job_id() == resume.job_id() &&
            task_->assignment.generation() == resume.generation() &&
            task_->scheduler_preempt && !task_->stop_on_request &&
            !preempted_) {
          // Too late if this step's vote was cast: then every rank stops.
          LogInfo("the preemption of job ", resume.job_id(),
                  " was called off: training on unless the ranks already "
                  "agreed to stop");
          task_->scheduler_preempt = false;
          task_->preempt_requested = false;
          task_->stop_requested = false;
        }
        break;
      }
      case v1::CoordinatorCommand::kCommit: {
        absl::MutexLock lock(&mu_);
        const v1::CommitCheckpoint& commit = command.commit();
        if (task_ && task_->assignment.job_id() == commit.job_id() &&
            task_->assignment.generation() == commit.generation()) {
          task_->DeliverCommit(commit);
        }
        break;
      }
      case v1::CoordinatorCommand::kStandby:
        if (options_.standby) options_.standby(command.standby());
        break;
      case v1::CoordinatorCommand::kAbort: {
        const v1::Abort& abort = command.abort();
        bool current;
        {
          absl::MutexLock lock(&mu_);
          current = task_ && task_->assignment.job_id() == abort.job_id() &&
                    task_->assignment.generation() == abort.generation();
        }
        if (current) {
          AbortTask(absl::StrCat("generation ", abort.generation(),
                                 " aborted: ", abort.reason()));
        }
        break;
      }
      default:
        break;
    }
  }
  session_over.Notify();
  heartbeats.join();
  (void)session->Finish();
}

void Agent::StartTask(const v1::Assignment& assignment,
                      const std::shared_ptr<Session>& session) {
  // A previous generation's task may still be unwinding; make it quick.
  {
    absl::MutexLock lock(&mu_);
    if (preempted_) {
      // Leaving: the replica may be being saved (LeaveWhileIdle), and the
      // coordinator was told this worker is leaving.
      LogWarning("not starting generation ", assignment.generation(), " of ",
                 assignment.job_id(), ": this worker is leaving (SIGTERM)");
      return;
    }
    if (task_ != nullptr) task_->Abort();
  }
  if (task_thread_.joinable()) task_thread_.join();
  auto task = std::make_shared<TaskContext>();
  task->assignment = assignment;
  task->kv = control_->KeyValue(assignment.job_id(), assignment.generation(),
                                assignment.rank(), assignment.rank_token());
  task->host = options_.registration.host();
  task->metrics = options_.metrics;
  task->data_plane_encryption = options_.data_plane_encryption;
  task->data_plane_gloo = options_.data_plane_gloo;
  // The task holds the session too: it may outlive this session's loop.
  task->report = [session](const v1::ProgressReport& report) {
    v1::WorkerMessage message;
    *message.mutable_progress() = report;
    session->Send(message);
  };
  task->send = [session](const v1::WorkerMessage& message) {
    session->Send(message);
  };
  {
    absl::MutexLock lock(&mu_);
    task_ = task;
  }
  // Tells the coordinator at once that this worker joined the generation
  // (a rank that does not, say one whose previous task cannot unwind, is
  // named by the coordinator after its join timeout).
  v1::WorkerMessage joined;
  joined.mutable_heartbeat()->set_job_id(assignment.job_id());
  joined.mutable_heartbeat()->set_generation(assignment.generation());
  session->Send(joined);
  task_thread_ = std::thread([this, task, session] {
    v1::TaskResult result = RunIfPathsAllowed(*task);
    UploadExport(*task, result);
    UploadCheckpoint(*task, result);
    v1::WorkerMessage message;
    *message.mutable_result() = std::move(result);
    session->Send(message);
    task->MarkDone();
  });
}

void Agent::UploadExport(const TaskContext& task,
                         const v1::TaskResult& result) {
  const v1::Assignment& assignment = task.assignment;
  if (!assignment.upload_export() || !result.ok() || result.stopped() ||
      assignment.spec().export_path().empty()) {
    return;
  }
  const std::string& path = assignment.spec().export_path();
  v1::ArtifactUpload::Header header = UploadHeader(assignment);
  v1::ArtifactInfo* info = header.mutable_info();
  info->set_name("model");
  info->set_file_name(path.substr(path.rfind('/') + 1));
  info->set_format(assignment.spec().export_format().empty()
                       ? "archive"
                       : assignment.spec().export_format());
  info->set_step(result.steps());
  auto kept = control_->UploadArtifact(std::move(header), path, kUploadTimeout);
  if (kept.ok()) {
    LogInfo("job ", assignment.job_id(), ": the coordinator keeps its export ",
            path, " (", kept->bytes(), " bytes)");
  } else {
    LogWarning("job ", assignment.job_id(), ": the coordinator did not keep ",
               "its export ", path, ": ", kept.status().message());
  }
}

void Agent::UploadCheckpoint(const TaskContext& task,
                             const v1::TaskResult& result) {
  const v1::Assignment& assignment = task.assignment;
  const v1::CheckpointSpec& ckpt = assignment.spec().checkpoint();
  // A preempted job is not over: it goes on from this checkpoint.
  if (!assignment.upload_checkpoint() || !result.ok() || result.preempted() ||
      ckpt.backup_dir().empty()) {
    return;
  }
  const std::string& job = assignment.job_id();
  absl::Status uploaded = [&]() -> absl::Status {
    ASSIGN_OR_RETURN(
        checkpoint::Found found,
        checkpoint::FindNewest(ckpt.backup_dir(), [&](const std::string& name,
                                                      const absl::Status& why) {
          LogWarning("job ", job, ": checkpoint ", name,
                     " is not uploaded: ", why.message());
        }));
    const int64_t step = found.manifest.step();
    const std::string temp_dir = ckpt.backup_dir() + "/.tmp";
    RETURN_IF_ERROR(MakeDirectories(temp_dir));
    const std::string path = temp_dir + "/" + checkpoint::ArchiveName(step);
    absl::Status written = checkpoint::WriteArchive(found, path);
    v1::ArtifactUpload::Header header = UploadHeader(assignment);
    v1::ArtifactInfo* info = header.mutable_info();
    info->set_name("checkpoint");
    info->set_file_name(checkpoint::ArchiveName(step));
    info->set_format("checkpoint");
    info->set_step(step);
    absl::StatusOr<v1::ArtifactInfo> kept =
        written.ok()
            ? control_->UploadArtifact(std::move(header), path, kUploadTimeout)
            : absl::StatusOr<v1::ArtifactInfo>(written);
    std::remove(path.c_str());
    if (!kept.ok()) return kept.status();
    LogInfo("job ", job, ": the coordinator keeps its checkpoint ",
            checkpoint::CheckpointName(step), " (", kept->bytes(), " bytes)");
    return absl::OkStatus();
  }();
  if (!uploaded.ok()) {
    LogWarning("job ", job, ": the coordinator did not keep its checkpoint: ",
               uploaded.message());
  }
  // A job that succeeded removes its checkpoints here rather than in
  // TrainingGeneration::Finalize, which left them for this upload.
  if (!result.stopped() && !ckpt.keep_backups()) {
    absl::Status removed = checkpoint::RemoveAll(ckpt.backup_dir());
    if (!removed.ok()) {
      LogWarning("job ", job, ": could not remove the checkpoints after ",
                 "success: ", removed.message());
    }
  }
}

v1::TaskResult Agent::RunIfPathsAllowed(TaskContext& task) {
  const v1::Assignment& assignment = task.assignment;
  absl::Status allowed = options_.check_paths
                             ? options_.check_paths({assignment.job_id(),
                                                     assignment.submitted_by()},
                                                    assignment.spec())
                             : absl::OkStatus();
  if (allowed.ok()) return runner_(task);
  LogError("refusing job ", assignment.job_id(), ": ", allowed.message());
  v1::TaskResult result;
  result.set_job_id(assignment.job_id());
  result.set_generation(assignment.generation());
  result.set_rank(assignment.rank());
  result.set_ok(false);
  result.set_code(static_cast<int>(allowed.code()));
  result.set_error(absl::StrCat("worker ", task.host, " (rank ",
                                assignment.rank(),
                                ") refuses the job: ", allowed.message()));
  return result;
}

void Agent::Preempt(absl::Duration grace) {
  const absl::Time deadline = absl::Now() + grace;
  std::shared_ptr<TaskContext> task;
  std::shared_ptr<Session> session;
  {
    absl::MutexLock lock(&mu_);
    if (preempted_) return;
    preempted_ = true;
    task = task_;
    session = session_;
  }
  const bool running = task != nullptr && !task->aborted() &&
                       !task->WaitUntilDone(absl::ZeroDuration());
  if (running && session != nullptr) {
    LogInfo("SIGTERM: asking the coordinator to stop job ",
            task->assignment.job_id(), " at an agreed step",
            task->assignment.spec().checkpoint().backup_dir().empty()
                ? ""
                : " and save it");
    task->preempt_requested = true;
    task->stop_requested = true;
    v1::WorkerMessage message;
    message.mutable_preempt()->set_job_id(task->assignment.job_id());
    message.mutable_preempt()->set_reason(
        absl::StrCat("worker ", task->host, " (rank ", task->assignment.rank(),
                     ") received SIGTERM"));
    session->Send(message);
    if (!task->WaitUntilDone(grace)) {
      LogWarning("the job did not reach a saved step within ",
                 absl::FormatDuration(grace), "; exiting anyway");
    }
  } else if (task != nullptr) {
    LeaveWhileIdle(task, session, deadline);
  }
  if (session != nullptr) session->CloseWrites();
}

void Agent::LeaveWhileIdle(const std::shared_ptr<TaskContext>& task,
                           const std::shared_ptr<Session>& session,
                           absl::Time deadline) {
  const std::string& job_id = task->assignment.job_id();
  v1::WorkerMessage message;
  v1::PreemptRequest* request = message.mutable_preempt();
  request->set_job_id(job_id);
  request->set_reason(absl::StrCat("worker ", task->host,
                                   " received SIGTERM while no generation of "
                                   "job ",
                                   job_id, " ran on it"));
  // First: the coordinator gives this worker no rank from now on.
  if (session != nullptr) session->Send(message);
  // The aborted generation's task unwinds (bounded: an abort releases every
  // wait); only then is the replica this thread's to save.
  if (!task->WaitUntilDone(
          std::max(deadline - absl::Now(), absl::ZeroDuration()))) {
    LogWarning(
        "SIGTERM: the aborted generation did not end within the grace "
        "period; the live state it holds leaves with this process");
    request->set_live_state_done(true);
    request->set_note(
        "its aborted generation did not end within the grace period; the "
        "live state it held was not saved");
  } else if (save_live_state_ != nullptr) {
    LiveStateOutcome outcome = save_live_state_();
    request->set_live_state_done(true);
    request->set_live_step(outcome.step);
    request->set_saved_checkpoint(outcome.saved_as);
    request->set_saved_epoch(outcome.saved_epoch);
    request->set_saved_bytes(outcome.saved_bytes);
    request->set_note(outcome.note);
    if (!outcome.saved_as.empty()) {
      LogInfo("SIGTERM while job ", job_id,
              " was recovering: saved the live "
              "state at step ",
              outcome.step, " as ", outcome.saved_as);
    } else {
      LogInfo("SIGTERM while job ", job_id, " was recovering: ", outcome.note);
    }
  } else {
    return;
  }
  if (session != nullptr) session->Send(message);
}

void Agent::AbortTask(const std::string& why) {
  absl::MutexLock lock(&mu_);
  if (task_ == nullptr || task_->aborted()) return;
  LogWarning(why);
  task_->Abort();
}

}  // namespace lockstep::worker
