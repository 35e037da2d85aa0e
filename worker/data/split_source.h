// One split (training or test) of a data set as named columns (docs/DESIGN.md
// §4, "Data"): each column has a dtype and a per-sample shape, and any
// sample of any column can be read directly. The formats open as sources:
// idx (decoded into memory: Fashion-MNIST is small), npy (memory-mapped
// arrays, one per column or many shards), tokens (a memory-mapped token
// file read as windows) and tfrecord (records found through an index).
//
// Sources are immutable once opened: Read is thread-safe.
#ifndef LOCKSTEP_WORKER_DATA_SPLIT_SOURCE_H_
#define LOCKSTEP_WORKER_DATA_SPLIT_SOURCE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "common/dtype.h"
#include "lockstep/v1/job.pb.h"

namespace lockstep::worker {

class SkipLog;

struct ColumnInfo {
  std::string name;
  Dtype dtype = Dtype::kUInt8;
  std::vector<int64_t> shape;  // per sample; [] for a scalar
  // A column of class indices whose data names the classes (a CSV column of
  // class names): the names, by index.
  std::vector<std::string> classes;

  int64_t elements() const;
  int64_t sample_bytes() const { return elements() * DtypeSize(dtype); }
  std::string ShapeText() const;  // "[28, 28]"
};

class SplitSource {
 public:
  virtual ~SplitSource() = default;

  int64_t size() const { return size_; }
  const std::vector<ColumnInfo>& columns() const { return columns_; }
  // The index of the column named `name`, or -1.
  int Find(const std::string& name) const;
  // What the split is made of, for messages: "npy files in /data (7 shards
  // of train_image)".
  const std::string& description() const { return description_; }

  // Copies the samples `indices` (each < size()) of each column in
  // `columns`, raw little-endian elements of its dtype, one sample after
  // another, into the matching `out` (indices.size() x sample_bytes bytes
  // each). Errors (a corrupt record) name the file and the position.
  virtual absl::Status Read(absl::Span<const int> columns,
                            absl::Span<const int64_t> indices,
                            absl::Span<char* const> out) const = 0;
  // The same in the epoch whose key is `epoch_key` (GlobalSampler::EpochKey):
  // a source whose samples move from epoch to epoch (token windows at a
  // random offset) reads that epoch's; the others ignore the key.
  virtual absl::Status ReadInEpoch(uint64_t epoch_key,
                                   absl::Span<const int> columns,
                                   absl::Span<const int64_t> indices,
                                   absl::Span<char* const> out) const {
    (void)epoch_key;
    return Read(columns, indices, out);
  }
  virtual bool VariesByEpoch() const { return false; }
  // The records this split skipped (data.skip_corrupt), or null when it
  // skips none (strict, or a format that does not).
  virtual const SkipLog* skipped() const { return nullptr; }
  // One column.
  absl::Status ReadColumn(int column, absl::Span<const int64_t> indices,
                          char* out) const {
    return Read({column}, indices, {out});
  }

  // The largest value of column `column` (as an integer) over every
  // sample: one pass over the split, remembered (a language model's
  // vocabulary; each generation asks again). Errors: Read's.
  absl::StatusOr<int64_t> LargestValue(int column) const;

 protected:
  // LargestValue's pass, not remembered: every sample read whole; a source
  // that can read each element once (overlapping token windows) overrides.
  virtual absl::StatusOr<int64_t> ScanLargest(int column) const;

  int64_t size_ = 0;
  std::vector<ColumnInfo> columns_;
  std::string description_;

 private:
  mutable absl::Mutex largest_mu_;
  mutable std::map<int, int64_t> largest_ ABSL_GUARDED_BY(largest_mu_);
};

// Opens split `train` (true) or test of the data set `spec` describes:
// data.format, data.dir, data.train/test globs (relative to data.dir;
// the files they match must resolve inside it), data.features, the token
// settings. The caller checked data.dir against the worker's data roots.
// Errors name the folder or file and what is wrong with it.
absl::StatusOr<std::shared_ptr<const SplitSource>> OpenSplit(
    const v1::DataSpec& spec, bool train);

// Where OpenSplit keeps a TFRecord file's record index when the file's own
// folder is not writable (empty: nowhere; it is rebuilt by every reader).
// Process-wide; the worker sets it once from --index-cache. Thread-safe.
void SetIndexCacheDir(std::string dir);

// How many threads decode one batch's encoded images (--data-threads);
// process-wide, set once by the worker. Default: 4, or fewer cores.
void SetDataThreads(int threads);
int DataThreads();

}  // namespace lockstep::worker

#endif  // LOCKSTEP_WORKER_DATA_SPLIT_SOURCE_H_
