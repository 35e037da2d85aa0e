// The built-in models and their export format.
#include "worker/train/model.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include "common/files.h"

namespace lockstep::worker {
namespace {

TEST(ModelTest, UnknownModelIsNamed) {
  auto model = BuildModel("resnet9000", 28, 28);
  ASSERT_FALSE(model.ok());
  EXPECT_NE(model.status().message().find("resnet9000"), std::string::npos);
}

// The exported file is what torch::load reads: a user loads the final model
// into the same architecture with plain LibTorch.
TEST(ModelTest, ExportedModelLoadsWithTorchLoad) {
  for (const char* name : {"mlp", "cnn"}) {
    torch::manual_seed(3);
    auto trained = BuildModel(name, 28, 28);
    ASSERT_TRUE(trained.ok());
    std::string tmpl = ::testing::TempDir() + "export_XXXXXX";
    std::string dir = mkdtemp(tmpl.data());
    std::string path = dir + "/final.pt";
    ASSERT_TRUE(WriteFileAtomically(path, SerializeModel(**trained)).ok());

    torch::manual_seed(4);  // different initial weights
    auto loaded = BuildModel(name, 28, 28);
    ASSERT_TRUE(loaded.ok());
    ASSERT_NE(ModelDigest(**loaded), ModelDigest(**trained)) << name;
    torch::load(*loaded, path);
    EXPECT_EQ(ModelDigest(**loaded), ModelDigest(**trained)) << name;
    torch::Tensor x = torch::randn({2, 1, 28, 28});
    EXPECT_TRUE(torch::equal((*loaded)->forward(x), (*trained)->forward(x)));
  }
}

}  // namespace
}  // namespace lockstep::worker
