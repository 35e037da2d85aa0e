// Memory-mapped .npy columns and token files (sources.h).
#include <algorithm>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/job_spec.h"
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
        " (NumPy's u1, i1, i2, i4, i8, u2, u4, f2, f4; bfloat16 only from "
        "TFRecord files)"));
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
class TokenWindows : public SplitSource {
 public:
  TokenWindows(std::unique_ptr<MappedFile> file, Dtype dtype, int64_t block,
               int64_t stride, int64_t windows)
      : file_(std::move(file)), stride_(stride) {
    ColumnInfo column;
    column.name = "tokens";
    column.dtype = dtype;
    column.shape = {block + 1};
    columns_.push_back(column);
    size_ = windows;
    description_ = absl::StrCat("token file ", file_->path());
  }

  absl::Status Read(absl::Span<const int> columns,
                    absl::Span<const int64_t> indices,
                    absl::Span<char* const> outs) const override {
    const int64_t token = DtypeSize(columns_[0].dtype);
    const int64_t bytes = columns_[0].sample_bytes();
    for (char* out : outs) {
      for (int64_t index : indices) {
        std::memcpy(out, file_->data() + index * stride_ * token,
                    static_cast<size_t>(bytes));
        out += bytes;
      }
    }
    (void)columns;  // one column
    return absl::OkStatus();
  }

 private:
  const std::unique_ptr<MappedFile> file_;
  const int64_t stride_;
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
  absl::MutexLock lock(&largest_mu_);
  largest_[column] = largest;
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
    const std::string& description, bool random) {
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

absl::StatusOr<std::shared_ptr<const SplitSource>> OpenTokenFile(
    const std::string& path, Dtype dtype, int64_t block, int64_t stride,
    bool random) {
  ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> file, MappedFile::Open(path));
  file->Advise(random ? MappedFile::Access::kRandom
                      : MappedFile::Access::kSequential);
  const int64_t token = DtypeSize(dtype);
  if (file->size() % token != 0) {
    return absl::DataLossError(
        absl::StrCat(path, " has ", file->size(),
                     " bytes, not a whole number of ", DtypeName(dtype),
                     " tokens: it is truncated, or data.token_dtype is wrong"));
  }
  const int64_t tokens = file->size() / token;
  if (tokens < block + 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, " holds ", tokens,
                     " tokens, fewer than one window of "
                     "data.block_size + 1 = ",
                     block + 1));
  }
  const int64_t windows = (tokens - (block + 1)) / stride + 1;
  return std::make_shared<TokenWindows>(std::move(file), dtype, block, stride,
                                        windows);
}

}  // namespace lockstep::worker
