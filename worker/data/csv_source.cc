// CSV files as a split (sources.h): each file converted once into a column
// store of .npy arrays, found again by the file's size, modification time
// and the job's column groups, and memory-mapped like npy shards.
#include <sys/stat.h>
#include <unistd.h>

#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/files.h"
#include "common/log.h"
#include "common/sha256.h"
#include "common/status_macros.h"
#include "worker/data/csv.h"
#include "worker/data/mapped_file.h"
#include "worker/data/npy.h"
#include "worker/data/sources.h"

namespace lockstep::worker {
namespace {

// Bumped when the store's layout changes: older stores are not reused.
constexpr char kStoreVersion[] = "lockstep-csv-store-1";

// The job's column groups, sorted by name (a protobuf map has no order).
absl::StatusOr<std::vector<CsvGroup>> GroupsOf(const v1::DataSpec& spec) {
  std::map<std::string, CsvGroup> sorted;
  for (const auto& [name, list] : spec.columns()) {
    CsvGroup group;
    group.name = name;
    for (const google::protobuf::Value& value : list.values()) {
      group.columns.push_back(value.string_value());
    }
    auto declared = spec.features().find(name);
    if (declared != spec.features().end() &&
        !declared->second.dtype().empty()) {
      std::optional<Dtype> dtype = DtypeFromName(declared->second.dtype());
      if (!dtype.has_value() ||
          (*dtype != Dtype::kFloat32 && *dtype != Dtype::kFloat64 &&
           *dtype != Dtype::kInt64)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "data.features[\"", name, "\"].dtype is \"",
            declared->second.dtype(),
            "\"; a CSV column is stored as float32, float64 or int64"));
      }
      group.dtype_given = true;
      group.dtype = *dtype;
    }
    sorted[name] = std::move(group);
  }
  std::vector<CsvGroup> groups;
  for (auto& [name, group] : sorted) groups.push_back(std::move(group));
  return groups;
}

// The store of one CSV file: one .npy per group, in the folder chosen.
struct Store {
  std::string csv;
  std::unique_ptr<MappedFile> text;
  std::string key;  // of the file's identity and the groups
  std::vector<std::string> paths;
  std::vector<Dtype> stored;  // per group, when the store exists
  bool exists = false;
};

absl::StatusOr<std::string> KeyOf(const MappedFile& file,
                                  const std::vector<CsvGroup>& groups) {
  struct stat st {};
  stat(file.path().c_str(), &st);
  Sha256 hash;
  hash.Update(absl::StrCat(kStoreVersion, "\n", file.size(), "\n",
                           file.mtime_ns(), "\n", st.st_ino, "\n"));
  for (const CsvGroup& group : groups) {
    hash.Update(absl::StrCat(group.name, "=", group.columns.size(), ":"));
    for (const std::string& column : group.columns) {
      hash.Update(absl::StrCat(column.size(), ":", column));
    }
    hash.Update(group.dtype_given ? DtypeName(group.dtype) : "auto");
    hash.Update("\n");
  }
  ASSIGN_OR_RETURN(std::string digest, hash.HexDigest());
  return digest.substr(0, 16);
}

std::vector<std::string> StorePaths(const std::string& folder,
                                    const std::string& csv,
                                    const std::string& key, size_t groups) {
  const std::string base = csv.substr(csv.find_last_of('/') + 1);
  std::vector<std::string> paths;
  for (size_t g = 0; g < groups; ++g) {
    paths.push_back(
        absl::StrCat(folder, "/", base, ".lockstep-csv-", key, "-", g, ".npy"));
  }
  return paths;
}

// Whether every array of a store is there; their dtypes into `stored`.
bool ReadStore(const std::vector<std::string>& paths,
               std::vector<Dtype>* stored) {
  stored->clear();
  for (const std::string& path : paths) {
    // Only a file lockstep wrote: a link in its place is not followed.
    struct stat st {};
    if (lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return false;
    auto file = MappedFile::Open(path);
    if (!file.ok()) return false;
    auto header = ParseNpyHeader((*file)->bytes(), path);
    if (!header.ok()) return false;
    auto data =
        NpyDataBytes(*header, (*file)->size() - header->data_offset, path);
    std::optional<Dtype> dtype = DtypeFromNumpy(header->dtype);
    if (!data.ok() || !dtype.has_value()) return false;
    stored->push_back(*dtype);
  }
  return true;
}

std::string FolderOf(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? "." : path.substr(0, slash);
}

bool Writable(const std::string& folder) {
  return access(folder.c_str(), W_OK | X_OK) == 0;
}

}  // namespace

absl::StatusOr<std::shared_ptr<const SplitSource>> OpenCsvFiles(
    const std::vector<std::string>& files, const v1::DataSpec& spec,
    bool random, const std::string& index_cache_dir) {
  ASSIGN_OR_RETURN(std::vector<CsvGroup> groups, GroupsOf(spec));
  std::vector<Store> stores;
  for (const std::string& csv : files) {
    Store store;
    store.csv = csv;
    ASSIGN_OR_RETURN(store.text, MappedFile::Open(csv));
    store.text->Advise(MappedFile::Access::kSequential);
    ASSIGN_OR_RETURN(store.key, KeyOf(*store.text, groups));
    // Beside the file, else in --index-cache: whichever holds it already.
    std::vector<std::string> folders = {FolderOf(csv)};
    if (!index_cache_dir.empty()) folders.push_back(index_cache_dir);
    for (const std::string& folder : folders) {
      std::vector<std::string> paths =
          StorePaths(folder, csv, store.key, groups.size());
      if (ReadStore(paths, &store.stored)) {
        store.paths = std::move(paths);
        store.exists = true;
        break;
      }
    }
    stores.push_back(std::move(store));
  }
  // A group not given a dtype is int64 only when every cell of every file
  // is whole: the files read now say so, and so do the stores built before.
  std::vector<bool> whole(groups.size(), true);
  std::vector<CsvSummary> summaries(stores.size());
  for (size_t f = 0; f < stores.size(); ++f) {
    Store& store = stores[f];
    if (store.exists) {
      for (size_t g = 0; g < groups.size(); ++g) {
        if (store.stored[g] != Dtype::kInt64) whole[g] = false;
      }
      continue;
    }
    ASSIGN_OR_RETURN(summaries[f],
                     ScanCsv(store.text->bytes(), store.csv, groups));
    for (size_t g = 0; g < groups.size(); ++g) {
      if (!summaries[f].whole[g]) whole[g] = false;
    }
  }
  for (size_t g = 0; g < groups.size(); ++g) {
    if (!groups[g].dtype_given) {
      groups[g].dtype = whole[g] ? Dtype::kInt64 : Dtype::kFloat64;
    }
  }
  std::vector<std::string> temporary;  // removed once mapped
  std::map<std::string, std::vector<std::string>> columns;
  for (size_t f = 0; f < stores.size(); ++f) {
    Store& store = stores[f];
    bool current = store.exists;
    for (size_t g = 0; current && g < groups.size(); ++g) {
      current = store.stored[g] == groups[g].dtype;
    }
    if (!current) {
      if (store.exists && summaries[f].rows == 0) {
        // Stored as int64 before a file with fractions joined the split.
        ASSIGN_OR_RETURN(summaries[f],
                         ScanCsv(store.text->bytes(), store.csv, groups));
      }
      std::string folder = FolderOf(store.csv);
      bool keep = true;
      if (!Writable(folder)) {
        if (!index_cache_dir.empty() &&
            (MakeDirectories(index_cache_dir).ok() &&
             Writable(index_cache_dir))) {
          folder = index_cache_dir;
        } else {
          // Nowhere to keep it: a private copy, unlinked once mapped.
          const char* tmp = getenv("TMPDIR");
          folder = tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
          keep = false;
        }
      }
      std::string key = store.key;
      if (!keep) absl::StrAppend(&key, "-", getpid());
      store.paths = StorePaths(folder, store.csv, key, groups.size());
      RETURN_IF_ERROR(WriteCsvColumns(store.text->bytes(), store.csv, groups,
                                      summaries[f], store.paths));
      LogInfo("converted ", store.csv, " (", summaries[f].rows,
              " rows) into its column store ", folder, "/",
              store.csv.substr(store.csv.find_last_of('/') + 1),
              ".lockstep-csv-", key, "-*.npy");
      if (!keep) {
        temporary.insert(temporary.end(), store.paths.begin(),
                         store.paths.end());
      }
    }
    for (size_t g = 0; g < groups.size(); ++g) {
      columns[groups[g].name].push_back(store.paths[g]);
    }
  }
  const std::string description =
      absl::StrCat(files.size(), " CSV file", files.size() == 1 ? "" : "s",
                   " (first ", files.front(), ")");
  auto source = OpenNpyColumns(columns, description, random);
  for (const std::string& path : temporary) unlink(path.c_str());
  return source;
}

}  // namespace lockstep::worker
