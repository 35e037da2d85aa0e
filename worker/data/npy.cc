// Parsing .npy files and loading an image data set's split from them
// (npy.h).
#include "worker/data/npy.h"

#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/files.h"
#include "common/status_macros.h"

namespace lockstep::worker {
namespace {

constexpr char kMagic[] = "\x93NUMPY";

absl::Status Bad(const std::string& origin, absl::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat(origin, " is not a usable .npy file: ", what));
}

// The value of `key` in the header dict, e.g. 'descr': '<u1' -> "'<u1'".
absl::StatusOr<std::string> HeaderValue(absl::string_view header,
                                        absl::string_view key,
                                        const std::string& origin) {
  std::string quoted = absl::StrCat("'", key, "'");
  size_t at = header.find(quoted);
  if (at == absl::string_view::npos) {
    return Bad(origin, absl::StrCat("its header has no ", quoted));
  }
  size_t colon = header.find(':', at + quoted.size());
  if (colon == absl::string_view::npos) {
    return Bad(origin, absl::StrCat("its header's ", quoted, " has no value"));
  }
  absl::string_view rest = header.substr(colon + 1);
  rest = absl::StripLeadingAsciiWhitespace(rest);
  size_t end;
  if (!rest.empty() && rest[0] == '(') {
    end = rest.find(')');
    if (end != absl::string_view::npos) ++end;
  } else if (!rest.empty() && rest[0] == '\'') {
    end = rest.find('\'', 1);
    if (end != absl::string_view::npos) ++end;
  } else {
    end = rest.find_first_of(",}");
  }
  if (end == absl::string_view::npos) {
    return Bad(origin, absl::StrCat("its header's ", quoted, " is cut short"));
  }
  return std::string(absl::StripAsciiWhitespace(rest.substr(0, end)));
}

int ElementSize(const std::string& dtype) {
  if (dtype.size() < 2) return 0;
  int size = 0;
  return absl::SimpleAtoi(dtype.substr(1), &size) ? size : 0;
}

}  // namespace

absl::StatusOr<NpyHeader> ParseNpyHeader(absl::string_view bytes,
                                         const std::string& origin) {
  if (bytes.size() < 10 || bytes.substr(0, 6) != absl::string_view(kMagic, 6)) {
    return Bad(origin, "it does not start with the NumPy magic \\x93NUMPY");
  }
  const int major = static_cast<uint8_t>(bytes[6]);
  size_t header_length = 0;
  size_t header_start = 0;
  if (major == 1) {
    header_length = static_cast<uint8_t>(bytes[8]) |
                    (static_cast<size_t>(static_cast<uint8_t>(bytes[9])) << 8);
    header_start = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) return Bad(origin, "its header is cut short");
    for (int i = 0; i < 4; ++i) {
      header_length |= static_cast<size_t>(static_cast<uint8_t>(bytes[8 + i]))
                       << (8 * i);
    }
    header_start = 12;
  } else {
    return Bad(origin, absl::StrCat("format version ", major,
                                    ".x is not one lockstep reads (1-3)"));
  }
  if (header_length > kMaxNpyHeaderBytes) {
    return Bad(origin, absl::StrCat("its header claims ", header_length,
                                    " bytes; lockstep reads headers of at "
                                    "most ",
                                    kMaxNpyHeaderBytes));
  }
  if (bytes.size() < header_start + header_length) {
    return Bad(origin, "its header is cut short (truncated file?)");
  }
  absl::string_view header = bytes.substr(header_start, header_length);
  ASSIGN_OR_RETURN(std::string descr, HeaderValue(header, "descr", origin));
  ASSIGN_OR_RETURN(std::string fortran,
                   HeaderValue(header, "fortran_order", origin));
  ASSIGN_OR_RETURN(std::string shape_text,
                   HeaderValue(header, "shape", origin));
  if (fortran != "False") {
    return Bad(origin,
               "it is in Fortran order; save a C-ordered array "
               "(numpy.ascontiguousarray)");
  }
  NpyHeader out;
  absl::string_view d = absl::StripPrefix(absl::StripSuffix(descr, "'"), "'");
  if (d.size() < 3 || (d[0] != '<' && d[0] != '|')) {
    return Bad(origin, absl::StrCat("dtype ", descr,
                                    " is not little-endian or not a plain "
                                    "number type"));
  }
  out.dtype = std::string(d.substr(1));
  const int element = ElementSize(out.dtype);
  if (element <= 0 ||
      std::string("uifb").find(out.dtype[0]) == std::string::npos) {
    return Bad(origin, absl::StrCat("dtype ", descr, " is not supported"));
  }
  absl::string_view inside =
      absl::StripSuffix(absl::StripPrefix(shape_text, "("), ")");
  for (absl::string_view part :
       absl::StrSplit(inside, ',', absl::SkipWhitespace())) {
    int64_t dim = 0;
    if (!absl::SimpleAtoi(absl::StripAsciiWhitespace(part), &dim) || dim < 0) {
      return Bad(origin,
                 absl::StrCat("its shape ", shape_text, " does not parse"));
    }
    out.shape.push_back(dim);
  }
  if (out.shape.size() > 16) {
    return Bad(origin, absl::StrCat("its shape ", shape_text,
                                    " has more than 16 dimensions"));
  }
  out.data_offset = static_cast<int64_t>(header_start + header_length);
  out.element_size = element;
  out.shape_text = shape_text;
  out.descr = descr;
  return out;
}

absl::StatusOr<int64_t> NpyDataBytes(const NpyHeader& header, int64_t available,
                                     const std::string& origin) {
  // The shape is untrusted: its product is checked against the bytes the
  // file has before it is formed, so it cannot pass 64 bits.
  uint64_t expected = static_cast<uint64_t>(header.element_size);
  for (int64_t dim : header.shape) {
    if (dim == 0) expected = 0;
  }
  for (int64_t dim : header.shape) {
    if (expected == 0) break;
    if (static_cast<uint64_t>(dim) >
        static_cast<uint64_t>(available) / expected) {
      return absl::DataLossError(
          absl::StrCat(origin, " is truncated: its shape ", header.shape_text,
                       " of dtype ", header.descr, " needs more than the ",
                       available, " bytes of data the file has"));
    }
    expected *= static_cast<uint64_t>(dim);
  }
  if (expected > static_cast<uint64_t>(available)) {
    return absl::DataLossError(absl::StrCat(
        origin, " is truncated: its shape ", header.shape_text, " needs ",
        expected, " bytes of data, the file has ", available));
  }
  return static_cast<int64_t>(expected);
}

absl::StatusOr<NpyArray> ParseNpy(absl::string_view bytes,
                                  const std::string& origin) {
  ASSIGN_OR_RETURN(NpyHeader header, ParseNpyHeader(bytes, origin));
  const int64_t available =
      static_cast<int64_t>(bytes.size()) - header.data_offset;
  ASSIGN_OR_RETURN(int64_t data_bytes, NpyDataBytes(header, available, origin));
  NpyArray out;
  out.dtype = header.dtype;
  out.shape = header.shape;
  out.data = std::string(bytes.substr(header.data_offset, data_bytes));
  return out;
}

absl::StatusOr<NpyArray> ReadNpy(const std::string& path) {
  auto bytes = ReadFileToString(path);
  if (!bytes.ok()) {
    return absl::NotFoundError(
        absl::StrCat("cannot read ", path, ": ", bytes.status().message()));
  }
  return ParseNpy(*bytes, path);
}

}  // namespace lockstep::worker
