// Coordinator tests: the devices workers report at registration, and the
// communication backend each generation resolves from them
// (communication.backend "auto", "gloo" or "nccl").
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "common/tf_config.h"
#include "coordinator/coordinator.h"
#include "tests/unit/coordinator_fixture.h"

namespace lockstep::coordinator {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::Not;

v1::JobSpec SpecWithBackend(int workers, const std::string& backend) {
  v1::JobSpec spec = Spec(workers);
  spec.mutable_communication()->set_backend(backend);
  return spec;
}

// The backend of every assignment `sinks` got, in order.
std::vector<std::string> AssignedBackends(const std::vector<FakeSink*>& sinks) {
  std::vector<std::string> backends;
  for (const FakeSink* sink : sinks) {
    for (const v1::CoordinatorCommand& command :
         CommandsOf(*sink, v1::CoordinatorCommand::kAssignment)) {
      backends.push_back(command.assignment().backend());
    }
  }
  return backends;
}

TEST_F(CoordinatorTest, AutoIsNcclWhenEveryRankHasAGpu) {
  Make();
  FakeSink a, b;
  Connect(1, &a, Gpu(0, "GPU-a"));
  Connect(2, &b, Gpu(0, "GPU-b"));
  std::string job = *coordinator_->SubmitJob(SpecWithBackend(2, "auto"));
  v1::JobStatus status = Status(job);
  EXPECT_EQ(status.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(status.backend(), "nccl");
  EXPECT_EQ(AssignedBackends({&a, &b}),
            std::vector<std::string>({"nccl", "nccl"}));
  auto started = EventsOf(status, "generation_started");
  ASSERT_EQ(started.size(), 1u);
  EXPECT_THAT(started[0].message(), HasSubstr("backend nccl"));
}

TEST_F(CoordinatorTest, AutoIsGlooWhenARankHasNoGpu) {
  Make();
  FakeSink a, b;
  Connect(1, &a, Gpu(0, "GPU-a"));
  Connect(2, &b);  // on the CPU
  std::string job = *coordinator_->SubmitJob(SpecWithBackend(2, "auto"));
  v1::JobStatus status = Status(job);
  EXPECT_EQ(status.state(), v1::JOB_STATE_RUNNING);
  EXPECT_EQ(status.backend(), "gloo");
  EXPECT_EQ(AssignedBackends({&a, &b}),
            std::vector<std::string>({"gloo", "gloo"}));
  auto started = EventsOf(status, "generation_started");
  ASSERT_EQ(started.size(), 1u);
  EXPECT_THAT(started[0].message(),
              AllOf(HasSubstr("backend gloo"),
                    HasSubstr("rank 1 (free:1 on 127.0.0.1) has no GPU")));
}

TEST_F(CoordinatorTest, AutoIsGlooWhenTwoRanksShareAGpu) {
  Make();
  FakeSink a, b;
  Connect(1, &a, Gpu(0, "GPU-same"));
  Connect(2, &b, Gpu(0, "GPU-same"));
  std::string job = *coordinator_->SubmitJob(SpecWithBackend(2, "auto"));
  v1::JobStatus status = Status(job);
  EXPECT_EQ(status.backend(), "gloo");
  EXPECT_THAT(EventsOf(status, "generation_started")[0].message(),
              HasSubstr("share GPU GPU-same"));
}

// communication.compression "bf16" is a wire format of Gloo's: "auto"
// picks Gloo for it even where every rank has a GPU, and says why.
TEST_F(CoordinatorTest, AutoIsGlooWhenTheJobCompressesGradients) {
  Make();
  FakeSink a, b;
  Connect(1, &a, Gpu(0, "GPU-a"));
  Connect(2, &b, Gpu(0, "GPU-b"));
  v1::JobSpec spec = SpecWithBackend(2, "auto");
  spec.mutable_communication()->set_compression("bf16");
  std::string job = *coordinator_->SubmitJob(spec);
  v1::JobStatus status = Status(job);
  EXPECT_EQ(status.backend(), "gloo");
  EXPECT_EQ(AssignedBackends({&a, &b}),
            std::vector<std::string>({"gloo", "gloo"}));
  EXPECT_THAT(EventsOf(status, "generation_started")[0].message(),
              HasSubstr("communication.compression \"bf16\""));
}

TEST_F(CoordinatorTest, NcclWithARankWithoutAGpuFailsTheJobNamingTheRank) {
  auto config = ParseTfConfig(
      R"({"cluster": {"worker": ["10.0.0.6:7071", "10.0.0.7:7071"]}})");
  ASSERT_TRUE(config.ok());
  Make(config->cluster);
  FakeSink sinks[2];
  for (int index = 0; index < 2; ++index) {
    v1::RegisterWorkerRequest request = Free(index + 1);
    request.set_host(index == 0 ? "10.0.0.6" : "10.0.0.7");
    request.mutable_task()->set_type("worker");
    request.mutable_task()->set_index(index);
    if (index == 0) *request.mutable_device() = Gpu(0, "GPU-a");
    auto id = coordinator_->RegisterWorker(Anyone(), request);
    ASSERT_TRUE(id.ok()) << id.status();
    ASSERT_TRUE(
        coordinator_
            ->OpenSession(Anyone(), id->worker_id(), index + 1, &sinks[index])
            .ok());
  }
  std::string job = *coordinator_->SubmitJob(SpecWithBackend(0, "nccl"));
  v1::JobStatus status = Status(job);
  EXPECT_EQ(status.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(status.error(),
              AllOf(HasSubstr("communication.backend is \"nccl\""),
                    HasSubstr("rank 1 (worker:1 on 10.0.0.7) has no GPU"),
                    HasSubstr("use \"auto\" or \"gloo\"")));
  EXPECT_EQ(EventsOf(status, "job_failed").size(), 1u);
  // No rank was told to start; both are free for the next job.
  EXPECT_TRUE(AssignedBackends({&sinks[0], &sinks[1]}).empty());
  for (const v1::WorkerInfo& worker : ListWorkers()) {
    EXPECT_EQ(worker.state(), "idle") << worker.worker_id();
  }
}

TEST_F(CoordinatorTest, NcclWithTwoRanksOnOneGpuFailsTheJob) {
  Make();
  FakeSink a, b;
  Connect(1, &a, Gpu(0, "GPU-same"));
  Connect(2, &b, Gpu(0, "GPU-same"));
  std::string job = *coordinator_->SubmitJob(SpecWithBackend(2, "nccl"));
  v1::JobStatus status = Status(job);
  EXPECT_EQ(status.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(status.error(),
              AllOf(HasSubstr("rank 0 (free:0 on 127.0.0.1) and rank 1 "
                              "(free:1 on 127.0.0.1) share GPU GPU-same"),
                    HasSubstr("NCCL needs a GPU per rank")));
}

TEST_F(CoordinatorTest, NcclWithAGpuOnEveryRankIsNccl) {
  Make();
  FakeSink a, b;
  Connect(1, &a, Gpu(0, "GPU-a"));
  Connect(2, &b, Gpu(1, "GPU-b"));
  std::string job = *coordinator_->SubmitJob(SpecWithBackend(2, "nccl"));
  EXPECT_EQ(Status(job).backend(), "nccl");
  EXPECT_EQ(AssignedBackends({&a, &b}),
            std::vector<std::string>({"nccl", "nccl"}));
}

TEST_F(CoordinatorTest, GlooStaysGlooOnGpus) {
  Make();
  FakeSink a, b;
  Connect(1, &a, Gpu(0, "GPU-a"));
  Connect(2, &b, Gpu(0, "GPU-b"));
  std::string job = *coordinator_->SubmitJob(SpecWithBackend(2, "gloo"));
  v1::JobStatus status = Status(job);
  EXPECT_EQ(status.backend(), "gloo");
  EXPECT_EQ(AssignedBackends({&a, &b}),
            std::vector<std::string>({"gloo", "gloo"}));
  EXPECT_THAT(EventsOf(status, "generation_started")[0].message(),
              AllOf(HasSubstr("backend gloo"), Not(HasSubstr("auto"))));
}

TEST_F(CoordinatorTest, EachGenerationResolvesTheBackendAgain) {
  Make();
  FakeSink a, b, c;
  std::string id_a = Connect(1, &a, Gpu(0, "GPU-a"));
  std::string id_b = Connect(2, &b, Gpu(0, "GPU-b"));
  std::string job = *coordinator_->SubmitJob(SpecWithBackend(2, "auto"));
  ASSERT_EQ(Status(job).backend(), "nccl");
  // The GPU worker of rank 1 fails; a CPU worker replaces it.
  coordinator_->CloseSession(id_b, 2, &b, absl::UnavailableError("reset"));
  Connect(3, &c);
  v1::JobStatus status = Status(job);
  EXPECT_EQ(status.generation(), 2);
  EXPECT_EQ(status.backend(), "gloo");
  auto assignments = CommandsOf(a, v1::CoordinatorCommand::kAssignment);
  ASSERT_EQ(assignments.size(), 2u);
  EXPECT_EQ(assignments[0].assignment().backend(), "nccl");
  EXPECT_EQ(assignments[1].assignment().backend(), "gloo");
  EXPECT_EQ(AssignedBackends({&c}), std::vector<std::string>({"gloo"}));
}

// A CPU as a worker reports it: its OpenBLAS kernel, ATen capability and
// oneDNN ISA.
v1::Device Cpu(const std::string& blas, const std::string& aten,
               const std::string& onednn) {
  v1::Device device;
  device.set_name("cpu");
  device.set_blas_kernel(blas);
  device.set_aten_cpu_capability(aten);
  device.set_onednn_cpu_isa(onednn);
  return device;
}

// Issue 51: ATen's unvectorized kernels beside vectorized ones are refused
// before a rank is told to start, naming both workers and what to set.
TEST_F(CoordinatorTest,
       UnvectorizedAtenBesideVectorizedFailsBeforeAnyRankStarts) {
  Make();
  FakeSink a, b;
  Connect(1, &a, Cpu("SkylakeX", "AVX512", "AVX512_CORE_BF16"));
  Connect(2, &b, Cpu("Haswell", "DEFAULT", "AVX2"));
  v1::JobStatus status = Status(*coordinator_->SubmitJob(Spec(2)));
  EXPECT_EQ(status.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(status.error(),
              AllOf(HasSubstr("rank 1 (free:1 on 127.0.0.1) computes with "
                              "ATen's unvectorized kernels"),
                    HasSubstr("rank 0 (free:0 on 127.0.0.1) with its AVX512 "
                              "ones"),
                    HasSubstr("ATEN_CPU_CAPABILITY=avx2 on all")));
  EXPECT_TRUE(AssignedBackends({&a, &b}).empty());
}

// A reproducible job needs oneDNN's AVX2 kernels as well as OpenBLAS' and
// ATen's portable ones.
TEST_F(CoordinatorTest, ReproducibleNeedsOneDnnPinnedToAvx2) {
  Make();
  FakeSink a, b;
  Connect(1, &a, Cpu("Haswell", "AVX2", "AVX2"));
  Connect(2, &b, Cpu("Haswell", "AVX2", "AVX512_CORE_BF16"));
  v1::JobSpec spec = Spec(2);
  spec.set_reproducible(true);
  v1::JobStatus status = Status(*coordinator_->SubmitJob(spec));
  EXPECT_EQ(status.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(status.error(), AllOf(HasSubstr("reproducible results"),
                                    HasSubstr("oneDNN ISA 'AVX512_CORE_BF16'"),
                                    HasSubstr("ONEDNN_MAX_CPU_ISA=AVX2")));
}

TEST_F(CoordinatorTest, WorkersListShowsTheirDevices) {
  Make();
  FakeSink a, b;
  std::string id_a = Connect(1, &a, Gpu(0, "GPU-a"));
  std::string id_b = Connect(2, &b);  // says nothing: the CPU
  std::vector<v1::WorkerInfo> workers = ListWorkers();
  ASSERT_EQ(workers.size(), 2u);
  EXPECT_EQ(workers[0].worker_id(), id_a);
  EXPECT_EQ(workers[0].device().name(), "cuda:0");
  EXPECT_EQ(workers[0].device().gpu_name(), "NVIDIA H200");
  EXPECT_EQ(workers[0].device().gpu_uuid(), "GPU-a");
  EXPECT_EQ(workers[1].worker_id(), id_b);
  EXPECT_EQ(workers[1].device().name(), "cpu");
  EXPECT_EQ(workers[1].device().gpu_name(), "");
}

}  // namespace
}  // namespace lockstep::coordinator
