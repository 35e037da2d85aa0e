// The worker's BLAS kernel (issue 38) with real processes: a worker started
// without OPENBLAS_CORETYPE runs a kernel of its CPU's level, one whose
// OpenBLAS fell back to Prescott starts itself again with the best kernel
// the CPU has (same pid), an explicit OPENBLAS_CORETYPE wins, and
// `lockstep workers` shows each worker's kernel and who chose it.
#include "common/blas_kernel.h"

#include <gmock/gmock.h>
#include <google/protobuf/util/json_util.h>
#include <gtest/gtest.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "common/files.h"
#include "tests/integration/harness.h"

namespace lockstep::integration {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

TEST_F(ClusterTest, WorkersRunTheBestBlasKernelTheirCpuHasUnlessTold) {
  const std::string best = BestKernelFor(HostCpuFeatures());
  // Worker 0 as found, worker 1 pinned as check-digests pins it, worker 2
  // with OpenBLAS' choice taken for its Prescott fallback.
  StartCluster(
      3, {},
      {{0, {"OPENBLAS_CORETYPE="}},
       {1, {"OPENBLAS_CORETYPE=Haswell"}},
       {2, {"OPENBLAS_CORETYPE=", "LOCKSTEP_FAILPOINT=blas_kernel_fallback"}}});
  const std::string job =
      Submit({"max_steps=20", "global_batch_size=48", "num_workers=3"});
  const v1::JobStatus status = WatchUntil(job, Ended);
  ASSERT_EQ(status.state(), v1::JOB_STATE_SUCCEEDED) << History(job);
  // Mixed kernels compute the same averaged gradient on every rank.
  ExpectAllRanks(status, status.ranks(0).model_digest());
  // The restart kept the process: the harness' pid is the worker's.
  EXPECT_TRUE(Alive(worker_pids_[2]));

  Result listed = RunCommand(
      {kBin + "/lockstep", "workers", "--json", "--coordinator", address_});
  ASSERT_EQ(listed.code, 0) << listed.err;
  v1::ListWorkersResponse workers;
  ASSERT_TRUE(
      google::protobuf::util::JsonStringToMessage(listed.out, &workers).ok())
      << listed.out;
  ASSERT_EQ(workers.workers_size(), 3) << listed.out;
  std::map<std::string, v1::Device> devices;
  for (const v1::WorkerInfo& worker : workers.workers()) {
    devices[worker.worker_id()] = worker.device();
  }

  const v1::Device& found = devices["worker:0"];
  EXPECT_THAT(found.blas_kernel_source(),
              ::testing::AnyOf("openblas", "lockstep"));
  if (!best.empty()) {
    // A CPU with AVX2 + FMA never trains on an SSE or AVX-only kernel.
    EXPECT_GE(LevelOfKernel(found.blas_kernel()), LevelOfKernel(best))
        << found.blas_kernel() << " on a CPU that runs " << best;
  }

  EXPECT_EQ(devices["worker:1"].blas_kernel(), "Haswell");
  EXPECT_EQ(devices["worker:1"].blas_kernel_source(), "environment");

  const v1::Device& fixed = devices["worker:2"];
  if (best.empty()) {
    GTEST_SKIP() << "this CPU has no AVX2 + FMA: nothing better to choose";
  }
  EXPECT_EQ(fixed.blas_kernel(), best);
  EXPECT_EQ(fixed.blas_kernel_source(), "lockstep");
  auto log = ReadFileToString(dir_ + "/worker-2-3.log");
  ASSERT_TRUE(log.ok()) << log.status();
  EXPECT_THAT(*log,
              HasSubstr("OpenBLAS picked Prescott, an older kernel than this "
                        "CPU"));
  EXPECT_THAT(*log,
              HasSubstr(absl::StrCat("lockstep set OPENBLAS_CORETYPE=", best)));

  Result table =
      RunCommand({kBin + "/lockstep", "workers", "--coordinator", address_});
  EXPECT_THAT(table.out, HasSubstr("BLAS KERNEL"));
  EXPECT_THAT(table.out, HasSubstr("Haswell (environment)"));
  EXPECT_THAT(table.out, HasSubstr(absl::StrCat(best, " (lockstep)")));
}

// Issue 35: a pool mixes CPUs. Workers on different OpenBLAS kernels, ATen
// capabilities and oneDNN ISAs (the portable ones on worker 0; on worker 1
// older OpenBLAS and oneDNN kernels and the best ATen ones of this CPU,
// AVX-512 where it has them) keep identical replicas: the gradients are
// averaged and every rank takes the same step, so the job ends with one
// digest on every rank. A job that asks for reproducible results refuses
// worker 1's kernels, naming it and what to set. Every kernel named here
// runs on any x86-64 CPU with AVX2 + FMA (issue 51: the test once gave
// worker 1 ATen's unvectorized kernels where AVX-512 was missing, which
// cannot share a job with vectorized ones: the next test).
TEST_F(ClusterTest, MixedKernelsKeepReplicasIdenticalAndReproducibleNamesThem) {
  if (BestKernelFor(HostCpuFeatures()).empty()) {
    GTEST_SKIP() << "this CPU has no AVX2 + FMA";
  }
  const bool avx512 = HostCpuFeatures().avx512f;
  StartCluster(
      2, {},
      {{0,
        {"OPENBLAS_CORETYPE=Haswell", "ATEN_CPU_CAPABILITY=avx2",
         "ONEDNN_MAX_CPU_ISA=AVX2"}},
       {1,
        {"OPENBLAS_CORETYPE=Sandybridge",
         avx512 ? "ATEN_CPU_CAPABILITY=avx512" : "ATEN_CPU_CAPABILITY=avx2",
         "ONEDNN_MAX_CPU_ISA=SSE41"}}});
  const std::string job = Submit({"max_steps=30", "global_batch_size=48"});
  const v1::JobStatus mixed = WatchUntil(job, Ended);
  ASSERT_EQ(mixed.state(), v1::JOB_STATE_SUCCEEDED) << History(job);
  ExpectAllRanks(mixed, mixed.ranks(0).model_digest());

  const std::string strict =
      Submit({"max_steps=30", "global_batch_size=48", "reproducible=true"});
  const v1::JobStatus refused = WatchUntil(strict, Ended);
  EXPECT_EQ(refused.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(refused.error(),
              AllOf(HasSubstr("reproducible results"), HasSubstr("worker:1"),
                    HasSubstr("oneDNN ISA 'SSE41'"),
                    HasSubstr("OPENBLAS_CORETYPE=Haswell "
                              "ATEN_CPU_CAPABILITY=avx2 "
                              "ONEDNN_MAX_CPU_ISA=AVX2")));
}

// ATen's unvectorized kernels draw other initial weights and, given the
// same ones, round the optimizer's step otherwise than its vectorized
// kernels: ranks mixing them would drift apart and fail the job at its
// end. The coordinator refuses the mix before anything trains, naming both
// workers and what to set; a job on vectorized workers alone then trains.
TEST_F(ClusterTest, UnvectorizedAtenBesideVectorizedIsRefusedBeforeTraining) {
  StartCluster(2, {},
               {{0, {"ATEN_CPU_CAPABILITY=avx2"}},
                {1, {"ATEN_CPU_CAPABILITY=default"}}});
  const std::string job = Submit({"max_steps=10", "global_batch_size=48"});
  const v1::JobStatus refused = WatchUntil(job, Ended);
  EXPECT_EQ(refused.state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(refused.error(),
              AllOf(HasSubstr("worker:1"), HasSubstr("worker:0"),
                    HasSubstr("unvectorized"),
                    HasSubstr("ATEN_CPU_CAPABILITY=avx2 on all")));
  EXPECT_EQ(FindEvent(refused, "generation_started"), nullptr) << History(job);
}

}  // namespace
}  // namespace lockstep::integration
