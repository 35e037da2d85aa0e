// data.skip_corrupt (issue 54): a damaged TFRecord file salvaged record by
// record (a bad data CRC, a bad length CRC, junk between records, a cut
// tail), the skipped records counted once each up to the limit, and a split
// whose unreadable records are left out or replaced by the next readable
// one, the same whichever rank reads which sample.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/files.h"
#include "tensorflow/example.pb.h"
#include "worker/data/skip_log.h"
#include "worker/data/split_source.h"
#include "worker/data/tfrecord.h"

namespace lockstep::worker {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

class SkipCorruptTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "skip_corrupt_XXXXXX";
    dir_ = mkdtemp(tmpl.data());
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }

  std::string Write(const std::string& name, const std::string& bytes) {
    EXPECT_TRUE(WriteFileAtomically(dir_ + "/" + name, bytes).ok());
    return dir_ + "/" + name;
  }
  // An Example with float feature "x" = value and int64 "label" = value.
  static std::string Example(int value) {
    tfexample::Example example;
    auto& features = *example.mutable_features()->mutable_feature();
    features["x"].mutable_float_list()->add_value(static_cast<float>(value));
    features["label"].mutable_int64_list()->add_value(value);
    return example.SerializeAsString();
  }
  v1::DataSpec Spec(int skip) {
    v1::DataSpec spec;
    spec.set_format("tfrecord");
    spec.set_dir(dir_);
    spec.set_train("*.tfrecord");
    spec.set_test("*.tfrecord");
    spec.set_skip_corrupt(skip);
    v1::ColumnSpec x;
    x.set_dtype("float32");
    x.add_shape(1);
    v1::ColumnSpec label;
    label.set_dtype("int64");
    (*spec.mutable_features())["x"] = x;
    (*spec.mutable_features())["label"] = label;
    return spec;
  }
  // Column "label" of samples `indices`, read in one call.
  static std::vector<int64_t> Labels(const SplitSource& split,
                                     const std::vector<int64_t>& indices) {
    std::vector<int64_t> out(indices.size());
    absl::Status read = split.ReadColumn(split.Find("label"), indices,
                                         reinterpret_cast<char*>(out.data()));
    EXPECT_TRUE(read.ok()) << read;
    return out;
  }

  std::string dir_;
};

// Records 0..9 of 5 to 14 bytes, then four kinds of damage: record 2's data
// CRC, record 5's length CRC, 20 bytes of junk after record 7, and the last
// record cut short. Every record that reads is found, and each stretch of
// damage is named once with its offset and size.
TEST_F(SkipCorruptTest, SalvageFindsEveryRecordThatReadsPastEachDamage) {
  std::vector<std::string> records;
  std::vector<uint64_t> offsets;
  std::string bytes;
  for (int i = 0; i < 10; ++i) {
    records.push_back(std::string(5 + i, static_cast<char>('a' + i)));
    if (i == 8) bytes += std::string(20, '\x5a');  // junk
    offsets.push_back(bytes.size());
    bytes += EncodeTfRecord(records.back());
  }
  bytes[offsets[2] + 12] ^= 0x01;  // a data byte
  bytes[offsets[5] + 9] ^= 0x01;   // the length's CRC
  bytes.resize(bytes.size() - 3);  // record 9's data CRC cut
  const std::string path = Write("damaged", bytes);

  EXPECT_TRUE(absl::IsDataLoss(BuildTfRecordIndex(path).status()));
  std::vector<TfRecordDamage> damage;
  auto index = SalvageTfRecordIndex(path, {}, &damage);
  ASSERT_TRUE(index.ok()) << index.status();
  std::vector<std::string> read;
  for (int64_t i = 0; i < index->size(); ++i) {
    auto record = ReadRecord(*index, i);
    ASSERT_TRUE(record.ok()) << record.status();
    read.push_back(*record);
  }
  EXPECT_THAT(read, ElementsAre(records[0], records[1], records[3], records[4],
                                records[6], records[7], records[8]));
  ASSERT_EQ(damage.size(), 4u);
  EXPECT_EQ(damage[0].offset, offsets[2]);
  EXPECT_EQ(damage[0].bytes, kTfRecordOverhead + records[2].size());
  EXPECT_THAT(damage[0].reason, HasSubstr("CRC-32C of its 7 bytes of data"));
  EXPECT_EQ(damage[1].offset, offsets[5]);
  EXPECT_EQ(damage[1].bytes, offsets[6] - offsets[5]);
  EXPECT_THAT(damage[1].reason,
              AllOf(HasSubstr("length field"),
                    HasSubstr(absl::StrCat("starts at byte ", offsets[6]))));
  EXPECT_EQ(damage[2].offset, offsets[8] - 20);
  EXPECT_EQ(damage[2].bytes, 20u);
  EXPECT_EQ(damage[3].offset, offsets[9]);
  EXPECT_EQ(damage[3].bytes, bytes.size() - offsets[9]);
  EXPECT_THAT(damage[3].reason, HasSubstr("no record reads after it"));
  // Numbered among the records and stretches before it, readable or not.
  EXPECT_EQ(damage[0].record, 2);
  EXPECT_EQ(damage[1].record, 5);
  EXPECT_EQ(damage[2].record, 8);
}

// With salvage on, LoadOrBuildTfRecordIndex salvages a damaged plain file
// and saves no index of it (a strict reader must still see the damage); a
// clean file is indexed and saved as always; a damaged GZIP file keeps its
// error.
TEST_F(SkipCorruptTest, OnlyAnUndamagedFilesIndexIsSaved) {
  std::string bytes =
      EncodeTfRecord("zero") + EncodeTfRecord("one") + EncodeTfRecord("two");
  const std::string clean = Write("clean", bytes);
  bytes[kTfRecordOverhead + 4 + 12] ^= 0x01;  // record 1's data
  const std::string damaged = Write("damaged", bytes);
  TfRecordIndexOptions options;
  options.salvage = true;
  TfRecordIndexReport report;
  auto index = LoadOrBuildTfRecordIndex(damaged, options, &report);
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_EQ(index->size(), 2);
  ASSERT_EQ(report.damage.size(), 1u);
  EXPECT_TRUE(report.index_path.empty());
  EXPECT_FALSE(std::filesystem::exists(TfRecordIndexPathBeside(damaged)));
  EXPECT_TRUE(absl::IsDataLoss(LoadOrBuildTfRecordIndex(damaged).status()));

  index = LoadOrBuildTfRecordIndex(clean, options, &report);
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_EQ(index->size(), 3);
  EXPECT_TRUE(report.damage.empty());
  EXPECT_TRUE(std::filesystem::exists(TfRecordIndexPathBeside(clean)));

  ASSERT_TRUE(WriteTfRecordFile(dir_ + "/g.gz", {"zero", "one"},
                                TfRecordCompression::kGzip)
                  .ok());
  std::vector<TfRecordDamage> damage;
  EXPECT_EQ(SalvageTfRecordIndex(dir_ + "/g.gz", {}, &damage).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST(SkipLogTest, CountsEachRecordOnceAndFailsPastTheLimit) {
  SkipLog log(2);
  SkippedRecordInfo a{"a.tfrecord", 3, 120, 0, "corrupt JPEG", "train"};
  SkippedRecordInfo b{"b.tfrecord", 0, 0, 40, "length field", "train"};
  bool fresh = false;
  EXPECT_TRUE(log.Note(a, &fresh).ok());
  EXPECT_TRUE(fresh);
  EXPECT_TRUE(log.Note(a, &fresh).ok());
  EXPECT_FALSE(fresh);
  SkippedRecordInfo a_in_test = a;
  a_in_test.split = "test";
  EXPECT_TRUE(log.Note(a_in_test).ok());  // another split's file
  EXPECT_EQ(log.count(), 2u);
  absl::Status over = log.Note(b);
  EXPECT_TRUE(absl::IsDataLoss(over));
  EXPECT_THAT(
      over.message(),
      AllOf(HasSubstr("more than 2 records"), HasSubstr("data.skip_corrupt: 2"),
            HasSubstr("b.tfrecord record 0 at byte 0 (40 bytes)")));
  EXPECT_FALSE(log.Note(a).ok());  // and from then on
  EXPECT_EQ(log.Since(1).size(), 2u);
}

// Records 0..11 in two files; in a.tfrecord record 2's CRC is bad (left
// out when the split opens) and record 4 is not an Example (found when it
// is read: the next record takes its place). Reading the samples in one
// call, one by one, or split between "ranks" gives the same labels.
TEST_F(SkipCorruptTest, UnreadableRecordsGiveTheirPlaceAlikeOnEveryRank) {
  std::string a, b;
  std::vector<uint64_t> offsets;
  for (int i = 0; i < 6; ++i) {
    offsets.push_back(a.size());
    a += EncodeTfRecord(i == 4 ? std::string("\xff\xff\xff not a proto")
                               : Example(i));
  }
  for (int i = 6; i < 12; ++i) b += EncodeTfRecord(Example(i));
  a[offsets[2] + 14] ^= 0x01;
  Write("a.tfrecord", a);
  Write("b.tfrecord", b);

  auto strict = OpenSplit(Spec(0), true);
  EXPECT_TRUE(absl::IsDataLoss(strict.status())) << strict.status();

  auto split = OpenSplit(Spec(2), true);
  ASSERT_TRUE(split.ok()) << split.status();
  ASSERT_EQ((*split)->size(), 11);  // record 2 left out
  ASSERT_NE((*split)->skipped(), nullptr);
  EXPECT_EQ((*split)->skipped()->count(), 1u);
  std::vector<int64_t> all;
  for (int64_t i = 0; i < 11; ++i) all.push_back(i);
  // Sample 3 is record 4: record 5 takes its place.
  const std::vector<int64_t> expected = {0, 1, 3, 5, 5, 6, 7, 8, 9, 10, 11};
  EXPECT_EQ(Labels(**split, all), expected);
  std::vector<int64_t> ranks(11);
  for (int64_t rank = 0; rank < 2; ++rank) {
    std::vector<int64_t> mine;
    for (int64_t i = rank; i < 11; i += 2) mine.push_back(i);
    const std::vector<int64_t> got = Labels(**split, mine);
    for (size_t k = 0; k < mine.size(); ++k) ranks[mine[k]] = got[k];
  }
  EXPECT_EQ(ranks, expected);
  const std::vector<SkippedRecordInfo> skipped = (*split)->skipped()->Since(0);
  ASSERT_EQ(skipped.size(), 2u);
  EXPECT_EQ(skipped[0].file, "a.tfrecord");
  EXPECT_EQ(skipped[0].record, 2);
  EXPECT_EQ(skipped[0].offset, static_cast<int64_t>(offsets[2]));
  EXPECT_THAT(skipped[0].reason, HasSubstr("CRC-32C"));
  EXPECT_EQ(skipped[1].record, 3);  // the index's number: 2 was left out
  EXPECT_EQ(skipped[1].offset, static_cast<int64_t>(offsets[4]));
  EXPECT_EQ(skipped[1].split, "train");

  // One allowed: the second fails the read, naming it and the limit.
  auto one = OpenSplit(Spec(1), true);
  ASSERT_TRUE(one.ok()) << one.status();
  std::vector<int64_t> labels(1);
  absl::Status read = (*one)->ReadColumn(
      (*one)->Find("label"), {3}, reinterpret_cast<char*>(labels.data()));
  EXPECT_TRUE(absl::IsDataLoss(read));
  EXPECT_THAT(
      read.message(),
      AllOf(
          HasSubstr("more than 1 record"), HasSubstr("data.skip_corrupt: 1"),
          HasSubstr(absl::StrCat("a.tfrecord record 3 at byte ", offsets[4]))));
}

// A GZIP file is decoded when the split opens: a record that does not
// decode is left out then, and counted.
TEST_F(SkipCorruptTest, AGzipFilesUndecodableRecordIsLeftOut) {
  ASSERT_TRUE(WriteTfRecordFile(dir_ + "/a.tfrecord",
                                {Example(0), "not an example", Example(2)},
                                TfRecordCompression::kGzip)
                  .ok());
  auto split = OpenSplit(Spec(1), true);
  ASSERT_TRUE(split.ok()) << split.status();
  EXPECT_EQ((*split)->size(), 2);
  EXPECT_EQ(Labels(**split, {0, 1}), (std::vector<int64_t>{0, 2}));
  ASSERT_EQ((*split)->skipped()->count(), 1u);
  EXPECT_EQ((*split)->skipped()->Since(0)[0].record, 1);
  EXPECT_EQ((*split)->skipped()->Since(0)[0].offset, -1);
}

}  // namespace
}  // namespace lockstep::worker
