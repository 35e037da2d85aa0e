// Fuzz target: CSV files as a worker reads a `data.format: "csv"` data
// set. The input is the file; its first line (up to the first newline) also
// names the columns grouped as "x" (every header name but the last) and
// "y" (the last), so most inputs reach the cells. What scans must convert:
// the column store written, mapped as a split, and every sample read.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/ascii.h"
#include "tests/fuzz/fuzz_files.h"
#include "worker/data/csv.h"
#include "worker/data/split_source.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using lockstep::fuzz::Check;
  absl::string_view input(reinterpret_cast<const char*>(data), size);
  // Records split whatever they hold, within their bounds.
  std::vector<absl::string_view> fields;
  std::string storage;
  const absl::string_view first = input.substr(0, input.find('\n'));
  const bool split =
      lockstep::worker::SplitCsvRecord(first, &fields, &storage).ok();
  if (!split || fields.size() < 2 || fields.size() > 64) return 0;
  std::vector<std::string> names;
  for (absl::string_view field : fields) {
    std::string name(absl::StripAsciiWhitespace(field));
    if (name.empty() || name.size() > 64) return 0;
    names.push_back(name);
  }
  const std::string dir = lockstep::fuzz::ScratchDir() + "/csv";
  lockstep::fuzz::Reset(dir);
  lockstep::fuzz::WriteFile(dir + "/train.csv", input);
  lockstep::v1::DataSpec spec;
  spec.set_format("csv");
  spec.set_dir(dir);
  auto& columns = *spec.mutable_columns();
  for (size_t i = 0; i + 1 < names.size(); ++i) {
    columns["x"].add_values()->set_string_value(names[i]);
  }
  columns["y"].add_values()->set_string_value(names.back());
  auto opened = lockstep::worker::OpenSplit(spec, /*train=*/true);
  if (!opened.ok()) return 0;
  const lockstep::worker::SplitSource& source = **opened;
  Check(source.size() > 0, "an opened CSV split has no rows");
  Check(source.columns().size() == 2, "a CSV split lost a column group");
  std::vector<int64_t> all;
  for (int64_t i = 0; i < source.size() && i < 4096; ++i) all.push_back(i);
  for (size_t c = 0; c < source.columns().size(); ++c) {
    const int64_t bytes = source.columns()[c].sample_bytes();
    std::vector<char> out(all.size() * static_cast<size_t>(bytes));
    Check(source.ReadColumn(static_cast<int>(c), all, out.data()).ok(),
          "reading an opened CSV column failed");
  }
  return 0;
}
