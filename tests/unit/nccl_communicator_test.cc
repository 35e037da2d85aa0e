// The NCCL backend on real GPUs; skipped where it is not built or no GPU is
// visible (every CPU-only machine). bench/gpu_check.sh runs it on a GPU.
#include <gtest/gtest.h>

#ifdef LOCKSTEP_HAVE_NCCL
#include <cuda_runtime.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/time/clock.h"
#include "worker/collective/cuda_events.h"
#include "worker/collective/in_memory_kv.h"
#include "worker/collective/membership.h"
#include "worker/collective/nccl_communicator.h"
#endif

namespace lockstep::worker {
namespace {

#ifndef LOCKSTEP_HAVE_NCCL

TEST(NcclCommunicatorTest, SkippedWithoutNccl) {
  GTEST_SKIP() << "built without CUDA/NCCL (LOCKSTEP_CUDA=OFF or not found)";
}

#else

// Runs `body(comm, rank, world)` with one rank per visible GPU (NCCL allows
// one rank per device), ranks as threads.
void RunOnEveryGpu(
    const std::function<void(NcclCommunicator&, int, int)>& body) {
  const int world = NcclCommunicator::DeviceCount();
  InMemoryKeyValue kv;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      NcclCommunicator::Options options;
      options.rank = rank;
      options.size = world;
      options.device = rank;
      options.timeout = absl::Seconds(30);
      auto comm = NcclCommunicator::Connect(&kv, options);
      ASSERT_TRUE(comm.ok()) << comm.status();
      body(**comm, rank, world);
    });
  }
  for (std::thread& t : threads) t.join();
}

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

// The trainer's small collectives pass host memory, pageable or pinned;
// the communicator stages it through the device.
TEST(NcclCommunicatorTest, HostBuffersOnEveryGpu) {
  if (NcclCommunicator::DeviceCount() == 0) GTEST_SKIP() << "no GPU visible";
  RunOnEveryGpu([](NcclCommunicator& comm, int rank, int world) {
    const float sum = world * (world + 1) / 2.0f;
    std::vector<float> sums(1000, static_cast<float>(rank + 1));
    absl::Status status = comm.AllReduceSum(sums.data(), sums.size());
    ASSERT_TRUE(status.ok()) << status;
    EXPECT_EQ(sums.front(), sum);
    EXPECT_EQ(sums.back(), sum);

    float* pinned = nullptr;
    ASSERT_EQ(cudaMallocHost(&pinned, 16 * sizeof(float)), cudaSuccess);
    std::fill(pinned, pinned + 16, static_cast<float>(rank + 1));
    status = comm.AllReduceSum(pinned, 16);
    const float first = pinned[0], last = pinned[15];
    cudaFreeHost(pinned);
    ASSERT_TRUE(status.ok()) << status;
    EXPECT_EQ(first, sum);
    EXPECT_EQ(last, sum);

    // A state archive of a few MB from the last rank (grows the staging
    // buffer past its first size).
    const int root = world - 1;
    std::vector<uint8_t> archive(3 << 20, 0);
    if (rank == root) {
      for (size_t i = 0; i < archive.size(); ++i) archive[i] = i * 7 + 3;
    }
    status = comm.Broadcast(archive.data(), archive.size(), root);
    ASSERT_TRUE(status.ok()) << status;
    size_t wrong = 0;
    for (size_t i = 0; i < archive.size(); ++i) {
      wrong += archive[i] != static_cast<uint8_t>(i * 7 + 3);
    }
    EXPECT_EQ(wrong, 0u);

    // Step agreement: a few int64 from every rank, into host memory, then
    // into device memory.
    const int64_t mine[2] = {rank * 10 + 1, rank * 10 + 2};
    std::vector<int64_t> all(2 * world, -1);
    status = comm.AllGather(mine, sizeof(mine), all.data());
    ASSERT_TRUE(status.ok()) << status;
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(all[2 * r], r * 10 + 1);
      EXPECT_EQ(all[2 * r + 1], r * 10 + 2);
    }
    int64_t* device_all = nullptr;
    ASSERT_EQ(cudaMalloc(&device_all, all.size() * sizeof(int64_t)),
              cudaSuccess);
    status = comm.AllGather(mine, sizeof(mine), device_all);
    std::vector<int64_t> copied(all.size(), -1);
    cudaMemcpy(copied.data(), device_all, copied.size() * sizeof(int64_t),
               cudaMemcpyDeviceToHost);
    cudaFree(device_all);
    ASSERT_TRUE(status.ok()) << status;
    EXPECT_EQ(copied, all);

    status = comm.Barrier();
    EXPECT_TRUE(status.ok()) << status;
  });
}

// The gradient hand-off: a bucket written on the default stream (here by an
// asynchronous copy from pinned memory), an event recorded after it, the
// communicator's stream made to wait on it, then the all-reduce.
TEST(NcclCommunicatorTest, CollectiveAfterWaitForEvent) {
  if (NcclCommunicator::DeviceCount() == 0) GTEST_SKIP() << "no GPU visible";
  RunOnEveryGpu([](NcclCommunicator& comm, int rank, int world) {
    ASSERT_TRUE(SetCudaDevice(rank).ok());
    absl::StatusOr<int> current = CurrentCudaDevice();
    ASSERT_TRUE(current.ok()) << current.status();
    EXPECT_EQ(*current, rank);
    const size_t n = 4 << 20;  // 16 MiB: the copy takes a while
    const size_t bytes = n * sizeof(float);
    float* device = nullptr;
    float* pinned = nullptr;
    ASSERT_EQ(cudaMalloc(&device, bytes), cudaSuccess);
    ASSERT_EQ(cudaMallocHost(&pinned, bytes), cudaSuccess);
    absl::Cleanup free_buffers = [&] {
      cudaDeviceSynchronize();
      cudaFreeHost(pinned);
      cudaFree(device);
    };
    ASSERT_EQ(cudaMemsetAsync(device, 0, bytes, cudaStreamLegacy), cudaSuccess);
    std::fill(pinned, pinned + n, static_cast<float>(rank + 1));
    absl::StatusOr<void*> event = CreateCudaEvent();
    ASSERT_TRUE(event.ok()) << event.status();
    absl::Cleanup destroy_event = [&] { DestroyCudaEvent(*event); };

    ASSERT_TRUE(CopyOnDefaultCudaStream(device, pinned, bytes).ok());
    ASSERT_TRUE(RecordCudaEventOnDefaultStream(*event).ok());
    absl::Status status = comm.WaitForEvent(*event);
    ASSERT_TRUE(status.ok()) << status;
    status = comm.AllReduceSum(device, n);
    ASSERT_TRUE(status.ok()) << status;

    std::vector<float> result(n, -1.0f);
    ASSERT_TRUE(CopyOnDefaultCudaStream(result.data(), device, bytes).ok());
    ASSERT_TRUE(RecordCudaEventOnDefaultStream(*event).ok());
    ASSERT_TRUE(SynchronizeCudaEvent(*event).ok());
    ASSERT_TRUE(SynchronizeCudaDevice().ok());
    const float sum = world * (world + 1) / 2.0f;
    size_t wrong = 0;
    for (float v : result) wrong += v != sum;
    EXPECT_EQ(wrong, 0u) << "of " << n << " elements";
  });
}

std::atomic<bool> gate_open{false};

// A host function that holds its stream until gate_open.
void CUDART_CB HoldUntilGateOpens(void*) {
  while (!gate_open.load()) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// A collective that cannot finish (its stream waits on a default stream
// held by a host function) returns Aborted soon after Abort() from another
// thread. One rank on one GPU, so it runs on any GPU machine.
TEST(NcclCommunicatorTest, AbortReleasesABlockedCollective) {
  if (NcclCommunicator::DeviceCount() == 0) GTEST_SKIP() << "no GPU visible";
  InMemoryKeyValue kv;
  NcclCommunicator::Options options;
  options.timeout = absl::Seconds(30);
  auto comm = NcclCommunicator::Connect(&kv, options);
  ASSERT_TRUE(comm.ok()) << comm.status();
  float* device = nullptr;
  ASSERT_EQ(cudaMalloc(&device, 1024 * sizeof(float)), cudaSuccess);
  absl::StatusOr<void*> event = CreateCudaEvent();
  ASSERT_TRUE(event.ok()) << event.status();

  gate_open = false;
  ASSERT_EQ(cudaLaunchHostFunc(cudaStreamLegacy, HoldUntilGateOpens, nullptr),
            cudaSuccess);
  // Runs before the communicator's destructor, which waits for its stream.
  absl::Cleanup open_gate = [&] {
    gate_open = true;
    cudaDeviceSynchronize();
    DestroyCudaEvent(*event);
    cudaFree(device);
  };
  ASSERT_TRUE(RecordCudaEventOnDefaultStream(*event).ok());
  ASSERT_TRUE((*comm)->WaitForEvent(*event).ok());

  std::thread aborter([&] {
    absl::SleepFor(absl::Milliseconds(300));
    (*comm)->Abort();
    // ncclCommAbort may wait for the device: let it drain a while later.
    absl::SleepFor(absl::Milliseconds(300));
    gate_open = true;
  });
  const absl::Time start = absl::Now();
  absl::Status status = (*comm)->AllReduceSum(device, 1024);
  const absl::Duration took = absl::Now() - start;
  aborter.join();
  EXPECT_EQ(status.code(), absl::StatusCode::kAborted) << status;
  EXPECT_GE(took, absl::Milliseconds(250)) << "it did not wait";
  EXPECT_LT(took, absl::Seconds(10));
  EXPECT_EQ((*comm)->Barrier().code(), absl::StatusCode::kAborted);
  EXPECT_EQ((*comm)->WaitForEvent(*event).code(), absl::StatusCode::kAborted);
}

// Rank 1 holds another generation's secret: the all-gather of proofs that
// ends Connect refuses it on rank 0, naming rank 1, before any collective
// (and rank 1 refuses rank 0's). NCCL allows one rank per device, so this
// needs two GPUs.
TEST(NcclCommunicatorTest, ARankWithoutTheSecretIsRefused) {
  if (NcclCommunicator::DeviceCount() < 2) GTEST_SKIP() << "needs two GPUs";
  InMemoryKeyValue kv;
  std::vector<absl::Status> results(2);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      NcclCommunicator::Options options;
      options.rank = rank;
      options.size = 2;
      options.device = rank;
      options.timeout = absl::Seconds(30);
      options.membership.job_id = "mlp-1";
      options.membership.generation = 3;
      options.membership.secret = std::string(kSecretSize, rank ? 'b' : 'a');
      results[rank] = NcclCommunicator::Connect(&kv, options).status();
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_TRUE(absl::IsUnavailable(results[0])) << results[0];
  EXPECT_NE(results[0].message().find("wrong membership proof from rank 1"),
            absl::string_view::npos)
      << results[0];
  EXPECT_FALSE(results[1].ok());
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
