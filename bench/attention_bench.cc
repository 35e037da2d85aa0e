// lockstep's fused causal attention (worker/train/attention.h) against the
// LibTorch ops it replaces (the gpt's unfused path, UnfusedCausalAttention),
// alone: forward, and forward + backward, on the gpt's shapes (4 heads of
// 32, batch 8 by default) at several sequence lengths, fp32 and bf16, one
// thread unless told otherwise (a worker's default), with a worker's heap
// settings (KeepLargeBlocksInTheHeap). The two take turns,
// repetition by repetition; each figure is the median, and the ratio is
// unfused time / fused time in this run. Also the heap each holds from a
// forward pass to its backward pass (what its graph keeps, and the output).
//
//   attention_bench [--reps N] [--threads N] [--batch N] [--tokens 64,256,1024]
//   attention_bench --tiny      a smoke run: 2 reps at 64 tokens
#include <ATen/Parallel.h>
#include <malloc.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "worker/compute_setup.h"
#include "worker/train/attention.h"
#include "worker/train/vector_isa.h"

namespace lockstep::worker {
namespace {

using Clock = std::chrono::steady_clock;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Bytes malloc has handed out and not had back (LibTorch's CPU tensors
// come from malloc).
size_t HeapBytes() {
  const struct mallinfo2 info = mallinfo2();
  return info.uordblks + info.hblkhd;
}

double Seconds(const std::function<void()>& run) {
  const auto start = Clock::now();
  run();
  return std::chrono::duration<double>(Clock::now() - start).count();
}

int Main(int argc, char** argv) {
  int reps = 10, threads = 1, batch = 8;
  std::vector<int64_t> lengths = {64, 256, 1024};
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    const bool has_value = i + 1 < argc;
    if (flag == "--tiny") {
      reps = 2;
      lengths = {64};
    } else if (flag == "--reps" && has_value) {
      reps = std::max(1, std::atoi(argv[++i]));
    } else if (flag == "--threads" && has_value) {
      threads = std::max(1, std::atoi(argv[++i]));
    } else if (flag == "--batch" && has_value) {
      batch = std::max(1, std::atoi(argv[++i]));
    } else if (flag == "--tokens" && has_value) {
      lengths.clear();
      for (absl::string_view part : absl::StrSplit(argv[++i], ',')) {
        int64_t t = 0;
        if (!absl::SimpleAtoi(part, &t) || t < 1 || t > 8192) {
          std::fprintf(stderr,
                       "attention_bench: --tokens takes lengths in "
                       "[1, 8192], comma separated\n");
          return 2;
        }
        lengths.push_back(t);
      }
    } else {
      std::fprintf(stderr,
                   "usage: attention_bench [--reps N] [--threads N] "
                   "[--batch N] [--tokens 64,256,1024] | --tiny\n");
      return 2;
    }
  }
  at::set_num_threads(threads);
  KeepLargeBlocksInTheHeap();  // as a worker's heap is (compute_setup.h)
  const int64_t heads = 4, head_size = 32, c = heads * head_size;
  const char* isa[] = {"none", "AVX2", "AVX-512"};
  std::printf(
      "attention_bench: batch %d, %lld heads x %lld, %d thread(s), %d reps "
      "(medians); vector code %s\n",
      batch, static_cast<long long>(heads), static_cast<long long>(head_size),
      threads, reps, isa[static_cast<int>(AllowedVectorIsa())]);
  std::printf(
      "| dtype | T | pass | unfused ms | fused ms | unfused / fused | "
      "kept for backward: unfused | fused |\n|---|---:|---|---:|---:|---:|"
      "---:|---:|\n");
  torch::manual_seed(1);
  for (torch::Dtype dtype : {torch::kFloat32, torch::kBFloat16}) {
    for (int64_t t : lengths) {
      const torch::Tensor base =
          (torch::randn({batch, t, 3 * c}) * 0.5).to(dtype);
      const torch::Tensor up = torch::randn({batch, t, c}).to(dtype);
      const torch::Tensor mask = CausalMask(t);
      using Attend = std::function<torch::Tensor(const torch::Tensor&)>;
      const Attend fused = [&](const torch::Tensor& in) {
        return FusedCausalAttention(in, heads);
      };
      const Attend unfused = [&](const torch::Tensor& in) {
        return UnfusedCausalAttention(in, heads, mask);
      };
      // The heap bytes held from the start of a forward pass with
      // gradients to its end: what the graph keeps for the backward pass,
      // the output included.
      const auto kept = [&](const Attend& attend) {
        torch::Tensor in = base.detach().requires_grad_(true);
        const size_t before = HeapBytes();
        torch::Tensor y = attend(in);
        return static_cast<double>(HeapBytes() - before);
      };
      const double kept_unfused = kept(unfused), kept_fused = kept(fused);
      for (bool backward : {false, true}) {
        const auto time = [&](const Attend& attend) {
          if (!backward) {
            torch::NoGradGuard no_grad;
            return Seconds([&] { attend(base); });
          }
          torch::Tensor in = base.detach().requires_grad_(true);
          return Seconds([&] { (attend(in) * up).sum().backward(); });
        };
        std::vector<double> a, b;
        for (int rep = 0; rep <= reps; ++rep) {
          const double ta = time(unfused), tb = time(fused);
          if (rep > 0) {  // the first is a warm-up
            a.push_back(ta);
            b.push_back(tb);
          }
        }
        std::printf(
            "| %s | %lld | %s | %.3f | %.3f | %.2f | %.1f MiB | %.1f MiB |\n",
            dtype == torch::kFloat32 ? "fp32" : "bf16",
            static_cast<long long>(t),
            backward ? "forward + backward" : "forward", Median(a) * 1e3,
            Median(b) * 1e3, Median(a) / Median(b), kept_unfused / (1 << 20),
            kept_fused / (1 << 20));
      }
    }
  }
  return 0;
}

}  // namespace
}  // namespace lockstep::worker

int main(int argc, char** argv) { return lockstep::worker::Main(argc, argv); }
