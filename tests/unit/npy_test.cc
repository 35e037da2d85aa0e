// NumPy .npy reading: what numpy.save writes, and every malformed file
// rejected with its name.
#include "worker/data/npy.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstring>
#include <filesystem>

#include "absl/strings/str_cat.h"
#include "common/files.h"
#include "tests/unit/npy_bytes.h"
#include "worker/data/split_source.h"

namespace lockstep::worker {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

class NpyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "npy_XXXXXX";
    dir_ = mkdtemp(tmpl.data());
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  void Write(const std::string& name, const std::string& bytes) {
    ASSERT_TRUE(WriteFileAtomically(dir_ + "/" + name, bytes).ok());
  }
  // A valid data set of 3 training and 2 test images of 2x2 pixels.
  void WriteValid() {
    Write("train_images.npy", Npy("|u1", "(3, 2, 2)", std::string(12, '\x7f')));
    Write("train_labels.npy", Npy("<i8", "(3,)", Int64s({0, 9, 4})));
    Write("test_images.npy",
          Npy("|u1", "(2, 1, 2, 2)", std::string(8, '\x01')));
    Write("test_labels.npy", Npy("|u1", "(2,)", std::string("\x02\x03", 2)));
  }

  std::string dir_;
};

// The legacy four-file layout reads as columns images and labels, of any
// integer label type and either image shape.
TEST_F(NpyTest, ReadsWhatNumpySaveWrites) {
  WriteValid();
  v1::DataSpec spec;
  spec.set_format("npy");
  spec.set_dir(dir_);
  auto train = OpenSplit(spec, true);
  ASSERT_TRUE(train.ok()) << train.status();
  EXPECT_EQ((*train)->size(), 3);
  const ColumnInfo& images = (*train)->columns()[(*train)->Find("images")];
  EXPECT_EQ(images.shape, (std::vector<int64_t>{2, 2}));
  int64_t labels[3];
  ASSERT_TRUE((*train)
                  ->ReadColumn((*train)->Find("labels"), {0, 1, 2},
                               reinterpret_cast<char*>(labels))
                  .ok());
  EXPECT_EQ(std::vector<int64_t>(labels, labels + 3),
            (std::vector<int64_t>{0, 9, 4}));
  auto test = OpenSplit(spec, false);  // (N, 1, H, W) and uint8 labels
  ASSERT_TRUE(test.ok()) << test.status();
  EXPECT_EQ((*test)->size(), 2);
  EXPECT_EQ((*test)->columns()[(*test)->Find("images")].shape,
            (std::vector<int64_t>{1, 2, 2}));
}

TEST_F(NpyTest, ReadsFormatVersionTwo) {
  auto array =
      ParseNpy(Npy("<i4", "(2,)", std::string(8, '\0'), false, 2), "x.npy");
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_EQ(array->dtype, "i4");
  EXPECT_EQ(array->shape, (std::vector<int64_t>{2}));
}

TEST_F(NpyTest, AZeroDimensionHoldsNoDataWhateverTheOthers) {
  auto array = ParseNpy(Npy("<i8", "(4294967296, 0)", ""), "x.npy");
  ASSERT_TRUE(array.ok()) << array.status();
  EXPECT_EQ(array->shape, (std::vector<int64_t>{4294967296, 0}));
  EXPECT_TRUE(array->data.empty());
}

struct Broken {
  const char* name;
  std::string bytes;
  const char* message;
};

TEST_F(NpyTest, EveryMalformedFileIsNamed) {
  const std::vector<Broken> cases = {
      {"magic", "PK\x03\x04 not numpy at all", "magic"},
      {"truncated", Npy("|u1", "(3, 2, 2)", std::string(5, '\0')), "truncated"},
      {"header", Npy("|u1", "(3, 2, 2)", "").substr(0, 20), "cut short"},
      {"fortran", Npy("|u1", "(3, 2, 2)", std::string(12, '\0'), true),
       "Fortran order"},
      {"big-endian", Npy(">i8", "(3,)", Int64s({0, 1, 2})), "little-endian"},
      {"shape", Npy("|u1", "(3, x)", std::string(12, '\0')), "does not parse"},
      // A shape whose product passes 64 bits (signed overflow before).
      {"overflow",
       Npy("<i8", "(4294967296, 4294967296, 4294967296)", std::string(8, '\0')),
       "truncated"},
      {"huge-element", Npy("<u2147483647", "(3,)", std::string(8, '\0')),
       "truncated"},
  };
  for (const Broken& c : cases) {
    const std::string path = dir_ + "/" + c.name + ".npy";
    Write(std::string(c.name) + ".npy", c.bytes);
    auto array = ReadNpy(path);
    ASSERT_FALSE(array.ok()) << c.name;
    EXPECT_THAT(array.status().message(),
                AllOf(HasSubstr(path), HasSubstr(c.message)))
        << c.name;
  }
}

TEST_F(NpyTest, ColumnsOfOtherLengthsAndAMissingFolderAreNamed) {
  WriteValid();
  Write("train_labels.npy", Npy("<i8", "(2,)", Int64s({0, 1})));
  v1::DataSpec spec;
  spec.set_format("npy");
  spec.set_dir(dir_);
  auto count = OpenSplit(spec, true);
  ASSERT_FALSE(count.ok());
  EXPECT_THAT(count.status().message(),
              AllOf(HasSubstr("train_labels.npy"), HasSubstr("2 samples"),
                    HasSubstr("has 3")));
  spec.set_dir(dir_ + "/missing");
  auto missing = OpenSplit(spec, true);
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(missing.status().message(), HasSubstr(dir_ + "/missing"));
}

}  // namespace
}  // namespace lockstep::worker
