// Reading TFRecord files plain and GZIP, in order or through an index
// (tfrecord.h). CRC-32C is in crc32c.cc, writing in tfrecord_write.cc, the
// index's saved form in tfrecord_index.cc.
#include "worker/data/tfrecord.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/files.h"
#include "common/status_macros.h"
#include "worker/data/tfrecord_internal.h"

namespace lockstep::worker {

namespace tfrecord_internal {

uint64_t LoadLe(const char* p, int bytes) {
  uint64_t value = 0;
  for (int i = bytes - 1; i >= 0; --i) {
    value = (value << 8) | static_cast<uint8_t>(p[i]);
  }
  return value;
}

std::string Hex8(uint64_t crc) {
  return absl::StrCat(absl::Hex(crc, absl::kZeroPad8));
}

bool LengthCrcMatches(const char* header) {
  return MaskCrc32c(Crc32cExtend(0, header, 8)) ==
         static_cast<uint32_t>(LoadLe(header + 8, 4));
}

absl::Status ErrnoStatus(absl::string_view what, const std::string& path) {
  return absl::DataLossError(
      absl::StrCat(what, " ", path, ": ", strerror(errno)));
}

absl::StatusOr<size_t> PreadFully(int fd, const std::string& path, char* out,
                                  size_t size, uint64_t offset) {
  size_t done = 0;
  while (done < size) {
    ssize_t n =
        pread(fd, out + done, size - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoStatus("cannot read", path);
    if (n == 0) break;
    done += static_cast<size_t>(n);
  }
  return done;
}

Fd::~Fd() {
  if (fd_ >= 0) close(fd_);
}

}  // namespace tfrecord_internal

using tfrecord_internal::ErrnoStatus;
using tfrecord_internal::Fd;
using tfrecord_internal::Hex8;
using tfrecord_internal::LengthCrcMatches;
using tfrecord_internal::LoadLe;
using tfrecord_internal::PreadFully;

// ---- Files
// -------------------------------------------------------------------

namespace {

constexpr size_t kBufferBytes = size_t{256} << 10;

// Size and modification time: which version of a file an index describes.
struct FileStamp {
  int64_t size = 0;
  int64_t mtime_ns = 0;
  bool operator==(const FileStamp& o) const {
    return size == o.size && mtime_ns == o.mtime_ns;
  }
};

FileStamp StampOf(const struct stat& st) {
  return {static_cast<int64_t>(st.st_size),
          static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 +
              st.st_mtim.tv_nsec};
}

absl::StatusOr<FileStamp> StampFd(int fd, const std::string& path) {
  struct stat st;
  if (fstat(fd, &st) != 0) return ErrnoStatus("cannot stat", path);
  return StampOf(st);
}

absl::StatusOr<TfRecordCompression> DetectCompression(int fd,
                                                      const std::string& path) {
  char head[12];
  ASSIGN_OR_RETURN(size_t got, PreadFully(fd, path, head, sizeof(head), 0));
  if (got == sizeof(head) && LengthCrcMatches(head)) {
    return TfRecordCompression::kNone;
  }
  const bool magic = got >= 2 && static_cast<uint8_t>(head[0]) == 0x1f &&
                     static_cast<uint8_t>(head[1]) == 0x8b;
  return magic || absl::EndsWith(path, ".gz") ? TfRecordCompression::kGzip
                                              : TfRecordCompression::kNone;
}

}  // namespace

// ---- Byte sources
// --------------------------------------------------------------

namespace tfrecord_internal {

// The bytes of the TFRecord stream: a file's, or what its gzip members
// inflate to. Errors carry no file name; the stream adds it.
class Source {
 public:
  // Takes `fd`, read from its current position, and closes it.
  explicit Source(int fd) : fd_(fd) {}
  virtual ~Source() { close(fd_); }
  Source(const Source&) = delete;
  Source& operator=(const Source&) = delete;
  virtual TfRecordCompression compression() const = 0;
  // Up to `size` bytes into `out`; 0 only at the end of the stream.
  virtual absl::StatusOr<size_t> Read(char* out, size_t size) = 0;

 protected:
  absl::StatusOr<size_t> ReadFd(char* out, size_t size) {
    while (true) {
      ssize_t n = read(fd_, out, size);
      if (n >= 0) return static_cast<size_t>(n);
      if (errno != EINTR) {
        return absl::DataLossError(
            absl::StrCat("read failed: ", strerror(errno)));
      }
    }
  }

 private:
  const int fd_;
};

namespace {

class PlainSource : public Source {
 public:
  using Source::Source;
  TfRecordCompression compression() const override {
    return TfRecordCompression::kNone;
  }
  absl::StatusOr<size_t> Read(char* out, size_t size) override {
    return ReadFd(out, size);
  }
};

// Inflates one or more concatenated gzip members (as gzip and gzread do).
// Each call inflates at most `size` bytes, so a small file that inflates to
// gigabytes costs no memory.
class GzipSource : public Source {
 public:
  explicit GzipSource(int fd) : Source(fd), input_(size_t{64} << 10) {}
  ~GzipSource() override {
    if (initialized_) inflateEnd(&zs_);
  }
  absl::Status Init() {
    if (inflateInit2(&zs_, 16 + MAX_WBITS) != Z_OK) {
      return absl::ResourceExhaustedError("zlib could not start inflating");
    }
    initialized_ = true;
    return absl::OkStatus();
  }
  TfRecordCompression compression() const override {
    return TfRecordCompression::kGzip;
  }
  absl::StatusOr<size_t> Read(char* out, size_t size) override;

 private:
  z_stream zs_{};
  bool initialized_ = false;
  std::vector<char> input_;
  bool in_member_ = false;  // inside a gzip member not yet ended
  int members_ = 0;         // members started
};

absl::StatusOr<size_t> GzipSource::Read(char* out, size_t size) {
  if (size == 0) return 0;
  const uInt want = static_cast<uInt>(
      std::min<size_t>(size, std::numeric_limits<uInt>::max()));
  zs_.next_out = reinterpret_cast<Bytef*>(out);
  zs_.avail_out = want;
  while (zs_.avail_out == want) {
    if (zs_.avail_in == 0) {
      ASSIGN_OR_RETURN(size_t n, ReadFd(input_.data(), input_.size()));
      if (n == 0) {
        if (in_member_) {
          return absl::DataLossError(
              "the gzip stream is cut short (truncated file)");
        }
        if (members_ == 0) {
          return absl::DataLossError("the file is empty; not a gzip stream");
        }
        return 0;
      }
      zs_.next_in = reinterpret_cast<Bytef*>(input_.data());
      zs_.avail_in = static_cast<uInt>(n);
    }
    if (!in_member_) {
      if (members_ > 0 && inflateReset(&zs_) != Z_OK) {
        return absl::InternalError("zlib could not restart inflating");
      }
      in_member_ = true;
      ++members_;
    }
    int rc = inflate(&zs_, Z_NO_FLUSH);
    if (rc == Z_STREAM_END) {
      in_member_ = false;
    } else if (rc == Z_BUF_ERROR && zs_.avail_in == 0) {
      continue;  // needs more input
    } else if (rc != Z_OK) {
      return absl::DataLossError(
          absl::StrCat("corrupt gzip stream",
                       members_ > 1 ? " (after its first member)" : "", ": ",
                       zs_.msg != nullptr ? zs_.msg : "zlib error"));
    }
  }
  return static_cast<size_t>(want - zs_.avail_out);
}

}  // namespace
}  // namespace tfrecord_internal

// ---- TfRecordStream
// ------------------------------------------------------------

absl::StatusOr<std::unique_ptr<TfRecordStream>> TfRecordStream::Open(
    const std::string& path, const TfRecordOptions& options) {
  int64_t size = 0;
  ASSIGN_OR_RETURN(int raw_fd, OpenRegularFile(path, &size));
  Fd fd(raw_fd);
  ASSIGN_OR_RETURN(FileStamp stamp, StampFd(fd.get(), path));
  ASSIGN_OR_RETURN(TfRecordCompression compression,
                   DetectCompression(fd.get(), path));
  std::unique_ptr<tfrecord_internal::Source> source;
  if (compression == TfRecordCompression::kGzip) {
    auto gzip = std::make_unique<tfrecord_internal::GzipSource>(fd.release());
    absl::Status started = gzip->Init();
    if (!started.ok()) {
      return absl::ResourceExhaustedError(
          absl::StrCat(path, ": ", started.message()));
    }
    source = std::move(gzip);
  } else {
    source = std::make_unique<tfrecord_internal::PlainSource>(fd.release());
  }
  return std::unique_ptr<TfRecordStream>(new TfRecordStream(
      path, options, std::move(source), stamp.size, stamp.mtime_ns));
}

TfRecordStream::TfRecordStream(
    std::string path, TfRecordOptions options,
    std::unique_ptr<tfrecord_internal::Source> source, int64_t file_size,
    int64_t mtime_ns)
    : path_(std::move(path)),
      options_(options),
      file_size_(file_size),
      mtime_ns_(mtime_ns),
      source_(std::move(source)),
      buffer_(kBufferBytes) {}

TfRecordStream::~TfRecordStream() = default;

TfRecordCompression TfRecordStream::compression() const {
  return source_->compression();
}

absl::Status TfRecordStream::Fail(absl::StatusCode code,
                                  absl::string_view what) {
  const bool gzip = compression() == TfRecordCompression::kGzip;
  sticky_ = absl::Status(
      code,
      absl::StrCat(path_, ": record ", next_index_, " at byte ", offset_,
                   gzip ? " of the uncompressed stream" : "", ": ", what));
  return sticky_;
}

absl::StatusOr<size_t> TfRecordStream::ReadUpTo(char* out, size_t size) {
  size_t got = 0;
  while (got < size) {
    if (buffer_begin_ == buffer_end_) {
      // Large reads go straight to the caller's memory.
      char* target = size - got >= buffer_.size() ? out + got : buffer_.data();
      size_t room = target == buffer_.data() ? buffer_.size() : size - got;
      auto n = source_->Read(target, room);
      if (!n.ok()) return Fail(n.status().code(), n.status().message());
      if (*n == 0) break;
      if (target != buffer_.data()) {
        got += *n;
        continue;
      }
      buffer_begin_ = 0;
      buffer_end_ = *n;
    }
    size_t take = std::min(size - got, buffer_end_ - buffer_begin_);
    std::memcpy(out + got, buffer_.data() + buffer_begin_, take);
    buffer_begin_ += take;
    got += take;
  }
  return got;
}

absl::Status TfRecordStream::ReadData(uint64_t length, std::string* record,
                                      uint32_t* crc) {
  std::vector<char> scratch;
  if (record == nullptr) scratch.resize(std::min<uint64_t>(length, 1 << 16));
  if (record != nullptr) record->clear();
  uint64_t got = 0;
  *crc = 0;
  while (got < length) {
    // A GZIP stream's length is unknown until inflated: memory grows with
    // the bytes that arrive, never with the promise alone.
    const size_t chunk = static_cast<size_t>(
        std::min<uint64_t>(length - got, record ? kBufferBytes : 1 << 16));
    char* target = scratch.data();
    if (record != nullptr) {
      record->resize(static_cast<size_t>(got) + chunk);
      target = record->data() + got;
    }
    ASSIGN_OR_RETURN(size_t n, ReadUpTo(target, chunk));
    *crc = Crc32cExtend(*crc, target, n);
    got += n;
    if (n < chunk) {
      return Fail(absl::StatusCode::kDataLoss,
                  absl::StrCat("truncated: it declares ", length,
                               " bytes of data, the file ends after ", got));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> TfRecordStream::Next(std::string* record) {
  if (!sticky_.ok()) return sticky_;
  if (done_) return false;
  char header[12];
  ASSIGN_OR_RETURN(size_t got, ReadUpTo(header, sizeof(header)));
  if (got == 0) {
    done_ = true;
    return false;
  }
  if (got < sizeof(header)) {
    return Fail(absl::StatusCode::kDataLoss,
                absl::StrCat("truncated: the file ends ", got,
                             " bytes into the 12-byte record header"));
  }
  const uint64_t length = LoadLe(header, 8);
  if (!LengthCrcMatches(header)) {
    return Fail(absl::StatusCode::kDataLoss,
                absl::StrCat("the CRC-32C of its length field does not match "
                             "(stored 0x",
                             Hex8(LoadLe(header + 8, 4)), ", computed 0x",
                             Hex8(MaskCrc32c(Crc32cExtend(0, header, 8))),
                             "); the file is corrupt or not a TFRecord file"));
  }
  if (length > options_.max_record_bytes) {
    return Fail(absl::StatusCode::kInvalidArgument,
                absl::StrCat("it declares ", length,
                             " bytes of data, more than the bound of ",
                             options_.max_record_bytes, " bytes"));
  }
  if (compression() == TfRecordCompression::kNone) {
    // Against the size at Open, before anything is allocated: a length
    // past the bytes left is a truncated file (or one still being written).
    const uint64_t end = offset_ + 12;
    const uint64_t size = static_cast<uint64_t>(file_size_);
    const uint64_t left = size > end ? size - end : 0;
    if (length > left || left - length < 4) {
      return Fail(absl::StatusCode::kDataLoss,
                  absl::StrCat("truncated: it declares ", length,
                               " bytes of data and a 4-byte CRC, the file has ",
                               left, " bytes left"));
    }
    if (record != nullptr) record->reserve(static_cast<size_t>(length));
  }
  uint32_t crc = 0;
  RETURN_IF_ERROR(ReadData(length, record, &crc));
  char trailer[4];
  ASSIGN_OR_RETURN(got, ReadUpTo(trailer, sizeof(trailer)));
  if (got < sizeof(trailer)) {
    return Fail(absl::StatusCode::kDataLoss,
                "truncated: the file ends inside the record's data CRC");
  }
  if (MaskCrc32c(crc) != static_cast<uint32_t>(LoadLe(trailer, 4))) {
    return Fail(absl::StatusCode::kDataLoss,
                absl::StrCat("the CRC-32C of its ", length,
                             " bytes of data does not match (stored 0x",
                             Hex8(LoadLe(trailer, 4)), ", computed 0x",
                             Hex8(MaskCrc32c(crc)), "); the file is corrupt"));
  }
  offset_ += kTfRecordOverhead + length;
  ++next_index_;
  return true;
}

// ---- The index ------------------------------------------------------------

absl::StatusOr<TfRecordIndex> BuildTfRecordIndex(
    const std::string& path, const TfRecordOptions& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<TfRecordStream> stream,
                   TfRecordStream::Open(path, options));
  TfRecordIndex index;
  index.path = path;
  index.compression = stream->compression();
  index.file_size = stream->file_size();
  index.mtime_ns = stream->mtime_ns();
  while (true) {
    const uint64_t offset = stream->offset();
    ASSIGN_OR_RETURN(bool more, stream->Next(nullptr));
    if (!more) break;
    index.offsets.push_back(offset);
    index.lengths.push_back(stream->offset() - offset - kTfRecordOverhead);
  }
  index.stream_size = stream->offset();
  RETURN_IF_ERROR(tfrecord_internal::CheckUnchangedSinceIndexed(index));
  return index;
}

namespace tfrecord_internal {

absl::Status CheckUnchangedSinceIndexed(const TfRecordIndex& index) {
  // The records are read through the descriptor; the path is what the next
  // reader opens, so it is the path's version that must not have moved.
  struct stat st;
  if (lstat(index.path.c_str(), &st) != 0) {
    return ErrnoStatus("cannot stat", index.path);
  }
  const FileStamp after = StampOf(st);
  if (!(after == FileStamp{index.file_size, index.mtime_ns})) {
    return absl::FailedPreconditionError(
        absl::StrCat(index.path, " changed while it was indexed (",
                     index.file_size, " bytes, mtime ", index.mtime_ns,
                     " ns, then ", after.size, " bytes, mtime ", after.mtime_ns,
                     " ns); index it again once it is complete"));
  }
  return absl::OkStatus();
}

}  // namespace tfrecord_internal

// ---- Random access
// ---------------------------------------------------------------

namespace {

absl::Status CheckStamp(int fd, const TfRecordIndex& index) {
  ASSIGN_OR_RETURN(FileStamp stamp, StampFd(fd, index.path));
  if (!(stamp == FileStamp{index.file_size, index.mtime_ns})) {
    return absl::FailedPreconditionError(absl::StrCat(
        index.path, " changed since it was indexed (", index.file_size,
        " bytes, mtime ", index.mtime_ns, " ns; now ", stamp.size,
        " bytes, mtime ", stamp.mtime_ns, " ns); rebuild its index"));
  }
  return absl::OkStatus();
}

absl::Status RecordError(absl::StatusCode code, const TfRecordIndex& index,
                         int64_t i, absl::string_view what) {
  return absl::Status(
      code, absl::StrCat(index.path, ": record ", i, " at byte ",
                         index.offsets[static_cast<size_t>(i)], ": ", what));
}

// Record i of a plain file: one pread of its framing and data, then the
// framing checked against the index and both CRCs.
absl::StatusOr<std::string> ReadPlainRecord(int fd, const TfRecordIndex& index,
                                            int64_t i,
                                            const TfRecordOptions& options) {
  const uint64_t offset = index.offsets[static_cast<size_t>(i)];
  const uint64_t length = index.lengths[static_cast<size_t>(i)];
  if (length > options.max_record_bytes) {
    return RecordError(
        absl::StatusCode::kInvalidArgument, index, i,
        absl::StrCat("its ", length, " bytes of data exceed the bound of ",
                     options.max_record_bytes, " bytes"));
  }
  // The file had index.file_size bytes when it was opened (CheckStamp):
  // nothing past them is allocated for.
  const uint64_t file_size = static_cast<uint64_t>(index.file_size);
  if (offset > file_size || file_size - offset < kTfRecordOverhead + length) {
    return RecordError(absl::StatusCode::kFailedPrecondition, index, i,
                       absl::StrCat("the index puts it past the file's ",
                                    file_size, " bytes; rebuild the index"));
  }
  std::string bytes(static_cast<size_t>(length + kTfRecordOverhead), '\0');
  ASSIGN_OR_RETURN(size_t got, PreadFully(fd, index.path, bytes.data(),
                                          bytes.size(), offset));
  if (got < bytes.size()) {
    return RecordError(
        absl::StatusCode::kDataLoss, index, i,
        absl::StrCat("truncated: the file ends ", got, " bytes into its ",
                     bytes.size(), " bytes; rebuild the index"));
  }
  if (!LengthCrcMatches(bytes.data())) {
    return RecordError(absl::StatusCode::kDataLoss, index, i,
                       "the CRC-32C of its length field does not match; the "
                       "file is corrupt");
  }
  if (LoadLe(bytes.data(), 8) != length) {
    return RecordError(
        absl::StatusCode::kFailedPrecondition, index, i,
        absl::StrCat("its length field says ", LoadLe(bytes.data(), 8),
                     ", the index ", length, "; rebuild the index"));
  }
  const uint32_t stored = static_cast<uint32_t>(
      LoadLe(bytes.data() + 12 + static_cast<size_t>(length), 4));
  const uint32_t computed = MaskCrc32c(
      Crc32cExtend(0, bytes.data() + 12, static_cast<size_t>(length)));
  if (stored != computed) {
    return RecordError(
        absl::StatusCode::kDataLoss, index, i,
        absl::StrCat("the CRC-32C of its ", length,
                     " bytes of data does not match (stored 0x", Hex8(stored),
                     ", computed 0x", Hex8(computed),
                     "); the file is "
                     "corrupt"));
  }
  bytes.erase(0, 12);
  bytes.resize(static_cast<size_t>(length));
  return bytes;
}

// Record i of a GZIP file: every record before it inflated and checked.
absl::StatusOr<std::string> ReadGzipRecord(const TfRecordIndex& index,
                                           int64_t i,
                                           const TfRecordOptions& options) {
  ASSIGN_OR_RETURN(std::unique_ptr<TfRecordStream> stream,
                   TfRecordStream::Open(index.path, options));
  if (!(FileStamp{stream->file_size(), stream->mtime_ns()} ==
        FileStamp{index.file_size, index.mtime_ns})) {
    return absl::FailedPreconditionError(
        absl::StrCat(index.path,
                     " changed since it was indexed; rebuild "
                     "its index"));
  }
  std::string record;
  while (stream->next_index() <= i) {
    const bool wanted = stream->next_index() == i;
    ASSIGN_OR_RETURN(bool more, stream->Next(wanted ? &record : nullptr));
    if (!more) {
      return RecordError(absl::StatusCode::kFailedPrecondition, index, i,
                         "the stream ends before it; rebuild the index");
    }
  }
  const uint64_t offset = index.offsets[static_cast<size_t>(i)];
  if (stream->offset() != offset + kTfRecordOverhead + record.size() ||
      record.size() != index.lengths[static_cast<size_t>(i)]) {
    return RecordError(absl::StatusCode::kFailedPrecondition, index, i,
                       "the stream does not match the index; rebuild it");
  }
  return record;
}

absl::Status CheckIndex(const TfRecordIndex& index, int64_t i) {
  if (i < 0 || i >= index.size()) {
    return absl::OutOfRangeError(absl::StrCat(
        index.path, ": record ", i, " asked for; it has ", index.size()));
  }
  if (index.lengths.size() != index.offsets.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(index.path,
                     ": the index's offsets and lengths differ "
                     "in number"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> ReadRecord(const TfRecordIndex& index, int64_t i,
                                       const TfRecordOptions& options) {
  RETURN_IF_ERROR(CheckIndex(index, i));
  if (index.compression == TfRecordCompression::kGzip) {
    return ReadGzipRecord(index, i, options);
  }
  int64_t size = 0;
  ASSIGN_OR_RETURN(int raw_fd, OpenRegularFile(index.path, &size));
  Fd fd(raw_fd);
  RETURN_IF_ERROR(CheckStamp(fd.get(), index));
  return ReadPlainRecord(fd.get(), index, i, options);
}

absl::StatusOr<std::unique_ptr<TfRecordFile>> TfRecordFile::Open(
    TfRecordIndex index, const TfRecordOptions& options) {
  if (index.compression != TfRecordCompression::kNone) {
    return absl::FailedPreconditionError(absl::StrCat(
        index.path,
        " is GZIP-compressed: its records can only be read in "
        "order (TfRecordStream); decompress it for random access"));
  }
  int64_t size = 0;
  ASSIGN_OR_RETURN(int raw_fd, OpenRegularFile(index.path, &size));
  Fd fd(raw_fd);
  RETURN_IF_ERROR(CheckStamp(fd.get(), index));
  return std::unique_ptr<TfRecordFile>(
      new TfRecordFile(std::move(index), options, fd.release()));
}

TfRecordFile::TfRecordFile(TfRecordIndex index, TfRecordOptions options, int fd)
    : index_(std::move(index)), options_(options), fd_(fd) {}

TfRecordFile::~TfRecordFile() { close(fd_); }

absl::StatusOr<std::string> TfRecordFile::Read(int64_t i) const {
  RETURN_IF_ERROR(CheckIndex(index_, i));
  return ReadPlainRecord(fd_, index_, i, options_);
}

}  // namespace lockstep::worker
