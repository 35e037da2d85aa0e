// The worker agent against an in-memory coordinator (FakeControlPlane):
// registration, the session's commands reaching the TaskContext, reconnects
// and preemption. Tasks are scripted runners; every wait is on an event.
#include "worker/agent.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "tests/fakes/fake_control_plane.h"

namespace lockstep::worker {
namespace {

using ::lockstep::fakes::FakeControlPlane;
using ::lockstep::fakes::FakeSession;
using ::lockstep::fakes::kEventTimeout;
using ::testing::HasSubstr;

constexpr uint64_t kIncarnation = 0x5eed;

// A TaskRunner the test drives. Each run records its TaskContext and thread,
// registers itself as the task's communicator (as the trainer registers
// its own, so TaskContext::Abort reaches it), and returns when the test
// releases it or the task is aborted.
class ScriptedTask : public SingleRankCommunicator {
 public:
  // Called on the task thread before the run blocks.
  std::function<void(TaskContext&)> on_start;

  TaskRunner Runner() {
    return [this](TaskContext& task) { return Run(task); };
  }

  // Waits until run number `run` (from 1) started; returns its context,
  // valid until the test releases that run or aborts it.
  TaskContext* WaitStarted(int run) {
    absl::MutexLock lock(&mu_);
    auto started = [&]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
      return static_cast<int>(contexts_.size()) >= run;
    };
    if (!mu_.AwaitWithTimeout(absl::Condition(&started), kEventTimeout)) {
      return nullptr;
    }
    return contexts_[run - 1];
  }
  // Waits until the running task was aborted.
  bool WaitAborted() {
    absl::MutexLock lock(&mu_);
    return mu_.AwaitWithTimeout(absl::Condition(&aborted_), kEventTimeout);
  }
  // Lets the running task return.
  void Release() {
    absl::MutexLock lock(&mu_);
    released_ = true;
  }
  // Lets every run, now and later, return at once.
  void ReleaseAll() {
    absl::MutexLock lock(&mu_);
    finished_ = true;
  }
  std::thread::id thread(int run) {
    absl::MutexLock lock(&mu_);
    return threads_.at(run - 1);
  }
  int runs() {
    absl::MutexLock lock(&mu_);
    return static_cast<int>(contexts_.size());
  }

  void Abort() override {
    absl::MutexLock lock(&mu_);
    aborted_ = true;
  }

 private:
  v1::TaskResult Run(TaskContext& task) {
    {
      absl::MutexLock lock(&mu_);
      aborted_ = released_ = false;
    }
    task.SetCommunicator(this);  // aborts at once if the task already was
    if (on_start) on_start(task);
    bool aborted;
    {
      absl::MutexLock lock(&mu_);
      contexts_.push_back(&task);
      threads_.push_back(std::this_thread::get_id());
      auto returns = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) {
        return aborted_ || released_ || finished_;
      };
      mu_.Await(absl::Condition(&returns));
      aborted = aborted_;
    }
    task.SetCommunicator(nullptr);
    v1::TaskResult result;
    result.set_job_id(task.assignment.job_id());
    result.set_generation(task.assignment.generation());
    result.set_rank(task.assignment.rank());
    result.set_ok(!aborted);
    if (aborted) result.set_code(static_cast<int>(absl::StatusCode::kAborted));
    result.set_stopped(task.stop_requested);
    result.set_preempted(task.preempt_requested);
    return result;
  }

  absl::Mutex mu_;
  std::vector<TaskContext*> contexts_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread::id> threads_ ABSL_GUARDED_BY(mu_);
  bool aborted_ ABSL_GUARDED_BY(mu_) = false;
  bool released_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

v1::CoordinatorCommand Assign(const std::string& job, int64_t generation,
                              int rank = 1, int world = 2) {
  v1::CoordinatorCommand command;
  v1::Assignment* assignment = command.mutable_assignment();
  assignment->set_job_id(job);
  assignment->set_generation(generation);
  assignment->set_rank(rank);
  assignment->set_world_size(world);
  return command;
}

v1::CoordinatorCommand StopCommand(const std::string& job, bool preempt) {
  v1::CoordinatorCommand command;
  command.mutable_stop()->set_job_id(job);
  command.mutable_stop()->set_reason("stop requested by the test");
  command.mutable_stop()->set_preempt(preempt);
  return command;
}

v1::CoordinatorCommand AbortCommand(const std::string& job,
                                    int64_t generation) {
  v1::CoordinatorCommand command;
  command.mutable_abort()->set_job_id(job);
  command.mutable_abort()->set_generation(generation);
  command.mutable_abort()->set_reason("a rank failed");
  return command;
}

v1::CoordinatorCommand CommitCommand(const std::string& job, int64_t generation,
                                     int64_t step) {
  v1::CoordinatorCommand command;
  command.mutable_commit()->set_job_id(job);
  command.mutable_commit()->set_generation(generation);
  command.mutable_commit()->set_step(step);
  return command;
}

// A message matcher: the task result of (job, generation).
std::function<bool(const v1::WorkerMessage&)> ResultOf(const std::string& job,
                                                       int64_t generation) {
  return [job, generation](const v1::WorkerMessage& m) {
    return m.has_result() && m.result().job_id() == job &&
           m.result().generation() == generation;
  };
}

class AgentTest : public ::testing::Test {
 protected:
  // Runs Agent::Run() on a thread of its own.
  void StartAgent(absl::Duration connect_timeout = kEventTimeout) {
    Agent::Options options;
    options.registration.mutable_task()->set_type("worker");
    options.registration.set_incarnation(kIncarnation);
    options.registration.set_host("10.0.0.7");
    options.connect_timeout = connect_timeout;
    options.check_paths = check_paths_;
    agent_ = std::make_unique<Agent>(&control_, task_.Runner(), options,
                                     save_live_state_);
    run_thread_ = std::thread([this] {
      run_thread_id_ = std::this_thread::get_id();
      run_status_ = agent_->Run();
      run_returned_.Notify();
    });
  }

  // Starts the agent and assigns generation `generation` of `job` down its
  // first session. Returns the session and the running task's context (null
  // when the task did not start).
  std::pair<std::shared_ptr<FakeSession>, TaskContext*> StartWithTask(
      const std::string& job, int64_t generation) {
    StartAgent();
    std::shared_ptr<FakeSession> session = control_.WaitForSession(0);
    if (session == nullptr) return {nullptr, nullptr};
    session->Push(Assign(job, generation));
    return {session, task_.WaitStarted(1)};
  }

  // Waits for Run() to return and says what it returned.
  absl::Status RunStatus() {
    if (!run_returned_.WaitForNotificationWithTimeout(kEventTimeout)) {
      return absl::DeadlineExceededError("Agent::Run() did not return");
    }
    return run_status_;
  }

  // Ends the agent the way the worker process does on SIGTERM (Preempt
  // closes the session, Run returns), or, should a test have left it
  // between sessions, by refusing its registration.
  void TearDown() override {
    if (agent_ == nullptr) return;
    task_.ReleaseAll();
    if (!run_returned_.HasBeenNotified()) {
      agent_->Preempt(absl::ZeroDuration());
    }
    if (!run_returned_.WaitForNotificationWithTimeout(kEventTimeout)) {
      control_.RefuseRegistrations(absl::FailedPreconditionError("test over"));
      control_.EndAllSessions(absl::UnavailableError("test over"));
    }
    run_thread_.join();
    agent_.reset();  // joins the task thread
  }

  FakeControlPlane control_;
  ScriptedTask task_;
  LiveStateSaver save_live_state_;  // set before StartAgent, or none
  // Set before StartAgent, or none.
  std::function<absl::Status(const ExportOwner&, const v1::JobSpec&)>
      check_paths_;
  std::unique_ptr<Agent> agent_;
  std::thread run_thread_;
  std::thread::id run_thread_id_;
  absl::Status run_status_;
  absl::Notification run_returned_;
};

TEST_F(AgentTest, RetriesRegistrationWhileTheCoordinatorIsUnavailable) {
  control_.ScriptUnavailable(2);
  StartAgent();
  std::shared_ptr<FakeSession> session = control_.WaitForSession(0);
  ASSERT_NE(session, nullptr);
  const auto registrations = control_.registrations();
  ASSERT_EQ(registrations.size(), 3u);
  for (const v1::RegisterWorkerRequest& request : registrations) {
    EXPECT_EQ(request.incarnation(), kIncarnation);
    EXPECT_EQ(request.host(), "10.0.0.7");
  }
  EXPECT_EQ(session->worker_id(), FakeControlPlane::kWorkerId);
  EXPECT_EQ(session->incarnation(), kIncarnation);
}

TEST_F(AgentTest, GivesUpWhenTheCoordinatorStaysUnreachable) {
  control_.ScriptUnavailable(1000);
  StartAgent(/*connect_timeout=*/absl::Milliseconds(100));
  absl::Status status = RunStatus();
  EXPECT_TRUE(absl::IsUnavailable(status)) << status;
  EXPECT_GE(control_.registrations().size(), 2u);
  EXPECT_EQ(control_.sessions_opened(), 0);
}

TEST_F(AgentTest, RefusedRegistrationEndsRunAtOnce) {
  control_.ScriptRegister(
      absl::InvalidArgumentError("worker:5 is not a training task"));
  StartAgent();
  absl::Status status = RunStatus();
  EXPECT_TRUE(absl::IsInvalidArgument(status)) << status;
  EXPECT_THAT(status.message(), HasSubstr("worker:5"));
  EXPECT_EQ(control_.registrations().size(), 1u);
}

TEST_F(AgentTest, RegistrationWaitsOutTheOldProcessesLiveSession) {
  // What a coordinator answers a restarted worker while the session of its
  // old process is still live: retried until that session ends.
  for (int i = 0; i < 3; ++i) {
    control_.ScriptRegister(absl::UnavailableError(
        "registered as worker:0, which already has a live session from "
        "ipv4:10.0.0.7:4000; register again then"));
  }
  StartAgent();
  ASSERT_NE(control_.WaitForSession(0), nullptr);
  EXPECT_EQ(control_.registrations().size(), 4u);
}

TEST_F(AgentTest, RefusedIdentityEndsRunAtOnce) {
  control_.ScriptRegister(absl::PermissionDeniedError(
      "worker \"worker/1\" may not call RegisterWorker: it registered as "
      "task worker:0"));
  StartAgent();
  absl::Status status = RunStatus();
  EXPECT_TRUE(absl::IsPermissionDenied(status)) << status;
  EXPECT_EQ(control_.registrations().size(), 1u);
  EXPECT_EQ(control_.sessions_opened(), 0);
}

TEST_F(AgentTest, SessionThatCannotOpenIsRetriedWithANewRegistration) {
  control_.FailNextOpenSession(absl::UnavailableError("connection reset"));
  StartAgent();
  ASSERT_NE(control_.WaitForSession(0), nullptr);
  EXPECT_EQ(control_.registrations().size(), 2u);
}

TEST_F(AgentTest, HeartbeatsCarryTheRunningTasksCollectiveSequence) {
  control_.SetHeartbeatInterval(absl::Milliseconds(1));
  task_.on_start = [](TaskContext& task) { task.collective_seq = 42; };
  StartAgent();
  std::shared_ptr<FakeSession> session = control_.WaitForSession(0);
  ASSERT_NE(session, nullptr);
  EXPECT_TRUE(session->messages().front().heartbeat().job_id().empty());
  session->Push(Assign("job-1", 3));
  auto beat = session->WaitForMessage([](const v1::WorkerMessage& m) {
    return m.has_heartbeat() && m.heartbeat().collective_seq() == 42;
  });
  ASSERT_TRUE(beat.has_value());
  EXPECT_EQ(beat->heartbeat().job_id(), "job-1");
  EXPECT_EQ(beat->heartbeat().generation(), 3);
}

TEST_F(AgentTest, AssignmentRunsOnATaskThreadAndItsResultIsSentUp) {
  StartAgent();
  std::shared_ptr<FakeSession> session = control_.WaitForSession(0);
  ASSERT_NE(session, nullptr);
  session->Push(Assign("job-1", 3, /*rank=*/1, /*world=*/2));
  TaskContext* context = task_.WaitStarted(1);
  ASSERT_NE(context, nullptr);
  EXPECT_EQ(context->assignment.job_id(), "job-1");
  EXPECT_EQ(context->assignment.rank(), 1);
  EXPECT_EQ(context->assignment.world_size(), 2);
  EXPECT_EQ(context->host, "10.0.0.7");
  EXPECT_NE(task_.thread(1), std::this_thread::get_id());
  EXPECT_NE(task_.thread(1), run_thread_id_);

  // The key-value store is the generation's.
  using Scope = std::pair<std::string, int64_t>;
  EXPECT_THAT(control_.kv_scopes(), ::testing::ElementsAre(Scope{"job-1", 3}));
  ASSERT_NE(context->kv, nullptr);
  ASSERT_TRUE(context->kv->Set("rank-1", "10.0.0.7:4000").ok());
  EXPECT_EQ(
      control_.Get("job-1", 3, "rank-1", absl::ZeroDuration(), nullptr).value(),
      "10.0.0.7:4000");

  // Progress and any other message go up the session.
  v1::ProgressReport progress;
  progress.set_job_id("job-1");
  progress.set_step(7);
  context->report(progress);
  v1::WorkerMessage prepared;
  prepared.mutable_prepared()->set_step(10);
  context->send(prepared);
  EXPECT_TRUE(session
                  ->WaitForMessage([](const v1::WorkerMessage& m) {
                    return m.has_progress() && m.progress().step() == 7;
                  })
                  .has_value());
  EXPECT_TRUE(session
                  ->WaitForMessage([](const v1::WorkerMessage& m) {
                    return m.has_prepared() && m.prepared().step() == 10;
                  })
                  .has_value());

  task_.Release();
  auto result = session->WaitForMessage(ResultOf("job-1", 3));
  ASSERT_TRUE(result.has_value());
  EXPECT_TRUE(result->result().ok());
  EXPECT_EQ(result->result().rank(), 1);
  EXPECT_FALSE(result->result().stopped());
}

TEST_F(AgentTest, AssignmentWhosePathsAreRefusedFailsWithoutRunning) {
  check_paths_ = [](const ExportOwner& owner, const v1::JobSpec& spec) {
    EXPECT_EQ(owner.job_id, "job-1");
    return spec.checkpoint().backup_dir() == "/etc"
               ? absl::PermissionDeniedError(
                     "checkpoint.backup_dir \"/etc\" is outside the roots")
               : absl::OkStatus();
  };
  StartAgent();
  std::shared_ptr<FakeSession> session = control_.WaitForSession(0);
  ASSERT_NE(session, nullptr);
  v1::CoordinatorCommand assign = Assign("job-1", 3);
  assign.mutable_assignment()
      ->mutable_spec()
      ->mutable_checkpoint()
      ->set_backup_dir("/etc");
  session->Push(assign);
  auto result = session->WaitForMessage(ResultOf("job-1", 3));
  ASSERT_TRUE(result.has_value());
  EXPECT_FALSE(result->result().ok());
  EXPECT_EQ(result->result().code(),
            static_cast<int>(absl::StatusCode::kPermissionDenied));
  EXPECT_THAT(result->result().error(),
              ::testing::HasSubstr("worker 10.0.0.7 (rank 1) refuses the job: "
                                   "checkpoint.backup_dir \"/etc\""));
  EXPECT_EQ(task_.runs(), 0);

  // The agent keeps serving: an allowed assignment runs.
  session->Push(Assign("job-1", 4));
  ASSERT_NE(task_.WaitStarted(1), nullptr);
}

v1::CoordinatorCommand ResumeCommand(const std::string& job,
                                     int64_t generation) {
  v1::CoordinatorCommand command;
  command.mutable_resume()->set_job_id(job);
  command.mutable_resume()->set_generation(generation);
  return command;
}

// Issue 52: the scheduler calls off its preemption before the ranks vote
// (the job it was for went away): the task trains on. A stop on request is
// never taken back so.
TEST_F(AgentTest, AResumeTakesBackOnlyTheSchedulersPreemption) {
  auto [session, context] = StartWithTask("job-1", 3);
  ASSERT_NE(context, nullptr);
  session->Push(StopCommand("job-1", /*preempt=*/true));
  ASSERT_TRUE(session->WaitUntilHandled());
  ASSERT_TRUE(context->preempt_requested);
  // Another generation's or job's Resume changes nothing.
  session->Push(ResumeCommand("job-1", 2));
  session->Push(ResumeCommand("job-2", 3));
  ASSERT_TRUE(session->WaitUntilHandled());
  EXPECT_TRUE(context->preempt_requested);
  session->Push(ResumeCommand("job-1", 3));
  ASSERT_TRUE(session->WaitUntilHandled());
  EXPECT_FALSE(context->preempt_requested);
  EXPECT_FALSE(context->stop_requested);

  session->Push(StopCommand("job-1", /*preempt=*/false));
  session->Push(StopCommand("job-1", /*preempt=*/true));
  session->Push(ResumeCommand("job-1", 3));
  ASSERT_TRUE(session->WaitUntilHandled());
  EXPECT_TRUE(context->stop_requested);
  EXPECT_TRUE(context->preempt_requested);
  task_.Release();
}

TEST_F(AgentTest, StopReachesTheTaskOfItsJobOnly) {
  auto [session, context] = StartWithTask("job-1", 3);
  ASSERT_NE(context, nullptr);

  session->Push(StopCommand("job-2", /*preempt=*/false));
  ASSERT_TRUE(session->WaitUntilHandled());
  EXPECT_FALSE(context->stop_requested);

  session->Push(StopCommand("job-1", /*preempt=*/false));
  ASSERT_TRUE(session->WaitUntilHandled());
  EXPECT_TRUE(context->stop_requested);
  EXPECT_FALSE(context->preempt_requested);

  session->Push(StopCommand("job-1", /*preempt=*/true));
  ASSERT_TRUE(session->WaitUntilHandled());
  EXPECT_TRUE(context->preempt_requested);
  EXPECT_FALSE(context->aborted());

  task_.Release();
  auto result = session->WaitForMessage(ResultOf("job-1", 3));
  ASSERT_TRUE(result.has_value());
  EXPECT_TRUE(result->result().stopped());
  EXPECT_TRUE(result->result().preempted());
}

TEST_F(AgentTest, AbortOfTheCurrentGenerationReachesTheCommunicator) {
  auto [session, context] = StartWithTask("job-1", 3);
  ASSERT_NE(context, nullptr);

  // An abort of an older generation is stale.
  session->Push(AbortCommand("job-1", 2));
  ASSERT_TRUE(session->WaitUntilHandled());
  EXPECT_FALSE(context->aborted());

  session->Push(AbortCommand("job-1", 3));
  ASSERT_TRUE(task_.WaitAborted());
  auto result = session->WaitForMessage(ResultOf("job-1", 3));
  ASSERT_TRUE(result.has_value());
  EXPECT_FALSE(result->result().ok());
  EXPECT_EQ(result->result().code(),
            static_cast<int>(absl::StatusCode::kAborted));

  // The process and its session stay: the next generation runs.
  session->Push(Assign("job-1", 4));
  ASSERT_NE(task_.WaitStarted(2), nullptr);
  EXPECT_EQ(control_.sessions_opened(), 1);
}

TEST_F(AgentTest, CommitReachesTheTaskOfItsGenerationOnly) {
  StartAgent();
  std::shared_ptr<FakeSession> session = control_.WaitForSession(0);
  ASSERT_NE(session, nullptr);
  session->Push(Assign("job-1", 3, /*rank=*/0));
  TaskContext* context = task_.WaitStarted(1);
  ASSERT_NE(context, nullptr);

  session->Push(CommitCommand("job-1", 2, 10));  // an older generation's
  session->Push(CommitCommand("job-2", 3, 10));  // another job's
  session->Push(CommitCommand("job-1", 3, 20));
  ASSERT_TRUE(session->WaitUntilHandled());
  auto commit = context->WaitForCommit(20, absl::ZeroDuration());
  ASSERT_TRUE(commit.ok()) << commit.status();
  EXPECT_EQ(commit->generation(), 3);
  EXPECT_TRUE(absl::IsDeadlineExceeded(
      context->WaitForCommit(10, absl::ZeroDuration()).status()));
}

TEST_F(AgentTest, NewAssignmentAbortsTheTaskOfTheGenerationBefore) {
  StartAgent();
  std::shared_ptr<FakeSession> session = control_.WaitForSession(0);
  ASSERT_NE(session, nullptr);
  session->Push(Assign("job-1", 3));
  ASSERT_NE(task_.WaitStarted(1), nullptr);
  session->Push(Assign("job-1", 4));
  TaskContext* next = task_.WaitStarted(2);
  ASSERT_NE(next, nullptr);
  EXPECT_EQ(next->assignment.generation(), 4);
  auto old = session->WaitForMessage(ResultOf("job-1", 3));
  ASSERT_TRUE(old.has_value());
  EXPECT_FALSE(old->result().ok());
}

TEST_F(AgentTest, LostSessionAbortsTheTaskAndReconnectsAsTheSameProcess) {
  StartAgent();
  std::shared_ptr<FakeSession> first = control_.WaitForSession(0);
  ASSERT_NE(first, nullptr);
  first->Push(Assign("job-1", 3));
  ASSERT_NE(task_.WaitStarted(1), nullptr);

  first->End(absl::UnavailableError("the coordinator restarted"));
  ASSERT_TRUE(task_.WaitAborted());
  std::shared_ptr<FakeSession> second = control_.WaitForSession(1);
  ASSERT_NE(second, nullptr);
  EXPECT_EQ(second->incarnation(), kIncarnation);
  EXPECT_EQ(second->worker_id(), first->worker_id());
  const auto registrations = control_.registrations();
  ASSERT_EQ(registrations.size(), 2u);
  EXPECT_EQ(registrations[1].incarnation(), kIncarnation);
  // The aborted generation's result is not reported on the new session.
  for (const v1::WorkerMessage& message : second->messages()) {
    EXPECT_FALSE(message.has_result()) << message.DebugString();
  }

  // The next generation runs in the same process.
  second->Push(Assign("job-1", 4));
  TaskContext* next = task_.WaitStarted(2);
  ASSERT_NE(next, nullptr);
  EXPECT_EQ(next->assignment.generation(), 4);
  EXPECT_EQ(task_.runs(), 2);
}

TEST_F(AgentTest, PreemptAsksForAnAgreedStopAndWaitsForTheTask) {
  StartAgent();
  std::shared_ptr<FakeSession> session = control_.WaitForSession(0);
  ASSERT_NE(session, nullptr);
  session->Push(Assign("job-1", 3, /*rank=*/1));
  TaskContext* context = task_.WaitStarted(1);
  ASSERT_NE(context, nullptr);

  absl::Notification preempted;
  std::thread sigterm([&] {
    agent_->Preempt(kEventTimeout);
    preempted.Notify();
  });
  auto request = session->WaitForMessage(
      [](const v1::WorkerMessage& m) { return m.has_preempt(); });
  ASSERT_TRUE(request.has_value());
  EXPECT_EQ(request->preempt().job_id(), "job-1");
  EXPECT_THAT(request->preempt().reason(),
              ::testing::AllOf(HasSubstr("10.0.0.7"), HasSubstr("rank 1"),
                               HasSubstr("SIGTERM")));
  EXPECT_TRUE(context->preempt_requested);
  EXPECT_TRUE(context->stop_requested);
  EXPECT_FALSE(session->writes_closed());  // still waiting for the task

  task_.Release();  // the ranks reached the agreed step
  sigterm.join();
  EXPECT_TRUE(preempted.HasBeenNotified());
  EXPECT_TRUE(session->writes_closed());
  auto result =
      session->WaitForMessage(ResultOf("job-1", 3), absl::ZeroDuration());
  ASSERT_TRUE(result.has_value()) << "the result was sent before closing";
  EXPECT_TRUE(result->result().preempted());
  EXPECT_TRUE(absl::IsCancelled(RunStatus()));
}

TEST_F(AgentTest, PreemptWithoutATaskClosesTheSessionAtOnce) {
  StartAgent();
  std::shared_ptr<FakeSession> session = control_.WaitForSession(0);
  ASSERT_NE(session, nullptr);
  agent_->Preempt(absl::InfiniteDuration());  // returns: nothing to wait for
  EXPECT_TRUE(session->writes_closed());
  for (const v1::WorkerMessage& message : session->messages()) {
    EXPECT_FALSE(message.has_preempt());
  }
  EXPECT_TRUE(absl::IsCancelled(RunStatus()));
  EXPECT_EQ(control_.registrations().size(), 1u);  // no reconnect
}

TEST_F(AgentTest, PreemptGivesUpOnATaskThatOutlastsTheGrace) {
  StartAgent();
  std::shared_ptr<FakeSession> session = control_.WaitForSession(0);
  ASSERT_NE(session, nullptr);
  session->Push(Assign("job-1", 3));
  ASSERT_NE(task_.WaitStarted(1), nullptr);
  agent_->Preempt(absl::Milliseconds(20));  // the task is never released
  EXPECT_TRUE(session->writes_closed());
  EXPECT_TRUE(absl::IsCancelled(RunStatus()));
  EXPECT_FALSE(
      session->WaitForMessage(ResultOf("job-1", 3), absl::ZeroDuration())
          .has_value());
}

// SIGTERM while the job is recovering: this worker's generation was aborted,
// nothing runs. The agent says it is leaving, starts no new task, saves the
// live state through the runner and reports what became of it.
TEST_F(AgentTest, PreemptWhileRecoveringSavesTheLiveStateAndSaysSo) {
  std::shared_ptr<FakeSession> session;
  int runs_during_save = -1;
  bool told_leaving_before_save = false;
  save_live_state_ = [&] {
    told_leaving_before_save =
        session
            ->WaitForMessage(
                [](const v1::WorkerMessage& m) { return m.has_preempt(); },
                absl::ZeroDuration())
            .has_value();
    // The coordinator, not yet aware, assigns the next generation.
    session->Push(Assign("job-1", 4));
    session->WaitUntilHandled(kEventTimeout);
    runs_during_save = task_.runs();
    LiveStateOutcome outcome;
    outcome.step = 42;
    outcome.saved_as = "ckpt-000000042";
    outcome.saved_epoch = 1;
    outcome.saved_bytes = 4096;
    return outcome;
  };
  StartAgent();
  session = control_.WaitForSession(0);
  ASSERT_NE(session, nullptr);
  session->Push(Assign("job-1", 3));
  ASSERT_NE(task_.WaitStarted(1), nullptr);
  session->Push(AbortCommand("job-1", 3));
  ASSERT_TRUE(session->WaitForMessage(ResultOf("job-1", 3)).has_value());

  agent_->Preempt(kEventTimeout);
  EXPECT_TRUE(told_leaving_before_save);
  EXPECT_EQ(runs_during_save, 1);  // generation 4 was not started
  std::vector<v1::PreemptRequest> requests;
  for (const v1::WorkerMessage& message : session->messages()) {
    if (message.has_preempt()) requests.push_back(message.preempt());
  }
  ASSERT_EQ(requests.size(), 2u);
  EXPECT_FALSE(requests[0].live_state_done());
  EXPECT_THAT(requests[0].reason(),
              ::testing::AllOf(HasSubstr("SIGTERM"),
                               HasSubstr("no generation of job job-1")));
  EXPECT_TRUE(requests[1].live_state_done());
  EXPECT_EQ(requests[1].job_id(), "job-1");
  EXPECT_EQ(requests[1].live_step(), 42);
  EXPECT_EQ(requests[1].saved_checkpoint(), "ckpt-000000042");
  EXPECT_EQ(requests[1].saved_bytes(), 4096);
  EXPECT_TRUE(session->writes_closed());
  EXPECT_TRUE(absl::IsCancelled(RunStatus()));
}

// A worker that never trained has nothing to save: no live-state report.
TEST_F(AgentTest, PreemptBeforeAnyTaskSavesNothing) {
  bool called = false;
  save_live_state_ = [&] {
    called = true;
    return LiveStateOutcome();
  };
  StartAgent();
  std::shared_ptr<FakeSession> session = control_.WaitForSession(0);
  ASSERT_NE(session, nullptr);
  agent_->Preempt(kEventTimeout);
  EXPECT_FALSE(called);
  EXPECT_TRUE(session->writes_closed());
}

}  // namespace
}  // namespace lockstep::worker
