// Memory-mapped .npy columns and token files (sources.h).
#include <algorithm>
#include <atomic>
#include <cstring>
#include <limits>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/job_spec.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "worker/data/mapped_file.h"
#include "worker/data/npy.h"
#include "worker/data/sources.h"

namespace lockstep::worker {
namespace {

// One memory-mapped shard of a column.
struct Shard {
  std::unique_ptr<MappedFile> file;
  const char* data = nullptr;  // the first sample
  int64_t first = 0;           // its first sample's index in the column
  int64_t count = 0;
};

struct MappedColumn {
  std::vector<Shard> shards;
};

class NpyColumns : public SplitSource {
 public:
  NpyColumns(std::vector<ColumnInfo> columns, std::vector<MappedColumn> mapped,
             int64_t size, std::string description)
      : mapped_(std::move(mapped)) {
    columns_ = std::move(columns);
    size_ = size;
    description_ = std::move(description);
  }

  absl::Status Read(absl::Span<const int> columns,
                    absl::Span<const int64_t> indices,
                    absl::Span<char* const> outs) const override {
    for (size_t c = 0; c < columns.size(); ++c) {
      ReadOne(columns[c], indices, outs[c]);
    }
    return absl::OkStatus();
  }

 private:
  void ReadOne(int column, absl::Span<const int64_t> indices, char* out) const {
    const std::vector<Shard>& shards = mapped_[column].shards;
    const int64_t bytes = columns_[column].sample_bytes();
    for (int64_t index : indices) {
      // The shard holding `index`: the last one starting at or before it.
      auto it = std::upper_bound(
          shards.begin(), shards.end(), index,
          [](int64_t i, const Shard& shard) { return i < shard.first; });
      const Shard& shard = *std::prev(it);
      std::memcpy(out, shard.data + (index - shard.first) * bytes,
                  static_cast<size_t>(bytes));
      out += bytes;
    }
  }

  const std::vector<MappedColumn> mapped_;
};

// A shard's header, checked against the file's size and the column's
// earlier shards.
absl::Status MapShard(const std::string& path, const std::string& column,
                      ColumnInfo* info, MappedColumn* mapped,
                      int64_t* samples) {
  ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> file, MappedFile::Open(path));
  const absl::string_view bytes = file->bytes();
  ASSIGN_OR_RETURN(NpyHeader header, ParseNpyHeader(bytes, path));
  ASSIGN_OR_RETURN(
      const int64_t data_bytes,
      NpyDataBytes(header, file->size() - header.data_offset, path));
  (void)data_bytes;
  const std::optional<Dtype> dtype = DtypeFromNumpy(header.dtype);
  if (!dtype.has_value()) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, " holds dtype ", header.descr, "; lockstep reads ", DtypeNames(),
        " (NumPy's u1, i1, i2, i4, i8, u2, u4, u8, b1, f2, f4, f8; bfloat16 "
        "only from TFRecord files)"));
  }
  if (header.shape.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        path,
        " holds a single value (shape ()); a column needs one entry "
        "per sample along its first axis"));
  }
  std::vector<int64_t> sample(header.shape.begin() + 1, header.shape.end());
  if (static_cast<int>(sample.size()) > kMaxColumnRank) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " has ", sample.size(),
                     " dimensions per sample; at most ", kMaxColumnRank));
  }
  int64_t elements = 1;
  for (int64_t dim : sample) {
    if (dim == 0 || elements > kMaxSampleElements / std::max<int64_t>(dim, 1)) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, " has shape ", header.shape_text,
                       ": each sample must have between 1 and ",
                       kMaxSampleElements, " elements"));
    }
    elements *= dim;
  }
  if (mapped->shards.empty()) {
    info->name = column;
    info->dtype = *dtype;
    info->shape = sample;
  } else if (info->dtype != *dtype || info->shape != sample) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, " holds ", DtypeName(*dtype), " samples of shape [",
        absl::StrJoin(sample, ", "), "], but the column's first shard ",
        mapped->shards.front().file->path(), " holds ", DtypeName(info->dtype),
        " samples of shape ", info->ShapeText(),
        "; every shard of a column must agree"));
  }
  Shard shard;
  shard.count = header.shape[0];
  shard.first = *samples;
  shard.data = file->data() + header.data_offset;
  shard.file = std::move(file);
  *samples += shard.count;
  // A shard without samples holds no position: the search skips it.
  if (shard.count > 0) mapped->shards.push_back(std::move(shard));
  return absl::OkStatus();
}

// Token files of any size are read as windows; each window is a sample.
// Per file, a window lies inside one file: shards are cut where a file
// ends. Concatenated, the files are one stream (with the separator token
// between two files, if any) and windows run across their ends.
class TokenWindows : public SplitSource {
 public:
  struct File {
    std::unique_ptr<MappedFile> file;
    int64_t first = 0;  // per file: its first window's index in the split
    int64_t windows = 0;
    int64_t start = 0;  // concatenated: its first token's place in the stream
    int64_t tokens = 0;
  };

  TokenWindows(std::vector<File> files, Dtype dtype, int64_t block,
               int64_t stride, bool random_offset, int64_t windows,
               std::string description, const TokenStream& stream)
      : files_(std::move(files)),
        stride_(stride),
        random_offset_(random_offset),
        stream_(stream) {
    ColumnInfo column;
    column.name = "tokens";
    column.dtype = dtype;
    column.shape = {block + 1};
    columns_.push_back(column);
    size_ = windows;
    description_ = std::move(description);
  }

  absl::Status Read(absl::Span<const int> columns,
                    absl::Span<const int64_t> indices,
                    absl::Span<char* const> outs) const override {
    return ReadInEpoch(0, columns, indices, outs);
  }

  bool VariesByEpoch() const override { return random_offset_; }

  absl::Status ReadInEpoch(uint64_t epoch_key, absl::Span<const int> columns,
                           absl::Span<const int64_t> indices,
                           absl::Span<char* const> outs) const override {
    const int64_t token = DtypeSize(columns_[0].dtype);
    const int64_t bytes = columns_[0].sample_bytes();
    // Every window of the epoch starts `offset` tokens later.
    const int64_t offset =
        random_offset_
            ? static_cast<int64_t>(epoch_key % static_cast<uint64_t>(stride_))
            : 0;
    for (char* out : outs) {
      for (int64_t index : indices) {
        if (stream_.concatenate) {
          CopyFromStream(offset + index * stride_, columns_[0].elements(),
                         token, out);
          out += bytes;
          continue;
        }
        auto it = std::upper_bound(
            files_.begin(), files_.end(), index,
            [](int64_t i, const File& file) { return i < file.first; });
        const File& file = *std::prev(it);
        const int64_t start = offset + (index - file.first) * stride_;
        std::memcpy(out, file.file->data() + start * token,
                    static_cast<size_t>(bytes));
        out += bytes;
      }
    }
    (void)columns;  // one column
    return absl::OkStatus();
  }

  // `count` tokens of the stream from `at`: the files' tokens, and the
  // separator where one file ends and the next begins.
  void CopyFromStream(int64_t at, int64_t count, int64_t token,
                      char* out) const {
    auto it = std::upper_bound(
        files_.begin(), files_.end(), at,
        [](int64_t i, const File& file) { return i < file.start; });
    size_t f = static_cast<size_t>(std::prev(it) - files_.begin());
    while (count > 0) {
      const File& file = files_[f];
      if (at < file.start + file.tokens) {
        const int64_t n = std::min(count, file.start + file.tokens - at);
        std::memcpy(out, file.file->data() + (at - file.start) * token,
                    static_cast<size_t>(n * token));
        out += n * token;
        at += n;
        count -= n;
        continue;
      }
      // Past this file: the separator, then the next file.
      if (stream_.separator.has_value()) {
        const uint32_t value = *stream_.separator;
        if (token == 2) {
          const auto narrow = static_cast<uint16_t>(value);
          std::memcpy(out, &narrow, 2);
        } else {
          std::memcpy(out, &value, 4);
        }
        out += token;
        ++at;
        --count;
      }
      ++f;
    }
  }

  // Each token once, whatever the windows' overlap: the files are cut
  // into chunks scanned by up to 8 threads.
  absl::StatusOr<int64_t> ScanLargest(int column) const override {
    (void)column;
    const Dtype dtype = columns_[0].dtype;
    const int64_t token = DtypeSize(dtype);
    struct Chunk {
      const char* data;
      int64_t tokens;
    };
    constexpr int64_t kChunkTokens = int64_t{1} << 22;
    std::vector<Chunk> chunks;
    for (const File& file : files_) {
      const int64_t tokens = file.file->size() / token;
      for (int64_t begin = 0; begin < tokens; begin += kChunkTokens) {
        chunks.push_back({file.file->data() + begin * token,
                          std::min(kChunkTokens, tokens - begin)});
      }
    }
    const int threads = static_cast<int>(
        std::min<int64_t>({8, std::max(1u, std::thread::hardware_concurrency()),
                           static_cast<int64_t>(chunks.size())}));
    std::vector<int64_t> largest(static_cast<size_t>(threads), -1);
    std::atomic<size_t> next{0};
    auto scan = [&](int t) {
      for (size_t c = next++; c < chunks.size(); c = next++) {
        int64_t top = largest[t];
        if (dtype == Dtype::kUInt16) {
          const auto* p = reinterpret_cast<const uint16_t*>(chunks[c].data);
          uint16_t m = 0;
          for (int64_t i = 0; i < chunks[c].tokens; ++i) m = std::max(m, p[i]);
          top = std::max<int64_t>(top, m);
        } else {
          for (int64_t i = 0; i < chunks[c].tokens; ++i) {
            top = std::max(top, ElementAsInt(dtype, chunks[c].data, i));
          }
        }
        largest[t] = top;
      }
    };
    std::vector<std::thread> pool;
    for (int t = 1; t < threads; ++t) pool.emplace_back(scan, t);
    if (threads > 0) scan(0);
    for (std::thread& thread : pool) thread.join();
    int64_t top = -1;
    for (int64_t value : largest) top = std::max(top, value);
    if (stream_.separator.has_value()) {
      top = std::max<int64_t>(top, *stream_.separator);
    }
    return top;
  }

 private:
  const std::vector<File> files_;
  const int64_t stride_;
  const bool random_offset_;
  const TokenStream stream_;
};

}  // namespace

int64_t ColumnInfo::elements() const {
  int64_t n = 1;
  for (int64_t dim : shape) n *= dim;
  return n;
}

std::string ColumnInfo::ShapeText() const {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

absl::StatusOr<int64_t> SplitSource::LargestValue(int column) const {
  {
    absl::MutexLock lock(&largest_mu_);
    auto known = largest_.find(column);
    if (known != largest_.end()) return known->second;
  }
  ASSIGN_OR_RETURN(const int64_t largest, ScanLargest(column));
  absl::MutexLock lock(&largest_mu_);
  largest_[column] = largest;
  return largest;
}

absl::StatusOr<int64_t> SplitSource::ScanLargest(int column) const {
  constexpr int64_t kChunk = 1024;
  const ColumnInfo& info = columns_[column];
  std::vector<int64_t> indices;
  std::vector<char> buffer;
  int64_t largest = -1;
  for (int64_t begin = 0; begin < size_; begin += kChunk) {
    const int64_t n = std::min(kChunk, size_ - begin);
    indices.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) indices[i] = begin + i;
    buffer.resize(static_cast<size_t>(n * info.sample_bytes()));
    RETURN_IF_ERROR(ReadColumn(column, indices, buffer.data()));
    const int64_t total = n * info.elements();
    for (int64_t i = 0; i < total; ++i) {
      largest = std::max(largest, ElementAsInt(info.dtype, buffer.data(), i));
    }
  }
  return largest;
}

int SplitSource::Find(const std::string& name) const {
  for (size_t i = 0; i < columns_.size(); ++i) {
    if (columns_[i].name == name) return static_cast<int>(i);
  }
  return -1;
}

absl::StatusOr<std::shared_ptr<const SplitSource>> OpenNpyColumns(
    const std::map<std::string, std::vector<std::string>>& files,
    const std::string& description, bool random,
    const std::map<std::string, std::vector<std::string>>& classes) {
  std::vector<ColumnInfo> columns;
  std::vector<MappedColumn> mapped;
  int64_t size = -1;
  std::string first_column;
  for (const auto& [name, paths] : files) {
    ColumnInfo info;
    MappedColumn column;
    int64_t samples = 0;
    for (const std::string& path : paths) {
      RETURN_IF_ERROR(MapShard(path, name, &info, &column, &samples));
    }
    for (const Shard& shard : column.shards) {
      shard.file->Advise(random ? MappedFile::Access::kRandom
                                : MappedFile::Access::kSequential);
    }
    if (size >= 0 && samples != size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "column ", name, " has ", samples, " samples (in ", paths.size(),
          " file", paths.size() == 1 ? "" : "s", ", first ", paths.front(),
          ") but column ", first_column, " has ", size,
          "; every column of a split needs one entry per sample"));
    }
    size = samples;
    if (first_column.empty()) first_column = name;
    if (auto named = classes.find(name); named != classes.end()) {
      info.classes = named->second;
    }
    columns.push_back(std::move(info));
    mapped.push_back(std::move(column));
  }
  if (size <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(description, " holds no samples"));
  }
  return std::make_shared<NpyColumns>(std::move(columns), std::move(mapped),
                                      size, description);
}

absl::StatusOr<TokenCoverage> CoverTokens(
    const std::vector<int64_t>& file_tokens, int64_t block, int64_t stride,
    bool random_offset, const TokenStream& stream) {
  TokenCoverage out;
  // With random offsets the windows are those that fit at any offset in
  // [0, stride): the count is the same every epoch.
  const int64_t span = block + 1 + (random_offset ? stride - 1 : 0);
  for (size_t f = 0; f < file_tokens.size(); ++f) {
    out.tokens += file_tokens[f];
  }
  if (stream.concatenate) {
    // A separator between two files that hold tokens.
    const int64_t nonempty =
        std::count_if(file_tokens.begin(), file_tokens.end(),
                      [](int64_t n) { return n > 0; });
    int64_t length = out.tokens;
    if (stream.separator.has_value() && nonempty > 0) length += nonempty - 1;
    out.windows = length < span ? 0 : (length - span) / stride + 1;
    const int64_t read =
        out.windows == 0 ? 0 : (out.windows - 1) * stride + block + 1;
    out.unread = std::max<int64_t>(0, length - read);
    return out;
  }
  for (int64_t tokens : file_tokens) {
    if (tokens < span) {
      ++out.short_files;
      out.unread += tokens;
      continue;
    }
    const int64_t windows = (tokens - span) / stride + 1;
    if (out.windows > std::numeric_limits<int64_t>::max() - windows) {
      return absl::InvalidArgumentError("too many token windows");
    }
    out.windows += windows;
    // At offset 0; a random offset moves the cut, not its size.
    out.unread += tokens - ((windows - 1) * stride + block + 1);
  }
  return out;
}

std::string TokenCoverage::Text() const {
  std::string text = absl::StrCat(
      windows, " windows; ", unread, " of ", tokens, " tokens (",
      absl::StrFormat("%.2f", tokens > 0 ? 100.0 * unread / tokens : 0.0),
      "%) in no window");
  if (short_files > 0) {
    absl::StrAppend(&text, ", ", short_files,
                    short_files == 1 ? " file" : " files",
                    " shorter than a window");
  }
  return text;
}

absl::StatusOr<std::shared_ptr<const SplitSource>> OpenTokenFiles(
    const std::vector<std::string>& paths, Dtype dtype, int64_t block,
    int64_t stride, bool random_offset, bool random,
    const TokenStream& stream) {
  std::vector<TokenWindows::File> files;
  std::vector<int64_t> file_tokens;
  const int64_t token = DtypeSize(dtype);
  const int64_t span = block + 1 + (random_offset ? stride - 1 : 0);
  int64_t start = 0;  // in the concatenated stream
  for (const std::string& path : paths) {
    ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> file, MappedFile::Open(path));
    file->Advise(random ? MappedFile::Access::kRandom
                        : MappedFile::Access::kSequential);
    if (file->size() % token != 0) {
      return absl::DataLossError(absl::StrCat(
          path, " has ", file->size(), " bytes, not a whole number of ",
          DtypeName(dtype),
          " tokens: it is truncated, or data.token_dtype is wrong"));
    }
    const int64_t tokens = file->size() / token;
    file_tokens.push_back(tokens);
    if (!stream.concatenate && tokens < span) {
      if (paths.size() == 1) {
        return absl::InvalidArgumentError(absl::StrCat(
            path, " holds ", tokens, " tokens, fewer than one window of ",
            random_offset ? "data.block_size + data.window_stride = "
                          : "data.block_size + 1 = ",
            span));
      }
      continue;  // a shard too short for a window holds none
    }
    if (stream.concatenate && tokens == 0) continue;
    TokenWindows::File entry;
    entry.tokens = tokens;
    entry.start = start;
    start += tokens + (stream.separator.has_value() ? 1 : 0);
    entry.file = std::move(file);
    files.push_back(std::move(entry));
  }
  ASSIGN_OR_RETURN(
      TokenCoverage coverage,
      CoverTokens(file_tokens, block, stride, random_offset, stream));
  if (!stream.concatenate) {
    int64_t first = 0;
    for (TokenWindows::File& file : files) {
      file.first = first;
      file.windows = (file.tokens - span) / stride + 1;
      first += file.windows;
    }
  }
  if (coverage.windows == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("none of the ", paths.size(), " token files (first ",
                     paths.front(), ") holds one window of ", span, " tokens",
                     stream.concatenate ? ", even concatenated" : ""));
  }
  std::string description =
      paths.size() == 1
          ? absl::StrCat("token file ", paths.front())
          : absl::StrCat(paths.size(), " token files (", paths.front(), " to ",
                         paths.back(),
                         stream.concatenate ? ", concatenated" : "", ")");
  // A corpus of many short files loses a share to the windows' cuts: say
  // so where it is noticeable, with the way out.
  if (!stream.concatenate && paths.size() > 1 &&
      coverage.unread * 100 > coverage.tokens) {
    LogWarning(description, ": ", coverage.Text(),
               "; data.concatenate reads the files as one stream");
  }
  return std::make_shared<TokenWindows>(std::move(files), dtype, block, stride,
                                        random_offset, coverage.windows,
                                        std::move(description), stream);
}

}  // namespace lockstep::worker
