// CSV files: records split as RFC 4180 says, cells parsed as numbers or
// named with their file, line and column, columns grouped into a split's
// columns, converted once into a column store that is found again, and the
// dtypes NumPy writes read with their conversions.
#include "worker/data/csv.h"

#include <dirent.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/dtype.h"
#include "google/protobuf/struct.pb.h"
#include "worker/data/npy.h"
#include "worker/data/split_source.h"

namespace lockstep::worker {
namespace {

using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

std::string TempDir() {
  std::string pattern = absl::StrCat(
      getenv("TMPDIR") != nullptr ? getenv("TMPDIR") : "/tmp", "/csvXXXXXX");
  EXPECT_NE(mkdtemp(pattern.data()), nullptr);
  return pattern;
}

void Write(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

std::vector<std::string> Fields(absl::string_view line) {
  std::vector<absl::string_view> fields;
  std::string storage;
  absl::Status split = SplitCsvRecord(line, &fields, &storage);
  EXPECT_TRUE(split.ok()) << split;
  return std::vector<std::string>(fields.begin(), fields.end());
}

TEST(CsvTest, RecordsSplitAsRfc4180Says) {
  EXPECT_THAT(Fields("a,b,c"), ElementsAre("a", "b", "c"));
  EXPECT_THAT(Fields("1,,3"), ElementsAre("1", "", "3"));
  EXPECT_THAT(Fields("\"x, y\",\"say \"\"hi\"\"\",2"),
              ElementsAre("x, y", "say \"hi\"", "2"));
  EXPECT_THAT(Fields(" \"q\" ,4"), ElementsAre("q", "4"));
  EXPECT_THAT(Fields(""), ElementsAre(""));
  std::vector<absl::string_view> fields;
  std::string storage;
  EXPECT_THAT(SplitCsvRecord("\"open,1", &fields, &storage).message(),
              HasSubstr("no closing quote"));
  EXPECT_THAT(SplitCsvRecord("\"a\"b,1", &fields, &storage).message(),
              HasSubstr("text after the closing quote"));
}

TEST(CsvTest, CellsAreNumbersOrSayWhy) {
  double value = 0;
  bool integer = false;
  int64_t whole = 0;
  ASSERT_TRUE(ParseCsvNumber(" 42 ", &value, &integer, &whole).ok());
  EXPECT_TRUE(integer);
  EXPECT_EQ(whole, 42);
  ASSERT_TRUE(
      ParseCsvNumber("9007199254740993", &value, &integer, &whole).ok());
  EXPECT_EQ(whole, 9007199254740993);  // exact, past a double's 2^53
  ASSERT_TRUE(ParseCsvNumber("-1.5e-3", &value, &integer, &whole).ok());
  EXPECT_FALSE(integer);
  EXPECT_DOUBLE_EQ(value, -1.5e-3);
  ASSERT_TRUE(ParseCsvNumber("3.0", &value, &integer, &whole).ok());
  EXPECT_FALSE(integer);  // written with a point
  EXPECT_THAT(ParseCsvNumber("", &value, &integer, &whole).message(),
              HasSubstr("empty"));
  EXPECT_THAT(ParseCsvNumber("abc", &value, &integer, &whole).message(),
              HasSubstr("\"abc\" is not a number"));
  EXPECT_FALSE(ParseCsvNumber("nan", &value, &integer, &whole).ok());
  EXPECT_FALSE(ParseCsvNumber("inf", &value, &integer, &whole).ok());
  EXPECT_FALSE(ParseCsvNumber("0x10", &value, &integer, &whole).ok());
  EXPECT_FALSE(ParseCsvNumber("1e999", &value, &integer, &whole).ok());
}

std::vector<CsvGroup> Groups() {
  CsvGroup x;
  x.name = "x";
  x.columns = {"a", "b"};
  CsvGroup y;
  y.name = "y";
  y.columns = {"label"};
  return {x, y};
}

TEST(CsvTest, ABadCellIsNamedWithItsFileLineAndColumn) {
  const std::string text = "a,b,label\n1,2,0\n\n3,oops,1\n";
  auto summary = ScanCsv(text, "data/train.csv", Groups());
  EXPECT_THAT(summary.status().message(),
              AllOf(HasSubstr("data/train.csv line 4, column 'b' (field 2)"),
                    HasSubstr("\"oops\" is not a number")));
  EXPECT_THAT(ScanCsv("a,b,label\n1,2\n", "t.csv", Groups()).status().message(),
              HasSubstr("t.csv line 2 has 2 fields; the header has 3"));
  EXPECT_THAT(
      ScanCsv("a,c,label\n1,2,3\n", "t.csv", Groups()).status().message(),
      AllOf(HasSubstr("no column 'b'"), HasSubstr("a, c, label")));
  EXPECT_THAT(ScanCsv("", "t.csv", Groups()).status().message(),
              HasSubstr("no header row"));
  EXPECT_THAT(ScanCsv("a,b,label\n", "t.csv", Groups()).status().message(),
              HasSubstr("no rows"));
  EXPECT_THAT(
      ScanCsv("a,a,b,label\n1,2,3,4\n", "t.csv", Groups()).status().message(),
      HasSubstr("more than once"));
  // Blank lines and "\r\n" line ends are fine; whole numbers noted.
  auto ok = ScanCsv("a,b,label\r\n1,2.5,0\r\n\r\n3,4,1\r\n", "t.csv", Groups());
  ASSERT_TRUE(ok.ok()) << ok.status();
  EXPECT_EQ(ok->rows, 2);
  EXPECT_THAT(ok->whole, ElementsAre(false, true));
}

v1::DataSpec CsvSpec(const std::string& dir) {
  v1::DataSpec spec;
  spec.set_format("csv");
  spec.set_dir(dir);
  spec.set_shuffle("global");
  auto& columns = *spec.mutable_columns();
  for (const char* name : {"f0", "f1", "f2"}) {
    columns["x"].add_values()->set_string_value(name);
  }
  columns["y"].add_values()->set_string_value("label");
  return spec;
}

// The store is written once beside the file, reused while the file is
// unchanged, and rebuilt when it changes; values and dtypes are the
// file's.
TEST(CsvTest, ASplitIsConvertedOnceAndReadLikeNpy) {
  const std::string dir = TempDir();
  Write(dir + "/train.csv",
        "id,f0,f1,f2,label\n7,0.5,1,2,3\n8,-1.25,1e2,0,1\n9,2,3,4,0\n");
  auto split = OpenSplit(CsvSpec(dir), true);
  ASSERT_TRUE(split.ok()) << split.status();
  EXPECT_EQ((*split)->size(), 3);
  const int x = (*split)->Find("x"), y = (*split)->Find("y");
  ASSERT_GE(x, 0);
  ASSERT_GE(y, 0);
  EXPECT_EQ((*split)->columns()[x].dtype, Dtype::kFloat64);
  EXPECT_EQ((*split)->columns()[x].ShapeText(), "[3]");
  EXPECT_EQ((*split)->columns()[y].dtype, Dtype::kInt64);
  EXPECT_EQ((*split)->columns()[y].ShapeText(), "[]");
  std::vector<char> xs(3 * 8), ys(8);
  const int64_t second[] = {1};
  ASSERT_TRUE((*split)->ReadColumn(x, second, xs.data()).ok());
  ASSERT_TRUE((*split)->ReadColumn(y, second, ys.data()).ok());
  EXPECT_EQ(ElementAsFloat(Dtype::kFloat64, xs.data(), 0), -1.25f);
  EXPECT_EQ(ElementAsFloat(Dtype::kFloat64, xs.data(), 1), 100.0f);
  EXPECT_EQ(ElementAsInt(Dtype::kInt64, ys.data(), 0), 1);

  // The store is there (one array per group), and a second open finds it
  // rather than writing another.
  // Their inodes: a rewrite would rename new files into place.
  auto stores = [&] {
    std::vector<ino_t> inodes;
    DIR* d = opendir(dir.c_str());
    while (dirent* entry = readdir(d)) {
      if (std::string(entry->d_name).find(".lockstep-csv-") !=
          std::string::npos) {
        inodes.push_back(entry->d_ino);
      }
    }
    closedir(d);
    std::sort(inodes.begin(), inodes.end());
    return inodes;
  };
  const std::vector<ino_t> first = stores();
  EXPECT_EQ(first.size(), 3u);  // an array per group, and the summary
  auto again = OpenSplit(CsvSpec(dir), true);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(stores(), first);

  // A changed file (a fraction in the label now) is converted again.
  Write(dir + "/train.csv", "id,f0,f1,f2,label\n7,0.5,1,2,3.5\n");
  auto changed = OpenSplit(CsvSpec(dir), true);
  ASSERT_TRUE(changed.ok()) << changed.status();
  EXPECT_EQ((*changed)->size(), 1);
  EXPECT_EQ((*changed)->columns()[(*changed)->Find("y")].dtype,
            Dtype::kFloat64);
}

// Issue 54: a.csv read together with a b.csv of fractions is stored as
// float64; a job reading a.csv alone still trains on int64, as a fresh run
// would, and neither job rewrites the other's store.
TEST(CsvTest, TheInferredDtypeDoesNotDependOnTheCache) {
  const std::string dir = TempDir();
  Write(dir + "/a.csv", "f0,f1,f2,label\n1,2,3,0\n4,5,6,1\n");
  Write(dir + "/b.csv", "f0,f1,f2,label\n1.5,2,3,0\n4,5,6,1\n");
  v1::DataSpec both = CsvSpec(dir);
  both.set_train("*.csv");
  v1::DataSpec alone = CsvSpec(dir);
  alone.set_train("a.csv");
  auto dtype = [](const v1::DataSpec& spec) {
    auto split = OpenSplit(spec, true);
    EXPECT_TRUE(split.ok()) << split.status();
    return split.ok() ? (*split)->columns()[(*split)->Find("x")].dtype
                      : Dtype::kBool;
  };
  EXPECT_EQ(dtype(both), Dtype::kFloat64);
  EXPECT_EQ(dtype(alone), Dtype::kInt64);
  // Again, in the other order and repeatedly: the same answers, and the
  // stores stay as they were written.
  struct stat before {};
  ASSERT_EQ(stat((dir + "/a.csv").c_str(), &before), 0);
  std::vector<std::string> names;
  auto listing = [&] {
    names.clear();
    DIR* d = opendir(dir.c_str());
    while (dirent* entry = readdir(d)) {
      const std::string name = entry->d_name;
      if (name.rfind("a.csv.lockstep-csv-", 0) == 0) {
        struct stat st {};
        stat((dir + "/" + name).c_str(), &st);
        names.push_back(absl::StrCat(name, "@", st.st_ino));
      }
    }
    closedir(d);
    std::sort(names.begin(), names.end());
    return names;
  };
  const std::vector<std::string> first = listing();
  // x as float64 and as int64, y as int64 for both, and the summary.
  EXPECT_EQ(first.size(), 4u) << absl::StrJoin(first, " ");
  EXPECT_EQ(dtype(alone), Dtype::kInt64);
  EXPECT_EQ(dtype(both), Dtype::kFloat64);
  EXPECT_EQ(listing(), first);
}

// Issue 54: what spreadsheets and pandas produce. Excel's byte order mark
// is dropped from the first name; a whole number past int64, a value past
// float32 and a blank line inside a one-column file are errors naming the
// line (a column declared float64 reads the big whole number rounded).
TEST(CsvTest, SpreadsheetFilesAreReadOrRefusedClearly) {
  auto scan = [](const std::string& text, const std::vector<CsvGroup>& groups) {
    return ScanCsv(text, "t.csv", groups);
  };
  auto bom = scan(
      "\xEF\xBB\xBF"
      "a,b,label\n1,2,0\n",
      Groups());
  ASSERT_TRUE(bom.ok()) << bom.status();
  EXPECT_EQ(bom->header[0], "a");

  auto big = scan("a,b,label\n1,2,9223372036854775808\n", Groups());
  EXPECT_THAT(big.status().message(),
              AllOf(HasSubstr("t.csv line 2, column 'label'"),
                    HasSubstr("beyond int64's range")));
  std::vector<CsvGroup> declared = Groups();
  declared[1].dtype_given = true;
  declared[1].dtype = Dtype::kFloat64;
  auto rounded = scan("a,b,label\n1,2,9223372036854775808\n", declared);
  ASSERT_TRUE(rounded.ok()) << rounded.status();
  EXPECT_THAT(rounded->whole, ElementsAre(true, false));

  EXPECT_THAT(scan("a,b,label\n1,3.5e38,0\n", Groups()).status().message(),
              AllOf(HasSubstr("line 2, column 'b'"),
                    HasSubstr("beyond float32's range")));

  CsvGroup one;
  one.name = "y";
  one.columns = {"label"};
  EXPECT_THAT(
      scan("label\n1\n\n2\n", {one}).status().message(),
      AllOf(HasSubstr("t.csv line 3 is blank"), HasSubstr("empty cell")));
  auto trailing = scan("label\n1\n2\n\n\n", {one});
  ASSERT_TRUE(trailing.ok()) << trailing.status();
  EXPECT_EQ(trailing->rows, 2);
  // With more columns a blank line is no cell: skipped, as pandas does.
  EXPECT_TRUE(scan("a,b,label\n1,2,0\n\n3,4,1\n", Groups()).ok());
}

// Issue 54: labels written as class names. Without a list they are
// numbered by the training split's sorted distinct names, on the test split
// too (a name the training split lacks is named); a list fixes the order;
// empty numeric cells take fill_missing, and the group is then a float.
TEST(CsvTest, ClassNamesAndMissingValues) {
  const std::string dir = TempDir();
  Write(dir + "/train.csv",
        "f0,f1,f2,label\n1,2,3,dog\n4,,6,cat\n7,8,9,\"fish, gold\"\n"
        "1,1,1,dog\n");
  Write(dir + "/test.csv", "f0,f1,f2,label\n1,2,3,fish, gold\n");
  v1::DataSpec spec = CsvSpec(dir);
  (*spec.mutable_features())["y"].set_class_names(true);
  (*spec.mutable_features())["x"].set_fill_missing(-1.5);
  spec.set_test("test.csv");
  // The test file's unquoted "fish, gold" is two fields: refused as such.
  EXPECT_THAT(OpenSplit(spec, false).status().message(),
              HasSubstr("has 5 fields"));
  Write(dir + "/test.csv", "f0,f1,f2,label\n1,2,3,\"fish, gold\"\n0,0,0,cat\n");
  auto train = OpenSplit(spec, true);
  ASSERT_TRUE(train.ok()) << train.status();
  const int y = (*train)->Find("y"), x = (*train)->Find("x");
  EXPECT_THAT((*train)->columns()[y].classes,
              ElementsAre("cat", "dog", "fish, gold"));
  EXPECT_EQ((*train)->columns()[y].dtype, Dtype::kInt64);
  EXPECT_EQ((*train)->columns()[x].dtype, Dtype::kFloat64);  // filled
  std::vector<char> ys(4 * 8), xs(3 * 8);
  const int64_t all[] = {0, 1, 2, 3};
  ASSERT_TRUE((*train)->ReadColumn(y, all, ys.data()).ok());
  std::vector<int64_t> labels;
  for (int i = 0; i < 4; ++i)
    labels.push_back(ElementAsInt(Dtype::kInt64, ys.data(), i));
  EXPECT_THAT(labels, ElementsAre(1, 0, 2, 1));
  const int64_t second[] = {1};
  ASSERT_TRUE((*train)->ReadColumn(x, second, xs.data()).ok());
  EXPECT_EQ(ElementAsFloat(Dtype::kFloat64, xs.data(), 1), -1.5f);
  // The test split: the training split's numbering.
  auto test = OpenSplit(spec, false);
  ASSERT_TRUE(test.ok()) << test.status();
  const int64_t both[] = {0, 1};
  ASSERT_TRUE((*test)->ReadColumn((*test)->Find("y"), both, ys.data()).ok());
  EXPECT_EQ(ElementAsInt(Dtype::kInt64, ys.data(), 0), 2);
  EXPECT_EQ(ElementAsInt(Dtype::kInt64, ys.data(), 1), 0);
  // A name the training split lacks.
  Write(dir + "/test.csv", "f0,f1,f2,label\n1,2,3,cow\n");
  EXPECT_THAT(OpenSplit(spec, false).status().message(),
              AllOf(HasSubstr("test.csv line 2, column 'label'"),
                    HasSubstr("\"cow\" is none of the 3 class names")));
  // A list fixes the order.
  for (const char* name : {"fish, gold", "dog", "cat"}) {
    (*spec.mutable_features())["y"].add_classes(name);
  }
  auto listed = OpenSplit(spec, true);
  ASSERT_TRUE(listed.ok()) << listed.status();
  ASSERT_TRUE((*listed)->ReadColumn(y, all, ys.data()).ok());
  labels.clear();
  for (int i = 0; i < 4; ++i)
    labels.push_back(ElementAsInt(Dtype::kInt64, ys.data(), i));
  EXPECT_THAT(labels, ElementsAre(1, 2, 0, 1));
  // Without fill_missing an empty cell is an error, as before.
  spec.mutable_features()->erase("x");
  EXPECT_THAT(OpenSplit(spec, true).status().message(),
              AllOf(HasSubstr("line 3, column 'f1'"), HasSubstr("empty")));
}

TEST(CsvTest, AReadOnlyFolderKeepsTheStoreInTheIndexCache) {
  if (geteuid() == 0) {
    // root writes anywhere; the folder's mode cannot stop it.
    GTEST_SKIP() << "runs as root";
  }
  const std::string dir = TempDir();
  const std::string cache = TempDir();
  Write(dir + "/train.csv", "f0,f1,f2,label\n1,2,3,0\n");
  chmod(dir.c_str(), 0555);
  SetIndexCacheDir(cache);
  auto split = OpenSplit(CsvSpec(dir), true);
  SetIndexCacheDir("");
  chmod(dir.c_str(), 0755);
  ASSERT_TRUE(split.ok()) << split.status();
}

TEST(CsvTest, ADeclaredDtypeIsKeptOrTheCellNamed) {
  const std::string dir = TempDir();
  Write(dir + "/train.csv", "f0,f1,f2,label\n1,2,3,0.5\n");
  v1::DataSpec spec = CsvSpec(dir);
  (*spec.mutable_features())["y"].set_dtype("int64");
  EXPECT_THAT(OpenSplit(spec, true).status().message(),
              AllOf(HasSubstr("line 2, column 'label'"),
                    HasSubstr("not a whole number")));
  (*spec.mutable_features())["y"].set_dtype("float32");
  (*spec.mutable_features())["x"].set_dtype("float32");
  auto split = OpenSplit(spec, true);
  ASSERT_TRUE(split.ok()) << split.status();
  EXPECT_EQ((*split)->columns()[(*split)->Find("x")].dtype, Dtype::kFloat32);
}

TEST(CsvTest, NumpysOtherDtypesConvertByTheirRules) {
  char data[8];
  const double wide = 0.1;
  std::memcpy(data, &wide, 8);
  EXPECT_EQ(ElementAsFloat(Dtype::kFloat64, data, 0), 0.1f);  // rounded
  const uint64_t big = uint64_t{1} << 63;
  std::memcpy(data, &big, 8);
  EXPECT_EQ(ElementAsInt(Dtype::kUInt64, data, 0), -1);  // out of range
  const uint64_t small = 12;
  std::memcpy(data, &small, 8);
  EXPECT_EQ(ElementAsInt(Dtype::kUInt64, data, 0), 12);
  data[0] = 2;  // NumPy writes 0 or 1; anything else is true
  EXPECT_EQ(ElementAsInt(Dtype::kBool, data, 0), 1);
  EXPECT_EQ(DtypeFromNumpy("f8"), Dtype::kFloat64);
  EXPECT_EQ(DtypeFromNumpy("b1"), Dtype::kBool);
  EXPECT_EQ(DtypeFromNumpy("u8"), Dtype::kUInt64);
  EXPECT_EQ(DtypeSize(Dtype::kFloat64), 8);
}

}  // namespace
}  // namespace lockstep::worker
