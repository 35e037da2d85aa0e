// The formats' sources behind OpenSplit (split_source.h).
#ifndef LOCKSTEP_WORKER_DATA_SOURCES_H_
#define LOCKSTEP_WORKER_DATA_SOURCES_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/dtype.h"
#include "worker/data/idx.h"
#include "worker/data/split_source.h"

namespace lockstep::worker {

// Columns of .npy arrays: for each column name its files, in order; each
// file holds samples along its first axis. Every file is memory-mapped,
// and its header checked: a dtype lockstep reads, C order, the same
// per-sample shape and dtype across one column's shards, data as long as
// the shape says; every column the same number of samples.
// `random`: the samples will be read in a full permutation (data.shuffle
// "global"), so the files are mapped without readahead.
// `classes`: the class names of columns that hold class indices
// (ColumnInfo.classes).
absl::StatusOr<std::shared_ptr<const SplitSource>> OpenNpyColumns(
    const std::map<std::string, std::vector<std::string>>& files,
    const std::string& description, bool random = false,
    const std::map<std::string, std::vector<std::string>>& classes = {});

// How token files make one sequence (data.concatenate,
// data.separator_token): each file on its own (windows never cross from
// one file into the next: each file's tail past its last window, and a
// file shorter than a window, are never read), or concatenated in order
// into one stream, nanoGPT's and Megatron's way, with `separator` (an
// end-of-text id) between two files if set.
struct TokenStream {
  bool concatenate = false;
  std::optional<uint32_t> separator;
};

// What windows of block + 1 tokens every `stride` make of files of
// `file_tokens` tokens: the windows, and the tokens in none of them (the
// files' tails, whole files shorter than a window).
struct TokenCoverage {
  int64_t tokens = 0;
  int64_t windows = 0;
  int64_t unread = 0;
  int64_t short_files = 0;
  // "1234 windows; 310 of 79000 tokens (0.39%) in no window, 2 files
  // shorter than a window".
  std::string Text() const;
};
absl::StatusOr<TokenCoverage> CoverTokens(
    const std::vector<int64_t>& file_tokens, int64_t block, int64_t stride,
    bool random_offset, const TokenStream& stream = {});

// Token files (`dtype` uint16 or uint32; shards, in the order given) read
// as windows of block + 1 tokens starting every `stride` tokens: one column
// "tokens" [block + 1], arranged as `stream` says. `random_offset`: each
// epoch every window starts a further o tokens in, o in [0, stride) from
// the epoch key (ReadInEpoch), and a file (or the stream) holds the windows
// that fit at any o. Per file, a shard too short for one window holds none,
// and files losing more than 1% of their tokens that way are logged.
// Errors: a file whose size is not a whole number of tokens, a single file
// shorter than one window, or no window at all.
absl::StatusOr<std::shared_ptr<const SplitSource>> OpenTokenFiles(
    const std::vector<std::string>& paths, Dtype dtype, int64_t block,
    int64_t stride, bool random_offset, bool random = false,
    const TokenStream& stream = {});

// TFRecord files of tf.train.Example records, in order, with the columns
// spec.features declares (sorted by name). Each plain file is indexed once
// (LoadOrBuildTfRecordIndex: the index is kept beside the file, or in
// `index_cache_dir`) and read record by record; a GZIP file cannot be
// entered in the middle, so its samples are decoded once into memory.
// Encoded images decode on up to `threads` threads per read; `train`: the
// declared random augmentations apply (drawn from ReadInEpoch's key).
// With spec.skip_corrupt N, up to N unreadable records are skipped
// (SplitSource::skipped): a file whose framing or CRCs are damaged is
// salvaged (SalvageTfRecordIndex) and its damage left out of the split, a
// GZIP file's record that does not decode is left out, and a record that
// does not decode when it is read gives its place to the next one of the
// split that does (index + 1, + 2, ...: the same on every rank).
absl::StatusOr<std::shared_ptr<const SplitSource>> OpenTfRecordFiles(
    const std::vector<std::string>& files, const v1::DataSpec& spec,
    const std::string& index_cache_dir = "", bool train = false,
    int threads = 1);

// CSV files (a header row, then numbers) with the columns data.columns
// groups: each file is converted once into a column store of .npy arrays
// beside it (or in `index_cache_dir` when its folder is read-only; else a
// private copy), found again while the file keeps its size and
// modification time, and mapped like npy shards. Errors name the file,
// line and column of a cell that is not a number.
// A group of class names (data.features[name].class_names) is stored as
// indices into its `classes`, or, without them, into the sorted distinct
// names of `train_files` (the training split's files: the same list for
// both splits), and its column carries the names (ColumnInfo.classes).
absl::StatusOr<std::shared_ptr<const SplitSource>> OpenCsvFiles(
    const std::vector<std::string>& files, const v1::DataSpec& spec,
    bool random, const std::string& index_cache_dir = "",
    const std::vector<std::string>& train_files = {});

// A decoded IDX image data set: columns "image" (uint8 [1, H, W]) and
// "label" (uint8 []).
std::shared_ptr<const SplitSource> ImagesInMemory(ImageDataset data,
                                                  const std::string& dir);

}  // namespace lockstep::worker

#endif  // LOCKSTEP_WORKER_DATA_SOURCES_H_
