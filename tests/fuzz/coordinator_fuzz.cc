// Fuzz target: the coordinator's logic driven by a random sequence of what
// workers and clients can send it (no gRPC): registrations, sessions opened
// and closed, every kind of WorkerMessage with fuzzed fields, job
// submissions and stops, key-value calls that never wait
// (timeout 0), status queries, and a fake clock advanced between Sweep()s.
// Messages are either protobuf-decoded from fuzz bytes or built from the
// jobs and generations the coordinator has announced, so that fuzzed values
// reach the handlers behind the fencing checks.
#include <fuzzer/FuzzedDataProvider.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/time/time.h"
#include "checkpoint/store.h"
#include "common/caller.h"
#include "common/clock.h"
#include "coordinator/coordinator.h"
#include "coordinator/session_sink.h"
#include "google/protobuf/descriptor.h"
#include "google/protobuf/message.h"

namespace lockstep::coordinator {
namespace {

// A worker's session stream: remembers the jobs and generations it was
// assigned, which later messages then name.
class Sink : public SessionSink {
 public:
  void Send(const v1::CoordinatorCommand& command) override {
    if (command.has_assignment()) {
      job_id = command.assignment().job_id();
      generation = command.assignment().generation();
      rank = command.assignment().rank();
    }
  }
  void Close() override { closed = true; }
  std::string job_id;
  int64_t generation = 0;
  int rank = 0;
  bool closed = false;
};

constexpr int kSinks = 4;

class Driver {
 public:
  explicit Driver(FuzzedDataProvider& in) : in_(in) {}

  bool Start() {
    Coordinator::Options options;
    if (in_.ConsumeBool()) options.cluster = StaticCluster();
    options.clock = &clock_;
    options.heartbeat_timeout = absl::Seconds(10);
    options.error_grace = absl::Seconds(1);
    options.stall_after = absl::Seconds(3);
    auto created = Coordinator::Create(std::move(options));
    if (!created.ok()) return false;
    coordinator_ = *std::move(created);
    return true;
  }

  // Who makes the next call: mostly anyone (--insecure), else one of a few
  // identities, so the authorization checks run under the fuzzer too.
  Caller Who() {
    static constexpr const char* kIds[] = {
        "spiffe://lockstep/worker/worker/0", "spiffe://lockstep/worker/pool",
        "spiffe://lockstep/viewer/v", "spiffe://lockstep/operator/o", ""};
    int pick = in_.ConsumeIntegralInRange(0, 7);
    if (pick >= 5) {
      Caller caller;
      caller.role = Role::kInsecure;
      return caller;
    }
    Caller caller = ParseIdentity(kIds[pick]);
    caller.peer = "ipv4:127.0.0.1:1";
    return caller;
  }

  void Step() {
    switch (in_.ConsumeIntegralInRange(0, 12)) {
      case 0:
        Register();
        break;
      case 1: {
        int s = SinkIndex();
        (void)coordinator_->OpenSession(Who(), WorkerId(), Incarnation(),
                                        &sinks_[s]);
        break;
      }
      case 2: {
        int s = SinkIndex();
        coordinator_->CloseSession(WorkerId(), Incarnation(), &sinks_[s],
                                   absl::UnavailableError("fuzz"));
        break;
      }
      case 3:
      case 4:
      case 5:
        (void)coordinator_->HandleWorkerMessage(WorkerId(), Message());
        break;
      case 6:
        Submit();
        break;
      case 7:
        Kv();
        break;
      case 8:
        (void)coordinator_->StopJob(JobId());
        break;
      case 9: {
        v1::GetJobStatusRequest request;
        if (in_.ConsumeBool()) request.set_job_id(JobId());
        request.set_include_history(in_.ConsumeBool());
        request.set_page_size(in_.ConsumeIntegralInRange(-1, 3));
        (void)coordinator_->GetJobStatus(request);
        (void)coordinator_->ListWorkers(v1::ListWorkersRequest());
        v1::ListQueueRequest queue;
        queue.set_page_size(in_.ConsumeIntegralInRange(-1, 3));
        (void)coordinator_->ListQueue(queue);
        break;
      }
      case 10: {
        // A watch that sees the job's changes until it is dropped.
        auto id = coordinator_->WatchJob(
            JobId(),
            [](absl::StatusOr<std::shared_ptr<const v1::JobStatus>>) {});
        if (id.ok()) watches_.push_back(*id);
        if (!watches_.empty() && in_.ConsumeBool()) {
          coordinator_->Unwatch(watches_.back());
          watches_.pop_back();
        }
        break;
      }
      default:
        clock_.Advance(
            absl::Milliseconds(in_.ConsumeIntegralInRange<int64_t>(0, 15000)));
        coordinator_->Sweep();
        break;
    }
  }

  void Finish() { coordinator_->Shutdown(); }

 private:
  static v1::ClusterSpec StaticCluster() {
    v1::ClusterSpec cluster;
    auto& tasks = *cluster.mutable_tasks();
    tasks["chief"].add_addresses("c:1");
    tasks["worker"].add_addresses("w0:1");
    tasks["worker"].add_addresses("w1:1");
    tasks["spare"].add_addresses("s:1");
    return cluster;
  }

  std::string Text(size_t max) { return in_.ConsumeRandomLengthString(max); }
  uint64_t Incarnation() { return in_.ConsumeIntegralInRange<uint64_t>(1, 4); }
  int SinkIndex() { return in_.ConsumeIntegralInRange(0, kSinks - 1); }

  std::string WorkerId() {
    if (worker_ids_.empty() || in_.ConsumeIntegralInRange(0, 15) == 0) {
      return Text(12);
    }
    return worker_ids_[in_.ConsumeIntegralInRange<size_t>(
        0, worker_ids_.size() - 1)];
  }

  std::string JobId() {
    if (job_ids_.empty() || in_.ConsumeIntegralInRange(0, 15) == 0) {
      return Text(12);
    }
    return job_ids_[in_.ConsumeIntegralInRange<size_t>(0, job_ids_.size() - 1)];
  }

  // A generation someone was assigned (or a near miss of it).
  const Sink& SomeSink() { return sinks_[SinkIndex()]; }
  int64_t Generation(const Sink& sink) {
    return sink.generation + in_.ConsumeIntegralInRange<int64_t>(-1, 1) *
                                 (in_.ConsumeIntegralInRange(0, 3) == 0);
  }

  void Register() {
    v1::RegisterWorkerRequest request;
    request.set_incarnation(Incarnation());
    request.set_host(in_.ConsumeBool() ? "127.0.0.1" : Text(16));
    if (in_.ConsumeBool()) {
      static const char* const kTypes[] = {"chief", "worker", "spare", "ps",
                                           ""};
      request.mutable_task()->set_type(
          kTypes[in_.ConsumeIntegralInRange(0, 4)]);
      request.mutable_task()->set_index(in_.ConsumeIntegralInRange(-1, 2));
    }
    if (in_.ConsumeBool()) {
      request.mutable_device()->set_name(in_.ConsumeBool() ? "cuda:0"
                                                           : Text(8));
      request.mutable_device()->set_gpu_uuid(Text(8));
    }
    request.set_spare(in_.ConsumeIntegralInRange(0, 3) == 0);
    if (in_.ConsumeIntegralInRange(0, 7) == 0) {
      (void)request.mutable_cluster()->ParseFromString(Text(64));
    }
    auto response = coordinator_->RegisterWorker(Who(), request);
    if (!response.ok()) return;
    worker_ids_.push_back(response->worker_id());
    if (in_.ConsumeBool()) {
      (void)coordinator_->OpenSession(Who(), response->worker_id(),
                                      request.incarnation(),
                                      &sinks_[SinkIndex()]);
    }
  }

  void Submit() {
    v1::JobSpec spec;
    if (in_.ConsumeIntegralInRange(0, 3) == 0) {
      (void)spec.ParseFromString(Text(128));
    } else {
      spec.set_name(in_.ConsumeBool() ? "fuzz" : Text(12));
      spec.set_num_workers(in_.ConsumeIntegralInRange(0, 4));
      if (in_.ConsumeBool()) {
        spec.set_min_workers(in_.ConsumeIntegralInRange(0, 4));
        spec.set_max_workers(in_.ConsumeIntegralInRange(0, 4));
      }
      spec.set_global_batch_size(in_.ConsumeIntegralInRange(0, 96));
      spec.set_max_steps(in_.ConsumeIntegralInRange(0, 100));
      if (in_.ConsumeBool()) {
        spec.mutable_checkpoint()->set_backup_dir("/nonexistent/fuzz");
        spec.mutable_checkpoint()->set_save_every_steps(
            in_.ConsumeIntegralInRange(0, 10));
      }
      if (in_.ConsumeBool()) {
        spec.mutable_communication()->set_backend(in_.ConsumeBool() ? "nccl"
                                                                    : "auto");
      }
      spec.set_max_restarts(in_.ConsumeIntegralInRange(0, 3));
    }
    auto id = coordinator_->SubmitJob(spec);
    if (id.ok()) job_ids_.push_back(*id);
  }

  void Kv() {
    const Sink& sink = SomeSink();
    const std::string job = in_.ConsumeBool() ? sink.job_id : JobId();
    const int64_t generation = Generation(sink);
    switch (in_.ConsumeIntegralInRange(0, 2)) {
      case 0: {
        v1::KvSetRequest request;
        request.set_job_id(job);
        request.set_generation(generation);
        request.set_key(in_.ConsumeBool() ? "k" : Text(16));
        request.set_value(Text(32));
        (void)coordinator_->KvSet(Who(), request);
        break;
      }
      case 1: {
        v1::KvGetRequest request;
        request.set_job_id(job);
        request.set_generation(generation);
        request.set_key(in_.ConsumeBool() ? "k" : Text(16));
        request.set_timeout_ms(in_.ConsumeIntegralInRange<int64_t>(-5, 0));
        coordinator_->KvGetAsync(Who(), request,
                                 [](absl::StatusOr<std::string>) {});
        break;
      }
      default: {
        // As a rank, with a token (a guessed one: the real ones are the
        // assignments').
        v1::KvGetRequest request;
        request.set_job_id(job);
        request.set_generation(generation);
        request.set_key(in_.ConsumeBool() ? "k" : Text(16));
        request.set_rank(in_.ConsumeIntegralInRange(-1, 4));
        request.set_rank_token(Text(32));
        request.set_timeout_ms(in_.ConsumeIntegralInRange<int64_t>(-5, 0));
        coordinator_->KvGetAsync(Who(), request,
                                 [](absl::StatusOr<std::string>) {});
        break;
      }
    }
  }

  // A WorkerMessage: decoded from fuzz bytes (any field, any value), then
  // usually pointed at a real job, generation and rank.
  v1::WorkerMessage Message() {
    v1::WorkerMessage message;
    (void)message.ParseFromString(Text(256));
    if (message.kind_case() == v1::WorkerMessage::KIND_NOT_SET) {
      const auto* oneof = v1::WorkerMessage::descriptor()->oneof_decl(0);
      const auto* field =
          oneof->field(in_.ConsumeIntegralInRange(0, oneof->field_count() - 1));
      message.GetReflection()->MutableMessage(&message, field);
    }
    if (in_.ConsumeIntegralInRange(0, 3) != 0) Aim(message);
    if (in_.ConsumeBool()) Shape(message);
    return message;
  }

  // Makes a checkpoint report or preemption consistent in itself (folder,
  // names and checksums as a real worker sends them), so the fuzzed steps
  // reach the two-phase commit rather than the range checks.
  void Shape(v1::WorkerMessage& message) {
    const int64_t step = in_.ConsumeIntegralInRange<int64_t>(1, 20);
    if (message.has_prepared()) {
      v1::CheckpointPrepared& prepared = *message.mutable_prepared();
      prepared.set_step(step);
      prepared.set_ok(in_.ConsumeIntegralInRange(0, 7) != 0);
      prepared.set_dir(checkpoint::PrepareDir(prepared.rank(), step));
      prepared.clear_files();
      v1::CheckpointFile* file = prepared.add_files();
      file->set_name(checkpoint::RankStateName(prepared.rank()));
      file->set_size(in_.ConsumeIntegralInRange<int64_t>(0, 4096));
      file->set_sha256(std::string(64, in_.ConsumeBool() ? 'a' : '0'));
    } else if (message.has_committed()) {
      v1::CheckpointCommitted& committed = *message.mutable_committed();
      committed.set_step(step);
      committed.set_ok(in_.ConsumeIntegralInRange(0, 7) != 0);
      committed.set_name(checkpoint::CheckpointName(step));
      committed.set_epoch(in_.ConsumeIntegralInRange<int64_t>(0, 3));
      committed.set_bytes(in_.ConsumeIntegralInRange<int64_t>(0, 1 << 20));
    } else if (message.has_preempt()) {
      v1::PreemptRequest& preempt = *message.mutable_preempt();
      preempt.set_live_step(step);
      preempt.set_saved_checkpoint(
          in_.ConsumeBool() ? checkpoint::CheckpointName(step) : "");
    }
  }

  // Sets the job_id, generation and rank fields of the message's kind, when
  // it has them, to what a sink was assigned.
  void Aim(v1::WorkerMessage& message) {
    const Sink& sink = SomeSink();
    const auto* oneof = v1::WorkerMessage::descriptor()->oneof_decl(0);
    const auto* kind =
        message.GetReflection()->GetOneofFieldDescriptor(message, oneof);
    if (kind == nullptr) return;
    google::protobuf::Message* body =
        message.GetReflection()->MutableMessage(&message, kind);
    const google::protobuf::Descriptor* type = body->GetDescriptor();
    const google::protobuf::Reflection* r = body->GetReflection();
    if (const auto* f = type->FindFieldByName("job_id");
        f != nullptr &&
        f->type() == google::protobuf::FieldDescriptor::TYPE_STRING) {
      r->SetString(body, f, sink.job_id);
    }
    if (const auto* f = type->FindFieldByName("generation");
        f != nullptr &&
        f->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_INT64) {
      r->SetInt64(body, f, Generation(sink));
    }
    if (const auto* f = type->FindFieldByName("rank");
        f != nullptr &&
        f->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_INT32) {
      r->SetInt32(
          body, f,
          in_.ConsumeBool() ? sink.rank : in_.ConsumeIntegralInRange(-1, 4));
    }
  }

  FuzzedDataProvider& in_;
  FakeClock clock_;
  std::vector<Coordinator::WaitId> watches_;
  Sink sinks_[kSinks];
  std::unique_ptr<Coordinator> coordinator_;
  std::vector<std::string> worker_ids_;
  std::vector<std::string> job_ids_;
};

}  // namespace
}  // namespace lockstep::coordinator

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FuzzedDataProvider in(data, size);
  // Sinks outlive the coordinator (members are destroyed in reverse order).
  lockstep::coordinator::Driver driver(in);
  if (!driver.Start()) return 0;
  for (int steps = 0; steps < 200 && in.remaining_bytes() > 0; ++steps) {
    driver.Step();
  }
  driver.Finish();
  return 0;
}
