// CSV files as a split (sources.h): each file converted once into a column
// store of .npy arrays, found again by the file's size, modification time,
// the job's column groups and their dtypes, and memory-mapped like npy
// shards. A group's inferred dtype depends on the files' cells only.
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
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
constexpr char kStoreVersion[] = "lockstep-csv-store-2";

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
    if (declared != spec.features().end() && declared->second.class_names()) {
      if (group.columns.size() != 1) {
        return absl::InvalidArgumentError(
            absl::StrCat("data.features[\"", name,
                         "\"].class_names is for a group of one "
                         "column (a label), not of ",
                         group.columns.size()));
      }
      group.class_names = true;
      group.dtype_given = true;
      group.dtype = Dtype::kInt64;
      group.classes.assign(declared->second.classes().begin(),
                           declared->second.classes().end());
    }
    if (declared != spec.features().end() &&
        declared->second.has_fill_missing()) {
      group.fill = declared->second.fill_missing();
    }
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

// The store of one CSV file: one .npy per group and dtype, and what the
// file holds (its rows, and per group whether every cell is whole), in the
// folder chosen.
struct Store {
  std::string csv;
  std::unique_ptr<MappedFile> text;
  std::string key;  // of the file's identity and the groups
  std::vector<std::string> paths;
  // The file's own summary: from its scan, or from the store's record of
  // an earlier scan (then rows and whole only).
  CsvSummary summary;
  bool scanned = false;  // summary is this open's scan
  bool known = false;    // summary is known at all
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
    if (group.class_names) hash.Update("names");
    if (group.fill.has_value()) {
      hash.Update(absl::StrCat("fill ", absl::StrFormat("%a", *group.fill)));
    }
    hash.Update("\n");
  }
  ASSIGN_OR_RETURN(std::string digest, hash.HexDigest());
  return digest.substr(0, 16);
}

std::string StoreBase(const std::string& folder, const std::string& csv,
                      const std::string& key) {
  const std::string base = csv.substr(csv.find_last_of('/') + 1);
  return absl::StrCat(folder, "/", base, ".lockstep-csv-", key);
}

// FILE.lockstep-csv-<key>-<g>-<dtype>.npy: a store per dtype, so that jobs
// that store a group differently never rewrite each other's arrays.
std::vector<std::string> StorePaths(const std::string& folder,
                                    const std::string& csv,
                                    const std::string& key,
                                    const std::vector<CsvGroup>& groups) {
  std::vector<std::string> paths;
  for (size_t g = 0; g < groups.size(); ++g) {
    std::string mapping;
    if (groups[g].class_names) {
      // Which names the indices stand for.
      Sha256 hash;
      for (const std::string& name : groups[g].classes) {
        hash.Update(absl::StrCat(name.size(), ":", name));
      }
      mapping = absl::StrCat("-c", hash.HexDigest().value_or("").substr(0, 12));
    }
    paths.push_back(absl::StrCat(StoreBase(folder, csv, key), "-", g, "-",
                                 DtypeName(groups[g].dtype), mapping, ".npy"));
  }
  return paths;
}

// FILE.lockstep-csv-<key>.summary: "rows N" and "whole 1 0 ..." (per
// group), so that the dtype of a split is inferred from every file's own
// cells without scanning files converted before.
std::string SummaryPath(const std::string& folder, const std::string& csv,
                        const std::string& key) {
  return StoreBase(folder, csv, key) + ".summary";
}

std::string SummaryText(const CsvSummary& summary) {
  std::string text =
      absl::StrCat(kStoreVersion, "\nrows ", summary.rows, "\nwhole");
  for (bool whole : summary.whole) absl::StrAppend(&text, whole ? " 1" : " 0");
  absl::StrAppend(&text, "\n");
  // Each class-name group's distinct names, one escaped name a line.
  for (size_t g = 0; g < summary.names.size(); ++g) {
    if (summary.names[g].empty()) continue;
    absl::StrAppend(&text, "names ", g, " ", summary.names[g].size(), "\n");
    for (const std::string& name : summary.names[g]) {
      absl::StrAppend(&text, absl::CEscape(name), "\n");
    }
  }
  return text;
}

// The summary a store recorded; false when there is none or it is not
// lockstep's (then the file is scanned again).
bool ReadSummary(const std::string& path, size_t groups, size_t name_groups,
                 CsvSummary* out) {
  struct stat st {};
  if (lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) return false;
  // Class names: at most kMaxCsvClassNames a group, escaped.
  auto text = ReadRegularFile(
      path, 4096 + 2 * int64_t(groups) +
                int64_t(name_groups) * int64_t{kMaxCsvClassNames} * 1100);
  if (!text.ok()) return false;
  std::vector<absl::string_view> lines =
      absl::StrSplit(*text, '\n', absl::SkipEmpty());
  if (lines.size() < 3 || lines[0] != kStoreVersion ||
      !absl::ConsumePrefix(&lines[1], "rows ") ||
      !absl::SimpleAtoi(lines[1], &out->rows) || out->rows <= 0 ||
      !absl::ConsumePrefix(&lines[2], "whole")) {
    return false;
  }
  out->whole.clear();
  for (absl::string_view flag :
       absl::StrSplit(lines[2], ' ', absl::SkipEmpty())) {
    if (flag != "0" && flag != "1") return false;
    out->whole.push_back(flag == "1");
  }
  out->names.assign(groups, {});
  for (size_t at = 3; at < lines.size();) {
    std::vector<absl::string_view> head = absl::StrSplit(lines[at], ' ');
    size_t g = 0, count = 0;
    if (head.size() != 3 || head[0] != "names" ||
        !absl::SimpleAtoi(head[1], &g) || !absl::SimpleAtoi(head[2], &count) ||
        g >= groups || count > kMaxCsvClassNames ||
        count > lines.size() - at - 1 || !out->names[g].empty()) {
      return false;
    }
    for (size_t i = 0; i < count; ++i) {
      std::string name;
      if (!absl::CUnescape(lines[at + 1 + i], &name)) return false;
      out->names[g].push_back(std::move(name));
    }
    at += 1 + count;
  }
  return out->whole.size() == groups;
}

// Whether every array of a store is there, of the dtypes `groups` say and
// `rows` long.
bool ReadStore(const std::vector<std::string>& paths,
               const std::vector<CsvGroup>& groups, int64_t rows) {
  for (size_t g = 0; g < paths.size(); ++g) {
    const std::string& path = paths[g];
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
    if (!data.ok() || dtype != groups[g].dtype || header->shape.empty() ||
        header->shape[0] != rows) {
      return false;
    }
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

// Where a store of `csv` is kept: beside it, else in --index-cache, else
// (`keep` false) a private folder, the files unlinked once mapped.
std::string StoreFolder(const std::string& csv,
                        const std::string& index_cache_dir, bool* keep) {
  *keep = true;
  const std::string folder = FolderOf(csv);
  if (Writable(folder)) return folder;
  if (!index_cache_dir.empty() && MakeDirectories(index_cache_dir).ok() &&
      Writable(index_cache_dir)) {
    return index_cache_dir;
  }
  *keep = false;
  const char* tmp = getenv("TMPDIR");
  return tmp != nullptr && *tmp != '\0' ? tmp : "/tmp";
}

// Where a store of `csv` may be already: beside it, else in --index-cache.
std::vector<std::string> StoreFolders(const std::string& csv,
                                      const std::string& index_cache_dir) {
  std::vector<std::string> folders = {FolderOf(csv)};
  if (!index_cache_dir.empty()) folders.push_back(index_cache_dir);
  return folders;
}

// What `csv` holds (its Store without paths): recorded by an earlier open,
// else scanned now and recorded beside it (or in `index_cache_dir`).
absl::StatusOr<Store> Summarize(const std::string& csv,
                                const std::vector<CsvGroup>& groups,
                                const std::string& index_cache_dir) {
  Store store;
  store.csv = csv;
  ASSIGN_OR_RETURN(store.text, MappedFile::Open(csv));
  store.text->Advise(MappedFile::Access::kSequential);
  ASSIGN_OR_RETURN(store.key, KeyOf(*store.text, groups));
  for (const std::string& folder : StoreFolders(csv, index_cache_dir)) {
    const size_t name_groups =
        std::count_if(groups.begin(), groups.end(),
                      [](const CsvGroup& group) { return group.class_names; });
    if (ReadSummary(SummaryPath(folder, csv, store.key), groups.size(),
                    name_groups, &store.summary)) {
      store.known = true;
      return store;
    }
  }
  ASSIGN_OR_RETURN(store.summary,
                   ScanCsv(store.text->bytes(), store.csv, groups));
  store.scanned = store.known = true;
  bool keep = false;
  const std::string folder = StoreFolder(csv, index_cache_dir, &keep);
  if (keep) {
    // Best effort: without it the next open scans the file again.
    (void)WriteFileAtomically(SummaryPath(folder, csv, store.key),
                              SummaryText(store.summary));
  }
  return store;
}

}  // namespace

absl::StatusOr<std::shared_ptr<const SplitSource>> OpenCsvFiles(
    const std::vector<std::string>& files, const v1::DataSpec& spec,
    bool random, const std::string& index_cache_dir,
    const std::vector<std::string>& train_files) {
  ASSIGN_OR_RETURN(std::vector<CsvGroup> groups, GroupsOf(spec));
  std::vector<Store> stores;
  for (const std::string& csv : files) {
    ASSIGN_OR_RETURN(Store store, Summarize(csv, groups, index_cache_dir));
    stores.push_back(std::move(store));
  }
  // Class names without a list: the training split's distinct names,
  // sorted, whichever split this is.
  for (size_t g = 0; g < groups.size(); ++g) {
    if (!groups[g].class_names || !groups[g].classes.empty()) continue;
    std::set<std::string> names;
    const std::vector<std::string>& from =
        train_files.empty() ? files : train_files;
    for (const std::string& csv : from) {
      auto same = std::find_if(stores.begin(), stores.end(),
                               [&](const Store& s) { return s.csv == csv; });
      std::optional<Store> other;
      if (same == stores.end()) {
        ASSIGN_OR_RETURN(other, Summarize(csv, groups, index_cache_dir));
      }
      const Store& store = same != stores.end() ? *same : *other;
      names.insert(store.summary.names[g].begin(),
                   store.summary.names[g].end());
      if (names.size() > kMaxCsvClassNames) {
        return absl::InvalidArgumentError(
            absl::StrCat("the training split's column '", groups[g].columns[0],
                         "' holds more than ", kMaxCsvClassNames,
                         " distinct class names: is it an id, not a label?"));
      }
    }
    groups[g].classes.assign(names.begin(), names.end());
  }
  // A group not given a dtype is int64 when every cell of every file of
  // the split is whole, else float64: a function of the files alone, never
  // of the stores other jobs left.
  for (size_t g = 0; g < groups.size(); ++g) {
    if (groups[g].dtype_given) continue;
    bool whole = true;
    for (const Store& store : stores) whole = whole && store.summary.whole[g];
    groups[g].dtype = whole ? Dtype::kInt64 : Dtype::kFloat64;
  }
  std::vector<std::string> temporary;  // removed once mapped
  std::map<std::string, std::vector<std::string>> columns;
  for (Store& store : stores) {
    bool found = false;
    for (const std::string& folder : StoreFolders(store.csv, index_cache_dir)) {
      std::vector<std::string> paths =
          StorePaths(folder, store.csv, store.key, groups);
      if (ReadStore(paths, groups, store.summary.rows)) {
        store.paths = std::move(paths);
        found = true;
        break;
      }
    }
    if (!found) {
      if (!store.scanned) {
        // Converted before in other dtypes: its cells are checked again
        // (a recorded summary is only a hint).
        ASSIGN_OR_RETURN(store.summary,
                         ScanCsv(store.text->bytes(), store.csv, groups));
        store.scanned = true;
        for (size_t g = 0; g < groups.size(); ++g) {
          if (groups[g].dtype == Dtype::kInt64 && !store.summary.whole[g]) {
            return absl::DataLossError(absl::StrCat(
                store.csv, " holds fractions in column group '", groups[g].name,
                "', which ",
                SummaryPath(FolderOf(store.csv), store.csv, store.key),
                " says are whole: remove its .lockstep-csv-* files and run "
                "again"));
          }
        }
      }
      bool keep = false;
      const std::string folder = StoreFolder(store.csv, index_cache_dir, &keep);
      std::string key = store.key;
      if (!keep) absl::StrAppend(&key, "-", getpid());
      store.paths = StorePaths(folder, store.csv, key, groups);
      RETURN_IF_ERROR(WriteCsvColumns(store.text->bytes(), store.csv, groups,
                                      store.summary, store.paths));
      LogInfo("converted ", store.csv, " (", store.summary.rows,
              " rows) into its column store ",
              StoreBase(folder, store.csv, key), "-*.npy");
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
  std::map<std::string, std::vector<std::string>> classes;
  for (const CsvGroup& group : groups) {
    if (group.class_names) classes[group.name] = group.classes;
  }
  auto source = OpenNpyColumns(columns, description, random, classes);
  for (const std::string& path : temporary) unlink(path.c_str());
  return source;
}

}  // namespace lockstep::worker
