// One rank of an all-reduce across hosts of the network test bed
// (bench/netbed_allreduce.sh starts one per host, each in a network
// namespace of its own, links capped with tbf). The ranks meet through a
// folder both see (a file per key), then time, per buffer size, lockstep's
// direct and ring all-reduce (encrypted, fp32), the ring over the 16-bit wire
// format (bf16: half the bytes), and plain Gloo's ring over its own pairs.
// Rank 0 prints one line per variant and size: the median seconds and the
// bus bandwidth (bytes x 2(W-1)/W / time, as nccl-tests define it).
//
//   netbed_allreduce --rank R --world W --store DIR --host ADDR
//                    [--max-mib N] [--iterations K]
#include <gloo/allreduce.h>
#include <gloo/math.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/args.h"
#include "common/files.h"
#include "worker/collective/half.h"
#include "worker/collective/mesh_communicator.h"

namespace lockstep {
namespace {

using Clock = std::chrono::steady_clock;

// The rendezvous through a shared folder: a key is a file, written whole
// and renamed into place.
class FolderKeyValue : public worker::KeyValueClient {
 public:
  explicit FolderKeyValue(std::string dir) : dir_(std::move(dir)) {}
  absl::Status Set(const std::string& key, const std::string& value) override {
    return WriteFileAtomically(dir_ + "/" + key, value);
  }
  absl::StatusOr<std::string> Get(const std::string& key,
                                  absl::Duration timeout) override {
    const absl::Time deadline = absl::Now() + timeout;
    while (true) {
      absl::StatusOr<std::string> value = ReadFileToString(dir_ + "/" + key);
      if (value.ok()) return value;
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError(absl::StrCat("no key ", key));
      }
      absl::SleepFor(absl::Milliseconds(10));
    }
  }
  void Cancel() override {}

 private:
  const std::string dir_;
};

int Main(int argc, char** argv) {
  absl::StatusOr<Args> args = Args::Parse(
      std::vector<std::string>(argv + 1, argv + argc),
      {"rank", "world", "store", "host", "max-mib", "iterations"}, {});
  if (!args.ok()) {
    std::fprintf(stderr, "netbed_allreduce: %s\n",
                 std::string(args.status().message()).c_str());
    return 2;
  }
  const int rank = args->GetInt("rank", -1).value_or(-1);
  const int world = args->GetInt("world", 0).value_or(0);
  const int max_mib = args->GetInt("max-mib", 64).value_or(64);
  const int max_iterations = args->GetInt("iterations", 5).value_or(5);
  const std::string store = args->Get("store", "");
  const std::string host = args->Get("host", "");
  if (rank < 0 || world < 2 || rank >= world || store.empty() || host.empty() ||
      max_mib < 1 || max_iterations < 1) {
    std::fprintf(stderr,
                 "usage: netbed_allreduce --rank R --world W --store DIR "
                 "--host ADDR [--max-mib N] [--iterations K]\n");
    return 2;
  }

  struct Variant {
    const char* name;
    worker::AllReduceAlgorithm algorithm;
    bool bf16;
    std::unique_ptr<worker::MeshCommunicator> comm;
  };
  Variant variants[] = {
      {"direct", worker::AllReduceAlgorithm::kDirect, false, nullptr},
      {"ring", worker::AllReduceAlgorithm::kRing, false, nullptr},
      {"ring bf16", worker::AllReduceAlgorithm::kRing, true, nullptr},
  };
  for (Variant& v : variants) {
    worker::MeshCommunicator::Options options;
    options.rank = rank;
    options.size = world;
    options.host = host;
    options.algorithm = v.algorithm;
    options.membership =
        worker::FixedKeysForTesting("netbed-allreduce", 1, rank, world);
    FolderKeyValue kv(
        absl::StrCat(store, "/", std::string(1, v.name[0]), v.bf16 ? "h" : ""));
    auto comm = worker::MeshCommunicator::Connect(&kv, options);
    if (!comm.ok()) {
      std::fprintf(stderr, "rank %d, %s: %s\n", rank, v.name,
                   std::string(comm.status().message()).c_str());
      return 1;
    }
    v.comm = *std::move(comm);
  }
  gloo::transport::tcp::attr attr;
  attr.hostname = host;
  auto device = gloo::transport::tcp::CreateDevice(attr);
  gloo::rendezvous::FileStore gloo_store(store + "/gloo");
  auto plain = std::make_shared<gloo::rendezvous::Context>(rank, world);
  plain->connectFullMesh(gloo_store, device);

  worker::Communicator& sync = *variants[0].comm;
  uint32_t tag = 0;
  if (rank == 0) {
    std::printf("%-10s %12s %10s %12s\n", "variant", "bytes", "median s",
                "busbw MB/s");
  }
  for (size_t bytes = 4096; bytes <= (size_t{1} << 20) * max_mib; bytes *= 4) {
    const int iterations =
        std::min(max_iterations, bytes >= (size_t{16} << 20)  ? 3
                                 : bytes >= (size_t{1} << 20) ? 10
                                                              : 30);
    const size_t count = bytes / sizeof(float);
    std::vector<float> data(count, 1.0f);
    std::vector<uint16_t> half(count, 0x3f80);  // 1.0 in bf16
    auto time = [&](const std::function<bool()>& op) {
      std::vector<double> samples;
      for (int i = 0; i <= iterations; ++i) {  // the first one warms up
        if (!sync.Barrier().ok()) return -1.0;
        const auto start = Clock::now();
        if (!op()) return -1.0;
        if (i > 0) {
          samples.push_back(
              std::chrono::duration<double>(Clock::now() - start).count());
        }
      }
      std::sort(samples.begin(), samples.end());
      return samples[samples.size() / 2];
    };
    auto report = [&](const char* name, double seconds, size_t moved) {
      if (rank != 0) return;
      const double bus = 2.0 * (world - 1) / world;
      std::printf("%-10s %12zu %10.5f %12.1f\n", name, bytes, seconds,
                  seconds > 0 ? moved * bus / seconds / 1e6 : 0.0);
      std::fflush(stdout);
    };
    for (Variant& v : variants) {
      const double t = time([&] {
        return v.bf16 ? v.comm
                            ->AllReduceSum(half.data(), count,
                                           worker::DataType::kBFloat16)
                            .ok()
                      : v.comm->AllReduceSum(data.data(), count).ok();
      });
      if (t < 0) return 1;
      // The bf16 wire moves half the bytes: its busbw counts what moved.
      report(v.name, t, v.bf16 ? bytes / 2 : bytes);
    }
    const double t = time([&] {
      gloo::AllreduceOptions opts(plain);
      opts.setOutput(data.data(), count);
      opts.setAlgorithm(gloo::AllreduceOptions::Algorithm::RING);
      opts.setReduceFunction(
          static_cast<void (*)(void*, const void*, const void*, size_t)>(
              &gloo::sum<float>));
      opts.setTag(tag++);
      gloo::allreduce(opts);
      return true;
    });
    report("gloo ring", t, bytes);
  }
  return 0;
}

}  // namespace
}  // namespace lockstep

int main(int argc, char** argv) { return lockstep::Main(argc, argv); }
