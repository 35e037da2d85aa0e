// The state handover of a new generation (docs/DESIGN.md §3), timed: rank 0
// hands its replica's state (model, optimizer, scalars) to rank 1, ranks as
// threads over Gloo's TCP transport on 127.0.0.1. The replica is built as
// the worker builds it from a job spec (default: the ResNet example) and
// trained one step, so the optimizer holds state; each repetition hands it
// to a fresh replica, as to a replacement worker. Compares, in this run,
// the LibTorch archive lockstep sent before (serialize, broadcast the
// bytes, load) with the raw tensors it sends now, at several pack sizes.
// The methods take turns, round by round. Reports per method the median
// time, the median over rounds of its time / the archive's (raw/archive),
// the bytes moved and the number of collectives; exits 1 when a receiver
// does not end with the sender's bytes.
//
//   handover_bench SPEC_JSON [ROUNDS]   default 20 rounds
//   handover_bench SPEC_JSON --tiny     3 rounds: a smoke run
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/job_spec.h"
#include "common/status_macros.h"
#include "worker/collective/gloo_communicator.h"
#include "worker/collective/in_memory_kv.h"
#include "worker/train/state_handover.h"

namespace lockstep::worker {
namespace {

using Clock = std::chrono::steady_clock;

// ---- the archive path, as state_agreement.cc sent the state before -------

struct ArchiveHeader {
  uint64_t archive_bytes = 0;
  int64_t global_batch = 0;
  double loss_scale = 1;
  int64_t good_steps = 0;
  int64_t skipped_steps = 0;
};

std::string SerializeState(const Replica& replica) {
  torch::serialize::OutputArchive archive;
  replica.model->save(archive);
  torch::serialize::OutputArchive optimizer;
  replica.optimizer->save(optimizer);
  archive.write("optimizer", optimizer);
  std::ostringstream out;
  archive.save_to(out);
  return out.str();
}

void LoadState(const std::string& bytes, Replica& replica) {
  std::istringstream in(bytes);
  torch::serialize::InputArchive archive;
  archive.load_from(in, replica.device);
  replica.model->load(archive);
  torch::serialize::InputArchive optimizer;
  archive.read("optimizer", optimizer);
  replica.optimizer->load(optimizer);
}

// Returns the bytes moved.
absl::StatusOr<int64_t> HandOverArchive(Communicator& comm, int source,
                                        Replica& replica) {
  const bool sending = comm.rank() == source;
  std::string archive;
  if (sending) archive = SerializeState(replica);
  ArchiveHeader header;
  header.archive_bytes = archive.size();
  header.global_batch = replica.global_batch;
  header.loss_scale = replica.scaler.scale();
  header.good_steps = replica.scaler.good_steps();
  header.skipped_steps = replica.scaler.skipped_steps();
  RETURN_IF_ERROR(comm.Broadcast(&header, sizeof(header), source));
  if (!sending) archive.resize(header.archive_bytes);
  RETURN_IF_ERROR(comm.Broadcast(archive.data(), archive.size(), source));
  if (!sending) LoadState(archive, replica);
  return static_cast<int64_t>(sizeof(header) + archive.size());
}

// ---- the run ----------------------------------------------------------------

absl::StatusOr<Replica> BuildReplica(const v1::JobSpec& spec) {
  Replica replica;
  RETURN_IF_ERROR(
      InitializeReplica(spec, ModelOptionsOf(spec), torch::kCPU, &replica));
  return replica;
}

// One optimizer step on a random batch: the optimizer creates its state.
void TrainOneStep(Replica& replica) {
  torch::manual_seed(7);
  torch::Tensor images = torch::randn({16, 1, 28, 28});
  torch::Tensor labels = torch::randint(0, 10, {16});
  replica.optimizer->zero_grad();
  torch::nn::functional::cross_entropy(replica.model->forward(images), labels)
      .backward();
  replica.optimizer->step();
  replica.step = 1;
}

// What one handover from rank 0 to rank 1 reports.
struct Moved {
  int64_t bytes = 0;
  int collectives = 0;
};
using Handover =
    std::function<absl::StatusOr<Moved>(Communicator&, Replica& replica)>;

struct Method {
  std::string name;
  Handover handover;
  std::vector<double> samples_ms;  // per repetition, as rank 1 saw it
  Moved moved;
};

double Median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  return values[values.size() / 2];
}

// Runs every method once per repetition, in turn (the first round is a
// warm-up), each into a fresh receiver: the machine's noise falls on all
// of them alike. Checks every receiver against the sender.
absl::Status Measure(const v1::JobSpec& spec, Replica& sender, int repetitions,
                     std::vector<Method>& methods) {
  const size_t rounds = static_cast<size_t>(repetitions) + 1;
  std::vector<Replica> receivers;
  for (size_t i = 0; i < rounds * methods.size(); ++i) {
    ASSIGN_OR_RETURN(Replica fresh, BuildReplica(spec));
    receivers.push_back(std::move(fresh));
  }
  InMemoryKeyValue kv;
  std::vector<absl::Status> failed(2);
  std::vector<std::thread> threads;
  for (int rank = 0; rank < 2; ++rank) {
    threads.emplace_back([&, rank] {
      GlooCommunicator::Options options;
      options.rank = rank;
      options.size = 2;
      options.timeout = absl::Seconds(60);
      auto comm = GlooCommunicator::Connect(&kv, options);
      if (!comm.ok()) {
        failed[rank] = comm.status();
        return;
      }
      for (size_t i = 0; i < receivers.size(); ++i) {
        Method& method = methods[i % methods.size()];
        Replica& replica = rank == 0 ? sender : receivers[i];
        failed[rank] = (*comm)->Barrier();
        if (!failed[rank].ok()) return;
        const auto start = Clock::now();
        absl::StatusOr<Moved> done = method.handover(**comm, replica);
        const auto end = Clock::now();
        if (!done.ok()) {
          failed[rank] = done.status();
          return;
        }
        if (rank == 1 && i >= methods.size()) {
          method.samples_ms.push_back(
              std::chrono::duration<double, std::milli>(end - start).count());
          method.moved = *done;
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  for (const absl::Status& status : failed) RETURN_IF_ERROR(status);
  const std::string expected = ModelDigest(*sender.model).value();
  for (size_t i = 0; i < receivers.size(); ++i) {
    if (ModelDigest(*receivers[i].model).value() != expected) {
      return absl::InternalError(
          absl::StrCat(methods[i % methods.size()].name,
                       ": the receiver's parameters differ from the sender's"));
    }
  }
  return absl::OkStatus();
}

std::vector<Method> Methods() {
  std::vector<Method> methods;
  methods.push_back(
      {"archive",
       [](Communicator& comm, Replica& replica) -> absl::StatusOr<Moved> {
         ASSIGN_OR_RETURN(int64_t bytes, HandOverArchive(comm, 0, replica));
         return Moved{bytes, 2};
       }});
  for (size_t pack : {size_t{4} << 20, size_t{256} << 10, size_t{0}}) {
    std::string name = pack == 0
                           ? "raw, a broadcast per tensor"
                           : absl::StrCat("raw, packs of ", pack >> 10, " KiB");
    methods.push_back(
        {name,
         [pack](Communicator& comm, Replica& replica) -> absl::StatusOr<Moved> {
           HandoverOptions options;
           options.pack_bytes = pack;
           ASSIGN_OR_RETURN(HandoverStats stats,
                            HandOverState(comm, 0, replica, options));
           return Moved{stats.header_bytes + stats.tensor_bytes,
                        stats.collectives};
         }});
  }
  return methods;
}

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "%s\n", std::string(status.message()).c_str());
  return 1;
}

int Run(const std::string& spec_path, int repetitions) {
  auto spec = LoadJobSpec(spec_path);
  if (!spec.ok()) return Fail(spec.status());
  ApplyDefaults(&*spec);
  auto sender = BuildReplica(*spec);
  if (!sender.ok()) return Fail(sender.status());
  TrainOneStep(*sender);
  auto state = CollectState(*sender);
  if (!state.ok()) return Fail(state.status());
  int64_t tensor_bytes = 0;
  for (const StateTensor& t : *state) tensor_bytes += t.layout.bytes();
  std::printf(
      "state handover of %s (model %s, optimizer %s): %zu tensors, %.2f MiB; "
      "rank 0 -> rank 1, Gloo TCP on 127.0.0.1, %d rounds\n\n",
      spec->name().c_str(), spec->model().name().c_str(),
      spec->optimizer().type().c_str(), state->size(), tensor_bytes / 1048576.0,
      repetitions);
  std::vector<Method> methods = Methods();
  absl::Status measured = Measure(*spec, *sender, repetitions, methods);
  if (!measured.ok()) return Fail(measured);
  std::printf("%-30s %12s %16s %14s %12s\n", "method", "median ms",
              "median / archive", "bytes moved", "collectives");
  for (const Method& method : methods) {
    // The ratio of each round's pair, then the median: robust to a noisy
    // round.
    std::vector<double> ratios;
    for (size_t i = 0; i < method.samples_ms.size(); ++i) {
      ratios.push_back(method.samples_ms[i] / methods[0].samples_ms[i]);
    }
    std::printf("%-30s %12.3f %16.3f %14lld %12d\n", method.name.c_str(),
                Median(method.samples_ms), Median(ratios),
                static_cast<long long>(method.moved.bytes),
                method.moved.collectives);
  }
  return 0;
}

}  // namespace
}  // namespace lockstep::worker

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    std::fprintf(stderr, "usage: handover_bench SPEC_JSON [ROUNDS | --tiny]\n");
    return 2;
  }
  int repetitions = 20;
  if (argc == 3) {
    const std::string arg = argv[2];
    repetitions = arg == "--tiny" ? 3 : std::atoi(argv[2]);
    if (repetitions < 1) {
      std::fprintf(stderr, "ROUNDS must be a positive number\n");
      return 2;
    }
  }
  return lockstep::worker::Run(argv[1], repetitions);
}
