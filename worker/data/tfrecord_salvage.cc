// The readable records of a damaged plain TFRecord file, and the damage
// between them (tfrecord.h, SalvageTfRecordIndex).
#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/files.h"
#include "common/status_macros.h"
#include "worker/data/tfrecord.h"
#include "worker/data/tfrecord_internal.h"

namespace lockstep::worker {
namespace {

using tfrecord_internal::Hex8;
using tfrecord_internal::LengthCrcMatches;
using tfrecord_internal::LoadLe;
using tfrecord_internal::PreadFully;

// Bytes searched per read after damaged framing.
constexpr size_t kSearchWindow = size_t{1} << 20;

class Salvager {
 public:
  Salvager(int fd, const std::string& path, uint64_t size,
           const TfRecordOptions& options)
      : fd_(fd), path_(path), size_(size), options_(options) {}

  // Whether a whole record, both CRCs matching, starts at `at`; its data
  // length in `*length`. Otherwise why not in `*why`, and in `*one_record`
  // whether the framing held (only the data is bad: the damage is that one
  // record).
  absl::StatusOr<bool> RecordAt(uint64_t at, uint64_t* length, std::string* why,
                                bool* one_record) {
    *one_record = false;
    char header[12];
    ASSIGN_OR_RETURN(size_t got,
                     PreadFully(fd_, path_, header, sizeof(header), at));
    if (got < sizeof(header)) {
      *why = absl::StrCat("the file ends ", got,
                          " bytes into a 12-byte record header");
      return false;
    }
    if (!LengthCrcMatches(header)) {
      *why = absl::StrCat(
          "the CRC-32C of its length field does not match "
          "(stored 0x",
          Hex8(LoadLe(header + 8, 4)), ")");
      return false;
    }
    *length = LoadLe(header, 8);
    const uint64_t left = size_ - at - sizeof(header);
    if (*length > left || left - *length < 4) {
      *why = absl::StrCat("it declares ", *length,
                          " bytes of data and a 4-byte CRC, the file has ",
                          left, " bytes left");
      return false;
    }
    *one_record = true;
    if (*length > options_.max_record_bytes) {
      *why = absl::StrCat("it declares ", *length,
                          " bytes of data, more than the bound of ",
                          options_.max_record_bytes, " bytes");
      return false;
    }
    data_.resize(static_cast<size_t>(*length) + 4);
    ASSIGN_OR_RETURN(got, PreadFully(fd_, path_, data_.data(), data_.size(),
                                     at + sizeof(header)));
    if (got < data_.size()) {
      *why = "the file was cut short while it was read";
      return false;
    }
    const uint32_t stored =
        static_cast<uint32_t>(LoadLe(data_.data() + *length, 4));
    const uint32_t computed =
        MaskCrc32c(Crc32cExtend(0, data_.data(), static_cast<size_t>(*length)));
    if (stored != computed) {
      *why = absl::StrCat("the CRC-32C of its ", *length,
                          " bytes of data does not match (stored 0x",
                          Hex8(stored), ", computed 0x", Hex8(computed), ")");
      return false;
    }
    return true;
  }

  // The offset of the first record past `from` that reads whole, or the
  // file's size when none does.
  absl::StatusOr<uint64_t> NextRecord(uint64_t from) {
    std::vector<char> window(kSearchWindow + 11);
    for (uint64_t base = from; base + 12 <= size_; base += kSearchWindow) {
      ASSIGN_OR_RETURN(size_t got, PreadFully(fd_, path_, window.data(),
                                              window.size(), base));
      for (size_t i = 0; i + 12 <= got && i < kSearchWindow; ++i) {
        if (!LengthCrcMatches(window.data() + i)) continue;
        uint64_t length = 0;
        std::string why;
        bool one_record = false;
        ASSIGN_OR_RETURN(bool whole,
                         RecordAt(base + i, &length, &why, &one_record));
        if (whole) return base + i;
      }
    }
    return size_;
  }

 private:
  const int fd_;
  const std::string& path_;
  const uint64_t size_;
  const TfRecordOptions& options_;
  std::string data_;
};

}  // namespace

absl::StatusOr<TfRecordIndex> SalvageTfRecordIndex(
    const std::string& path, const TfRecordOptions& options,
    std::vector<TfRecordDamage>* damage) {
  damage->clear();
  TfRecordIndex index;
  index.path = path;
  {
    ASSIGN_OR_RETURN(std::unique_ptr<TfRecordStream> stream,
                     TfRecordStream::Open(path, options));
    if (stream->compression() != TfRecordCompression::kNone) {
      return absl::FailedPreconditionError(absl::StrCat(
          path,
          " is GZIP-compressed: past damage in a compressed stream no record "
          "can be found again, so it cannot be salvaged (data.skip_corrupt); "
          "decompress what can be read, or restore the file"));
    }
    index.file_size = stream->file_size();
    index.mtime_ns = stream->mtime_ns();
  }
  int64_t size = 0;
  ASSIGN_OR_RETURN(int raw_fd, OpenRegularFile(path, &size));
  tfrecord_internal::Fd fd(raw_fd);
  index.stream_size = static_cast<uint64_t>(index.file_size);
  Salvager salvager(fd.get(), path, index.stream_size, options);
  uint64_t at = 0;
  int64_t number = 0;  // records, readable or not, before `at`
  while (at < index.stream_size) {
    uint64_t length = 0;
    std::string why;
    bool one_record = false;
    ASSIGN_OR_RETURN(bool whole,
                     salvager.RecordAt(at, &length, &why, &one_record));
    if (whole) {
      index.offsets.push_back(at);
      index.lengths.push_back(length);
      at += kTfRecordOverhead + length;
      ++number;
      continue;
    }
    TfRecordDamage stretch;
    stretch.record = number++;
    stretch.offset = at;
    stretch.reason = std::move(why);
    if (one_record) {
      at += kTfRecordOverhead + length;
    } else {
      ASSIGN_OR_RETURN(at, salvager.NextRecord(at + 1));
      absl::StrAppend(&stretch.reason,
                      at == index.stream_size ? "; no record reads after it"
                                              : "; the next record that reads "
                                                "starts at byte ",
                      at == index.stream_size ? "" : absl::StrCat(at));
    }
    stretch.bytes = at - stretch.offset;
    damage->push_back(std::move(stretch));
  }
  RETURN_IF_ERROR(tfrecord_internal::CheckUnchangedSinceIndexed(index));
  return index;
}

}  // namespace lockstep::worker
