// All-reduce throughput on loopback, all in this run, ranks as threads:
// lockstep's direct and ring algorithms over Gloo's TCP pairs (the data
// plane before lockstep's own transport) and over lockstep's transport in
// clear and encrypted (AES-256-GCM), and a plain gloo::allreduce (ring)
// loop. Reports per size each variant's bus bandwidth (bytes / median time
// * 2(W-1)/W, as nccl-tests define it) and its time relative to lockstep's
// direct algorithm over Gloo's pairs. Where the NCCL backend is built and GPUs
// are visible, an NCCL section follows: one rank per GPU (NCCL allows no more),
// device buffers, the same columns.
//
//   allreduce_bench [MAX_MIB]     sizes 4 KiB .. MAX_MIB (default 256)
//   allreduce_bench --tiny        4 KiB .. 64 KiB, 3 iterations: a smoke run
#include <gloo/allreduce.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/hash_store.h>
#include <gloo/transport/tcp/device.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "worker/collective/gloo_communicator.h"
#include "worker/collective/in_memory_kv.h"
#include "worker/collective/mesh_communicator.h"

#ifdef LOCKSTEP_HAVE_NCCL
#include <cuda_runtime.h>

#include "worker/collective/nccl_communicator.h"
#endif

namespace lockstep {
namespace {

using Clock = std::chrono::steady_clock;

// Set when a collective fails: the run then exits 1 (a smoke run must fail).
std::atomic<bool> failed{false};

void Check(const absl::Status& status) {
  if (!status.ok() && !failed.exchange(true)) {
    std::fprintf(stderr, "all-reduce failed: %s\n",
                 std::string(status.message()).c_str());
  }
}

// Runs `op(rank)` `iterations` times on every rank; returns the median
// seconds per iteration seen by rank 0.
double Time(int world, int iterations, const std::function<void(int)>& op) {
  std::vector<double> samples;
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      op(rank);  // warm-up
      for (int i = 0; i < iterations; ++i) {
        auto start = Clock::now();
        op(rank);
        if (rank == 0) {
          samples.push_back(
              std::chrono::duration<double>(Clock::now() - start).count());
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  std::sort(samples.begin(), samples.end());
  return samples[samples.size() / 2];
}

// Sizes 4 KiB, 16 KiB, ... up to `max_bytes`; at most `max_iterations` timed
// iterations of each.
struct Sizes {
  size_t max_bytes;
  int max_iterations;
};

void Run(int world, Sizes sizes) {
  const size_t max_bytes = sizes.max_bytes;
  // Connect every transport and algorithm once: lockstep's algorithms over
  // Gloo's pairs (the transport before lockstep's own) and over lockstep's
  // transport in clear and encrypted, and plain gloo::allreduce.
  using Algorithm = worker::AllReduceAlgorithm;
  struct Variant {
    const char* name;
    bool gloo;
    Algorithm algorithm;
    bool encrypted;
    worker::InMemoryKeyValue kv;
    std::vector<std::unique_ptr<worker::Communicator>> comms;
  };
  Variant variants[] = {
      {"gloo direct", true, Algorithm::kDirect, false, {}, {}},
      {"gloo ring", true, Algorithm::kRing, false, {}, {}},
      {"clear direct", false, Algorithm::kDirect, false, {}, {}},
      {"aes direct", false, Algorithm::kDirect, true, {}, {}},
      {"aes ring", false, Algorithm::kRing, true, {}, {}},
  };
  gloo::rendezvous::HashStore store;
  std::vector<std::shared_ptr<gloo::Context>> plain(world);
  std::vector<std::thread> threads;
  for (Variant& v : variants) v.comms.resize(world);
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      for (Variant& v : variants) {
        if (v.gloo) {
          worker::GlooCommunicator::Options options;
          options.rank = rank;
          options.size = world;
          options.algorithm = v.algorithm;
          v.comms[rank] = *worker::GlooCommunicator::Connect(&v.kv, options);
        } else {
          worker::MeshCommunicator::Options options;
          options.rank = rank;
          options.size = world;
          options.algorithm = v.algorithm;
          options.encrypted = v.encrypted;
          options.membership.job_id = "bench";
          options.membership.generation = 1;
          options.membership.rank = rank;
          options.membership.secret = std::string(32, 's');
          v.comms[rank] = *worker::MeshCommunicator::Connect(&v.kv, options);
        }
      }
      gloo::transport::tcp::attr attr;
      attr.hostname = "127.0.0.1";
      auto device = gloo::transport::tcp::CreateDevice(attr);
      auto context = std::make_shared<gloo::rendezvous::Context>(rank, world);
      context->connectFullMesh(store, device);
      plain[rank] = context;
    });
  }
  for (std::thread& t : threads) t.join();

  std::printf("\nW = %d: busbw GB/s per variant (time / gloo direct's)\n%10s",
              world, "bytes");
  for (const Variant& v : variants) std::printf(" %20s", v.name);
  std::printf(" %12s\n", "plain gloo");
  for (size_t bytes = 4096; bytes <= max_bytes; bytes *= 4) {
    const size_t count = bytes / sizeof(float);
    std::vector<std::vector<float>> data(world,
                                         std::vector<float>(count, 1.0f));
    const int iterations =
        std::min(sizes.max_iterations, bytes >= (64u << 20)  ? 3
                                       : bytes >= (4u << 20) ? 10
                                                             : 50);
    const double bus = 2.0 * (world - 1) / world;
    auto busbw = [&](double t) { return bytes / t / 1e9 * bus; };
    std::printf("%10zu", bytes);
    double reference = 0;
    for (Variant& v : variants) {
      const double t = Time(world, iterations, [&](int rank) {
        Check(v.comms[rank]->AllReduceSum(data[rank].data(), count));
      });
      if (reference == 0) reference = t;
      std::printf(" %12.3f (%5.2f)", busbw(t), t / reference);
    }
    std::vector<uint32_t> tags(world, 0);
    double t_plain = Time(world, iterations, [&](int rank) {
      gloo::AllreduceOptions opts(plain[rank]);
      opts.setOutput(data[rank].data(), count);
      opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
      opts.setReduceFunction(
          static_cast<void (*)(void*, const void*, const void*, size_t)>(
              &gloo::sum<float>));
      opts.setTag(tags[rank]++);
      gloo::allreduce(opts);
    });
    std::printf(" %12.3f\n", busbw(t_plain));
  }
}

#ifdef LOCKSTEP_HAVE_NCCL
void RunNccl(Sizes sizes) {
  const size_t max_bytes = sizes.max_bytes;
  const int world = worker::NcclCommunicator::DeviceCount();
  if (world == 0) {
    std::printf("\nNCCL: no GPU visible; skipped\n");
    return;
  }
  worker::InMemoryKeyValue kv;
  std::vector<std::unique_ptr<worker::NcclCommunicator>> comms(world);
  std::vector<float*> buffers(world, nullptr);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < world; ++rank) {
    threads.emplace_back([&, rank] {
      worker::NcclCommunicator::Options options;
      options.rank = rank;
      options.size = world;
      options.device = rank;
      auto comm = worker::NcclCommunicator::Connect(&kv, options);
      if (!comm.ok()) {
        std::fprintf(stderr, "NCCL rank %d: %s\n", rank,
                     std::string(comm.status().message()).c_str());
        return;
      }
      comms[rank] = *std::move(comm);
      cudaSetDevice(rank);
      if (cudaMalloc(&buffers[rank], max_bytes) != cudaSuccess) {
        buffers[rank] = nullptr;
      } else {
        cudaMemset(buffers[rank], 0, max_bytes);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (int rank = 0; rank < world; ++rank) {
    if (comms[rank] == nullptr || buffers[rank] == nullptr) {
      std::printf("\nNCCL: setup failed on rank %d; skipped\n", rank);
      return;
    }
  }
  std::printf("\nNCCL, W = %d (one rank per GPU)\n%10s %10s %8s %8s\n", world,
              "bytes", "nccl us", "algbw", "busbw");
  for (size_t bytes = 4096; bytes <= max_bytes; bytes *= 4) {
    const size_t count = bytes / sizeof(float);
    const int iterations =
        std::min(sizes.max_iterations, bytes >= (64u << 20) ? 10 : 50);
    double t = Time(world, iterations, [&](int rank) {
      cudaSetDevice(rank);
      Check(comms[rank]->AllReduceSum(buffers[rank], count));
    });
    const double algbw = bytes / t / 1e9;
    std::printf("%10zu %10.1f %8.3f %8.3f\n", bytes, t * 1e6, algbw,
                algbw * 2.0 * (world - 1) / world);
  }
  for (int rank = 0; rank < world; ++rank) {
    cudaSetDevice(rank);
    cudaFree(buffers[rank]);
  }
}
#endif

}  // namespace
}  // namespace lockstep

int main(int argc, char** argv) {
  const std::string arg = argc > 1 ? argv[1] : "256";
  lockstep::Sizes sizes{64u << 10, 3};
  if (arg != "--tiny") {
    const size_t max_mib = std::strtoul(arg.c_str(), nullptr, 10);
    if (max_mib == 0) {
      std::fprintf(stderr, "usage: allreduce_bench [MAX_MIB | --tiny]\n");
      return 2;
    }
    sizes = {max_mib << 20, 50};
  }
  std::printf(
      "all-reduce (sum, fp32) on loopback; busbw in GB/s; (ratio) = time / "
      "gloo direct's time (lower is better)\n");
  for (int world : {2, 4}) lockstep::Run(world, sizes);
#ifdef LOCKSTEP_HAVE_NCCL
  lockstep::RunNccl(sizes);
#endif
  return lockstep::failed ? 1 : 0;
}
