// TFRecord files: CRC-32C, framing, plain and GZIP reading, every kind of
// corruption an error naming the file, record and offset, and the saved
// index built, reused and rebuilt.
#include "worker/data/tfrecord.h"

#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/files.h"

namespace lockstep::worker {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

// ---- CRC-32C and framing
// ------------------------------------------------------

TEST(Crc32cTest, StandardCheckValues) {
  EXPECT_EQ(Crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(Crc32c(""), 0u);
  // RFC 3720 (iSCSI) B.4.
  EXPECT_EQ(Crc32c(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(Crc32c(std::string(32, '\xff')), 0x62A8AB43u);
  std::string up, down;
  for (int i = 0; i < 32; ++i) {
    up.push_back(static_cast<char>(i));
    down.push_back(static_cast<char>(31 - i));
  }
  EXPECT_EQ(Crc32c(up), 0x46DD794Eu);
  EXPECT_EQ(Crc32c(down), 0x113FDB5Cu);
}

// The CPU's instruction (where there is one) and the tables agree on every
// length and alignment.
TEST(Crc32cTest, TheInstructionAndTheTablesAgree) {
  std::string data;
  for (int i = 0; i < 5000; ++i) {
    data.push_back(static_cast<char>((i * 2654435761u) >> 13));
  }
  for (size_t start : {0u, 1u, 3u, 8u}) {
    for (size_t size : {0u, 1u, 7u, 8u, 15u, 64u, 1000u, 4991u}) {
      EXPECT_EQ(Crc32cExtend(0x1234u, data.data() + start, size),
                Crc32cExtendPortable(0x1234u, data.data() + start, size))
          << start << " " << size;
    }
  }
}

TEST(Crc32cTest, ExtendingInPiecesEqualsTheWhole) {
  std::string data;
  for (int i = 0; i < 1000; ++i) data.push_back(static_cast<char>(i * 7 + 3));
  const uint32_t whole = Crc32c(data);
  for (size_t cut : {0u, 1u, 7u, 8u, 9u, 63u, 500u, 999u, 1000u}) {
    uint32_t crc = Crc32cExtend(0, data.data(), cut);
    crc = Crc32cExtend(crc, data.data() + cut, data.size() - cut);
    EXPECT_EQ(crc, whole) << "cut at " << cut;
  }
}

TEST(Crc32cTest, MaskingIsTensorFlows) {
  EXPECT_EQ(MaskCrc32c(0), 0xa282ead8u);
  for (uint32_t crc : {0u, 1u, 0xE3069283u, 0xFFFFFFFFu}) {
    EXPECT_EQ(UnmaskCrc32c(MaskCrc32c(crc)), crc);
  }
}

// Bytes computed independently (a bitwise CRC-32C in Python); the empty
// record is the one TensorFlow writes for b"".
TEST(TfRecordFormatTest, EncodesKnownBytes) {
  EXPECT_EQ(EncodeTfRecord("hello"),
            std::string("\x05\x00\x00\x00\x00\x00\x00\x00\xea\xb2\x04\x3e"
                        "hello\xbb\x1f\x1c\x19",
                        21));
  EXPECT_EQ(
      EncodeTfRecord(""),
      std::string("\0\0\0\0\0\0\0\0\x29\x03\x98\x07\xd8\xea\x82\xa2", 16));
}

// ---- Files
// ----------------------------------------------------------------------

// Records of assorted sizes: empty, small, and one larger than the reader's
// 256 KiB buffer.
std::vector<std::string> SampleRecords() {
  std::vector<std::string> records;
  for (int i = 0; i < 40; ++i) {
    std::string r;
    for (int j = 0; j < (i * 37) % 301; ++j) {
      r.push_back(static_cast<char>(i + j));
    }
    records.push_back(r);
  }
  records.push_back(std::string(600 << 10, 'x'));
  records.push_back("last");
  return records;
}

class TfRecordTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "tfrecord_test_XXXXXX";
    dir_ = mkdtemp(tmpl.data());
  }
  std::string Path(const std::string& name) { return dir_ + "/" + name; }
  std::string WriteRaw(const std::string& name, const std::string& bytes) {
    EXPECT_TRUE(WriteFileAtomically(Path(name), bytes).ok());
    return Path(name);
  }
  std::string WriteRecords(const std::string& name,
                           const std::vector<std::string>& records,
                           TfRecordCompression compression) {
    absl::Status written = WriteTfRecordFile(Path(name), records, compression);
    EXPECT_TRUE(written.ok()) << written;
    return Path(name);
  }
  // Framed bytes of `records`, uncompressed.
  static std::string Framed(const std::vector<std::string>& records) {
    std::string out;
    for (const std::string& r : records) out += EncodeTfRecord(r);
    return out;
  }
  static std::string GzipBytes(const std::string& data) {
    z_stream zs{};
    deflateInit2(&zs, 6, Z_DEFLATED, 16 + MAX_WBITS, 8, Z_DEFAULT_STRATEGY);
    std::string out(deflateBound(&zs, data.size()), '\0');
    zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
    zs.avail_in = static_cast<uInt>(data.size());
    zs.next_out = reinterpret_cast<Bytef*>(out.data());
    zs.avail_out = static_cast<uInt>(out.size());
    EXPECT_EQ(deflate(&zs, Z_FINISH), Z_STREAM_END);
    out.resize(zs.total_out);
    deflateEnd(&zs);
    return out;
  }
  static void SetMtime(const std::string& path, int64_t seconds) {
    struct timespec times[2] = {{seconds, 0}, {seconds, 0}};
    ASSERT_EQ(utimensat(AT_FDCWD, path.c_str(), times, 0), 0);
  }
  static int64_t MtimeSeconds(const std::string& path) {
    struct stat st;
    EXPECT_EQ(stat(path.c_str(), &st), 0);
    return st.st_mtim.tv_sec;
  }
  // Overwrites one byte in place, keeping the size and mtime: a corruption
  // the index's stamp cannot see.
  static void FlipByteKeepingStamp(const std::string& path, uint64_t at) {
    struct stat st;
    ASSERT_EQ(stat(path.c_str(), &st), 0);
    int fd = open(path.c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    char c;
    ASSERT_EQ(pread(fd, &c, 1, static_cast<off_t>(at)), 1);
    c = static_cast<char>(c ^ 0x40);
    ASSERT_EQ(pwrite(fd, &c, 1, static_cast<off_t>(at)), 1);
    close(fd);
    struct timespec times[2] = {st.st_atim, st.st_mtim};
    ASSERT_EQ(utimensat(AT_FDCWD, path.c_str(), times, 0), 0);
  }
  static std::vector<std::string> ReadAll(const std::string& path) {
    std::vector<std::string> out;
    auto stream = TfRecordStream::Open(path);
    EXPECT_TRUE(stream.ok()) << stream.status();
    if (!stream.ok()) return out;
    std::string record;
    while (true) {
      auto more = (*stream)->Next(&record);
      EXPECT_TRUE(more.ok()) << more.status();
      if (!more.ok() || !*more) break;
      out.push_back(record);
    }
    return out;
  }
  std::string dir_;
};

TEST_F(TfRecordTest, PlainFileReadsEveryRecordEveryWay) {
  const auto records = SampleRecords();
  const std::string path =
      WriteRecords("data.tfrecord", records, TfRecordCompression::kNone);
  EXPECT_EQ(ReadAll(path), records);

  auto index = BuildTfRecordIndex(path);
  ASSERT_TRUE(index.ok()) << index.status();
  ASSERT_EQ(index->size(), static_cast<int64_t>(records.size()));
  EXPECT_EQ(index->compression, TfRecordCompression::kNone);
  uint64_t offset = 0;
  for (size_t i = 0; i < records.size(); ++i) {
    EXPECT_EQ(index->offsets[i], offset);
    EXPECT_EQ(index->lengths[i], records[i].size());
    offset += records[i].size() + kTfRecordOverhead;
  }
  EXPECT_EQ(index->stream_size, offset);
  EXPECT_EQ(index->file_size, static_cast<int64_t>(offset));

  auto file = TfRecordFile::Open(*index);
  ASSERT_TRUE(file.ok()) << file.status();
  for (int64_t i = index->size() - 1; i >= 0; --i) {
    auto one = ReadRecord(*index, i);
    ASSERT_TRUE(one.ok()) << one.status();
    EXPECT_EQ(*one, records[static_cast<size_t>(i)]);
    auto again = (*file)->Read(i);
    ASSERT_TRUE(again.ok()) << again.status();
    EXPECT_EQ(*again, records[static_cast<size_t>(i)]);
  }
  EXPECT_EQ(ReadRecord(*index, index->size()).status().code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ((*file)->Read(-1).status().code(), absl::StatusCode::kOutOfRange);
}

TEST_F(TfRecordTest, GzipFileIndexesTheUncompressedStream) {
  const auto records = SampleRecords();
  const std::string plain =
      WriteRecords("data.tfrecord", records, TfRecordCompression::kNone);
  const std::string gz =
      WriteRecords("data.tfrecord.gz", records, TfRecordCompression::kGzip);
  EXPECT_EQ(ReadAll(gz), records);

  auto plain_index = BuildTfRecordIndex(plain);
  auto index = BuildTfRecordIndex(gz);
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_EQ(index->compression, TfRecordCompression::kGzip);
  EXPECT_EQ(index->offsets, plain_index->offsets);
  EXPECT_EQ(index->lengths, plain_index->lengths);
  EXPECT_EQ(index->stream_size, plain_index->stream_size);
  EXPECT_LT(index->file_size, plain_index->file_size);
  for (int64_t i : {int64_t{0}, int64_t{17}, index->size() - 1}) {
    auto one = ReadRecord(*index, i);
    ASSERT_TRUE(one.ok()) << one.status();
    EXPECT_EQ(*one, records[static_cast<size_t>(i)]);
  }
  auto file = TfRecordFile::Open(*index);
  EXPECT_EQ(file.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(file.status().message(), HasSubstr("TfRecordStream"));
}

TEST_F(TfRecordTest, CompressionIsDetectedByContentAndSuffix) {
  const std::vector<std::string> records = {"a", "bb", "ccc"};
  const std::string framed = Framed(records);
  // GZIP bytes without the suffix, and plain bytes with it.
  const std::string gzip_plain_name = WriteRaw("gz-inside", GzipBytes(framed));
  const std::string plain_gz_name = WriteRaw("plain.gz", framed);
  auto stream = TfRecordStream::Open(gzip_plain_name);
  ASSERT_TRUE(stream.ok());
  EXPECT_EQ((*stream)->compression(), TfRecordCompression::kGzip);
  EXPECT_EQ(ReadAll(gzip_plain_name), records);
  stream = TfRecordStream::Open(plain_gz_name);
  ASSERT_TRUE(stream.ok());
  EXPECT_EQ((*stream)->compression(), TfRecordCompression::kNone);
  EXPECT_EQ(ReadAll(plain_gz_name), records);
  // A plain file whose first length begins 1f 8b: its header CRC says plain.
  const std::vector<std::string> big = {std::string(0x8b1f, 'q'), "z"};
  const std::string looks_gzip =
      WriteRecords("looks-gzip", big, TfRecordCompression::kNone);
  EXPECT_EQ(ReadAll(looks_gzip), big);
}

TEST_F(TfRecordTest, ConcatenatedGzipMembersAreOneStream) {
  const std::string path = WriteRaw(
      "two.gz", GzipBytes(Framed({"one", "two"})) + GzipBytes(Framed({"3"})));
  EXPECT_EQ(ReadAll(path), (std::vector<std::string>{"one", "two", "3"}));
}

TEST_F(TfRecordTest, EmptyPlainFileHasNoRecords) {
  const std::string path = WriteRaw("empty.tfrecord", "");
  auto index = BuildTfRecordIndex(path);
  ASSERT_TRUE(index.ok()) << index.status();
  EXPECT_EQ(index->size(), 0);
  EXPECT_FALSE(BuildTfRecordIndex(WriteRaw("empty.gz", "")).ok());
}

// ---- Corruption
// -------------------------------------------------------------------

TEST_F(TfRecordTest, CorruptLengthCrcNamesFileRecordAndOffset) {
  const std::vector<std::string> records = {"zero", "one", "two", "three"};
  std::string bytes = Framed(records);
  const uint64_t at = 2 * kTfRecordOverhead + 4 + 3;  // record 2
  bytes[at + 9] ^= 0x01;                              // its length CRC
  for (bool gzip : {false, true}) {
    const std::string path =
        WriteRaw(gzip ? "bad.gz" : "bad", gzip ? GzipBytes(bytes) : bytes);
    auto index = BuildTfRecordIndex(path);
    EXPECT_EQ(index.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(index.status().message(),
                AllOf(HasSubstr(path), HasSubstr("record 2"),
                      HasSubstr(absl::StrCat("at byte ", at)),
                      HasSubstr("length field")));
    if (gzip) {
      EXPECT_THAT(index.status().message(),
                  HasSubstr("of the uncompressed stream"));
    }
  }
}

TEST_F(TfRecordTest, CorruptDataCrcNamesFileRecordAndOffset) {
  std::string bytes = Framed({"zero", "one", "two"});
  const uint64_t at = kTfRecordOverhead + 4;  // record 1
  bytes[at + 12] ^= 0x20;                     // its first data byte
  const std::string path = WriteRaw("bad", bytes);
  auto stream = TfRecordStream::Open(path);
  ASSERT_TRUE(stream.ok());
  std::string record;
  EXPECT_TRUE(*(*stream)->Next(&record));
  auto second = (*stream)->Next(&record);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(second.status().message(),
              AllOf(HasSubstr(path), HasSubstr("record 1"),
                    HasSubstr(absl::StrCat("at byte ", at)),
                    HasSubstr("CRC-32C of its 3 bytes of data")));
  // Sticky: the stream does not resynchronise on garbage.
  EXPECT_EQ((*stream)->Next(&record).status(), second.status());
}

TEST_F(TfRecordTest, ReadRecordChecksCrcsAgainAfterIndexing) {
  const std::string path =
      WriteRecords("data", {"zero", "one", "two"}, TfRecordCompression::kNone);
  auto index = BuildTfRecordIndex(path);
  ASSERT_TRUE(index.ok());
  FlipByteKeepingStamp(path, index->offsets[2] + 12);
  auto file = TfRecordFile::Open(*index);
  ASSERT_TRUE(file.ok()) << file.status();
  for (const auto& read : {ReadRecord(*index, 2), (*file)->Read(2)}) {
    EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(read.status().message(),
                AllOf(HasSubstr(path), HasSubstr("record 2"),
                      HasSubstr(absl::StrCat("at byte ", index->offsets[2])),
                      HasSubstr("CRC-32C")));
  }
  EXPECT_EQ(*ReadRecord(*index, 1), "one");
  FlipByteKeepingStamp(path, index->offsets[1] + 9);  // length CRC
  EXPECT_THAT((*file)->Read(1).status().message(), HasSubstr("length field"));
}

TEST_F(TfRecordTest, TruncatedRecordNamesFileRecordAndOffset) {
  const std::string whole = Framed({"zero", "one", "two-two"});
  const uint64_t at = 2 * kTfRecordOverhead + 4 + 3;  // record 2
  // Inside its header, its data and its data CRC.
  for (uint64_t cut : {at + 5, at + 12 + 3, at + 12 + 7 + 2}) {
    for (bool gzip : {false, true}) {
      const std::string prefix = whole.substr(0, cut);
      const std::string path =
          WriteRaw(absl::StrCat("cut", cut, gzip ? ".gz" : ""),
                   gzip ? GzipBytes(prefix) : prefix);
      auto index = BuildTfRecordIndex(path);
      EXPECT_EQ(index.status().code(), absl::StatusCode::kDataLoss);
      EXPECT_THAT(index.status().message(),
                  AllOf(HasSubstr(path), HasSubstr("record 2"),
                        HasSubstr(absl::StrCat("at byte ", at)),
                        HasSubstr("truncated")))
          << "cut at " << cut << (gzip ? " (gzip)" : "");
    }
  }
}

TEST_F(TfRecordTest, TruncatedOrCorruptGzipStreamIsDataLoss) {
  const std::string gz = GzipBytes(Framed(SampleRecords()));
  const std::string cut = WriteRaw("cut.gz", gz.substr(0, gz.size() / 2));
  auto index = BuildTfRecordIndex(cut);
  EXPECT_EQ(index.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(index.status().message(), HasSubstr(cut));
  std::string flipped = gz;
  for (size_t i = 40; i < 60; ++i) flipped[i] ^= 0x55;
  const std::string bad = WriteRaw("bad.gz", flipped);
  index = BuildTfRecordIndex(bad);
  EXPECT_EQ(index.status().code(), absl::StatusCode::kDataLoss);
  // Inflate fails, or what it yields fails a CRC: either way, DataLoss.
  EXPECT_THAT(index.status().message(), HasSubstr(bad));
  const std::string trailing = WriteRaw("trailing.gz", gz + "garbage!");
  EXPECT_FALSE(BuildTfRecordIndex(trailing).ok());
}

// A header declaring `length` with a correct length CRC, and `data`.
std::string HeaderFor(uint64_t length, const std::string& data) {
  std::string header;
  for (int i = 0; i < 8; ++i) {
    header.push_back(static_cast<char>((length >> (8 * i)) & 0xFF));
  }
  const uint32_t crc = MaskCrc32c(Crc32c(header));
  for (int i = 0; i < 4; ++i) {
    header.push_back(static_cast<char>((crc >> (8 * i)) & 0xFF));
  }
  return header + data;
}

TEST_F(TfRecordTest, HugeLengthIsRefusedBeforeAnyAllocation) {
  const std::string first = EncodeTfRecord("fine");
  // Above the bound, CRC intact: InvalidArgument.
  const std::string huge =
      WriteRaw("huge", first + HeaderFor(uint64_t{1} << 40, "tiny"));
  auto index = BuildTfRecordIndex(huge);
  EXPECT_EQ(index.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(index.status().message(),
              AllOf(HasSubstr(huge), HasSubstr("record 1"),
                    HasSubstr(absl::StrCat("at byte ", first.size())),
                    HasSubstr("bound")));
  // Within the bound but beyond the file: truncated, nothing allocated.
  const std::string beyond =
      WriteRaw("beyond", first + HeaderFor(uint64_t{200} << 20, "tiny"));
  index = BuildTfRecordIndex(beyond);
  EXPECT_EQ(index.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(index.status().message(),
              AllOf(HasSubstr("record 1"), HasSubstr("truncated"),
                    HasSubstr("4 bytes left")));
  // GZIP: the length is unknown until inflated; memory grows with what comes.
  const std::string gz = WriteRaw(
      "beyond.gz", GzipBytes(first + HeaderFor(uint64_t{200} << 20, "tiny")));
  std::string record;
  auto stream = TfRecordStream::Open(gz);
  ASSERT_TRUE(stream.ok());
  EXPECT_TRUE(*(*stream)->Next(&record));
  EXPECT_THAT((*stream)->Next(&record).status().message(),
              AllOf(HasSubstr("record 1"), HasSubstr("truncated")));
  EXPECT_LT(record.capacity(), size_t{1} << 20);
  // The caller's own bound.
  TfRecordOptions small;
  small.max_record_bytes = 3;
  index = BuildTfRecordIndex(
      WriteRecords("small", {"abc", "abcd"}, TfRecordCompression::kNone),
      small);
  EXPECT_EQ(index.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(index.status().message(), HasSubstr("record 1"));
}

TEST_F(TfRecordTest, ChangedFileIsRefusedUntilReindexed) {
  const std::string path =
      WriteRecords("data", {"a", "b"}, TfRecordCompression::kNone);
  auto index = BuildTfRecordIndex(path);
  ASSERT_TRUE(index.ok());
  SetMtime(path, MtimeSeconds(path) - 100);
  EXPECT_EQ(ReadRecord(*index, 0).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(TfRecordFile::Open(*index).status().code(),
            absl::StatusCode::kFailedPrecondition);
}

// ---- The saved index
// ------------------------------------------------------------

TEST_F(TfRecordTest, IndexIsSavedReusedAndRebuiltWhenTheFileChanges) {
  const std::string path =
      WriteRecords("data.tfrecord", {"a", "bb"}, TfRecordCompression::kNone);
  TfRecordIndexReport report;
  auto built = LoadOrBuildTfRecordIndex(path, {}, &report);
  ASSERT_TRUE(built.ok()) << built.status();
  EXPECT_FALSE(report.reused);
  EXPECT_EQ(report.index_path, TfRecordIndexPathBeside(path));
  EXPECT_TRUE(report.save_status.ok());
  EXPECT_TRUE(PathExists(path + ".lockstep-index"));

  auto reused = LoadOrBuildTfRecordIndex(path, {}, &report);
  ASSERT_TRUE(reused.ok());
  EXPECT_TRUE(report.reused);
  EXPECT_EQ(reused->path, path);
  EXPECT_EQ(reused->offsets, built->offsets);
  EXPECT_EQ(reused->lengths, built->lengths);
  EXPECT_EQ(reused->mtime_ns, built->mtime_ns);

  // A different size: rebuilt, with the new record.
  const int64_t mtime = MtimeSeconds(path);
  WriteRecords("data.tfrecord", {"a", "bb", "ccc"}, TfRecordCompression::kNone);
  SetMtime(path, mtime);
  auto grown = LoadOrBuildTfRecordIndex(path, {}, &report);
  ASSERT_TRUE(grown.ok());
  EXPECT_FALSE(report.reused);
  EXPECT_THAT(report.rebuild_reason, HasSubstr("stale"));
  EXPECT_EQ(grown->size(), 3);
  // The same size, another mtime: rebuilt.
  SetMtime(path, mtime - 10);
  auto touched = LoadOrBuildTfRecordIndex(path, {}, &report);
  ASSERT_TRUE(touched.ok());
  EXPECT_FALSE(report.reused);
  EXPECT_EQ(touched->mtime_ns, (mtime - 10) * 1000000000);
  ASSERT_TRUE(LoadOrBuildTfRecordIndex(path, {}, &report).ok());
  EXPECT_TRUE(report.reused);
}

TEST_F(TfRecordTest, CorruptIndexFileIsRebuilt) {
  const std::string path =
      WriteRecords("data", {"a", "bb", "ccc"}, TfRecordCompression::kGzip);
  ASSERT_TRUE(LoadOrBuildTfRecordIndex(path).ok());
  const std::string index_path = TfRecordIndexPathBeside(path);
  const std::string good = *ReadFileToString(index_path);
  std::string flipped = good;
  flipped[50] ^= 0x01;
  for (const std::string& bad :
       {flipped, good.substr(0, good.size() - 3), std::string("LSTF"),
        std::string(), std::string(1000, '\xff')}) {
    ASSERT_TRUE(WriteFileAtomically(index_path, bad).ok());
    TfRecordIndexReport report;
    auto index = LoadOrBuildTfRecordIndex(path, {}, &report);
    ASSERT_TRUE(index.ok()) << index.status();
    EXPECT_FALSE(report.reused);
    EXPECT_THAT(report.rebuild_reason,
                HasSubstr("not a usable TFRecord index"));
    EXPECT_EQ(index->size(), 3);
    EXPECT_EQ(*ReadFileToString(index_path), good);
  }
}

TEST_F(TfRecordTest, IndexGoesToTheCacheWhenItCannotBeSavedBeside) {
  const std::string path =
      WriteRecords("data", {"a", "bb"}, TfRecordCompression::kNone);
  // A folder where the index file would go: no rename can replace it, even
  // for root.
  ASSERT_EQ(mkdir(TfRecordIndexPathBeside(path).c_str(), 0755), 0);
  TfRecordIndexReport report;
  auto index = LoadOrBuildTfRecordIndex(path, {}, &report);
  ASSERT_TRUE(index.ok());
  EXPECT_FALSE(report.save_status.ok());
  EXPECT_TRUE(report.index_path.empty());

  TfRecordIndexOptions options;
  options.cache_dir = Path("cache/indexes");
  index = LoadOrBuildTfRecordIndex(path, options, &report);
  ASSERT_TRUE(index.ok());
  EXPECT_TRUE(report.save_status.ok()) << report.save_status;
  EXPECT_EQ(report.index_path,
            TfRecordIndexPathInCache(options.cache_dir, path).value());
  EXPECT_THAT(report.index_path, HasSubstr(options.cache_dir + "/data."));
  index = LoadOrBuildTfRecordIndex(path, options, &report);
  ASSERT_TRUE(index.ok());
  EXPECT_TRUE(report.reused);
  EXPECT_EQ(report.index_path,
            TfRecordIndexPathInCache(options.cache_dir, path).value());
}

TEST_F(TfRecordTest, ReadOnlyFolderUsesTheCache) {
  const std::string data_dir = Path("ro");
  ASSERT_TRUE(MakeDirectories(data_dir).ok());
  const std::string path =
      WriteRecords("ro/data", {"a"}, TfRecordCompression::kNone);
  ASSERT_EQ(chmod(data_dir.c_str(), 0555), 0);
  if (access(data_dir.c_str(), W_OK) == 0) {
    chmod(data_dir.c_str(), 0755);
    GTEST_SKIP() << "running as root: a read-only folder is still writable";
  }
  TfRecordIndexOptions options;
  options.cache_dir = Path("cache");
  TfRecordIndexReport report;
  auto index = LoadOrBuildTfRecordIndex(path, options, &report);
  chmod(data_dir.c_str(), 0755);
  ASSERT_TRUE(index.ok());
  EXPECT_EQ(report.index_path,
            TfRecordIndexPathInCache(options.cache_dir, path).value());
}

// ---- The index file's format
// ------------------------------------------------------

// `bytes` with its trailing checksum recomputed, so a parser's other checks
// are reached.
std::string Reseal(std::string bytes) {
  bytes.resize(bytes.size() - 4);
  const uint32_t crc = Crc32c(bytes);
  for (int i = 0; i < 4; ++i)
    bytes.push_back(static_cast<char>(crc >> (8 * i)));
  return bytes;
}

void PutLe64(std::string* bytes, size_t at, uint64_t value) {
  for (int i = 0; i < 8; ++i) {
    (*bytes)[at + i] = static_cast<char>((value >> (8 * i)) & 0xFF);
  }
}

TEST(TfRecordIndexFormatTest, RoundTripsAndRefusesEveryInconsistency) {
  TfRecordIndex index;
  index.compression = TfRecordCompression::kNone;
  index.lengths = {0, 5, 100};
  index.offsets = {0, 16, 37};
  index.stream_size = 16 * 3 + 105;
  index.file_size = static_cast<int64_t>(index.stream_size);
  index.mtime_ns = 1700000000123456789;
  const std::string bytes = SerializeTfRecordIndex(index);
  EXPECT_EQ(bytes.size(), 48u + 3 * 8 + 4);
  auto parsed = ParseTfRecordIndex(bytes, "idx");
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->offsets, index.offsets);
  EXPECT_EQ(parsed->lengths, index.lengths);
  EXPECT_EQ(parsed->mtime_ns, index.mtime_ns);
  EXPECT_EQ(SerializeTfRecordIndex(*parsed), bytes);

  auto refused = [](const std::string& b, const std::string& why) {
    auto result = ParseTfRecordIndex(b, "idx");
    EXPECT_EQ(result.status().code(), absl::StatusCode::kDataLoss) << why;
    EXPECT_THAT(result.status().message(), HasSubstr(why));
  };
  std::string b = bytes;
  b[20] ^= 1;
  refused(b, "checksum");
  refused(bytes.substr(0, 40), "LSTFRIDX");
  b = bytes;
  b[8] = 2;
  refused(Reseal(b), "version 2");
  b = bytes;
  PutLe64(&b, 40, 4);  // count
  refused(Reseal(b), "claims 4 records");
  b = bytes;
  PutLe64(&b, 48 + 16, 101);  // the last length
  refused(Reseal(b), "out of bounds");
  b = bytes;
  PutLe64(&b, 48 + 16, 99);
  refused(Reseal(b), "end at byte");
  b = bytes;
  PutLe64(&b, 48 + 8, ~uint64_t{0} - 3);  // would wrap the offsets
  refused(Reseal(b), "out of bounds");
  b = bytes;
  PutLe64(&b, 16, 7);  // a plain file's size differs from the stream's
  refused(Reseal(b), "stream size");
  TfRecordOptions tight;
  tight.max_record_bytes = 99;
  EXPECT_FALSE(ParseTfRecordIndex(bytes, "idx", tight).ok());
}

}  // namespace
}  // namespace lockstep::worker
