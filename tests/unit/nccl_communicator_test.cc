// The NCCL backend on real GPUs; skipped where it is not built or no GPU is
// visible (every CPU-only machine). bench/gpu_check.sh runs it on a GPU.
#include <gtest/gtest.h>

#ifdef LOCKSTEP_HAVE_NCCL
#include <cuda_runtime.h>

#include <map>
#include <thread>

#include "absl/synchronization/mutex.h"
#include "worker/collective/in_memory_kv.h"
#include "worker/collective/nccl_communicator.h"
#endif

namespace lockstep::worker {
namespace {

#ifndef LOCKSTEP_HAVE_NCCL

TEST(NcclCommunicatorTest, SkippedWithoutNccl) {
  GTEST_SKIP() << "built without CUDA/NCCL (LOCKSTEP_CUDA=OFF or not found)";
}

#else

// One rank per visible GPU (NCCL allows one rank per device), ranks as
// threads.
TEST(NcclCommunicatorTest, CollectivesOnEveryGpu) {
  const int world = NcclCommunicator::DeviceCount();
  if (world == 0) GTEST_SKIP() << "no GPU visible";
  InMemoryKeyValue kv;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      NcclCommunicator::Options options;
      options.rank = rank;
      options.size = world;
      options.device = rank;
      auto comm = NcclCommunicator::Connect(&kv, options);
      ASSERT_TRUE(comm.ok()) << comm.status();
      const size_t n = 1 << 20;
      std::vector<float> host(n, static_cast<float>(rank + 1));
      float* device = nullptr;
      ASSERT_EQ(cudaMalloc(&device, n * sizeof(float)), cudaSuccess);
      cudaMemcpy(device, host.data(), n * sizeof(float),
                 cudaMemcpyHostToDevice);
      ASSERT_TRUE((*comm)->AllReduceSum(device, n).ok());
      cudaMemcpy(host.data(), device, n * sizeof(float),
                 cudaMemcpyDeviceToHost);
      EXPECT_EQ(host[0], world * (world + 1) / 2.0f);
      EXPECT_EQ(host[n - 1], world * (world + 1) / 2.0f);
      ASSERT_TRUE((*comm)->Barrier().ok());
      (*comm)->Abort();
      EXPECT_EQ((*comm)->AllReduceSum(device, n).code(),
                absl::StatusCode::kAborted);
      cudaFree(device);
    });
  }
  for (std::thread& t : threads) t.join();
}

TEST(NcclCommunicatorTest, MissingPeerTimesOut) {
  if (NcclCommunicator::DeviceCount() == 0) GTEST_SKIP() << "no GPU visible";
  InMemoryKeyValue kv;
  NcclCommunicator::Options options;
  options.rank = 1;  // rank 0 never publishes the unique id
  options.size = 2;
  options.timeout = absl::Milliseconds(200);
  auto comm = NcclCommunicator::Connect(&kv, options);
  EXPECT_EQ(comm.status().code(), absl::StatusCode::kDeadlineExceeded);
}

#endif

}  // namespace
}  // namespace lockstep::worker
