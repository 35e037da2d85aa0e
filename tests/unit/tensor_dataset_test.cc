// The per-process data set cache: a split is decoded once, the cache holds
// one data set at a time, and a finished job's data can be dropped.
#include "worker/train/tensor_dataset.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <string>

#include "common/files.h"
#include "tests/unit/npy_bytes.h"

namespace lockstep::worker {
namespace {

class TensorDatasetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ForgetCachedData();
    std::string tmpl = ::testing::TempDir() + "tensor_dataset_XXXXXX";
    root_ = mkdtemp(tmpl.data());
  }
  void TearDown() override {
    ForgetCachedData();
    std::filesystem::remove_all(root_);
  }

  // A .npy data set of 3 training and 2 test images of 2x2 pixels in
  // root/name; its spec.
  v1::DataSpec DataSet(const std::string& name) {
    const std::string dir = root_ + "/" + name;
    std::filesystem::create_directory(dir);
    auto write = [&](const std::string& file, const std::string& bytes) {
      EXPECT_TRUE(WriteFileAtomically(dir + "/" + file, bytes).ok());
    };
    write("train_images.npy", Npy("|u1", "(3, 2, 2)", std::string(12, '\x7f')));
    write("train_labels.npy", Npy("<i8", "(3,)", Int64s({0, 9, 4})));
    write("test_images.npy", Npy("|u1", "(2, 2, 2)", std::string(8, '\x01')));
    write("test_labels.npy", Npy("<i8", "(2,)", Int64s({2, 3})));
    v1::DataSpec spec;
    spec.set_format("npy");
    spec.set_dir(dir);
    return spec;
  }

  // Where the split's pixels live: the same address means the same decode.
  const void* Pixels(const v1::DataSpec& spec, bool train) {
    auto data = LoadSplit(spec, train);
    EXPECT_TRUE(data.ok()) << data.status();
    return data.ok() ? data->images.data_ptr() : nullptr;
  }

  std::string root_;
};

TEST_F(TensorDatasetTest, ASplitIsDecodedOncePerDataSet) {
  const v1::DataSpec a = DataSet("a");
  const void* train = Pixels(a, true);
  const void* test = Pixels(a, false);
  EXPECT_EQ(Pixels(a, true), train);
  EXPECT_EQ(Pixels(a, false), test);
  EXPECT_NE(train, test);
}

TEST_F(TensorDatasetTest, AnotherDataSetReplacesTheCachedOne) {
  const v1::DataSpec a = DataSet("a");
  const v1::DataSpec b = DataSet("b");
  // Held by the test, as a running generation holds its data: it stays
  // valid when the cache lets go of it.
  absl::StatusOr<TensorDataset> held = LoadSplit(a, true);
  ASSERT_TRUE(held.ok()) << held.status();
  const void* b_train = Pixels(b, true);
  EXPECT_EQ(Pixels(b, true), b_train);
  // a was dropped: decoded again.
  EXPECT_NE(Pixels(a, true), held->images.data_ptr());
  EXPECT_EQ(held->images.numel(), 12);
  EXPECT_EQ(held->images.flatten()[0].item<int>(), 0x7f);
  // and b in its turn.
  EXPECT_NE(Pixels(b, true), b_train);
}

TEST_F(TensorDatasetTest, ForgettingDropsEverySplit) {
  const v1::DataSpec a = DataSet("a");
  const void* train = Pixels(a, true);
  ForgetCachedData();
  EXPECT_NE(Pixels(a, true), train);
}

}  // namespace
}  // namespace lockstep::worker
