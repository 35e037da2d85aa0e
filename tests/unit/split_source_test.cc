// Every format opened as a split of named columns: npy arrays of any dtype,
// one file or shards read as one column, token windows, TFRecord Examples;
// and the errors a wrong file gets, naming it.
#include "worker/data/split_source.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/files.h"
#include "tensorflow/example.pb.h"
#include "tests/unit/npy_bytes.h"
#include "worker/data/sources.h"
#include "worker/data/tfrecord.h"

namespace lockstep::worker {
namespace {

using ::testing::HasSubstr;

std::string Uint16s(const std::vector<uint16_t>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()),
                     values.size() * 2);
}

class SplitSourceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "split_source_XXXXXX";
    dir_ = mkdtemp(tmpl.data());
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  void Write(const std::string& name, const std::string& bytes) {
    ASSERT_TRUE(WriteFileAtomically(dir_ + "/" + name, bytes).ok());
  }
  v1::DataSpec Spec(const std::string& format) {
    v1::DataSpec spec;
    spec.set_format(format);
    spec.set_dir(dir_);
    spec.set_token_dtype("uint16");
    spec.set_block_size(3);
    spec.set_window_stride(3);
    return spec;
  }
  // Column `name`'s samples `indices` as floats.
  std::vector<float> ReadFloats(const SplitSource& split,
                                const std::string& name,
                                const std::vector<int64_t>& indices) {
    const int column = split.Find(name);
    EXPECT_GE(column, 0) << name;
    const ColumnInfo& info = split.columns()[column];
    std::vector<char> raw(indices.size() * info.sample_bytes());
    EXPECT_TRUE(split.ReadColumn(column, indices, raw.data()).ok());
    std::vector<float> out;
    for (int64_t i = 0;
         i < static_cast<int64_t>(indices.size()) * info.elements(); ++i) {
      out.push_back(ElementAsFloat(info.dtype, raw.data(), i));
    }
    return out;
  }

  std::string dir_;
};

TEST_F(SplitSourceTest, NpyColumnsOfAnyDtypeAndShape) {
  Write("train_x.npy", Npy("<f4", "(3, 2)", Floats({0, 1, 2, 3, 4, 5})));
  Write("train_y.npy",
        Npy("<i2", "(3,)", std::string("\x05\x00\xff\xff\x07\x00", 6)));
  auto split = OpenSplit(Spec("npy"), /*train=*/true);
  ASSERT_TRUE(split.ok()) << split.status();
  EXPECT_EQ((*split)->size(), 3);
  ASSERT_EQ((*split)->columns().size(), 2u);
  const ColumnInfo& x = (*split)->columns()[(*split)->Find("x")];
  EXPECT_EQ(x.dtype, Dtype::kFloat32);
  EXPECT_EQ(x.shape, std::vector<int64_t>{2});
  EXPECT_EQ(ReadFloats(**split, "x", {2, 0}), (std::vector<float>{4, 5, 0, 1}));
  EXPECT_EQ(ReadFloats(**split, "y", {0, 1, 2}),
            (std::vector<float>{5, -1, 7}));
}

TEST_F(SplitSourceTest, ShardsReadAsOneColumnInNameOrder) {
  // 7 samples over three shards of 3, 0 and 4 (in sorted name order).
  Write("train_v-00002.npy", Npy("<f4", "(4,)", Floats({3, 4, 5, 6})));
  Write("train_v-00000.npy", Npy("<f4", "(3,)", Floats({0, 1, 2})));
  Write("train_v-00001.npy", Npy("<f4", "(0,)", ""));
  Write("train_w.npy", Npy("|u1", "(7,)", std::string("abcdefg")));
  auto split = OpenSplit(Spec("npy"), true);
  ASSERT_TRUE(split.ok()) << split.status();
  EXPECT_EQ((*split)->size(), 7);
  EXPECT_EQ(ReadFloats(**split, "v", {6, 0, 3, 2}),
            (std::vector<float>{6, 0, 3, 2}));
  EXPECT_THAT((*split)->description(), HasSubstr("v: 3 shards"));
}

TEST_F(SplitSourceTest, ShardsThatDisagreeOrColumnsOfOtherLengthsAreRefused) {
  Write("train_v-00000.npy", Npy("<f4", "(3, 2)", Floats({0, 1, 2, 3, 4, 5})));
  Write("train_v-00001.npy", Npy("<f4", "(1, 3)", Floats({0, 1, 2})));
  auto split = OpenSplit(Spec("npy"), true);
  EXPECT_TRUE(absl::IsInvalidArgument(split.status()));
  EXPECT_THAT(split.status().message(),
              HasSubstr("every shard of a column must agree"));
  std::filesystem::remove(dir_ + "/train_v-00001.npy");
  Write("train_w.npy", Npy("<f4", "(2,)", Floats({0, 1})));
  split = OpenSplit(Spec("npy"), true);
  EXPECT_THAT(split.status().message(), HasSubstr("one entry per sample"));
}

TEST_F(SplitSourceTest, ATruncatedNpyFileIsDataLossNamingIt) {
  std::string bytes = Npy("<f4", "(3,)", Floats({0, 1, 2}));
  bytes.resize(bytes.size() - 1);
  Write("train_v.npy", bytes);
  auto split = OpenSplit(Spec("npy"), true);
  EXPECT_TRUE(absl::IsDataLoss(split.status())) << split.status();
  EXPECT_THAT(split.status().message(), HasSubstr(dir_ + "/train_v.npy"));
}

TEST_F(SplitSourceTest, AGlobMayNotLeaveTheDataFolderThroughALink) {
  const std::string outside = dir_ + "-outside";
  std::filesystem::create_directory(outside);
  ASSERT_TRUE(
      WriteFileAtomically(outside + "/a_v.npy", Npy("<f4", "(1,)", Floats({1})))
          .ok());
  std::filesystem::create_directory_symlink(outside, dir_ + "/link");
  v1::DataSpec spec = Spec("npy");
  spec.set_train("link/*.npy");
  auto split = OpenSplit(spec, true);
  std::filesystem::remove_all(outside);
  EXPECT_TRUE(absl::IsPermissionDenied(split.status())) << split.status();
}

TEST_F(SplitSourceTest, ALinkInTheDataFolderMayNotLeadOutOfIt) {
  const std::string outside = dir_ + "-elsewhere";
  std::filesystem::create_directory(outside);
  ASSERT_TRUE(WriteFileAtomically(outside + "/secret.npy",
                                  Npy("<f4", "(1,)", Floats({1})))
                  .ok());
  std::filesystem::create_symlink(outside + "/secret.npy",
                                  dir_ + "/train_v.npy");
  auto split = OpenSplit(Spec("npy"), true);
  EXPECT_TRUE(absl::IsPermissionDenied(split.status())) << split.status();
  std::filesystem::remove(dir_ + "/train_v.npy");
  std::filesystem::create_symlink(outside + "/secret.npy", dir_ + "/train.bin");
  split = OpenSplit(Spec("tokens"), true);
  std::filesystem::remove_all(outside);
  EXPECT_TRUE(absl::IsPermissionDenied(split.status())) << split.status();
}

TEST_F(SplitSourceTest, TokenFilesAreReadAsWindows) {
  // 10 tokens, windows of block 3 + 1 every 3 tokens: starts 0, 3, 6.
  Write("train.bin", Uint16s({0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
  Write("val.bin", Uint16s({9, 8, 7, 6}));
  auto train = OpenSplit(Spec("tokens"), true);
  ASSERT_TRUE(train.ok()) << train.status();
  EXPECT_EQ((*train)->size(), 3);
  EXPECT_EQ((*train)->columns()[0].shape, std::vector<int64_t>{4});
  EXPECT_EQ(ReadFloats(**train, "tokens", {2, 1}),
            (std::vector<float>{6, 7, 8, 9, 3, 4, 5, 6}));
  auto val = OpenSplit(Spec("tokens"), false);
  ASSERT_TRUE(val.ok()) << val.status();
  EXPECT_EQ((*val)->size(), 1);
}

// Shards matched by globs, in sorted order: no window crosses from one file
// into the next, and a shard too short for a window holds none. The vocab
// scan reads every token of the shards once.
TEST_F(SplitSourceTest, TokenShardsKeepTheirWindowsApart) {
  Write("b-1.bin", Uint16s({10, 11, 12, 13, 14}));   // one window: 10..13
  Write("b-0.bin", Uint16s({0, 1, 2, 3, 4, 5, 6}));  // two: 0..3, 3..6
  Write("b-2.bin", Uint16s({40, 41}));               // none
  Write("v-0.bin", Uint16s({9, 8, 7, 6}));
  v1::DataSpec spec = Spec("tokens");
  spec.set_train("b-*.bin");
  spec.set_test("v-*.bin");
  auto train = OpenSplit(spec, true);
  ASSERT_TRUE(train.ok()) << train.status();
  EXPECT_EQ((*train)->size(), 3);
  EXPECT_EQ(ReadFloats(**train, "tokens", {0, 1, 2}),
            (std::vector<float>{0, 1, 2, 3, 3, 4, 5, 6, 10, 11, 12, 13}));
  auto largest = (*train)->LargestValue(0);
  ASSERT_TRUE(largest.ok());
  EXPECT_EQ(*largest, 14);  // a shard without windows is not read
  EXPECT_THAT((*train)->description(), HasSubstr("3 token files"));
}

// Issue 54: the same shards concatenated (data.concatenate) are one stream,
// nanoGPT's way: windows cross from one file into the next, with the
// separator token between files when one is set, and a shard too short for
// a window is read too. CoverTokens says what each way leaves unread.
TEST_F(SplitSourceTest, ConcatenatedShardsAreOneStream) {
  Write("b-0.bin", Uint16s({0, 1, 2, 3, 4, 5, 6}));
  Write("b-1.bin", Uint16s({10, 11, 12, 13, 14}));
  Write("b-2.bin", Uint16s({40, 41}));
  Write("v-0.bin", Uint16s({9, 8, 7, 6}));
  v1::DataSpec spec = Spec("tokens");
  spec.set_train("b-*.bin");
  spec.set_test("v-*.bin");
  spec.set_concatenate(true);
  // 14 tokens: windows of 4 every 3 start at 0, 3, 6, 9.
  auto train = OpenSplit(spec, true);
  ASSERT_TRUE(train.ok()) << train.status();
  EXPECT_EQ((*train)->size(), 4);
  EXPECT_EQ(ReadFloats(**train, "tokens", {1, 2, 3}),
            (std::vector<float>{3, 4, 5, 6, 6, 10, 11, 12, 12, 13, 14, 40}));
  EXPECT_THAT((*train)->description(), HasSubstr("concatenated"));

  // With an end-of-text token 99 between files: 16 tokens, 5 windows.
  spec.set_separator_token(99);
  auto separated = OpenSplit(spec, true);
  ASSERT_TRUE(separated.ok()) << separated.status();
  EXPECT_EQ((*separated)->size(), 5);
  EXPECT_EQ(
      ReadFloats(**separated, "tokens", {2, 3, 4}),
      (std::vector<float>{6, 99, 10, 11, 11, 12, 13, 14, 14, 99, 40, 41}));
  auto largest = (*separated)->LargestValue(0);
  ASSERT_TRUE(largest.ok());
  EXPECT_EQ(*largest, 99);  // the separator is in the vocabulary

  // Apart, 3 windows read 11 of the 14 tokens: b-1's last (14) and all of
  // b-2 are in none.
  auto apart = CoverTokens({7, 5, 2}, 3, 3, false);
  ASSERT_TRUE(apart.ok());
  EXPECT_EQ(apart->windows, 3);
  EXPECT_EQ(apart->unread, 3);
  EXPECT_EQ(apart->short_files, 1);
  EXPECT_THAT(apart->Text(), HasSubstr("3 of 14 tokens (21.43%) in no window, "
                                       "1 file shorter than a window"));
  TokenStream joined;
  joined.concatenate = true;
  auto together = CoverTokens({7, 5, 2}, 3, 3, false, joined);
  ASSERT_TRUE(together.ok());
  EXPECT_EQ(together->windows, 4);
  EXPECT_EQ(together->unread, 1);  // the stream's last token
}

// data.window_offset "random": each epoch's key moves every window by
// o in [0, stride); a file holds the windows that fit at any offset.
TEST_F(SplitSourceTest, RandomWindowOffsetsMoveEveryWindowByTheEpochsKey) {
  // 12 tokens, block 3 (windows of 4), stride 3: with offsets up to 2 a
  // window needs 6 tokens: starts 0, 3, 6 (and +o).
  std::vector<uint16_t> tokens;
  for (uint16_t t = 0; t < 12; ++t) tokens.push_back(t);
  Write("train.bin", Uint16s(tokens));
  Write("val.bin", Uint16s({9, 8, 7, 6}));
  v1::DataSpec spec = Spec("tokens");
  spec.set_window_offset("random");
  auto train = OpenSplit(spec, true);
  ASSERT_TRUE(train.ok()) << train.status();
  EXPECT_EQ((*train)->size(), 3);
  EXPECT_TRUE((*train)->VariesByEpoch());
  for (uint64_t key : {0, 1, 2, 5}) {
    const int64_t offset = static_cast<int64_t>(key % 3);
    std::vector<char> raw(4 * 2);
    const int64_t last[] = {2};
    char* out = raw.data();
    ASSERT_TRUE((*train)->ReadInEpoch(key, {0}, last, {out}).ok());
    EXPECT_EQ(ElementAsInt(Dtype::kUInt16, raw.data(), 0), 6 + offset) << key;
    EXPECT_EQ(ElementAsInt(Dtype::kUInt16, raw.data(), 3), 9 + offset) << key;
  }
  // The test split is read at offset 0.
  auto val = OpenSplit(spec, false);
  ASSERT_TRUE(val.ok());
  EXPECT_FALSE((*val)->VariesByEpoch());
}

TEST_F(SplitSourceTest, ATokenFileOfAnOddSizeOrShorterThanAWindowIsRefused) {
  Write("train.bin", std::string(7, '\0'));
  auto split = OpenSplit(Spec("tokens"), true);
  EXPECT_TRUE(absl::IsDataLoss(split.status())) << split.status();
  EXPECT_THAT(split.status().message(), HasSubstr("not a whole number"));
  Write("train.bin", Uint16s({1, 2, 3}));
  split = OpenSplit(Spec("tokens"), true);
  EXPECT_THAT(split.status().message(), HasSubstr("fewer than one window"));
}

TEST_F(SplitSourceTest, TfRecordExamplesAreColumnsAndACorruptRecordNamesIt) {
  std::vector<std::string> records;
  for (int i = 0; i < 5; ++i) {
    tfexample::Example example;
    auto& features = *example.mutable_features()->mutable_feature();
    features["x"].mutable_float_list()->add_value(i * 0.5f);
    features["x"].mutable_float_list()->add_value(-i);
    features["label"].mutable_int64_list()->add_value(i);
    records.push_back(example.SerializeAsString());
  }
  const std::string path = dir_ + "/a.tfrecord";
  ASSERT_TRUE(
      WriteTfRecordFile(path, records, TfRecordCompression::kNone).ok());
  ASSERT_TRUE(WriteTfRecordFile(dir_ + "/b.tfrecord.gz", records,
                                TfRecordCompression::kGzip)
                  .ok());
  v1::DataSpec spec = Spec("tfrecord");
  spec.set_train("*.tfrecord*");
  v1::ColumnSpec x;
  x.set_dtype("float32");
  x.add_shape(2);
  v1::ColumnSpec label;
  label.set_dtype("int64");
  (*spec.mutable_features())["x"] = x;
  (*spec.mutable_features())["label"] = label;
  auto split = OpenSplit(spec, true);
  ASSERT_TRUE(split.ok()) << split.status();
  EXPECT_EQ((*split)->size(), 10);  // 5 plain, 5 from the GZIP file
  EXPECT_EQ(ReadFloats(**split, "x", {3, 8}),
            (std::vector<float>{1.5f, -3, 1.5f, -3}));
  EXPECT_EQ(ReadFloats(**split, "label", {4, 5}), (std::vector<float>{4, 0}));
  // No samples asked for: nothing read, no error.
  EXPECT_TRUE((*split)->ReadColumn(0, {}, nullptr).ok());
  // The index was kept beside the file, and is not taken for data.
  EXPECT_TRUE(std::filesystem::exists(path + ".lockstep-index"));
  // A flipped byte in record 2's data: its CRC no longer matches.
  auto bytes = ReadFileToString(path);
  ASSERT_TRUE(bytes.ok());
  const size_t offset = 2 * (records[0].size() + 16) + 12 + 3;
  (*bytes)[offset] ^= 1;
  std::filesystem::remove(path);
  ASSERT_TRUE(WriteFileAtomically(path, *bytes).ok());
  std::filesystem::remove(path + ".lockstep-index");
  split = OpenSplit(spec, true);
  EXPECT_TRUE(absl::IsDataLoss(split.status())) << split.status();
  EXPECT_THAT(split.status().message(), HasSubstr(path));
}

TEST_F(SplitSourceTest, AMissingFolderNamesTheFormatsFiles) {
  v1::DataSpec spec = Spec("npy");
  spec.set_dir(dir_ + "/nothing");
  EXPECT_THAT(OpenSplit(spec, true).status().message(),
              HasSubstr("cannot list data.dir"));
  spec = Spec("tokens");
  EXPECT_THAT(OpenSplit(spec, true).status().message(),
              HasSubstr("train.bin and val.bin"));
}

}  // namespace
}  // namespace lockstep::worker
