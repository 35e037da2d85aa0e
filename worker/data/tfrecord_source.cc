// TFRecord files of tf.train.Example records as a split (sources.h).
#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <map>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/log.h"
#include "common/status_macros.h"
#include "worker/data/skip_log.h"
#include "worker/data/sources.h"
#include "worker/data/tf_example.h"
#include "worker/data/tfrecord.h"

namespace lockstep::worker {
namespace {

// GZIP files decoded whole: more than this per split is refused.
constexpr int64_t kMaxInMemoryBytes = int64_t{4} << 30;

class TfRecordSplit : public SplitSource {
 public:
  // `augment`: the training split's declared random augmentations apply.
  // `skip`: the log of what may be skipped (null: nothing may).
  TfRecordSplit(std::vector<ColumnInfo> columns, ExampleDecoder decoder,
                std::string description, bool augment, int threads,
                std::shared_ptr<SkipLog> skip, std::string split,
                std::string data_dir)
      : decoder_(std::move(decoder)),
        augment_(augment),
        threads_(threads),
        skip_(std::move(skip)),
        split_(std::move(split)),
        data_dir_(std::move(data_dir)) {
    columns_ = std::move(columns);
    description_ = std::move(description);
    for (const ColumnInfo& column : columns_) {
      decoded_bytes_ += column.sample_bytes();
    }
  }

  // A plain file, read record by record, and what salvaging it left out.
  absl::Status AddIndexed(std::unique_ptr<TfRecordFile> file,
                          const std::vector<TfRecordDamage>& damage) {
    for (const TfRecordDamage& stretch : damage) {
      RETURN_IF_ERROR(Skip(file->index().path, stretch.record,
                           static_cast<int64_t>(stretch.offset),
                           static_cast<int64_t>(stretch.bytes),
                           stretch.reason));
    }
    Part part;
    part.first = size_;
    part.count = file->index().size();
    part.file = std::move(file);
    size_ += part.count;
    if (part.count > 0) parts_.push_back(std::move(part));
    return absl::OkStatus();
  }

  // A GZIP file, decoded now: every sample's columns, back to back.
  absl::Status AddDecoded(const std::string& path) {
    ASSIGN_OR_RETURN(std::unique_ptr<TfRecordStream> stream,
                     TfRecordStream::Open(path));
    Part part;
    part.first = size_;
    std::string record;
    while (true) {
      const int64_t at = stream->next_index();
      ASSIGN_OR_RETURN(bool more, stream->Next(&record));
      if (!more) break;
      // Every GZIP file of the split together.
      if (in_memory_ + static_cast<int64_t>(part.decoded.size()) +
              decoded_bytes_ >
          kMaxInMemoryBytes) {
        return absl::ResourceExhaustedError(absl::StrCat(
            "the GZIP files of the split, up to ", path,
            ", decode to more than ", kMaxInMemoryBytes >> 30,
            " GiB: a GZIP file cannot be read in place; store the data set "
            "as plain TFRecord files (TFRecordWriter without compression)"));
      }
      const size_t offset = part.decoded.size();
      part.decoded.resize(offset + static_cast<size_t>(decoded_bytes_));
      absl::Status decoded =
          DecodeInto(record, path, at, &part.decoded[offset]);
      if (!decoded.ok() && skip_ != nullptr && Skippable(decoded)) {
        part.decoded.resize(offset);
        absl::string_view reason = decoded.message();
        absl::ConsumePrefix(&reason, absl::StrCat(path, " record ", at, ": "));
        RETURN_IF_ERROR(Skip(path, at, -1, 0, reason));
        continue;
      }
      RETURN_IF_ERROR(decoded);
      ++part.count;
    }
    in_memory_ += static_cast<int64_t>(part.decoded.size());
    size_ += part.count;
    if (part.count > 0) parts_.push_back(std::move(part));
    return absl::OkStatus();
  }

  absl::Status Read(absl::Span<const int> columns,
                    absl::Span<const int64_t> indices,
                    absl::Span<char* const> outs) const override {
    return ReadInEpoch(0, columns, indices, outs);
  }

  bool VariesByEpoch() const override { return augment_; }
  const SkipLog* skipped() const override { return skip_.get(); }

  // Records decode on up to `threads_` threads (encoded images are worth
  // it), each taking the next sample until none is left, so a slow image
  // keeps no thread idle. An error is that of the first failing sample.
  absl::Status ReadInEpoch(uint64_t epoch_key, absl::Span<const int> columns,
                           absl::Span<const int64_t> indices,
                           absl::Span<char* const> outs) const override {
    const int64_t n = static_cast<int64_t>(indices.size());
    if (n == 0) return absl::OkStatus();
    const int threads = static_cast<int>(
        std::min<int64_t>(n, images_ ? std::max(threads_, 1) : 1));
    std::atomic<int64_t> next{0};
    // Per thread: the first sample that failed and why.
    std::vector<std::pair<int64_t, absl::Status>> failed(
        static_cast<size_t>(threads), {n, absl::OkStatus()});
    auto work = [&](int t) {
      std::string scratch(static_cast<size_t>(decoded_bytes_), '\0');
      for (int64_t i = next++; i < n; i = next++) {
        absl::Status read =
            ReadOne(epoch_key, columns, indices, outs, i, scratch);
        if (!read.ok() && i < failed[t].first) failed[t] = {i, read};
      }
    };
    std::vector<std::thread> pool;
    for (int t = 1; t < threads; ++t) pool.emplace_back(work, t);
    work(0);
    for (std::thread& thread : pool) thread.join();
    const auto first = std::min_element(
        failed.begin(), failed.end(),
        [](const auto& a, const auto& b) { return a.first < b.first; });
    return first->second;
  }

  void SetHasImages(bool images) { images_ = images; }

  void ComputeOffsets() {
    int64_t offset = 0;
    for (const ColumnInfo& column : columns_) {
      offsets_.push_back(offset);
      offset += column.sample_bytes();
    }
  }

 private:
  struct Part {
    int64_t first = 0;
    int64_t count = 0;
    std::unique_ptr<TfRecordFile> file;  // null: decoded
    std::string decoded;
  };

  // Errors of one record's bytes (not of the file or the machine).
  static bool Skippable(const absl::Status& status) {
    return status.code() == absl::StatusCode::kDataLoss ||
           status.code() == absl::StatusCode::kInvalidArgument ||
           status.code() == absl::StatusCode::kResourceExhausted;
  }

  // Notes a skipped record of `path` (offset -1: a GZIP stream's record,
  // named by its number).
  absl::Status Skip(const std::string& path, int64_t record, int64_t offset,
                    int64_t bytes, absl::string_view reason) const {
    SkippedRecordInfo info;
    const std::string relative =
        std::filesystem::path(path).lexically_relative(data_dir_).string();
    info.file =
        relative.empty() || absl::StartsWith(relative, "..") ? path : relative;
    info.record = record;
    info.offset = offset;
    info.bytes = bytes;
    info.reason = std::string(reason);
    info.split = split_;
    const std::string described = DescribeSkipped(info);
    bool fresh = false;
    absl::Status noted = skip_->Note(std::move(info), &fresh);
    if (fresh) {
      LogWarning("skipping ", split_, " data ", described,
                 " (data.skip_corrupt: ", skip_->limit(), ")");
    }
    return noted;
  }

  // Sample i of `indices` into its rows of `outs`; `scratch` holds the
  // columns not asked for. With skip_corrupt, a record that does not decode
  // is noted and the next sample of the split read in its place, until one
  // decodes: what takes its place depends on the data only.
  absl::Status ReadOne(uint64_t epoch_key, absl::Span<const int> columns,
                       absl::Span<const int64_t> indices,
                       absl::Span<char* const> outs, int64_t i,
                       std::string& scratch) const {
    int64_t index = indices[i];
    for (int64_t tried = 0;; ++tried) {
      absl::Status read =
          ReadSample(epoch_key, indices[i], index, columns, outs, i, scratch);
      if (read.ok() || skip_ == nullptr || !Skippable(read)) return read;
      const auto [part, record] = Locate(index);
      if (part->file == nullptr) return read;  // decoded when opened
      const TfRecordIndex& file = part->file->index();
      // The reason without the record's name (the skip names it).
      absl::string_view reason = read.message();
      absl::ConsumePrefix(&reason,
                          absl::StrCat(file.path, " record ", record, ": "));
      RETURN_IF_ERROR(
          Skip(file.path, record,
               static_cast<int64_t>(file.offsets[static_cast<size_t>(record)]),
               0, reason));
      if (tried + 1 >= size_) {
        return absl::DataLossError(absl::StrCat("no record of ", description_,
                                                " decodes: ", read.message()));
      }
      index = (index + 1) % size_;
    }
  }

  // The part holding sample `index`, and its record number there.
  std::pair<const Part*, int64_t> Locate(int64_t index) const {
    auto it = std::upper_bound(
        parts_.begin(), parts_.end(), index,
        [](int64_t at, const Part& part) { return at < part.first; });
    const Part& part = *std::prev(it);
    return {&part, index - part.first};
  }

  // ReadOne's read of sample `index` in place of `slot` (the sample asked
  // for, whose key draws the augmentation).
  absl::Status ReadSample(uint64_t epoch_key, int64_t slot, int64_t index,
                          absl::Span<const int> columns,
                          absl::Span<char* const> outs, int64_t i,
                          std::string& scratch) const {
    const auto [found, record] = Locate(index);
    const Part& part = *found;
    if (part.file == nullptr) {
      const char* sample = part.decoded.data() + record * decoded_bytes_;
      for (size_t c = 0; c < columns.size(); ++c) {
        const int64_t bytes = columns_[columns[c]].sample_bytes();
        std::memcpy(outs[c] + i * bytes, sample + offsets_[columns[c]],
                    static_cast<size_t>(bytes));
      }
      return absl::OkStatus();
    }
    ASSIGN_OR_RETURN(std::string bytes, part.file->Read(record));
    // A function of (seed, epoch, sample): the epoch's key and the sample's
    // index mixed.
    Augmentation augmentation;
    augmentation.key =
        epoch_key ^ (0x9E3779B97F4A7C15ull * static_cast<uint64_t>(slot + 1));
    // The columns asked for decode straight into their rows of `outs` (an
    // image is most of a sample); the others into `scratch`.
    std::vector<absl::Span<char>> spans;
    std::vector<int> first_ask(columns_.size(), -1);
    for (size_t c = 0; c < columns.size(); ++c) {
      if (first_ask[columns[c]] < 0)
        first_ask[columns[c]] = static_cast<int>(c);
    }
    for (size_t k = 0; k < columns_.size(); ++k) {
      const int64_t size = columns_[k].sample_bytes();
      char* at = first_ask[k] >= 0 ? outs[first_ask[k]] + i * size
                                   : scratch.data() + offsets_[k];
      spans.emplace_back(at, static_cast<size_t>(size));
    }
    RETURN_IF_ERROR(decoder_.Decode(
        bytes, spans, absl::StrCat(part.file->index().path, " record ", record),
        augment_ ? &augmentation : nullptr));
    // A column asked for twice.
    for (size_t c = 0; c < columns.size(); ++c) {
      if (first_ask[columns[c]] != static_cast<int>(c)) {
        const int64_t size = columns_[columns[c]].sample_bytes();
        std::memcpy(outs[c] + i * size, spans[columns[c]].data(),
                    static_cast<size_t>(size));
      }
    }
    return absl::OkStatus();
  }

  absl::Status DecodeInto(absl::string_view record, const std::string& path,
                          int64_t index, char* out,
                          const Augmentation* augment = nullptr) const {
    std::vector<absl::Span<char>> spans;
    int64_t offset = 0;
    for (const ColumnInfo& column : columns_) {
      spans.emplace_back(out + offset,
                         static_cast<size_t>(column.sample_bytes()));
      offset += column.sample_bytes();
    }
    return decoder_.Decode(record, spans, absl::StrCat(path, " record ", index),
                           augment);
  }

  const ExampleDecoder decoder_;
  const bool augment_;
  const int threads_;
  const std::shared_ptr<SkipLog> skip_;
  const std::string split_;     // "train" or "test"
  const std::string data_dir_;  // skipped files are named relative to it
  bool images_ = false;
  int64_t decoded_bytes_ = 0;
  int64_t in_memory_ = 0;  // decoded GZIP samples, all files
  std::vector<int64_t> offsets_;
  std::vector<Part> parts_;
};

}  // namespace

absl::StatusOr<std::shared_ptr<const SplitSource>> OpenTfRecordFiles(
    const std::vector<std::string>& files, const v1::DataSpec& spec,
    const std::string& index_cache_dir, bool train, int threads) {
  // Sorted by name: a protobuf map has no fixed order.
  std::map<std::string, v1::ColumnSpec> sorted(spec.features().begin(),
                                               spec.features().end());
  std::vector<ColumnInfo> columns;
  std::vector<FeatureSpec> features;
  bool images = false, random = false;
  for (const auto& [name, declared] : sorted) {
    ColumnInfo column;
    column.name = name;
    column.dtype = DtypeFromName(declared.dtype()).value_or(Dtype::kFloat32);
    column.shape.assign(declared.shape().begin(), declared.shape().end());
    if (declared.max_len() > 0) column.shape = {declared.max_len()};
    FeatureSpec feature;
    feature.name = name;
    ASSIGN_OR_RETURN(feature.dtype, ParseDType(declared.dtype()));
    feature.shape = column.shape;
    // An image is declared [H, W, C] and delivered [C, H, W] (the decoder
    // checks the declared shape).
    if (!declared.encoding().empty() && column.shape.size() == 3) {
      column.shape = {column.shape[2], column.shape[0], column.shape[1]};
    }
    columns.push_back(column);
    feature.key = declared.from();
    feature.optional = declared.optional();
    feature.offset = declared.offset();
    feature.variable_length = declared.max_len() > 0;
    if (!declared.encoding().empty()) {
      if (!ParseImageEncoding(declared.encoding(), &feature.encoding)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "data.features[\"", name, "\"].encoding is not jpeg, png or auto"));
      }
      feature.image = true;
      images = true;
      if (declared.resize_size() == 2) {
        feature.resize_height = declared.resize(0);
        feature.resize_width = declared.resize(1);
      }
      feature.random_crop = declared.random_crop();
      feature.random_flip = declared.random_flip();
      feature.antialias = declared.resize_filter() == "antialias";
      if (declared.has_random_resized_crop()) {
        const v1::ResizedCrop& crop = declared.random_resized_crop();
        feature.random_resized_crop = true;
        if (crop.scale_size() == 2) {
          feature.crop_scale[0] = crop.scale(0);
          feature.crop_scale[1] = crop.scale(1);
        }
        if (crop.ratio_size() == 2) {
          feature.crop_ratio[0] = crop.ratio(0);
          feature.crop_ratio[1] = crop.ratio(1);
        }
      }
      random = random || feature.random_crop || feature.random_flip ||
               feature.random_resized_crop;
    }
    features.push_back(std::move(feature));
  }
  ASSIGN_OR_RETURN(ExampleDecoder decoder,
                   ExampleDecoder::Create(std::move(features)));
  const bool augment = train && random;
  std::shared_ptr<SkipLog> skip;
  if (spec.skip_corrupt() > 0) {
    skip = std::make_shared<SkipLog>(spec.skip_corrupt());
  }
  std::error_code error;
  std::filesystem::path data_dir =
      std::filesystem::weakly_canonical(spec.dir(), error);
  if (error) data_dir = spec.dir();
  auto split = std::make_shared<TfRecordSplit>(
      std::move(columns), std::move(decoder),
      absl::StrCat(files.size(), " TFRecord file", files.size() == 1 ? "" : "s",
                   " (first ", files.front(), ")"),
      augment, threads, std::move(skip), train ? "train" : "test",
      data_dir.string());
  split->SetHasImages(images);
  split->ComputeOffsets();
  TfRecordIndexOptions options;
  options.cache_dir = index_cache_dir;
  options.salvage = spec.skip_corrupt() > 0;
  for (const std::string& path : files) {
    TfRecordIndexReport report;
    ASSIGN_OR_RETURN(TfRecordIndex index,
                     LoadOrBuildTfRecordIndex(path, options, &report));
    if (index.compression == TfRecordCompression::kGzip) {
      if (augment) {
        return absl::InvalidArgumentError(absl::StrCat(
            path,
            " is GZIP-compressed: its records are decoded once, so "
            "random_crop, random_resized_crop and random_flip cannot draw "
            "anew each epoch; store the data set as plain TFRecord files"));
      }
      RETURN_IF_ERROR(split->AddDecoded(path));
      continue;
    }
    if (!report.reused && !report.save_status.ok()) {
      LogWarning("the record index of ", path,
                 " could not be saved (it is rebuilt by every reader): ",
                 report.save_status.message());
    }
    ASSIGN_OR_RETURN(std::unique_ptr<TfRecordFile> file,
                     TfRecordFile::Open(std::move(index)));
    RETURN_IF_ERROR(split->AddIndexed(std::move(file), report.damage));
  }
  if (split->size() == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(split->description(), " hold no records"));
  }
  return std::shared_ptr<const SplitSource>(split);
}

}  // namespace lockstep::worker
