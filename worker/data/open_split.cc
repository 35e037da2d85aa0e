// Finding a split's files and opening them as a source (split_source.h):
// the formats' file names in data.dir, or data.train/test globs inside it.
#include <dirent.h>
#include <glob.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <thread>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "common/path_policy.h"
#include "common/status_macros.h"
#include "worker/data/sources.h"

namespace lockstep::worker {
namespace {

// IDX images decoded into memory.
class MemoryImages : public SplitSource {
 public:
  MemoryImages(ImageDataset data, const std::string& dir)
      : data_(std::move(data)) {
    ColumnInfo image;
    image.name = "image";
    image.dtype = Dtype::kUInt8;
    image.shape = {1, data_.rows, data_.cols};
    ColumnInfo label;
    label.name = "label";
    label.dtype = Dtype::kUInt8;
    columns_ = {image, label};
    size_ = data_.count;
    description_ = absl::StrCat("IDX files in ", dir);
  }

  absl::Status Read(absl::Span<const int> columns,
                    absl::Span<const int64_t> indices,
                    absl::Span<char* const> outs) const override {
    const int64_t pixels = data_.rows * data_.cols;
    for (size_t c = 0; c < columns.size(); ++c) {
      char* out = outs[c];
      for (int64_t index : indices) {
        if (columns[c] == 0) {
          std::memcpy(out, data_.pixels.data() + index * pixels,
                      static_cast<size_t>(pixels));
          out += pixels;
        } else {
          *out++ = static_cast<char>(data_.labels[index]);
        }
      }
    }
    return absl::OkStatus();
  }

 private:
  const ImageDataset data_;
};

// The entries of `dir` (names only), sorted.
absl::StatusOr<std::vector<std::string>> ListFolder(const std::string& dir) {
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) {
    return absl::NotFoundError(
        absl::StrCat("cannot list data.dir ", dir, ": ", std::strerror(errno)));
  }
  std::vector<std::string> names;
  while (dirent* entry = readdir(d)) names.push_back(entry->d_name);
  closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

// "<prefix>_<column>.npy" or "<prefix>_<column>-<digits>.npy" -> column;
// empty when `name` is not such a file.
std::string NpyColumnOf(absl::string_view name, absl::string_view prefix) {
  if (!absl::ConsumeSuffix(&name, ".npy")) return "";
  if (!prefix.empty() && !absl::ConsumePrefix(&name, prefix)) return "";
  const size_t underscore = name.find('_');
  if (underscore == absl::string_view::npos) return "";
  if (prefix.empty()) {
    name.remove_prefix(underscore + 1);
  } else if (underscore == 0) {
    name.remove_prefix(1);
  } else {
    return "";
  }
  const size_t dash = name.rfind('-');
  if (dash != absl::string_view::npos && dash + 1 < name.size() &&
      std::all_of(name.begin() + dash + 1, name.end(),
                  [](char c) { return absl::ascii_isdigit(c); })) {
    name = name.substr(0, dash);
  }
  return std::string(name);
}

// `path` (in `dir`) resolved; a symbolic link that leads out of `dir` is
// refused (PermissionDenied), as for the globs' matches.
absl::StatusOr<std::string> InsideDataDir(const std::string& path,
                                          const std::string& dir) {
  return CheckUnderRoots("data.dir", path, {dir}, "data.dir",
                         CurrentDirectory());
}

// The files `glob` (relative to `dir`) matches, sorted, each resolved and
// checked to lie inside `dir`; index files are never data.
absl::StatusOr<std::vector<std::string>> Expand(const std::string& dir,
                                                const std::string& pattern,
                                                const std::string& field) {
  glob_t matches;
  const std::string full = absl::StrCat(dir, "/", pattern);
  const int rc = glob(full.c_str(), GLOB_ERR, nullptr, &matches);
  std::vector<std::string> files;
  if (rc == 0) {
    for (size_t i = 0; i < matches.gl_pathc; ++i) {
      const std::string path = matches.gl_pathv[i];
      if (absl::EndsWith(path, ".lockstep-index")) continue;
      if (absl::StrContains(path, ".lockstep-csv-")) continue;
      files.push_back(path);
    }
  }
  globfree(&matches);
  if (files.empty()) {
    return absl::NotFoundError(
        absl::StrCat(field, " \"", pattern, "\" matches no file in ", dir));
  }
  std::sort(files.begin(), files.end());
  const std::string cwd = CurrentDirectory();
  for (std::string& file : files) {
    // A link among the matches must not lead out of data.dir.
    ASSIGN_OR_RETURN(file,
                     CheckUnderRoots(field, file, {dir}, "data.dir", cwd));
  }
  return files;
}

absl::StatusOr<std::shared_ptr<const SplitSource>> OpenNpy(
    const v1::DataSpec& spec, bool train) {
  const std::string& dir = spec.dir();
  const std::string& glob = train ? spec.train() : spec.test();
  const char* split = train ? "train" : "test";
  std::map<std::string, std::vector<std::string>> columns;
  if (!glob.empty()) {
    ASSIGN_OR_RETURN(std::vector<std::string> files,
                     Expand(dir, glob, train ? "data.train" : "data.test"));
    for (const std::string& file : files) {
      const std::string base = file.substr(file.find_last_of('/') + 1);
      const std::string column = NpyColumnOf(base, "");
      if (column.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            file,
            " is not named <prefix>_<column>.npy or "
            "<prefix>_<column>-<shard>.npy: lockstep cannot tell which "
            "column it holds"));
      }
      columns[column].push_back(file);
    }
  } else {
    ASSIGN_OR_RETURN(std::vector<std::string> names, ListFolder(dir));
    for (const std::string& name : names) {
      const std::string column = NpyColumnOf(name, split);
      if (column.empty()) continue;
      ASSIGN_OR_RETURN(std::string path,
                       InsideDataDir(absl::StrCat(dir, "/", name), dir));
      columns[column].push_back(path);
    }
  }
  if (columns.empty()) {
    return absl::NotFoundError(absl::StrCat(
        "data.dir ", dir, " holds no ", split, "_<column>.npy files (e.g. ",
        split, "_image.npy and ", split, "_label.npy, or shards such as ",
        split,
        "_image-00000.npy); data.format \"npy\" needs one array per column"));
  }
  std::string description = absl::StrCat("npy files in ", dir, " (");
  for (const auto& [name, files] : columns) {
    absl::StrAppend(
        &description, description.back() == '(' ? "" : ", ", name,
        files.size() > 1 ? absl::StrCat(": ", files.size(), " shards") : "");
  }
  description += ")";
  // The test split is read in order; a training split in a permutation
  // unless shuffled by blocks.
  const bool random = train && spec.shuffle() != "blocks";
  return OpenNpyColumns(columns, description, random);
}

absl::StatusOr<std::shared_ptr<const SplitSource>> OpenTokens(
    const v1::DataSpec& spec, bool train) {
  const Dtype dtype =
      spec.token_dtype() == "uint32" ? Dtype::kUInt32 : Dtype::kUInt16;
  const bool random = train && spec.shuffle() != "blocks";
  const bool random_offset = train && spec.window_offset() == "random";
  TokenStream stream;
  stream.concatenate = spec.concatenate();
  if (spec.has_separator_token()) {
    stream.separator = static_cast<uint32_t>(spec.separator_token());
  }
  const std::string& glob = train ? spec.train() : spec.test();
  if (!glob.empty()) {
    ASSIGN_OR_RETURN(
        std::vector<std::string> files,
        Expand(spec.dir(), glob, train ? "data.train" : "data.test"));
    return OpenTokenFiles(files, dtype, spec.block_size(), spec.window_stride(),
                          random_offset, random, stream);
  }
  std::string path =
      absl::StrCat(spec.dir(), train ? "/train.bin" : "/val.bin");
  if (!train && access(path.c_str(), F_OK) != 0) {
    const std::string test = absl::StrCat(spec.dir(), "/test.bin");
    if (access(test.c_str(), F_OK) == 0) path = test;
  }
  if (access(path.c_str(), F_OK) == 0) {
    ASSIGN_OR_RETURN(path, InsideDataDir(path, spec.dir()));
  }
  auto source =
      OpenTokenFiles({path}, dtype, spec.block_size(), spec.window_stride(),
                     random_offset, random, stream);
  if (absl::IsNotFound(source.status())) {
    return absl::NotFoundError(absl::StrCat(
        source.status().message(),
        "; data.format \"tokens\" reads train.bin and val.bin (or test.bin) "
        "from data.dir, flat arrays of ",
        spec.token_dtype(),
        " token ids, or the files data.train and data.test match"));
  }
  return source;
}

absl::Mutex index_cache_mu(absl::kConstInit);
std::string* index_cache ABSL_GUARDED_BY(index_cache_mu) = nullptr;

std::string IndexCacheDir() {
  absl::MutexLock lock(&index_cache_mu);
  return index_cache != nullptr ? *index_cache : "";
}

std::atomic<int> data_threads{0};

}  // namespace

void SetDataThreads(int threads) { data_threads = std::max(1, threads); }

int DataThreads() {
  const int set = data_threads.load();
  if (set > 0) return set;
  return static_cast<int>(
      std::clamp<unsigned>(std::thread::hardware_concurrency(), 1, 4));
}

void SetIndexCacheDir(std::string dir) {
  absl::MutexLock lock(&index_cache_mu);
  delete index_cache;
  index_cache = new std::string(std::move(dir));
}

std::shared_ptr<const SplitSource> ImagesInMemory(ImageDataset data,
                                                  const std::string& dir) {
  return std::make_shared<MemoryImages>(std::move(data), dir);
}

absl::StatusOr<std::shared_ptr<const SplitSource>> OpenSplit(
    const v1::DataSpec& spec, bool train) {
  const std::string& format = spec.format();
  if (format == "npy") return OpenNpy(spec, train);
  if (format == "tokens") return OpenTokens(spec, train);
  if (format == "csv") {
    std::string glob = train ? spec.train() : spec.test();
    if (glob.empty()) glob = train ? "train.csv" : "test.csv";
    ASSIGN_OR_RETURN(
        std::vector<std::string> files,
        Expand(spec.dir(), glob, train ? "data.train" : "data.test"));
    const bool random = train && spec.shuffle() != "blocks";
    // Class names are numbered by the training split's, on both splits.
    std::vector<std::string> train_files = files;
    if (!train) {
      const std::string train_glob =
          spec.train().empty() ? "train.csv" : spec.train();
      ASSIGN_OR_RETURN(train_files,
                       Expand(spec.dir(), train_glob, "data.train"));
    }
    return OpenCsvFiles(files, spec, random, IndexCacheDir(), train_files);
  }
  if (format == "tfrecord") {
    const std::string& glob = train ? spec.train() : spec.test();
    ASSIGN_OR_RETURN(
        std::vector<std::string> files,
        Expand(spec.dir(), glob, train ? "data.train" : "data.test"));
    return OpenTfRecordFiles(files, spec, IndexCacheDir(), train,
                             DataThreads());
  }
  ASSIGN_OR_RETURN(ImageDataset images, LoadFashionMnist(spec.dir(), train));
  return ImagesInMemory(std::move(images), spec.dir());
}

}  // namespace lockstep::worker
