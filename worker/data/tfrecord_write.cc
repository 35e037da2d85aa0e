// Writing TFRecord files, plain or GZIP (tfrecord.h): for tests, examples
// and converting data sets.
#include <zlib.h>

#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/files.h"
#include "common/status_macros.h"
#include "worker/data/tfrecord.h"

namespace lockstep::worker {
namespace {

void AppendLe(std::string* out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) {
    out->push_back(static_cast<char>((value >> (8 * i)) & 0xFF));
  }
}

}  // namespace

std::string EncodeTfRecord(absl::string_view data) {
  std::string out;
  out.reserve(data.size() + kTfRecordOverhead);
  AppendLe(&out, data.size(), 8);
  AppendLe(&out, MaskCrc32c(Crc32c(out)), 4);
  out.append(data.data(), data.size());
  AppendLe(&out, MaskCrc32c(Crc32c(data)), 4);
  return out;
}

namespace {

absl::StatusOr<std::string> Gzip(absl::string_view data,
                                 const std::string& path) {
  z_stream zs{};
  if (deflateInit2(&zs, Z_DEFAULT_COMPRESSION, Z_DEFLATED, 16 + MAX_WBITS, 8,
                   Z_DEFAULT_STRATEGY) != Z_OK) {
    return absl::ResourceExhaustedError(
        absl::StrCat("zlib could not start compressing ", path));
  }
  std::string out(deflateBound(&zs, data.size()), '\0');
  zs.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(data.data()));
  zs.avail_in = static_cast<uInt>(data.size());
  zs.next_out = reinterpret_cast<Bytef*>(out.data());
  zs.avail_out = static_cast<uInt>(out.size());
  int rc = deflate(&zs, Z_FINISH);
  out.resize(zs.total_out);
  deflateEnd(&zs);
  if (rc != Z_STREAM_END) {
    return absl::InternalError(absl::StrCat("zlib could not compress ", path));
  }
  return out;
}

}  // namespace

absl::Status WriteTfRecordFile(const std::string& path,
                               const std::vector<std::string>& records,
                               TfRecordCompression compression) {
  std::string bytes;
  for (const std::string& record : records) {
    if (bytes.size() + record.size() > std::numeric_limits<uInt>::max() / 2) {
      return absl::InvalidArgumentError(absl::StrCat(
          path, ": WriteTfRecordFile writes at most 2 GiB per file"));
    }
    bytes += EncodeTfRecord(record);
  }
  if (compression == TfRecordCompression::kGzip) {
    ASSIGN_OR_RETURN(bytes, Gzip(bytes, path));
  }
  return WriteFileAtomically(path, bytes);
}

}  // namespace lockstep::worker
