// Reading CSV text and writing its columns as .npy arrays (csv.h).
#include "worker/data/csv.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "common/status_macros.h"
#include "common/terminal_text.h"

namespace lockstep::worker {
namespace {

// The lines of `text`, numbered from 1, without their line ends.
class Lines {
 public:
  explicit Lines(absl::string_view text) : rest_(text) {}

  bool Next(absl::string_view* line) {
    if (rest_.empty()) return false;
    const size_t end = rest_.find('\n');
    *line = rest_.substr(0, end);
    rest_.remove_prefix(end == absl::string_view::npos ? rest_.size()
                                                       : end + 1);
    if (!line->empty() && line->back() == '\r') line->remove_suffix(1);
    ++number_;
    return true;
  }
  int64_t number() const { return number_; }

 private:
  absl::string_view rest_;
  int64_t number_ = 0;
};

constexpr double kFloat32Max = std::numeric_limits<float>::max();

bool Blank(absl::string_view line) {
  return absl::StripAsciiWhitespace(line).empty();
}

// A cell for a message: shown safely, at most 40 bytes of it.
std::string Shown(absl::string_view cell) {
  return absl::StrCat("\"", TerminalSafe(std::string(cell.substr(0, 40))),
                      cell.size() > 40 ? "...\"" : "\"");
}

// Where a record's problem is: "data/train.csv line 17".
std::string At(const std::string& path, int64_t line) {
  return absl::StrCat(path, " line ", line);
}

// The header's names, trimmed, and where each group's columns stand in it.
struct Layout {
  std::vector<std::string> header;
  std::vector<std::vector<int>> fields;  // per group, per column
};

absl::StatusOr<Layout> ReadHeader(Lines& lines, const std::string& path,
                                  const std::vector<CsvGroup>& groups) {
  absl::string_view line;
  if (!lines.Next(&line) || Blank(line)) {
    return absl::InvalidArgumentError(absl::StrCat(
        path,
        " has no header row on line 1: data.format \"csv\" needs the "
        "columns' names first"));
  }
  if (static_cast<int64_t>(line.size()) > kMaxCsvLineBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        At(path, 1), " is longer than ", kMaxCsvLineBytes, " bytes"));
  }
  // Excel's "CSV UTF-8" starts with a byte order mark: not part of the
  // first column's name (pandas drops it too).
  absl::ConsumePrefix(&line, "\xEF\xBB\xBF");
  std::vector<absl::string_view> fields;
  std::string storage;
  absl::Status split = SplitCsvRecord(line, &fields, &storage);
  if (!split.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat(At(path, 1), " (the header): ", split.message()));
  }
  Layout layout;
  std::map<std::string, int> where;
  for (absl::string_view field : fields) {
    std::string name(absl::StripAsciiWhitespace(field));
    // A repeated name is ambiguous only where a group asks for it.
    auto [it, added] =
        where.emplace(name, static_cast<int>(layout.header.size()));
    if (!added) it->second = -1;
    layout.header.push_back(std::move(name));
  }
  for (const CsvGroup& group : groups) {
    std::vector<int> indices;
    for (const std::string& column : group.columns) {
      auto it = where.find(column);
      if (it == where.end()) {
        std::vector<std::string> shown;
        for (size_t i = 0; i < layout.header.size() && i < 12; ++i) {
          shown.push_back(TerminalSafe(layout.header[i].substr(0, 40)));
        }
        return absl::InvalidArgumentError(absl::StrCat(
            path, " has no column '", TerminalSafe(column),
            "' (data.columns[\"", group.name, "\"]); its header has ",
            layout.header.size(), ": ", absl::StrJoin(shown, ", "),
            layout.header.size() > shown.size() ? ", ..." : ""));
      }
      if (it->second < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(path, "'s header names column '", TerminalSafe(column),
                         "' more than once: rename one"));
      }
      indices.push_back(it->second);
    }
    layout.fields.push_back(std::move(indices));
  }
  return layout;
}

// Calls `visit(group, column, value, integer, whole, name, line)` for every
// cell the groups use, record by record, after checking the record's width
// and every cell; a class-name group's cells come as `name` alone.
template <typename Visit>
absl::Status ForEachCell(absl::string_view text, const std::string& path,
                         const std::vector<CsvGroup>& groups, Layout* layout,
                         int64_t* rows, Visit visit) {
  Lines lines(text);
  ASSIGN_OR_RETURN(*layout, ReadHeader(lines, path, groups));
  const size_t width = layout->header.size();
  std::vector<absl::string_view> fields;
  std::string storage;
  absl::string_view line;
  *rows = 0;
  // In a one-column file a blank line may be an empty cell (a missing
  // value) as well as a stray line: one before more records is refused;
  // blank lines at the end are not records.
  int64_t blank = 0;
  while (lines.Next(&line)) {
    const int64_t number = lines.number();
    if (static_cast<int64_t>(line.size()) > kMaxCsvLineBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          At(path, number), " is longer than ", kMaxCsvLineBytes, " bytes"));
    }
    if (Blank(line)) {
      if (blank == 0) blank = number;
      continue;
    }
    if (blank > 0 && width == 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          At(path, blank),
          " is blank: in a file of one column that is an empty cell (a "
          "missing value) or a stray line; remove the line or fill in the "
          "value"));
    }
    blank = 0;
    absl::Status split = SplitCsvRecord(line, &fields, &storage);
    if (!split.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(At(path, number), ": ", split.message()));
    }
    if (fields.size() != width) {
      return absl::InvalidArgumentError(
          absl::StrCat(At(path, number), " has ", fields.size(),
                       " fields; the header has ", width));
    }
    for (size_t g = 0; g < groups.size(); ++g) {
      const std::vector<int>& indices = layout->fields[g];
      for (size_t c = 0; c < indices.size(); ++c) {
        double value = 0;
        bool integer = false;
        int64_t whole = 0;
        const CsvGroup& group = groups[g];
        const absl::string_view cell = fields[indices[c]];
        if (group.class_names) {
          // The name itself; the visitor maps it.
          RETURN_IF_ERROR(visit(g, c, 0.0, false, int64_t{-1},
                                absl::StripAsciiWhitespace(cell), number));
          continue;
        }
        absl::Status parsed;
        if (group.fill.has_value() && Blank(cell)) {
          value = *group.fill;  // a float, as pandas' fillna leaves it
        } else {
          parsed = ParseCsvNumber(cell, &value, &integer, &whole,
                                  /*whole_may_round=*/group.dtype_given &&
                                      group.dtype != Dtype::kInt64);
        }
        if (parsed.ok() && !integer && std::fabs(value) > kFloat32Max) {
          parsed = absl::InvalidArgumentError(absl::StrCat(
              Shown(fields[indices[c]]),
              " is beyond float32's range (3.4e38), in which lockstep "
              "trains: scale the column"));
        }
        if (!parsed.ok()) {
          return absl::InvalidArgumentError(absl::StrCat(
              At(path, number), ", column '",
              TerminalSafe(layout->header[indices[c]].substr(0, 64)),
              "' (field ", indices[c] + 1, "): ", parsed.message()));
        }
        RETURN_IF_ERROR(
            visit(g, c, value, integer, whole, absl::string_view(), number));
      }
    }
    ++*rows;
  }
  return absl::OkStatus();
}

// A .npy header for `rows` samples of `columns` (1: scalars) of `dtype`,
// padded to a multiple of 64 bytes as NumPy writes it.
std::string NpyHeader(Dtype dtype, int64_t rows, size_t columns) {
  const char* descr = dtype == Dtype::kInt64     ? "<i8"
                      : dtype == Dtype::kFloat32 ? "<f4"
                                                 : "<f8";
  std::string dict = absl::StrCat(
      "{'descr': '", descr, "', 'fortran_order': False, 'shape': (", rows,
      columns == 1 ? "," : absl::StrCat(", ", columns), "), }");
  const size_t preamble = 10;  // magic, version, header length
  size_t total = preamble + dict.size() + 1;
  total = (total + 63) / 64 * 64;
  dict.append(total - preamble - dict.size() - 1, ' ');
  dict.push_back('\n');
  std::string header("\x93NUMPY\x01\x00", 8);
  const uint16_t length = static_cast<uint16_t>(dict.size());
  header.push_back(static_cast<char>(length & 0xff));
  header.push_back(static_cast<char>(length >> 8));
  return header + dict;
}

// A file written through a buffer, then fsynced and renamed into place.
class DurableWriter {
 public:
  DurableWriter() = default;
  DurableWriter(const DurableWriter&) = delete;
  DurableWriter& operator=(const DurableWriter&) = delete;
  ~DurableWriter() {
    if (fd_ >= 0) {
      close(fd_);
      unlink(temp_.c_str());
    }
  }

  absl::Status Open(const std::string& path) {
    path_ = path;
    temp_ = absl::StrCat(path, ".tmp-", getpid(), "-",
                         reinterpret_cast<uintptr_t>(this));
    fd_ = open(temp_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd_ < 0) return Errno("cannot create");
    return absl::OkStatus();
  }

  absl::Status Append(const void* data, size_t size) {
    buffer_.append(static_cast<const char*>(data), size);
    if (buffer_.size() >= (1u << 20)) return Flush();
    return absl::OkStatus();
  }

  absl::Status Commit() {
    RETURN_IF_ERROR(Flush());
    if (fsync(fd_) != 0) return Errno("cannot fsync");
    close(fd_);
    fd_ = -1;
    if (rename(temp_.c_str(), path_.c_str()) != 0) {
      const absl::Status error = Errno("cannot rename into place");
      unlink(temp_.c_str());
      return error;
    }
    return absl::OkStatus();
  }

 private:
  absl::Status Flush() {
    size_t done = 0;
    while (done < buffer_.size()) {
      const ssize_t n =
          write(fd_, buffer_.data() + done, buffer_.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return Errno("cannot write");
      done += static_cast<size_t>(n);
    }
    buffer_.clear();
    return absl::OkStatus();
  }
  absl::Status Errno(absl::string_view what) const {
    return absl::UnavailableError(absl::StrCat(
        what, " the column store ", temp_, ": ", std::strerror(errno)));
  }

  std::string path_;
  std::string temp_;
  int fd_ = -1;
  std::string buffer_;
};

}  // namespace

absl::Status SplitCsvRecord(absl::string_view line,
                            std::vector<absl::string_view>* fields,
                            std::string* storage) {
  fields->clear();
  storage->clear();
  // Unquoted fields are views of `line`; quoted ones are unquoted into
  // `storage`, reserved up front so that its views stay valid.
  storage->reserve(line.size());
  size_t i = 0;
  while (true) {
    if (static_cast<int>(fields->size()) >= kMaxCsvFields) {
      return absl::InvalidArgumentError(
          absl::StrCat("more than ", kMaxCsvFields, " fields"));
    }
    // Blanks before an opening quote are allowed.
    size_t start = i;
    while (start < line.size() && (line[start] == ' ' || line[start] == '\t')) {
      ++start;
    }
    if (start < line.size() && line[start] == '"') {
      const size_t begin = storage->size();
      size_t j = start + 1;
      bool closed = false;
      while (j < line.size()) {
        if (line[j] == '"') {
          if (j + 1 < line.size() && line[j + 1] == '"') {
            storage->push_back('"');
            j += 2;
            continue;
          }
          closed = true;
          ++j;
          break;
        }
        storage->push_back(line[j++]);
      }
      if (!closed) {
        return absl::InvalidArgumentError(
            absl::StrCat("the quoted field ", fields->size() + 1,
                         " has no closing quote (a field cannot span lines)"));
      }
      while (j < line.size() && (line[j] == ' ' || line[j] == '\t')) ++j;
      if (j < line.size() && line[j] != ',') {
        return absl::InvalidArgumentError(absl::StrCat(
            "text after the closing quote of field ", fields->size() + 1));
      }
      fields->push_back(absl::string_view(*storage).substr(begin));
      if (j >= line.size()) return absl::OkStatus();
      i = j + 1;
      continue;
    }
    const size_t comma = line.find(',', i);
    if (comma == absl::string_view::npos) {
      fields->push_back(line.substr(i));
      return absl::OkStatus();
    }
    fields->push_back(line.substr(i, comma - i));
    i = comma + 1;
  }
}

absl::Status ParseCsvNumber(absl::string_view cell, double* value,
                            bool* integer, int64_t* whole,
                            bool whole_may_round) {
  const absl::string_view text = absl::StripAsciiWhitespace(cell);
  if (text.empty()) {
    return absl::InvalidArgumentError(
        "the cell is empty; lockstep does not fill in missing values: drop "
        "or fill the row");
  }
  if (absl::SimpleAtoi(text, whole)) {
    *value = static_cast<double>(*whole);
    *integer = true;
    return absl::OkStatus();
  }
  *integer = false;
  // Digits alone that are not an int64: an id or a count past 2^63 would
  // silently become a rounded float.
  absl::string_view digits = text;
  if (!digits.empty() && (digits[0] == '+' || digits[0] == '-')) {
    digits.remove_prefix(1);
  }
  if (!whole_may_round && !digits.empty() &&
      std::all_of(digits.begin(), digits.end(), absl::ascii_isdigit)) {
    return absl::InvalidArgumentError(absl::StrCat(
        Shown(text),
        " is a whole number beyond int64's range (-2^63 to 2^63 - 1); "
        "declare the column's dtype float64 to read it rounded"));
  }
  // Only what a number is made of: SimpleAtod alone would take "nan",
  // "inf" and hexadecimal.
  for (char c : text) {
    if (!absl::ascii_isdigit(c) && c != '.' && c != 'e' && c != 'E' &&
        c != '+' && c != '-') {
      return absl::InvalidArgumentError(
          absl::StrCat(Shown(text), " is not a number"));
    }
  }
  if (!absl::SimpleAtod(text, value)) {
    return absl::InvalidArgumentError(
        absl::StrCat(Shown(text), " is not a number"));
  }
  if (!std::isfinite(*value)) {
    return absl::InvalidArgumentError(
        absl::StrCat(Shown(text), " is out of a float64's range"));
  }
  return absl::OkStatus();
}

absl::StatusOr<CsvSummary> ScanCsv(absl::string_view text,
                                   const std::string& path,
                                   const std::vector<CsvGroup>& groups) {
  CsvSummary summary;
  summary.whole.assign(groups.size(), true);
  std::vector<std::set<std::string, std::less<>>> names(groups.size());
  Layout layout;
  RETURN_IF_ERROR(ForEachCell(
      text, path, groups, &layout, &summary.rows,
      [&](size_t g, size_t c, double value, bool integer, int64_t,
          absl::string_view name, int64_t line) -> absl::Status {
        if (groups[g].class_names) {
          if (name.empty()) {
            return absl::InvalidArgumentError(absl::StrCat(
                At(path, line), ", column '",
                TerminalSafe(groups[g].columns[c]),
                "': the class name is empty; drop or fill the row"));
          }
          if (names[g].find(name) == names[g].end()) {
            if (names[g].size() >= kMaxCsvClassNames) {
              return absl::InvalidArgumentError(absl::StrCat(
                  path, " column '", TerminalSafe(groups[g].columns[c]),
                  "' holds more than ", kMaxCsvClassNames,
                  " distinct class names: is it an id, not a label?"));
            }
            names[g].emplace(name);
          }
          return absl::OkStatus();
        }
        if (integer) return absl::OkStatus();
        summary.whole[g] = false;
        if (groups[g].dtype_given && groups[g].dtype == Dtype::kInt64) {
          return absl::InvalidArgumentError(absl::StrCat(
              At(path, line), ", column '", TerminalSafe(groups[g].columns[c]),
              "': ", value, " is not a whole number, but data.features[\"",
              groups[g].name, "\"].dtype is int64"));
        }
        return absl::OkStatus();
      }));
  summary.header = std::move(layout.header);
  summary.names.resize(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    summary.names[g].assign(names[g].begin(), names[g].end());
  }
  if (summary.rows == 0 && !groups.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " has a header but no rows"));
  }
  return summary;
}

absl::Status WriteCsvColumns(absl::string_view text, const std::string& path,
                             const std::vector<CsvGroup>& groups,
                             const CsvSummary& summary,
                             const std::vector<std::string>& out_paths) {
  std::vector<std::unique_ptr<DurableWriter>> writers;
  for (size_t g = 0; g < groups.size(); ++g) {
    writers.push_back(std::make_unique<DurableWriter>());
    RETURN_IF_ERROR(writers[g]->Open(out_paths[g]));
    const std::string header =
        NpyHeader(groups[g].dtype, summary.rows, groups[g].columns.size());
    RETURN_IF_ERROR(writers[g]->Append(header.data(), header.size()));
  }
  // Each class-name group's names to their indices.
  std::vector<std::map<std::string, int64_t, std::less<>>> index(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    for (size_t i = 0; i < groups[g].classes.size(); ++i) {
      index[g].emplace(groups[g].classes[i], static_cast<int64_t>(i));
    }
  }
  Layout layout;
  int64_t rows = 0;
  RETURN_IF_ERROR(ForEachCell(
      text, path, groups, &layout, &rows,
      [&](size_t g, size_t c, double value, bool, int64_t whole,
          absl::string_view name, int64_t line) -> absl::Status {
        if (groups[g].class_names) {
          auto it = index[g].find(name);
          if (it == index[g].end()) {
            return absl::InvalidArgumentError(absl::StrCat(
                At(path, line), ", column '",
                TerminalSafe(groups[g].columns[c]), "': ", Shown(name),
                " is none of the ", groups[g].classes.size(),
                " class names (data.features[\"", groups[g].name,
                "\"].classes, or those of the training split)"));
          }
          return writers[g]->Append(&it->second, sizeof(int64_t));
        }
        switch (groups[g].dtype) {
          case Dtype::kInt64:
            return writers[g]->Append(&whole, sizeof(whole));
          case Dtype::kFloat32: {
            const auto v = static_cast<float>(value);
            return writers[g]->Append(&v, sizeof(v));
          }
          default:
            return writers[g]->Append(&value, sizeof(value));
        }
      }));
  if (rows != summary.rows) {
    return absl::DataLossError(
        absl::StrCat(path, " changed while it was read"));
  }
  for (auto& writer : writers) RETURN_IF_ERROR(writer->Commit());
  return absl::OkStatus();
}

}  // namespace lockstep::worker
