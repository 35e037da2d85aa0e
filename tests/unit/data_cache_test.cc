// The per-process data set cache: a split is opened once, the cache holds
// one data set at a time, and a finished job's data can be dropped.
#include "worker/train/data_cache.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <string>

#include "common/files.h"
#include "tests/unit/npy_bytes.h"

namespace lockstep::worker {
namespace {

class DataCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ForgetCachedData();
    std::string tmpl = ::testing::TempDir() + "data_cache_XXXXXX";
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

  // The split's source: the same address means the same opening.
  const void* Pixels(const v1::DataSpec& spec, bool train) {
    auto data = LoadSplit(spec, train);
    EXPECT_TRUE(data.ok()) << data.status();
    return data.ok() ? data->get() : nullptr;
  }

  std::string root_;
};

TEST_F(DataCacheTest, ASplitIsDecodedOncePerDataSet) {
  const v1::DataSpec a = DataSet("a");
  const void* train = Pixels(a, true);
  const void* test = Pixels(a, false);
  EXPECT_EQ(Pixels(a, true), train);
  EXPECT_EQ(Pixels(a, false), test);
  EXPECT_NE(train, test);
}

TEST_F(DataCacheTest, AnotherDataSetReplacesTheCachedOne) {
  const v1::DataSpec a = DataSet("a");
  const v1::DataSpec b = DataSet("b");
  // Held by the test, as a running generation holds its data: it stays
  // valid when the cache lets go of it.
  auto held = LoadSplit(a, true);
  ASSERT_TRUE(held.ok()) << held.status();
  auto held_b = LoadSplit(b, true);
  ASSERT_TRUE(held_b.ok()) << held_b.status();
  const void* b_train = held_b->get();
  EXPECT_EQ(Pixels(b, true), b_train);
  // a was dropped: opened again.
  auto a_again = LoadSplit(a, true);
  ASSERT_TRUE(a_again.ok());
  EXPECT_NE(a_again->get(), held->get());
  ASSERT_EQ((*held)->size(), 3);
  char pixels[4];
  ASSERT_TRUE((*held)->ReadColumn((*held)->Find("images"), {2}, pixels).ok());
  EXPECT_EQ(pixels[0], 0x7f);
  // and b in its turn.
  EXPECT_NE(Pixels(b, true), b_train);
}

TEST_F(DataCacheTest, ForgettingDropsEverySplit) {
  const v1::DataSpec a = DataSet("a");
  auto held = LoadSplit(a, true);  // keeps its address from being reused
  ASSERT_TRUE(held.ok());
  ForgetCachedData();
  EXPECT_NE(Pixels(a, true), held->get());
}

}  // namespace
}  // namespace lockstep::worker
