// The raw-tensor handover of a replica's state: between ranks as threads
// over real Gloo TCP on loopback (replicas built as the trainer builds
// them, trained a few steps so the optimizer holds state), and a receiver
// fed a scripted, hostile sender through a fake communicator.
#include "worker/train/state_handover.h"

#include <gtest/gtest.h>

#include <cstring>
#include <deque>
#include <functional>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/job_spec.h"
#include "tests/unit/gloo_ranks.h"
#include "worker/collective/gloo_communicator.h"
#include "worker/collective/in_memory_kv.h"

namespace lockstep::worker {
namespace {

v1::JobSpec Spec(const std::string& model, const std::string& optimizer) {
  v1::JobSpec spec;
  spec.mutable_model()->set_name(model);
  spec.mutable_optimizer()->set_type(optimizer);
  spec.set_seed(5);
  ApplyDefaults(&spec);
  return spec;
}

// Ranks are threads sharing LibTorch's global generator: build and train
// under a lock.
absl::Mutex torch_mu(absl::kConstInit);

Replica Build(const v1::JobSpec& spec) {
  absl::MutexLock lock(&torch_mu);
  Replica replica;
  absl::Status built =
      InitializeReplica(spec, ModelOptionsOf(spec), torch::kCPU, &replica);
  EXPECT_TRUE(built.ok()) << built;
  return replica;
}

// `steps` optimizer steps on random batches drawn from `seed`.
void Train(Replica& replica, int steps, uint64_t seed) {
  absl::MutexLock lock(&torch_mu);
  torch::manual_seed(seed);
  for (int i = 0; i < steps; ++i) {
    torch::Tensor images = torch::randn({8, 1, 28, 28});
    torch::Tensor labels = torch::randint(0, 10, {8});
    replica.optimizer->zero_grad();
    torch::nn::functional::cross_entropy(replica.model->forward(images), labels)
        .backward();
    replica.optimizer->step();
    ++replica.step;
  }
}

bool BitwiseEqual(const torch::Tensor& a, const torch::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) {
    return false;
  }
  const torch::Tensor x = a.contiguous(), y = b.contiguous();
  return std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) == 0;
}

void ExpectSameState(const Replica& expected, const Replica& actual) {
  auto want = CollectState(expected);
  auto got = CollectState(actual);
  ASSERT_TRUE(want.ok()) << want.status();
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_EQ(want->size(), got->size());
  for (size_t i = 0; i < want->size(); ++i) {
    EXPECT_EQ((*want)[i].layout.ToString(), (*got)[i].layout.ToString());
    EXPECT_TRUE(BitwiseEqual((*want)[i].tensor, (*got)[i].tensor))
        << (*want)[i].layout.ToString();
  }
}

// Model, optimizer, pack size, whether the receiver trained before.
using Case = std::tuple<std::string, std::string, size_t, bool>;

class RawHandoverTest : public testing::TestWithParam<Case> {};

TEST_P(RawHandoverTest, EveryReceiverEndsWithTheSendersBytes) {
  const auto& [model, optimizer, pack_bytes, receiver_trained] = GetParam();
  const v1::JobSpec spec = Spec(model, optimizer);
  constexpr int kWorld = 3;
  std::vector<Replica> replicas(kWorld);
  for (Replica& r : replicas) r = Build(spec);
  Train(replicas[1], 3, /*seed=*/11);  // the sender
  replicas[1].global_batch = 48;
  replicas[1].scaler.Restore(256, 7, /*skipped=*/2);
  if (receiver_trained) Train(replicas[2], 1, /*seed=*/12);
  HandoverOptions options;
  options.pack_bytes = pack_bytes;
  std::vector<absl::StatusOr<HandoverStats>> stats(kWorld);
  OnRanks(kWorld, [&](int rank, Communicator& comm) {
    stats[rank] = HandOverState(comm, 1, replicas[rank], options);
  });
  for (int rank = 0; rank < kWorld; ++rank) {
    ASSERT_TRUE(stats[rank].ok()) << rank << ": " << stats[rank].status();
    EXPECT_EQ(stats[rank]->tensor_bytes, stats[1]->tensor_bytes);
    EXPECT_EQ(replicas[rank].global_batch, 48);
    EXPECT_EQ(replicas[rank].scaler.scale(), replicas[1].scaler.scale());
    EXPECT_EQ(replicas[rank].scaler.skipped_steps(), 2);
    ExpectSameState(replicas[1], replicas[rank]);
  }
  EXPECT_GT(stats[1]->tensors,
            static_cast<int>(replicas[1].model->parameters().size()));
  // The adopted optimizer state steps as the sender's does.
  for (Replica& r : replicas) Train(r, 1, /*seed=*/13);
  for (const Replica& r : replicas) {
    EXPECT_EQ(ModelDigest(*r.model).value(),
              ModelDigest(*replicas[1].model).value());
  }
}

INSTANTIATE_TEST_SUITE_P(
    Optimizers, RawHandoverTest,
    testing::Values(Case{"mlp", "sgd", size_t{4} << 20, false},
                    Case{"mlp", "sgd", 0, true},
                    Case{"resnet", "adam", size_t{4} << 20, false},
                    Case{"resnet", "adam", 4096, true},
                    Case{"cnn", "adam", 0, false}));

TEST(RawHandoverTest, PackingKeepsTheCollectivesFew) {
  Replica sender = Build(Spec("resnet", "adam"));
  Replica receiver = Build(Spec("resnet", "adam"));
  Train(sender, 1, 21);
  std::vector<Replica*> replicas = {&sender, &receiver};
  std::vector<absl::StatusOr<HandoverStats>> packed(2), alone(2);
  OnRanks(2, [&](int rank, Communicator& comm) {
    packed[rank] = HandOverState(comm, 0, *replicas[rank]);
    HandoverOptions one_each;
    one_each.pack_bytes = 0;
    alone[rank] = HandOverState(comm, 0, *replicas[rank], one_each);
  });
  ASSERT_TRUE(packed[1].ok()) << packed[1].status();
  ASSERT_TRUE(alone[1].ok()) << alone[1].status();
  // The header with the layout, the verdict, then one pack: the state of
  // this small network fits in 4 MiB.
  EXPECT_EQ(packed[1]->collectives, 3);
  EXPECT_GT(alone[1]->collectives, 100);
  ExpectSameState(sender, receiver);
}

// A network of many small tensors: its layout outgrows the first message.
class ManyTensors : public Network {
 public:
  explicit ManyTensors(int tensors) {
    for (int i = 0; i < tensors; ++i) {
      register_parameter(absl::StrCat("a_rather_long_parameter_name_", i),
                         torch::randn({2, 3}));
    }
  }
  torch::Tensor Features(const torch::Tensor& x) override { return x; }
  torch::Tensor Logits(const torch::Tensor& x) override { return x; }
};

TEST(RawHandoverTest, ALayoutLongerThanTheFirstMessageFollowsIt) {
  std::vector<Replica> replicas(2);
  for (Replica& r : replicas) {
    absl::MutexLock lock(&torch_mu);
    torch::manual_seed(3);
    r.model = std::make_shared<ManyTensors>(2000);
    r.optimizer =
        MakeOptimizer(Spec("mlp", "sgd").optimizer(), r.model->parameters(),
                      r.model->WeightDecayMask());
  }
  {
    torch::NoGradGuard no_grad;
    for (torch::Tensor& p : replicas[0].model->parameters()) {
      p.add_(1);
      p.mutable_grad() = torch::ones_like(p);
    }
  }
  replicas[0].optimizer->step();  // creates the momentum buffers
  std::vector<absl::StatusOr<HandoverStats>> stats(2);
  OnRanks(2, [&](int rank, Communicator& comm) {
    stats[rank] = HandOverState(comm, 0, replicas[rank]);
  });
  ASSERT_TRUE(stats[1].ok()) << stats[1].status();
  EXPECT_GT(stats[1]->header_bytes, kFirstMessageBytes);
  EXPECT_EQ(stats[1]->tensors, 4000);
  // The header in two parts, the verdict, one pack.
  EXPECT_EQ(stats[1]->collectives, 4);
  ExpectSameState(replicas[0], replicas[1]);
}

TEST(RawHandoverTest, AnotherModelIsRefusedBeforeAnyTensorMoves) {
  Replica sender = Build(Spec("mlp", "sgd"));
  Replica receiver = Build(Spec("cnn", "sgd"));
  Train(sender, 1, 31);
  const std::string before = ModelDigest(*receiver.model).value();
  std::vector<Replica*> replicas = {&sender, &receiver};
  std::vector<absl::StatusOr<HandoverStats>> stats(2);
  OnRanks(2, [&](int rank, Communicator& comm) {
    stats[rank] = HandOverState(comm, 0, *replicas[rank]);
  });
  ASSERT_FALSE(stats[1].ok());
  EXPECT_EQ(stats[1].status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(stats[1].status().message().find(
                "rank 1 cannot adopt rank 0's state: tensor 0 differs (rank 0 "
                "sends parameter body."),
            std::string::npos)
      << stats[1].status();
  ASSERT_FALSE(stats[0].ok());
  EXPECT_EQ(stats[0].status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(stats[0].status().message().find("rank 1 refused rank 0's state"),
            std::string::npos)
      << stats[0].status();
  EXPECT_EQ(ModelDigest(*receiver.model).value(), before);
}

TEST(RawHandoverTest, AnotherOptimizerIsRefusedNamingItsState) {
  Replica sender = Build(Spec("mlp", "sgd"));
  Replica receiver = Build(Spec("mlp", "adam"));
  Train(sender, 1, 41);
  std::vector<Replica*> replicas = {&sender, &receiver};
  std::vector<absl::StatusOr<HandoverStats>> stats(2);
  OnRanks(2, [&](int rank, Communicator& comm) {
    stats[rank] = HandOverState(comm, 0, *replicas[rank]);
  });
  ASSERT_FALSE(stats[1].ok());
  EXPECT_NE(stats[1].status().message().find("/momentum_buffer"),
            std::string::npos)
      << stats[1].status();
  EXPECT_FALSE(stats[0].ok());
  EXPECT_TRUE(receiver.optimizer->state().empty());
}

// Rank 1 of 2. Each broadcast from rank 0 delivers the next scripted
// message; the sizes asked for are recorded. Rank 0 accepts every verdict.
class ScriptedSender : public Communicator {
 public:
  explicit ScriptedSender(std::deque<std::string> script)
      : script_(std::move(script)) {}
  int rank() const override { return rank_; }
  int size() const override { return 2; }
  absl::Status AllReduceSum(void*, size_t, DataType) override {
    return absl::UnimplementedError("not used");
  }
  absl::Status Broadcast(void* data, size_t bytes, int root) override {
    asked_.push_back(bytes);
    if (rank_ == root) {  // recording a real sender
      script_.emplace_back(static_cast<const char*>(data), bytes);
      return absl::OkStatus();
    }
    if (script_.empty()) return absl::UnavailableError("rank 0 went away");
    std::string next = std::move(script_.front());
    script_.pop_front();
    if (next.size() != bytes) return absl::InternalError("size mismatch");
    std::memcpy(data, next.data(), bytes);
    return absl::OkStatus();
  }
  absl::Status AllGather(const void* in, size_t bytes, void* out) override {
    for (int r = 0; r < 2; ++r) {
      std::memcpy(static_cast<char*>(out) + r * bytes, in, bytes);
    }
    return absl::OkStatus();
  }
  absl::Status Barrier() override { return absl::OkStatus(); }
  void Abort() override {}

  void set_rank(int rank) { rank_ = rank; }
  std::deque<std::string>& script() { return script_; }
  const std::vector<size_t>& asked() const { return asked_; }

 private:
  int rank_ = 1;
  std::deque<std::string> script_;
  std::vector<size_t> asked_;
};

// What a real MLP/SGD sender broadcasts: the header, the layout, the packs.
std::deque<std::string> RecordSender(size_t pack_bytes = size_t{4} << 20) {
  Replica sender = Build(Spec("mlp", "sgd"));
  Train(sender, 1, 51);
  ScriptedSender recorder({});
  recorder.set_rank(0);
  HandoverOptions options;
  options.pack_bytes = pack_bytes;
  auto stats = HandOverState(recorder, 0, sender, options);
  EXPECT_TRUE(stats.ok()) << stats.status();
  return recorder.script();
}

// The recorded first message with its header replaced.
std::string WithHeader(std::string first, const StateHeader& header) {
  return first.replace(0, sizeof(header),
                       reinterpret_cast<const char*>(&header), sizeof(header));
}

StateHeader HeaderOf(const std::deque<std::string>& script) {
  StateHeader header;
  std::memcpy(&header, script.front().data(), sizeof(header));
  return header;
}

TEST(HostileHeaderTest, HugeCountsAreRefusedBeforeAllocating) {
  const std::deque<std::string> honest = RecordSender();
  for (int field = 0; field < 2; ++field) {
    StateHeader header = HeaderOf(honest);
    if (field == 0) header.layout_bytes = uint64_t{1} << 62;
    if (field == 1) header.tensors = uint64_t{1} << 40;
    Replica receiver = Build(Spec("mlp", "sgd"));
    const std::string before = ModelDigest(*receiver.model).value();
    ScriptedSender comm({WithHeader(honest.front(), header)});
    auto stats = HandOverState(comm, 0, receiver);
    ASSERT_FALSE(stats.ok());
    EXPECT_EQ(stats.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_NE(stats.status().message().find("rank 1 refuses rank 0's state "
                                            "header"),
              std::string::npos)
        << stats.status();
    // Only the first message was received: no layout was allocated.
    EXPECT_EQ(comm.asked(), std::vector<size_t>{kFirstMessageBytes});
    EXPECT_EQ(ModelDigest(*receiver.model).value(), before);
  }
}

TEST(HostileHeaderTest, ALayoutThatClaimsMoreThanItHoldsIsRefused) {
  std::deque<std::string> script = RecordSender();
  StateHeader header = HeaderOf(script);
  header.tensors = 100000;  // within the limit; the layout holds 12
  script.front() = WithHeader(script.front(), header);
  Replica receiver = Build(Spec("mlp", "sgd"));
  ScriptedSender comm(script);
  auto stats = HandOverState(comm, 0, receiver);
  ASSERT_FALSE(stats.ok());
  EXPECT_EQ(stats.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(comm.asked().size(), 1u);  // the header, no tensor
}

TEST(HostileHeaderTest, DecodeLayoutChecksEveryLengthAndDimension) {
  TensorLayout good;
  good.name = "w";
  good.shape = {3, 4};
  const std::string bytes = EncodeLayout({good});
  auto decoded = DecodeLayout(bytes, 1);
  ASSERT_TRUE(decoded.ok()) << decoded.status();
  EXPECT_EQ((*decoded)[0], good);
  // Truncated, trailing bytes, a count the bytes cannot hold.
  EXPECT_FALSE(DecodeLayout(bytes.substr(0, bytes.size() - 1), 1).ok());
  EXPECT_FALSE(DecodeLayout(bytes + "x", 1).ok());
  EXPECT_FALSE(DecodeLayout(bytes, uint64_t{1} << 60).ok());
  // A name longer than allowed, though the bytes hold it.
  TensorLayout long_name = good;
  long_name.name.assign(kMaxTensorNameBytes + 1, 'n');
  EXPECT_FALSE(DecodeLayout(EncodeLayout({long_name}), 1).ok());
  // Dimensions whose product overflows, a negative one, an unknown dtype.
  TensorLayout huge = good;
  huge.shape = {int64_t{1} << 30, int64_t{1} << 30, int64_t{1} << 30};
  EXPECT_FALSE(DecodeLayout(EncodeLayout({huge}), 1).ok());
  TensorLayout negative = good;
  negative.shape = {-1};
  EXPECT_FALSE(DecodeLayout(EncodeLayout({negative}), 1).ok());
  std::string bad_dtype = bytes;
  bad_dtype[1] = 99;
  auto refused = DecodeLayout(bad_dtype, 1);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_NE(refused.status().message().find("unknown dtype"),
            std::string::npos);
}

TEST(HostileHeaderTest, AReceiverTornMidTransferBecomesAFreshReplica) {
  std::deque<std::string> script = RecordSender(/*pack_bytes=*/0);
  ASSERT_GT(script.size(), 3u);
  script.pop_back();  // the sender dies before the last tensor
  Replica receiver = Build(Spec("mlp", "sgd"));
  receiver.job_id = "job-1";
  receiver.step = 4;
  ScriptedSender comm(script);
  auto stats = HandOverState(comm, 0, receiver);
  ASSERT_FALSE(stats.ok());
  EXPECT_EQ(stats.status().code(), absl::StatusCode::kUnavailable);
  // Rebuilt from the seed by the next generation, never a source.
  EXPECT_EQ(receiver.model, nullptr);
  EXPECT_EQ(receiver.optimizer, nullptr);
  EXPECT_EQ(receiver.step, 0);
  EXPECT_EQ(receiver.job_id, "job-1");
}

}  // namespace
}  // namespace lockstep::worker
