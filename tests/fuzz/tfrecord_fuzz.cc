// Fuzz target: TFRecord files, plain or GZIP, and saved TFRecord indexes.
// The input is parsed as a saved index (what parses must describe records
// that chain exactly to its stream size, and serialize back to the input),
// then written as a data file and indexed. An index that builds must agree
// with a sequential read record by record, and every record it lists must
// read back, by ReadRecord and TfRecordFile, as the same bytes; a file that
// does not index must not read to its end either. The same file is
// salvaged (data.skip_corrupt), which must account for every byte.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_files.h"
#include "worker/data/tfrecord.h"

namespace {

using lockstep::fuzz::Check;
namespace w = lockstep::worker;

void FuzzSavedIndex(absl::string_view input,
                    const w::TfRecordOptions& options) {
  auto index = w::ParseTfRecordIndex(input, "fuzz.lockstep-index", options);
  if (!index.ok()) return;
  Check(index->offsets.size() == index->lengths.size(),
        "a parsed index has as many offsets as lengths");
  uint64_t offset = 0;
  for (size_t i = 0; i < index->offsets.size(); ++i) {
    Check(index->offsets[i] == offset, "a parsed index's offsets do not chain");
    Check(index->lengths[i] <= options.max_record_bytes,
          "a parsed index has a record above the bound");
    offset += w::kTfRecordOverhead + index->lengths[i];
  }
  Check(offset == index->stream_size, "a parsed index ends off its stream");
  Check(w::SerializeTfRecordIndex(*index) == input,
        "a parsed index does not serialize back to its bytes");
}

// Every record by a sequential read; false when the stream fails.
bool ReadAll(const std::string& path, const w::TfRecordOptions& options,
             std::vector<std::string>* records) {
  auto stream = w::TfRecordStream::Open(path, options);
  if (!stream.ok()) return false;
  std::string record;
  while (true) {
    auto more = (*stream)->Next(&record);
    if (!more.ok()) return false;
    if (!*more) return true;
    records->push_back(record);
  }
}

// data.skip_corrupt's salvage of a plain file: it never fails on damage;
// its records and its stretches of damage tile the file in order; every
// record it lists reads back; an undamaged file salvages to its index.
void FuzzSalvage(const std::string& path, const w::TfRecordOptions& options,
                 const absl::StatusOr<w::TfRecordIndex>& strict) {
  std::vector<w::TfRecordDamage> damage;
  auto salvaged = w::SalvageTfRecordIndex(path, options, &damage);
  if (!salvaged.ok()) {
    Check(absl::IsFailedPrecondition(salvaged.status()),
          "salvage failed on something other than a GZIP file");
    return;
  }
  uint64_t at = 0;
  size_t next_record = 0, next_damage = 0;
  while (next_record < salvaged->offsets.size() ||
         next_damage < damage.size()) {
    if (next_record < salvaged->offsets.size() &&
        salvaged->offsets[next_record] == at) {
      at += w::kTfRecordOverhead + salvaged->lengths[next_record++];
    } else {
      Check(next_damage < damage.size() && damage[next_damage].offset == at &&
                damage[next_damage].bytes > 0,
            "salvage leaves a gap between its records and its damage");
      at += damage[next_damage++].bytes;
    }
  }
  Check(at == static_cast<uint64_t>(salvaged->file_size),
        "salvage's records and damage do not end at the file's end");
  auto file = w::TfRecordFile::Open(*salvaged, options);
  Check(file.ok(), "a salvaged file does not open");
  for (int64_t i = 0; i < salvaged->size(); ++i) {
    Check((*file)->Read(i).ok(), "a salvaged record does not read");
  }
  if (strict.ok()) {
    Check(damage.empty() && salvaged->offsets == strict->offsets,
          "an undamaged file salvages to another index");
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  absl::string_view input(reinterpret_cast<const char*>(data), size);
  w::TfRecordOptions options;
  options.max_record_bytes = 1 << 20;  // well inside -rss_limit_mb
  FuzzSavedIndex(input, options);

  const std::string path = lockstep::fuzz::ScratchDir() + "/data.tfrecord";
  lockstep::fuzz::WriteFile(path, input);
  auto index = w::BuildTfRecordIndex(path, options);
  std::vector<std::string> records;
  const bool read = ReadAll(path, options, &records);
  FuzzSalvage(path, options, index);
  if (!index.ok()) {
    Check(!read, "a file that does not index reads to its end");
    return 0;
  }
  Check(read, "a file that indexes does not read to its end");
  Check(records.size() == index->offsets.size(),
        "the index and a sequential read count different records");
  for (size_t i = 0; i < records.size(); ++i) {
    Check(records[i].size() == index->lengths[i],
          "the index and a sequential read disagree on a length");
  }
  // Round trip through the saved form.
  auto reparsed = w::ParseTfRecordIndex(w::SerializeTfRecordIndex(*index),
                                        "saved", options);
  Check(reparsed.ok() && reparsed->offsets == index->offsets,
        "a built index does not survive its saved form");
  if (index->compression == w::TfRecordCompression::kNone) {
    auto file = w::TfRecordFile::Open(*index, options);
    Check(file.ok(), "a plain file that indexes does not open");
    for (size_t i = 0; i < records.size(); ++i) {
      auto one = (*file)->Read(static_cast<int64_t>(i));
      Check(one.ok() && *one == records[i],
            "TfRecordFile reads a record differently");
    }
  }
  // ReadRecord: the last record (for GZIP, the whole stream is inflated).
  if (!records.empty()) {
    auto last = w::ReadRecord(*index, index->size() - 1, options);
    Check(last.ok() && *last == records.back(),
          "ReadRecord reads the last record differently");
  }
  return 0;
}
