// A replica's checkpoint files do not depend on the device that trained it:
// the path a GPU replica takes (every tensor through the host) writes the
// same bytes as the CPU's, and what is written loads back onto a device
// given explicitly.
#include "worker/train/replica_checkpoint.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <sstream>

#include "common/files.h"
#include "common/job_spec.h"
#include "common/sha256.h"

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

// A replica that took one optimizer step, so the optimizer has state.
Replica Trained(const v1::JobSpec& spec) {
  Replica replica;
  absl::Status built =
      InitializeReplica(spec, ModelOptionsOf(spec), torch::kCPU, &replica);
  EXPECT_TRUE(built.ok()) << built;
  torch::Tensor images = torch::randn({4, 1, 28, 28});
  torch::Tensor labels = torch::tensor({1, 2, 3, 4}, torch::kInt64);
  torch::nn::functional::cross_entropy(replica.model->forward(images), labels)
      .backward();
  replica.optimizer->step();
  return replica;
}

class ReplicaCheckpointTest
    : public ::testing::TestWithParam<std::tuple<std::string, std::string>> {};

// One more identical step on `replica`: its result depends on the
// parameters and on the optimizer's state (momentum, Adam's moments).
std::string StepAndDigest(Replica& replica) {
  torch::manual_seed(11);
  torch::Tensor images = torch::randn({4, 1, 28, 28});
  torch::Tensor labels = torch::tensor({5, 6, 7, 8}, torch::kInt64);
  replica.optimizer->zero_grad();
  torch::nn::functional::cross_entropy(replica.model->forward(images), labels)
      .backward();
  replica.optimizer->step();
  return ModelDigest(*replica.model).value();
}

// The archives name their classes with a process-wide counter, so two
// saves of one model differ in bytes; what they hold is compared instead.
TEST_P(ReplicaCheckpointTest, ThroughTheHostHoldsTheSameState) {
  const auto& [model, optimizer] = GetParam();
  const v1::JobSpec spec = Spec(model, optimizer);
  Replica trained = Trained(spec);
  const std::string model_bytes = SerializeModelThroughHost(*trained.model);
  const std::string optimizer_bytes =
      SerializeOptimizerThroughHost(spec, trained);
  Replica fresh;
  ASSERT_TRUE(
      InitializeReplica(spec, ModelOptionsOf(spec), torch::kCPU, &fresh).ok());
  std::istringstream model_in(model_bytes);
  torch::serialize::InputArchive model_archive;
  model_archive.load_from(model_in, fresh.device);
  fresh.model->load(model_archive);
  std::istringstream optimizer_in(optimizer_bytes);
  torch::serialize::InputArchive optimizer_archive;
  optimizer_archive.load_from(optimizer_in, fresh.device);
  fresh.optimizer->load(optimizer_archive);
  EXPECT_EQ(ModelDigest(*fresh.model).value(),
            ModelDigest(*trained.model).value());
  EXPECT_EQ(StepAndDigest(fresh), StepAndDigest(trained));
}

TEST_P(ReplicaCheckpointTest, ASnapshotLoadsOntoTheDeviceItIsGiven) {
  const auto& [model, optimizer] = GetParam();
  const v1::JobSpec spec = Spec(model, optimizer);
  Replica trained = Trained(spec);
  Replica fresh;
  ASSERT_TRUE(
      InitializeReplica(spec, ModelOptionsOf(spec), torch::kCPU, &fresh).ok());
  ASSERT_NE(ModelDigest(*fresh.model).value(),
            ModelDigest(*trained.model).value());
  std::istringstream model_in(SerializeModelOnHost(trained));
  torch::serialize::InputArchive archive;
  archive.load_from(model_in, fresh.device);
  fresh.model->load(archive);
  EXPECT_EQ(ModelDigest(*fresh.model).value(),
            ModelDigest(*trained.model).value());
}

// A checkpoint whose manifest omits model.pt: the restore refuses it as
// corrupt instead of reading whatever model.pt is (here bytes that no
// manifest vouches for; a link to /dev/zero would never end).
TEST(LoadCheckpointTest, AFileTheManifestOmitsIsNotRead) {
  const v1::JobSpec spec = Spec("mlp", "sgd");
  std::string dir = ::testing::TempDir() + "load_checkpoint_XXXXXX";
  ASSERT_NE(mkdtemp(dir.data()), nullptr);
  v1::TrainerState state;
  state.set_model("mlp");
  state.set_seed(spec.seed());
  const std::string trainer = checkpoint::ToJson(state);
  checkpoint::Found found;
  found.dir = dir;
  found.manifest.set_step(10);
  v1::CheckpointFile* listed = found.manifest.add_files();
  listed->set_name("trainer.state");
  listed->set_size(static_cast<int64_t>(trainer.size()));
  listed->set_sha256(Sha256Hex(trainer).value());
  ASSERT_TRUE(WriteFileDurably(dir + "/trainer.state", trainer).ok());
  ASSERT_TRUE(WriteFileDurably(dir + "/model.pt", "not vouched for").ok());
  Replica replica;
  ASSERT_TRUE(
      InitializeReplica(spec, ModelOptionsOf(spec), torch::kCPU, &replica)
          .ok());
  absl::Status loaded = LoadCheckpoint(found, spec, "mlp", replica);
  EXPECT_EQ(loaded.code(), absl::StatusCode::kDataLoss) << loaded;
  EXPECT_THAT(std::string(loaded.message()),
              ::testing::HasSubstr("does not list model.pt"));
  EXPECT_EQ(replica.step, 0);
  std::error_code error;
  std::filesystem::remove_all(dir, error);
}

INSTANTIATE_TEST_SUITE_P(Models, ReplicaCheckpointTest,
                         ::testing::Combine(::testing::Values("mlp", "resnet"),
                                            ::testing::Values("sgd", "adam")));

}  // namespace
}  // namespace lockstep::worker
