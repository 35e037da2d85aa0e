// TFRecord files, as tf.io.TFRecordWriter writes them, plain or
// GZIP-compressed, read without TensorFlow. Each record is framed as
//
//   uint64  length                    little-endian
//   uint32  masked CRC-32C of the 8 length bytes
//   byte    data[length]
//   uint32  masked CRC-32C of data
//
// where masked(crc) = ((crc >> 15) | (crc << 17)) + 0xa282ead8 (mod 2^32).
// Every byte of a file is untrusted: both CRCs of every record are checked,
// a length is bounded (TfRecordOptions::max_record_bytes, and never more than
// the bytes left in a plain file), and memory grows only with the bytes
// actually there. A corrupt, truncated or oversized record is an error that
// names the file, the record's index and its byte offset:
//
//   DataLoss         a CRC mismatch, a record cut short, a corrupt gzip stream
//   InvalidArgument  a record longer than max_record_bytes
//   NotFound         the file is missing
//
// Random access goes through a TfRecordIndex: the offset and length of every
// record, found by one pass over the file and saved beside it (or in a cache
// folder) for the next reader. Plain files are then read with one pread per
// record. A GZIP file cannot be entered in the middle: its index holds offsets
// in the uncompressed stream, and reading record i decompresses everything
// before it, so TfRecordStream (sequential) is the way to read one; see
// ReadRecord.
#ifndef LOCKSTEP_WORKER_DATA_TFRECORD_H_
#define LOCKSTEP_WORKER_DATA_TFRECORD_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace lockstep::worker {

namespace tfrecord_internal {
class Source;
}  // namespace tfrecord_internal

// ---- CRC-32C (Castagnoli, reflected polynomial 0x82F63B78) ----------------

// The CRC-32C of `data` continued from `crc` (the CRC of what came before;
// 0 to start): Crc32cExtend(Crc32c(a), b) == Crc32c(a + b).
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t size);
// The same without the CPU's CRC32 instruction (tables), for CPUs without
// SSE 4.2 and to test one against the other.
uint32_t Crc32cExtendPortable(uint32_t crc, const void* data, size_t size);
inline uint32_t Crc32c(absl::string_view data) {
  return Crc32cExtend(0, data.data(), data.size());
}

// TFRecord's masking of a stored CRC (a CRC of data that embeds CRCs is
// weak; the rotation and offset make it strong again).
inline uint32_t MaskCrc32c(uint32_t crc) {
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}
inline uint32_t UnmaskCrc32c(uint32_t masked) {
  uint32_t rotated = masked - 0xa282ead8u;
  return (rotated >> 17) | (rotated << 15);
}

// ---- Format ----------------------------------------------------------------

// Bytes of framing around each record's data: length, its CRC, data CRC.
inline constexpr uint64_t kTfRecordOverhead = 16;
// The default bound on one record's data.
inline constexpr uint64_t kMaxTfRecordBytes = uint64_t{256} << 20;

enum class TfRecordCompression { kNone = 0, kGzip = 1 };

struct TfRecordOptions {
  // A record with more data is refused (InvalidArgument).
  uint64_t max_record_bytes = kMaxTfRecordBytes;
};

// The framed bytes of one record holding `data`.
std::string EncodeTfRecord(absl::string_view data);

// Writes `records` to `path` as a TFRecord file, GZIP-compressed or not,
// atomically (common/files.h WriteFileAtomically). For tests and tools; it
// holds the whole file in memory.
absl::Status WriteTfRecordFile(const std::string& path,
                               const std::vector<std::string>& records,
                               TfRecordCompression compression);

// ---- Sequential reading
// ------------------------------------------------------

// Reads the records of one file in order, plain or GZIP: a file is GZIP when
// it starts with the gzip magic 1f 8b or its name ends in ".gz", unless its
// first 12 bytes are a TFRecord length with a matching CRC (a plain file
// whose first length happens to begin 1f 8b). Memory: one record, plus a
// 256 KiB buffer (and zlib's 32 KiB window). Like every reader here it opens
// regular files only and does not follow a symbolic link (common/files.h
// OpenRegularFile): give it the path ResolvePath (common/path_policy.h)
// resolved. Not thread-safe; one stream per thread.
class TfRecordStream {
 public:
  static absl::StatusOr<std::unique_ptr<TfRecordStream>> Open(
      const std::string& path, const TfRecordOptions& options = {});
  ~TfRecordStream();
  TfRecordStream(const TfRecordStream&) = delete;
  TfRecordStream& operator=(const TfRecordStream&) = delete;

  // The next record's data into `*record` (nullptr: checked, then dropped);
  // false at the clean end of the file. After an error the stream is done:
  // every later call returns the same error.
  absl::StatusOr<bool> Next(std::string* record);

  // The index of the record Next reads next, and its offset in the
  // (uncompressed) stream.
  int64_t next_index() const { return next_index_; }
  uint64_t offset() const { return offset_; }
  TfRecordCompression compression() const;
  const std::string& path() const { return path_; }
  // The file's size and modification time when it was opened.
  int64_t file_size() const { return file_size_; }
  int64_t mtime_ns() const { return mtime_ns_; }

 private:
  TfRecordStream(std::string path, TfRecordOptions options,
                 std::unique_ptr<tfrecord_internal::Source> source,
                 int64_t file_size, int64_t mtime_ns);
  // Up to `size` bytes of the stream; fewer only at its end.
  absl::StatusOr<size_t> ReadUpTo(char* out, size_t size);
  // `length` bytes of data into `*record` (or skimmed), and their CRC-32C.
  absl::Status ReadData(uint64_t length, std::string* record, uint32_t* crc);
  // Makes `what` the sticky error, naming the file, record and offset.
  absl::Status Fail(absl::StatusCode code, absl::string_view what);

  // Constant after construction.
  const std::string path_;
  const TfRecordOptions options_;
  const int64_t file_size_;
  const int64_t mtime_ns_;

  std::unique_ptr<tfrecord_internal::Source> source_;
  std::vector<char> buffer_;  // read ahead of the framing
  size_t buffer_begin_ = 0;
  size_t buffer_end_ = 0;
  int64_t next_index_ = 0;
  uint64_t offset_ = 0;
  absl::Status sticky_;  // the first error, or OK
  bool done_ = false;
};

// ---- The index
// ---------------------------------------------------------------

// Where each record of one file is. For a plain file, record i's framing
// starts at byte offsets[i] of the file; for a GZIP file, at byte offsets[i]
// of the uncompressed stream. The data file's size and mtime say which
// version of the file it describes.
struct TfRecordIndex {
  std::string path;  // the data file
  TfRecordCompression compression = TfRecordCompression::kNone;
  int64_t file_size = 0;     // bytes of the data file as stored
  int64_t mtime_ns = 0;      // its modification time, nanoseconds since 1970
  uint64_t stream_size = 0;  // bytes of TFRecord framing (uncompressed)
  std::vector<uint64_t> offsets;
  std::vector<uint64_t> lengths;  // data bytes of each record

  int64_t size() const { return static_cast<int64_t>(offsets.size()); }
};

// One pass over `path`: every record's framing and CRCs checked, its offset
// and length noted. The file must not change meanwhile (FailedPrecondition
// if its size or mtime did).
absl::StatusOr<TfRecordIndex> BuildTfRecordIndex(
    const std::string& path, const TfRecordOptions& options = {});

// A stretch of a plain file where no record can be read: one record whose
// data CRC does not match (or whose length is over the bound), or the bytes
// from damaged framing (a length whose CRC does not match, a length past
// the end of the file, a file cut short) to the next record that reads.
struct TfRecordDamage {
  int64_t record = 0;   // the records (readable or not) before it
  uint64_t offset = 0;  // its first byte
  uint64_t bytes = 0;
  std::string reason;
};

// BuildTfRecordIndex for data that may be damaged (data.skip_corrupt): the
// records of a plain file that read, in order, with `*damage` saying what
// lies between them. After damaged framing the next record is searched for
// byte by byte: a 12-byte header whose length CRC matches, then a data CRC
// that matches too. GZIP files are refused (FailedPrecondition): after
// damage in a compressed stream nothing can be found again.
absl::StatusOr<TfRecordIndex> SalvageTfRecordIndex(
    const std::string& path, const TfRecordOptions& options,
    std::vector<TfRecordDamage>* damage);

// The saved form: "LSTFRIDX", version, the data file's compression, size,
// mtime and stream size, the record count and each length (the offsets
// follow from them), then a CRC-32C of all before it; little-endian.
std::string SerializeTfRecordIndex(const TfRecordIndex& index);
// Parses a saved index, every byte untrusted (`origin` names it in errors):
// exact size, version, checksum, every length within `options`, and the
// lengths' framing summing to the stream size. `path` is left empty.
absl::StatusOr<TfRecordIndex> ParseTfRecordIndex(
    absl::string_view bytes, const std::string& origin,
    const TfRecordOptions& options = {});

// Where LoadOrBuildTfRecordIndex keeps the index of `path`: beside it,
// "<path>.lockstep-index" (a glob over data files must not match these), or
// in `cache_dir` under a name made from the path's SHA-256 (Internal when
// that fails).
std::string TfRecordIndexPathBeside(const std::string& path);
absl::StatusOr<std::string> TfRecordIndexPathInCache(
    const std::string& cache_dir, const std::string& path);

struct TfRecordIndexOptions {
  TfRecordOptions record;
  // Where the index goes when the data's folder is not writable. Empty: it
  // is then not saved (and rebuilt by every reader).
  std::string cache_dir;
  // A plain file that fails the index's checks is salvaged
  // (SalvageTfRecordIndex) instead of failing; its index is not saved.
  bool salvage = false;
};

// What LoadOrBuildTfRecordIndex did.
struct TfRecordIndexReport {
  bool reused = false;         // a saved index matched the file
  std::string index_path;      // where it was read or saved; empty: not saved
  std::string rebuild_reason;  // why a saved index was not used, if one was
  absl::Status save_status;    // why it could not be saved, if it was not
  std::vector<TfRecordDamage> damage;  // what salvaging found
};

// The index of `path`: a saved one (beside the file, then in the cache
// folder) when it parses and records the file's current size and mtime;
// otherwise built (BuildTfRecordIndex) and saved atomically beside the file,
// or in the cache folder when that fails; with `options.salvage`, a file
// that fails to build is salvaged and its index kept in memory only. A saved
// index that is corrupt or stale is rebuilt, never an error; failing to save is
// not an error either
// (`report->save_status` says why). Errors: BuildTfRecordIndex's. A file
// rewritten to the same size within its filesystem's mtime granularity is
// not noticed here; reading it fails the index or CRC checks instead.
absl::StatusOr<TfRecordIndex> LoadOrBuildTfRecordIndex(
    const std::string& path, const TfRecordIndexOptions& options = {},
    TfRecordIndexReport* report = nullptr);

// ---- Random access
// -----------------------------------------------------------

// Record `i` of `index`'s file, its framing and both CRCs checked, and its
// length and position checked against the index. A plain file: one open and
// one pread. A GZIP file: decompresses the stream up to and through record i
// (cost proportional to offsets[i]); read GZIP files with TfRecordStream.
// Errors: OutOfRange for i outside [0, size); FailedPrecondition when the
// file's size or mtime differ from the index's (rebuild it); DataLoss and
// InvalidArgument as above.
absl::StatusOr<std::string> ReadRecord(const TfRecordIndex& index, int64_t i,
                                       const TfRecordOptions& options = {});

// Random access to a plain file's records through one open descriptor.
// Open checks the file still has the index's size and mtime. Read is const
// and thread-safe (pread). GZIP files are refused (FailedPrecondition; use
// TfRecordStream).
class TfRecordFile {
 public:
  static absl::StatusOr<std::unique_ptr<TfRecordFile>> Open(
      TfRecordIndex index, const TfRecordOptions& options = {});
  ~TfRecordFile();
  TfRecordFile(const TfRecordFile&) = delete;
  TfRecordFile& operator=(const TfRecordFile&) = delete;

  // Record i's data; errors as ReadRecord's.
  absl::StatusOr<std::string> Read(int64_t i) const;
  const TfRecordIndex& index() const { return index_; }

 private:
  TfRecordFile(TfRecordIndex index, TfRecordOptions options, int fd);

  // Constant after construction.
  const TfRecordIndex index_;
  const TfRecordOptions options_;
  const int fd_;
};

}  // namespace lockstep::worker

#endif  // LOCKSTEP_WORKER_DATA_TFRECORD_H_
