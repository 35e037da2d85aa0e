// Reading IDX files and loading the Fashion-MNIST splits from them (idx.h).
#include "worker/data/idx.h"

#include <zlib.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/files.h"
#include "common/status_macros.h"

namespace lockstep::worker {
namespace {

constexpr int64_t kMaxElements = int64_t{1} << 34;
constexpr int64_t kReadChunk = int64_t{1} << 24;

// Reads exactly `size` bytes; false on a short read.
bool ReadExactly(gzFile file, void* out, size_t size) {
  auto* dst = static_cast<char*>(out);
  while (size > 0) {
    unsigned chunk = static_cast<unsigned>(std::min<size_t>(size, 1u << 30));
    int n = gzread(file, dst, chunk);
    if (n <= 0) return false;
    dst += n;
    size -= static_cast<size_t>(n);
  }
  return true;
}

}  // namespace

absl::StatusOr<IdxArray> ReadIdx(const std::string& path) {
  gzFile file = gzopen(path.c_str(), "rb");
  if (file == nullptr) {
    return absl::NotFoundError(absl::StrCat(
        "cannot open data file ", path,
        "; install Debian's dataset-fashion-mnist or set data.dir"));
  }
  struct Closer {
    gzFile file;
    ~Closer() { gzclose(file); }
  } closer{file};

  unsigned char header[4];
  if (!ReadExactly(file, header, 4)) {
    return absl::DataLossError(
        absl::StrCat(path, ": file too short for an IDX header"));
  }
  if (header[0] != 0 || header[1] != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": not an IDX file (bad magic number)"));
  }
  if (header[2] != 0x08) {
    return absl::InvalidArgumentError(absl::StrCat(
        path, ": IDX element type 0x", absl::Hex(header[2]),
        " is not supported; lockstep reads unsigned bytes (0x08)"));
  }
  int ndims = header[3];
  if (ndims < 1 || ndims > 4) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": IDX file has ", ndims, " dimensions"));
  }
  IdxArray array;
  int64_t elements = 1;
  for (int i = 0; i < ndims; ++i) {
    unsigned char raw[4];
    if (!ReadExactly(file, raw, 4)) {
      return absl::DataLossError(
          absl::StrCat(path, ": truncated in the IDX header"));
    }
    int64_t dim = (int64_t{raw[0]} << 24) | (int64_t{raw[1]} << 16) |
                  (int64_t{raw[2]} << 8) | int64_t{raw[3]};
    array.dims.push_back(dim);
    // Divided, not multiplied: elements * dim could pass 64 bits.
    if (dim != 0 && elements > kMaxElements / dim) {
      return absl::InvalidArgumentError(
          absl::StrCat(path, ": IDX dimensions are implausibly large"));
    }
    elements *= dim;
  }
  // The header is untrusted and a gzip stream's length is unknown until it
  // is read: memory grows with the bytes actually there, never with the
  // promise alone.
  while (static_cast<int64_t>(array.data.size()) < elements) {
    const size_t at = array.data.size();
    const size_t chunk = static_cast<size_t>(
        std::min<int64_t>(elements - static_cast<int64_t>(at), kReadChunk));
    array.data.resize(at + chunk);
    if (!ReadExactly(file, array.data.data() + at, chunk)) {
      return absl::DataLossError(
          absl::StrCat(path, ": truncated: the header promises ", elements,
                       " bytes of data; re-download or reinstall the file"));
    }
  }
  char extra;
  if (gzread(file, &extra, 1) > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": has bytes past the ", elements,
                     " its header promises; the file is corrupt"));
  }
  int error = Z_OK;
  gzerror(file, &error);
  if (error != Z_OK && error != Z_STREAM_END) {
    return absl::DataLossError(absl::StrCat(path, ": corrupt gzip stream"));
  }
  return array;
}

absl::StatusOr<ImageDataset> LoadImageDataset(const std::string& images_path,
                                              const std::string& labels_path) {
  ASSIGN_OR_RETURN(IdxArray images, ReadIdx(images_path));
  ASSIGN_OR_RETURN(IdxArray labels, ReadIdx(labels_path));
  if (images.dims.size() != 3) {
    return absl::InvalidArgumentError(absl::StrCat(
        images_path, ": images must be 3-D (count, rows, cols), got ",
        images.dims.size(), "-D"));
  }
  if (labels.dims.size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        labels_path, ": labels must be 1-D, got ", labels.dims.size(), "-D"));
  }
  if (images.dims[0] != labels.dims[0]) {
    return absl::InvalidArgumentError(
        absl::StrCat(images_path, " has ", images.dims[0], " images but ",
                     labels_path, " has ", labels.dims[0], " labels"));
  }
  for (size_t i = 0; i < labels.data.size(); ++i) {
    if (labels.data[i] >= kNumClasses) {
      return absl::InvalidArgumentError(absl::StrCat(
          labels_path, ": label ", int{labels.data[i]}, " at index ", i,
          " is out of range [0, ", kNumClasses, ")"));
    }
  }
  ImageDataset dataset;
  dataset.count = images.dims[0];
  dataset.rows = images.dims[1];
  dataset.cols = images.dims[2];
  dataset.pixels = std::move(images.data);
  dataset.labels = std::move(labels.data);
  return dataset;
}

absl::StatusOr<ImageDataset> LoadFashionMnist(const std::string& dir,
                                              bool train) {
  const char* prefix = train ? "train" : "t10k";
  auto pick = [&](const char* kind) {
    std::string raw = absl::StrCat(dir, "/", prefix, "-", kind, "-ubyte");
    std::string gz = raw + ".gz";
    return PathExists(gz) || !PathExists(raw) ? gz : raw;
  };
  return LoadImageDataset(pick("images-idx3"), pick("labels-idx1"));
}

}  // namespace lockstep::worker
