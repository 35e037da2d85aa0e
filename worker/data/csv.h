// CSV files with a header row, as tables of numbers (README.md, "Bringing
// your own data"): columns are picked by name and grouped into the split's
// columns, each group a scalar (one name) or a vector (several), and the
// whole file is converted once into a column store of .npy arrays that is
// memory-mapped like any npy data set.
//
// The text is untrusted: a record is RFC 4180 (fields separated by commas,
// a field in double quotes may hold commas and doubled quotes, no line
// breaks inside a field, "\r\n" or "\n" line ends), at most
// kMaxCsvLineBytes long and kMaxCsvFields wide; a UTF-8 byte order mark
// before the header is dropped; blank lines are skipped, except one
// before more records in a file of one column (an empty cell, refused);
// a value beyond float32's range is refused (lockstep trains in float32).
// Every error names the file, the line and the column:
//
//   "data/train.csv line 17, column 'x3' (field 4): \"abc\" is not a number"
#ifndef LOCKSTEP_WORKER_DATA_CSV_H_
#define LOCKSTEP_WORKER_DATA_CSV_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/dtype.h"

namespace lockstep::worker {

inline constexpr int64_t kMaxCsvLineBytes = int64_t{1} << 20;
inline constexpr int kMaxCsvFields = 1 << 16;

// The fields of one record (`line` without its line end). Quoted fields
// are unquoted into `storage`, which the views may point into. Errors: an
// unterminated quote, text after a closing quote, too many fields.
absl::Status SplitCsvRecord(absl::string_view line,
                            std::vector<absl::string_view>* fields,
                            std::string* storage);

// A cell as a number: decimal or scientific, surrounding blanks ignored.
// `integer` says whether it is a whole number written without a point or
// an exponent (then `whole` holds it exactly). Errors (InvalidArgument, the
// caller adds where): empty, not a number, NaN or infinite, and digits
// alone beyond int64 unless `whole_may_round` (a column declared float).
absl::Status ParseCsvNumber(absl::string_view cell, double* value,
                            bool* integer, int64_t* whole,
                            bool whole_may_round = false);

// One column of the split made from CSV columns.
struct CsvGroup {
  std::string name;                  // the split's column
  std::vector<std::string> columns;  // the CSV's, in order
  // float64, float32 or int64 (int64 needs whole numbers). Not given
  // (data.features[name].dtype unset): int64 when every cell of the group
  // is whole in every file of the split, else float64.
  bool dtype_given = false;
  Dtype dtype = Dtype::kFloat64;
  // A group of one column of class names: stored as int64 indices into
  // `classes` (which WriteCsvColumns needs; ScanCsv collects the names).
  bool class_names = false;
  std::vector<std::string> classes;
  // An empty cell's value; none: an empty cell is an error.
  std::optional<double> fill;
};

// Distinct class names one file's group may hold (a label column, not an
// id column: past this the group is refused).
inline constexpr size_t kMaxCsvClassNames = 1 << 16;

// What a CSV file holds, for `lockstep data inspect` and the store.
struct CsvSummary {
  std::vector<std::string> header;
  int64_t rows = 0;
  // Per group: whether every cell is a whole number (a filled empty cell
  // is not: the group is stored as a float, as pandas' fillna leaves it).
  std::vector<bool> whole;
  // Per group of class names: the distinct names, sorted.
  std::vector<std::vector<std::string>> names;
};

// Reads `text` (the file `path`), checks every record, and summarises it
// for `groups` (empty: only the header and rows, cells unchecked).
absl::StatusOr<CsvSummary> ScanCsv(absl::string_view text,
                                   const std::string& path,
                                   const std::vector<CsvGroup>& groups);

// Writes group g's values from `text` as a .npy array at out_paths[g]
// (a class-name group: each name's index in its `classes`; a name not in
// them is an error naming the line, the column and the name)
// (dtype groups[g].dtype; [rows] for one column, [rows, columns] for
// more), each written to a temporary file, fsynced and renamed. `text`
// must have passed ScanCsv with the same groups.
absl::Status WriteCsvColumns(absl::string_view text, const std::string& path,
                             const std::vector<CsvGroup>& groups,
                             const CsvSummary& summary,
                             const std::vector<std::string>& out_paths);

}  // namespace lockstep::worker

#endif  // LOCKSTEP_WORKER_DATA_CSV_H_
