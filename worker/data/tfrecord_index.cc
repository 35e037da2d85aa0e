// The saved index of a TFRecord file: its format, and finding, checking and
// saving it beside the data or in a cache folder (tfrecord.h).
#include <filesystem>
#include <limits>
#include <system_error>

#include "absl/strings/str_cat.h"
#include "common/files.h"
#include "common/sha256.h"
#include "common/status_macros.h"
#include "worker/data/tfrecord.h"
#include "worker/data/tfrecord_internal.h"

namespace lockstep::worker {
namespace {

using tfrecord_internal::LoadLe;

constexpr char kIndexMagic[] = "LSTFRIDX";
constexpr uint32_t kIndexVersion = 1;
constexpr size_t kIndexHeaderBytes = 48;
constexpr size_t kIndexTrailerBytes = 4;

absl::Status BadIndex(const std::string& origin, absl::string_view what) {
  return absl::DataLossError(
      absl::StrCat(origin, " is not a usable TFRecord index: ", what));
}

void AppendLe(std::string* out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) {
    out->push_back(static_cast<char>((value >> (8 * i)) & 0xFF));
  }
}

// Which version of the data file an index must describe.
struct FileStamp {
  int64_t size = 0;
  int64_t mtime_ns = 0;
  TfRecordCompression compression = TfRecordCompression::kNone;
};

}  // namespace

std::string SerializeTfRecordIndex(const TfRecordIndex& index) {
  std::string out(kIndexMagic, 8);
  AppendLe(&out, kIndexVersion, 4);
  AppendLe(&out, static_cast<uint32_t>(index.compression), 4);
  AppendLe(&out, static_cast<uint64_t>(index.file_size), 8);
  AppendLe(&out, static_cast<uint64_t>(index.mtime_ns), 8);
  AppendLe(&out, index.stream_size, 8);
  AppendLe(&out, index.lengths.size(), 8);
  out.reserve(out.size() + 8 * index.lengths.size() + kIndexTrailerBytes);
  for (uint64_t length : index.lengths) AppendLe(&out, length, 8);
  AppendLe(&out, Crc32c(out), 4);
  return out;
}

absl::StatusOr<TfRecordIndex> ParseTfRecordIndex(
    absl::string_view bytes, const std::string& origin,
    const TfRecordOptions& options) {
  if (bytes.size() < kIndexHeaderBytes + kIndexTrailerBytes ||
      bytes.substr(0, 8) != absl::string_view(kIndexMagic, 8)) {
    return BadIndex(origin, "it does not start with LSTFRIDX");
  }
  const size_t body = bytes.size() - kIndexTrailerBytes;
  if (Crc32c(bytes.substr(0, body)) != LoadLe(bytes.data() + body, 4)) {
    return BadIndex(origin, "its checksum does not match");
  }
  const char* p = bytes.data();
  if (LoadLe(p + 8, 4) != kIndexVersion) {
    return BadIndex(
        origin, absl::StrCat("it is version ", LoadLe(p + 8, 4),
                             "; this reader knows version ", kIndexVersion));
  }
  TfRecordIndex index;
  const uint64_t compression = LoadLe(p + 12, 4);
  if (compression > 1) return BadIndex(origin, "unknown compression");
  index.compression = static_cast<TfRecordCompression>(compression);
  index.file_size = static_cast<int64_t>(LoadLe(p + 16, 8));
  index.mtime_ns = static_cast<int64_t>(LoadLe(p + 24, 8));
  index.stream_size = LoadLe(p + 32, 8);
  const uint64_t count = LoadLe(p + 40, 8);
  if (index.file_size < 0) return BadIndex(origin, "negative file size");
  if (index.compression == TfRecordCompression::kNone &&
      index.stream_size != static_cast<uint64_t>(index.file_size)) {
    return BadIndex(origin, "a plain file's stream size is not its size");
  }
  // The count is checked against the bytes there before anything is sized
  // by it.
  if (count != (body - kIndexHeaderBytes) / 8 ||
      (body - kIndexHeaderBytes) % 8 != 0) {
    return BadIndex(
        origin, absl::StrCat("it claims ", count, " records but its size says ",
                             (body - kIndexHeaderBytes) / 8));
  }
  index.offsets.reserve(count);
  index.lengths.reserve(count);
  uint64_t offset = 0;
  for (uint64_t i = 0; i < count; ++i) {
    const uint64_t length = LoadLe(p + kIndexHeaderBytes + 8 * i, 8);
    if (length > options.max_record_bytes ||
        index.stream_size - offset < kTfRecordOverhead ||
        index.stream_size - offset - kTfRecordOverhead < length) {
      return BadIndex(origin, absl::StrCat("record ", i, "'s length ", length,
                                           " is out of bounds"));
    }
    index.offsets.push_back(offset);
    index.lengths.push_back(length);
    offset += kTfRecordOverhead + length;
  }
  if (offset != index.stream_size) {
    return BadIndex(origin,
                    absl::StrCat("its records end at byte ", offset,
                                 ", the stream at ", index.stream_size));
  }
  return index;
}

std::string TfRecordIndexPathBeside(const std::string& path) {
  return path + ".lockstep-index";
}

absl::StatusOr<std::string> TfRecordIndexPathInCache(
    const std::string& cache_dir, const std::string& path) {
  std::error_code error;
  std::filesystem::path absolute = std::filesystem::absolute(path, error);
  const std::string full = error ? path : absolute.lexically_normal().string();
  const std::string name = std::filesystem::path(path).filename().string();
  ASSIGN_OR_RETURN(const std::string digest, Sha256Hex(full));
  return absl::StrCat(cache_dir, "/", name, ".", digest.substr(0, 16),
                      ".lockstep-index");
}

namespace {

// The largest index a data file of `size` bytes can have: a record takes at
// least 16 bytes of the stream, and deflate expands at most 1032-fold.
int64_t MaxIndexBytes(int64_t size, TfRecordCompression compression) {
  const int64_t fixed = kIndexHeaderBytes + kIndexTrailerBytes;
  const int64_t max = std::numeric_limits<int64_t>::max() / 2;
  if (compression == TfRecordCompression::kNone) return fixed + size / 2;
  if (size > max / 1032) return max;
  return fixed + 8 * (size * 1032 / 16 + 1);
}

// Why the index at `index_path` cannot be used for the file with `stamp`,
// or OK with it in `*index`.
absl::Status TrySavedIndex(const std::string& index_path,
                           const FileStamp& stamp,
                           const TfRecordOptions& options,
                           TfRecordIndex* index) {
  ASSIGN_OR_RETURN(
      std::string bytes,
      ReadRegularFile(index_path,
                      MaxIndexBytes(stamp.size, stamp.compression)));
  ASSIGN_OR_RETURN(*index, ParseTfRecordIndex(bytes, index_path, options));
  if (index->file_size != stamp.size || index->mtime_ns != stamp.mtime_ns ||
      index->compression != stamp.compression) {
    return absl::FailedPreconditionError(absl::StrCat(
        index_path, " is stale: it describes ", index->file_size,
        " bytes with mtime ", index->mtime_ns, " ns, the file has ", stamp.size,
        " bytes with mtime ", stamp.mtime_ns, " ns"));
  }
  return absl::OkStatus();
}

// Saves beside the data, else in the cache folder; the path written, or why
// neither worked.
absl::StatusOr<std::string> SaveIndex(const TfRecordIndex& index,
                                      const std::string& cache_dir) {
  const std::string bytes = SerializeTfRecordIndex(index);
  const std::string beside = TfRecordIndexPathBeside(index.path);
  absl::Status saved = WriteFileAtomically(beside, bytes);
  if (saved.ok()) return beside;
  if (cache_dir.empty()) return saved;
  ASSIGN_OR_RETURN(const std::string cached,
                   TfRecordIndexPathInCache(cache_dir, index.path));
  absl::Status in_cache = MakeDirectories(cache_dir);
  if (in_cache.ok()) in_cache = WriteFileAtomically(cached, bytes);
  if (in_cache.ok()) return cached;
  return absl::FailedPreconditionError(absl::StrCat(
      "the index of ", index.path, " was not saved: ", saved.message(), "; ",
      in_cache.message()));
}

}  // namespace

absl::StatusOr<TfRecordIndex> LoadOrBuildTfRecordIndex(
    const std::string& path, const TfRecordIndexOptions& options,
    TfRecordIndexReport* report) {
  TfRecordIndexReport unused;
  if (report == nullptr) report = &unused;
  *report = TfRecordIndexReport();
  FileStamp stamp;
  {
    // Opening a stream stats the file and tells its compression; nothing
    // is read past its first 12 bytes.
    ASSIGN_OR_RETURN(std::unique_ptr<TfRecordStream> stream,
                     TfRecordStream::Open(path, options.record));
    stamp = {stream->file_size(), stream->mtime_ns(), stream->compression()};
  }
  std::vector<std::string> candidates = {TfRecordIndexPathBeside(path)};
  if (!options.cache_dir.empty()) {
    ASSIGN_OR_RETURN(std::string cached,
                     TfRecordIndexPathInCache(options.cache_dir, path));
    candidates.push_back(std::move(cached));
  }
  for (const std::string& candidate : candidates) {
    if (!PathExists(candidate)) continue;
    TfRecordIndex index;
    absl::Status usable =
        TrySavedIndex(candidate, stamp, options.record, &index);
    if (usable.ok()) {
      index.path = path;
      report->reused = true;
      report->index_path = candidate;
      return index;
    }
    if (!report->rebuild_reason.empty()) report->rebuild_reason += "; ";
    report->rebuild_reason += std::string(usable.message());
  }
  absl::StatusOr<TfRecordIndex> built =
      BuildTfRecordIndex(path, options.record);
  const bool damaged =
      !built.ok() &&
      (built.status().code() == absl::StatusCode::kDataLoss ||
       built.status().code() == absl::StatusCode::kInvalidArgument);
  if (options.salvage && damaged &&
      stamp.compression == TfRecordCompression::kNone) {
    return SalvageTfRecordIndex(path, options.record, &report->damage);
  }
  if (!built.ok()) return built.status();
  TfRecordIndex index = *std::move(built);
  auto saved = SaveIndex(index, options.cache_dir);
  if (saved.ok()) {
    report->index_path = *saved;
  } else {
    report->save_status = saved.status();
  }
  return index;
}

}  // namespace lockstep::worker
