// The Coordinator unit tests' shared fixture: a fake session sink, a fake
// clock, and builders for the messages workers send.
#ifndef LOCKSTEP_TESTS_UNIT_COORDINATOR_FIXTURE_H_
#define LOCKSTEP_TESTS_UNIT_COORDINATOR_FIXTURE_H_

#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/caller.h"
#include "common/clock.h"
#include "coordinator/coordinator.h"
#include "tests/unit/fake_sink.h"

namespace lockstep::coordinator {

// A caller of a coordinator running --insecure: allowed everything.
inline Caller Anyone() {
  Caller caller;
  caller.role = Role::kInsecure;
  caller.id = "--insecure";
  return caller;
}

// The caller whose client certificate names `spiffe_id`, at `peer`.
inline Caller Identity(const std::string& spiffe_id,
                       const std::string& peer = "ipv4:10.0.0.9:40000") {
  Caller caller = ParseIdentity(spiffe_id);
  caller.peer = peer;
  return caller;
}

inline v1::RegisterWorkerRequest Free(uint64_t incarnation) {
  v1::RegisterWorkerRequest request;
  request.set_incarnation(incarnation);
  request.set_host("127.0.0.1");
  return request;
}

// A GPU device as a worker reports it: GPU `index` of those it sees, with
// `uuid` naming the physical GPU.
inline v1::Device Gpu(int index, const std::string& uuid) {
  v1::Device device;
  device.set_name(absl::StrFormat("cuda:%d", index));
  device.set_gpu_name("NVIDIA H200");
  device.set_gpu_uuid(uuid);
  return device;
}

inline v1::JobSpec Spec(int workers) {
  v1::JobSpec spec;
  spec.set_name("test");
  spec.set_global_batch_size(64);
  spec.set_num_workers(workers);
  return spec;
}

// A job that saves checkpoints: the coordinator accepts commits and saved
// live state only for such a job.
inline v1::JobSpec SavingSpec(int workers) {
  v1::JobSpec spec = Spec(workers);
  spec.mutable_checkpoint()->set_backup_dir("/tmp/lockstep-test-backup");
  return spec;
}

// The chief's progress report of `step` of `total_steps`.
inline v1::WorkerMessage Progress(const std::string& job, int64_t generation,
                                  int64_t step, int64_t total_steps) {
  v1::WorkerMessage message;
  v1::ProgressReport* progress = message.mutable_progress();
  progress->set_job_id(job);
  progress->set_generation(generation);
  progress->set_step(step);
  progress->set_total_steps(total_steps);
  return message;
}

// Rank `rank`'s successful result at `steps` with `digest`.
inline v1::WorkerMessage OkResult(const std::string& job, int64_t generation,
                                  int rank, int64_t steps,
                                  const std::string& digest) {
  v1::WorkerMessage message;
  v1::TaskResult* result = message.mutable_result();
  result->set_job_id(job);
  result->set_generation(generation);
  result->set_rank(rank);
  result->set_ok(true);
  result->set_steps(steps);
  result->set_model_digest(digest);
  return message;
}

// ---- the tests' synchronous forms of the coordinator's waits and lists ----
// The coordinator itself has none: nothing of it blocks a thread, and its
// waits time out on the injected clock.

// A wait's result: at once when it can complete at once (the key is set,
// every rank arrived, the call was refused or fenced); otherwise `clock`
// moves to the wait's deadline and a Sweep times it out.
inline absl::StatusOr<std::string> KvGetOn(Coordinator& coordinator,
                                           FakeClock& clock,
                                           const Caller& caller,
                                           const v1::KvGetRequest& request) {
  std::optional<absl::StatusOr<std::string>> result;
  coordinator.KvGetAsync(
      caller, request,
      [&result](absl::StatusOr<std::string> got) { result = std::move(got); });
  if (!result.has_value()) {
    clock.Advance(absl::Milliseconds(request.timeout_ms()));
    coordinator.Sweep();
  }
  if (!result.has_value()) {
    return absl::InternalError("the KvGet wait never completed");
  }
  return *std::move(result);
}

// The job named (one element), or every job newest first when `job_id` is
// empty, each with its full record: through the paged GetJobStatus.
inline absl::StatusOr<std::vector<v1::JobStatus>> JobsOn(
    Coordinator& coordinator, const std::string& job_id, bool include_history) {
  std::vector<std::string> ids;
  if (!job_id.empty()) {
    ids.push_back(job_id);
  } else {
    v1::GetJobStatusRequest request;
    do {
      auto page = coordinator.GetJobStatus(request);
      if (!page.ok()) return page.status();
      for (const v1::JobStatus& job : page->jobs()) ids.push_back(job.job_id());
      request.set_page_token(page->next_page_token());
    } while (!request.page_token().empty());
  }
  std::vector<v1::JobStatus> jobs;
  for (const std::string& id : ids) {
    v1::GetJobStatusRequest request;
    request.set_job_id(id);
    request.set_include_history(include_history);
    auto one = coordinator.GetJobStatus(request);
    if (!one.ok()) return one.status();
    v1::JobStatus job = one->jobs(0);
    // The rest of the loss history, page by page.
    while (include_history && job.step_losses_size() < job.history_size()) {
      request.set_history_offset(job.step_losses_size());
      auto page = coordinator.GetJobStatus(request);
      if (!page.ok()) return page.status();
      if (page->jobs(0).step_losses().empty()) break;
      for (float loss : page->jobs(0).step_losses()) job.add_step_losses(loss);
    }
    jobs.push_back(std::move(job));
  }
  return jobs;
}

// Every worker, in id order: through the paged ListWorkers.
inline std::vector<v1::WorkerInfo> WorkersOn(Coordinator& coordinator) {
  std::vector<v1::WorkerInfo> workers;
  v1::ListWorkersRequest request;
  do {
    auto page = coordinator.ListWorkers(request);
    if (!page.ok()) {
      ADD_FAILURE() << page.status();
      break;
    }
    for (const v1::WorkerInfo& worker : page->workers()) {
      workers.push_back(worker);
    }
    request.set_page_token(page->next_page_token());
  } while (!request.page_token().empty());
  return workers;
}

class CoordinatorTest : public ::testing::Test {
 protected:
  void Make(std::optional<v1::ClusterSpec> cluster = std::nullopt,
            std::unique_ptr<JobStore> store = nullptr) {
    Coordinator::Options options;
    options.cluster = std::move(cluster);
    options.clock = &clock_;
    options.heartbeat_timeout = absl::Seconds(10);
    options.error_grace = absl::Seconds(1);
    options.stall_after = absl::Seconds(3);
    options.store = std::move(store);
    if (configure_) configure_(options);
    auto created = Coordinator::Create(std::move(options));
    ASSERT_TRUE(created.ok()) << created.status();
    coordinator_ = *std::move(created);
  }

  // Registers a free worker (on the CPU unless `device` says otherwise) and
  // opens its session.
  std::string Connect(uint64_t incarnation, FakeSink* sink,
                      const v1::Device& device = v1::Device()) {
    v1::RegisterWorkerRequest request = Free(incarnation);
    *request.mutable_device() = device;
    return Connect(request, sink);
  }
  // Registers the worker `request` describes (a spare, labels...) and
  // opens its session; returns its id.
  std::string Connect(const v1::RegisterWorkerRequest& request,
                      FakeSink* sink) {
    sinks_.push_back(sink);
    auto registered = coordinator_->RegisterWorker(Anyone(), request);
    EXPECT_TRUE(registered.ok()) << registered.status();
    if (!registered.ok()) return "";
    EXPECT_TRUE(coordinator_
                    ->OpenSession(Anyone(), registered->worker_id(),
                                  request.incarnation(), sink)
                    .ok());
    return registered->worker_id();
  }

  // A heartbeat from worker `id` in generation 1 of `job`, `seq`
  // collectives in.
  void Beat(const std::string& id, const std::string& job, int64_t seq) {
    v1::WorkerMessage message;
    message.mutable_heartbeat()->set_job_id(job);
    message.mutable_heartbeat()->set_generation(1);
    message.mutable_heartbeat()->set_collective_seq(seq);
    ASSERT_TRUE(coordinator_->HandleWorkerMessage(id, message).ok());
  }

  // Registers worker:`index` of a static cluster and opens its session.
  void ConnectTask(int index, uint64_t incarnation, FakeSink* sink) {
    v1::RegisterWorkerRequest request = Free(incarnation);
    request.mutable_task()->set_type("worker");
    request.mutable_task()->set_index(index);
    sinks_.push_back(sink);
    auto id = coordinator_->RegisterWorker(Anyone(), request);
    ASSERT_TRUE(id.ok()) << id.status();
    ASSERT_TRUE(
        coordinator_->OpenSession(Anyone(), id->worker_id(), incarnation, sink)
            .ok());
  }

  v1::JobStatus Status(const std::string& job) {
    auto jobs = JobsOn(*coordinator_, job, /*include_history=*/true);
    EXPECT_TRUE(jobs.ok()) << jobs.status();
    return jobs.ok() ? (*jobs)[0] : v1::JobStatus();
  }
  // The synchronous waits and lists above, on this fixture's clock.
  absl::StatusOr<std::string> KvGet(const Caller& caller,
                                    const v1::KvGetRequest& request) {
    return KvGetOn(*coordinator_, clock_, caller, request);
  }
  absl::StatusOr<std::vector<v1::JobStatus>> GetJobStatus(
      const std::string& job_id, bool include_history) {
    return JobsOn(*coordinator_, job_id, include_history);
  }
  std::vector<v1::WorkerInfo> ListWorkers() { return WorkersOn(*coordinator_); }

  // The assignment of rank `rank` (any rank: -1) of the job's generation,
  // found in the sinks Connect saw; null when none was sent.
  const v1::Assignment* AssignmentOf(const std::string& job_id,
                                     int64_t generation, int rank = -1) const {
    for (const FakeSink* sink : sinks_) {
      for (const v1::CoordinatorCommand& command : sink->commands) {
        const v1::Assignment& a = command.assignment();
        if (command.has_assignment() && a.job_id() == job_id &&
            a.generation() == generation && (rank < 0 || a.rank() == rank)) {
          return &a;
        }
      }
    }
    return nullptr;
  }

  // The rank_token of rank `rank`'s assignment ("" when none was sent).
  std::string TokenOf(const std::string& job_id, int64_t generation,
                      int rank) const {
    const v1::Assignment* a = AssignmentOf(job_id, generation, rank);
    return a == nullptr ? "" : a->rank_token();
  }

  // `request` as its key's owner sends it (a rank's number, or one after
  // the last "/": that rank, any other key: rank 0), with the rank and token
  // of the owner's assignment for that job and generation; unchanged when
  // no such assignment was sent.
  v1::KvSetRequest Signed(v1::KvSetRequest request) const {
    const v1::Assignment* any =
        AssignmentOf(request.job_id(), request.generation());
    if (any == nullptr) return request;
    int owner = 0;
    const std::string last = request.key().substr(request.key().rfind('/') + 1);
    if (!absl::SimpleAtoi(last, &owner) || owner < 0 ||
        owner >= any->world_size() || absl::StrCat(owner) != last) {
      owner = 0;
    }
    const v1::Assignment* own =
        AssignmentOf(request.job_id(), request.generation(), owner);
    if (own == nullptr) return request;
    request.set_rank(owner);
    request.set_rank_token(own->rank_token());
    return request;
  }

  FakeClock clock_;
  // Set before Make() to change more options (caps, retention).
  std::function<void(Coordinator::Options&)> configure_;
  std::unique_ptr<Coordinator> coordinator_;
  // Every sink Connect and ConnectTask opened a session with.
  std::vector<FakeSink*> sinks_;
};

// A rank's CheckpointPrepared for `step`, with one file named after the rank.
inline v1::WorkerMessage Prepared(const std::string& job, int64_t generation,
                                  int rank, int64_t step, bool ok = true,
                                  const std::string& error = "") {
  v1::WorkerMessage message;
  v1::CheckpointPrepared* prepared = message.mutable_prepared();
  prepared->set_job_id(job);
  prepared->set_generation(generation);
  prepared->set_rank(rank);
  prepared->set_step(step);
  prepared->set_ok(ok);
  prepared->set_error(error);
  if (ok) {
    prepared->set_dir(
        absl::StrFormat(".tmp/worker-%05d/ckpt-%09d", rank, step));
    v1::CheckpointFile* file = prepared->add_files();
    file->set_name(absl::StrFormat("rank-%05d.state", rank));
    file->set_size(100 + rank);
    file->set_sha256(std::string(64, 'a' + rank));
  }
  return message;
}

inline v1::WorkerMessage Committed(const std::string& job, int64_t generation,
                                   int64_t step, bool ok = true) {
  v1::WorkerMessage message;
  v1::CheckpointCommitted* committed = message.mutable_committed();
  committed->set_job_id(job);
  committed->set_generation(generation);
  committed->set_step(step);
  committed->set_ok(ok);
  committed->set_name(absl::StrFormat("ckpt-%09d", step));
  committed->set_epoch(1);
  committed->set_bytes(4096);
  if (!ok) committed->set_error("rename failed");
  return message;
}

inline v1::WorkerMessage Preempt(const std::string& job,
                                 const std::string& reason) {
  v1::WorkerMessage message;
  message.mutable_preempt()->set_job_id(job);
  message.mutable_preempt()->set_reason(reason);
  return message;
}

// The live-state report of a leaving worker.
inline v1::WorkerMessage LiveState(const std::string& job, int64_t step,
                                   const std::string& saved,
                                   const std::string& note) {
  v1::WorkerMessage message = Preempt(job, "SIGTERM while recovering");
  message.mutable_preempt()->set_live_state_done(true);
  message.mutable_preempt()->set_live_step(step);
  message.mutable_preempt()->set_saved_checkpoint(saved);
  message.mutable_preempt()->set_saved_epoch(0);
  message.mutable_preempt()->set_saved_bytes(5000);
  message.mutable_preempt()->set_note(note);
  return message;
}

// An ok TaskResult of a rank that stopped for a preemption.
inline v1::WorkerMessage PreemptedResult(const std::string& job,
                                         int64_t generation, int rank) {
  v1::WorkerMessage message;
  v1::TaskResult* result = message.mutable_result();
  result->set_job_id(job);
  result->set_generation(generation);
  result->set_rank(rank);
  result->set_ok(true);
  result->set_steps(120);
  result->set_stopped(true);
  result->set_preempted(true);
  return message;
}

// An ok TaskResult of a rank of generation 1 that stopped on request after
// step 120.
inline v1::WorkerMessage StoppedResult(const std::string& job, int rank) {
  v1::WorkerMessage message = PreemptedResult(job, 1, rank);
  message.mutable_result()->set_preempted(false);
  return message;
}

// The commands of one kind a sink received.
inline std::vector<v1::CoordinatorCommand> CommandsOf(
    const FakeSink& sink, v1::CoordinatorCommand::KindCase kind) {
  std::vector<v1::CoordinatorCommand> out;
  for (const v1::CoordinatorCommand& command : sink.commands) {
    if (command.kind_case() == kind) out.push_back(command);
  }
  return out;
}

// The job each sink was last assigned to ("" if none).
inline std::string AssignedJob(const FakeSink& sink) {
  auto assignments = CommandsOf(sink, v1::CoordinatorCommand::kAssignment);
  return assignments.empty() ? "" : assignments.back().assignment().job_id();
}

// Every rank of generation `generation` of `job` reports success at `steps`.
inline void Succeed(Coordinator& coordinator, const v1::JobStatus& status,
                    int64_t steps) {
  for (const v1::RankResult& rank : status.ranks()) {
    ASSERT_TRUE(
        coordinator
            .HandleWorkerMessage(rank.worker_id(),
                                 OkResult(status.job_id(), status.generation(),
                                          rank.rank(), steps, "digest"))
            .ok());
  }
}

// A job of priority 10 (an admin's, in these tests) needing `workers`.
inline v1::JobSpec Urgent(int workers) {
  v1::JobSpec spec = Spec(workers);
  spec.set_name("urgent");
  spec.set_priority(10);
  return spec;
}

inline std::vector<v1::JobEvent> EventsOf(const v1::JobStatus& status,
                                          const std::string& kind) {
  std::vector<v1::JobEvent> out;
  for (const v1::JobEvent& event : status.events()) {
    if (event.kind() == kind) out.push_back(event);
  }
  return out;
}

}  // namespace lockstep::coordinator

#endif  // LOCKSTEP_TESTS_UNIT_COORDINATOR_FIXTURE_H_
