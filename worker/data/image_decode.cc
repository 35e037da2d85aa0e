// JPEG and PNG decoding and the image augmentations (image_decode.h).
#include "worker/data/image_decode.h"

#include <jpeglib.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include <png.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/status_macros.h"

namespace lockstep::worker {
namespace {

bool IsJpeg(absl::string_view bytes) {
  return bytes.size() >= 3 && static_cast<uint8_t>(bytes[0]) == 0xFF &&
         static_cast<uint8_t>(bytes[1]) == 0xD8 &&
         static_cast<uint8_t>(bytes[2]) == 0xFF;
}

bool IsPng(absl::string_view bytes) {
  static constexpr unsigned char kSignature[8] = {0x89, 'P',  'N',  'G',
                                                  0x0D, 0x0A, 0x1A, 0x0A};
  return bytes.size() >= 8 && std::memcmp(bytes.data(), kSignature, 8) == 0;
}

absl::StatusOr<ImageEncoding> Detect(absl::string_view bytes,
                                     ImageEncoding declared) {
  const ImageEncoding found = IsJpeg(bytes)  ? ImageEncoding::kJpeg
                              : IsPng(bytes) ? ImageEncoding::kPng
                                             : ImageEncoding::kAuto;
  if (found == ImageEncoding::kAuto) {
    return absl::InvalidArgumentError(
        absl::StrCat("the ", bytes.size(),
                     " bytes are neither a JPEG nor a PNG (no signature)"));
  }
  if (declared != ImageEncoding::kAuto && declared != found) {
    return absl::InvalidArgumentError(
        absl::StrCat("declared ", ImageEncodingName(declared), " but holds a ",
                     ImageEncodingName(found),
                     "; declare {\"encoding\": \"auto\"} for a mix"));
  }
  return found;
}

absl::Status TooLarge(int64_t height, int64_t width) {
  return absl::InvalidArgumentError(absl::StrCat("the image is ", width, "x",
                                                 height, ", more than ",
                                                 kMaxImagePixels, " pixels"));
}

// Converts `native` (1 grey, 2 grey + alpha, 3 RGB, 4 RGBA) 8-bit pixels to
// `channels` as Pillow's Image.convert does: grey from RGB by ITU-R 601-2
// luma, L = (19595 R + 38470 G + 7471 B + 2^15) >> 16; alpha dropped, or
// 255 where there was none.
void ConvertChannels(const uint8_t* in, int native, int64_t pixels,
                     int channels, uint8_t* out) {
  for (int64_t i = 0; i < pixels; ++i, in += native, out += channels) {
    const bool colour = native >= 3;
    const uint8_t r = in[0], g = colour ? in[1] : in[0],
                  b = colour ? in[2] : in[0];
    const uint8_t alpha = native == 2   ? in[1]
                          : native == 4 ? in[3]
                                        : uint8_t{255};
    if (channels == 1) {
      out[0] = colour
                   ? static_cast<uint8_t>(
                         (19595u * r + 38470u * g + 7471u * b + 0x8000u) >> 16)
                   : r;
    } else {
      out[0] = r;
      out[1] = g;
      out[2] = b;
      if (channels == 4) out[3] = alpha;
    }
  }
}

// libjpeg reports errors and corrupt-data warnings through these: both end
// the decode (longjmp back to the caller's setjmp) with the message kept.
struct JpegErrors {
  jpeg_error_mgr manager;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

[[noreturn]] void JpegFail(j_common_ptr info) {
  auto* errors = reinterpret_cast<JpegErrors*>(info->err);
  (*info->err->format_message)(info, errors->message);
  std::longjmp(errors->jump, 1);
}

void JpegMessage(j_common_ptr info, int level) {
  if (level < 0) JpegFail(info);  // a warning: the data is damaged
}

// Scans of a progressive JPEG: a real one has about ten; thousands of
// tiny scans make a small file cost minutes of CPU.
constexpr int kMaxJpegScans = 1000;

void JpegProgress(j_common_ptr info) {
  if (!info->is_decompressor) return;
  auto* decompress = reinterpret_cast<j_decompress_ptr>(info);
  if (decompress->input_scan_number > kMaxJpegScans) {
    auto* errors = reinterpret_cast<JpegErrors*>(info->err);
    std::snprintf(errors->message, sizeof(errors->message),
                  "more than %d scans (a progressive JPEG built to cost "
                  "CPU time)",
                  kMaxJpegScans);
    std::longjmp(errors->jump, 1);
  }
}

// A decompressor over `bytes`, destroyed whatever happens.
class Jpeg {
 public:
  explicit Jpeg(absl::string_view bytes) {
    info_.err = jpeg_std_error(&errors_.manager);
    errors_.manager.error_exit = JpegFail;
    errors_.manager.emit_message = JpegMessage;
    errors_.message[0] = '\0';
    jpeg_create_decompress(&info_);
    progress_.progress_monitor = JpegProgress;
    info_.progress = &progress_;
    jpeg_mem_src(&info_, reinterpret_cast<const unsigned char*>(bytes.data()),
                 static_cast<unsigned long>(bytes.size()));
  }

  // libjpeg's own buffers (a progressive image's coefficients) may take at
  // most `bytes`; past that the decode fails ("Backing store not
  // supported").
  void LimitMemory(int64_t bytes) { info_.mem->max_memory_to_use = bytes; }
  ~Jpeg() { jpeg_destroy_decompress(&info_); }
  Jpeg(const Jpeg&) = delete;
  Jpeg& operator=(const Jpeg&) = delete;

  // Each step returns false with message() set on an error. Only C data
  // lives between setjmp and a longjmp here.
  bool ReadHeader() {
    if (setjmp(errors_.jump) != 0) return false;
    jpeg_read_header(&info_, TRUE);
    return true;
  }
  bool Decode(J_COLOR_SPACE space, int channels, uint8_t* out) {
    if (setjmp(errors_.jump) != 0) return false;
    info_.out_color_space = space;
    jpeg_start_decompress(&info_);
    const size_t stride = static_cast<size_t>(info_.output_width) * channels;
    while (info_.output_scanline < info_.output_height) {
      JSAMPROW row = out + info_.output_scanline * stride;
      jpeg_read_scanlines(&info_, &row, 1);
    }
    jpeg_finish_decompress(&info_);
    return true;
  }

  // As Decode, kRowsAtOnce rows at a time into `rows` (that many rows of
  // output_width * channels bytes), each handed to `visit(context, y,
  // row)` in order.
  static constexpr int kRowsAtOnce = 1;
  bool DecodeRows(J_COLOR_SPACE space, int channels, uint8_t* rows,
                  void (*visit)(void*, int64_t, const uint8_t*),
                  void* context) {
    if (setjmp(errors_.jump) != 0) return false;
    info_.out_color_space = space;
    jpeg_start_decompress(&info_);
    const size_t stride = static_cast<size_t>(info_.output_width) * channels;
    JSAMPROW pointers[kRowsAtOnce];
    for (int r = 0; r < kRowsAtOnce; ++r) pointers[r] = rows + r * stride;
    while (info_.output_scanline < info_.output_height) {
      const int64_t y = info_.output_scanline;
      const JDIMENSION got = jpeg_read_scanlines(&info_, pointers, kRowsAtOnce);
      for (JDIMENSION r = 0; r < got; ++r) visit(context, y + r, pointers[r]);
    }
    jpeg_finish_decompress(&info_);
    return true;
  }

  jpeg_decompress_struct& info() { return info_; }
  const char* message() const { return errors_.message; }

 private:
  jpeg_decompress_struct info_;
  JpegErrors errors_;
  jpeg_progress_mgr progress_{};
};

absl::Status JpegError(const Jpeg& jpeg) {
  return absl::InvalidArgumentError(
      absl::StrCat("corrupt JPEG: ", jpeg.message()));
}

// What decoding a JPEG whose header `jpeg` read takes: checked against
// kMaxImagePixels, and libjpeg's memory capped.
struct JpegPlan {
  int64_t height = 0;
  int64_t width = 0;
  int64_t libjpeg_bytes = 0;  // its own buffers, at most
  // Grey from a colour JPEG as Pillow's convert("L") makes it: from the
  // decoded RGB, not libjpeg's luma channel.
  bool grey_from_colour = false;
  int decoded_channels = 0;
  J_COLOR_SPACE space = JCS_RGB;
};

absl::StatusOr<JpegPlan> PlanJpeg(Jpeg& jpeg, int channels) {
  if (!jpeg.ReadHeader()) return JpegError(jpeg);
  jpeg_decompress_struct& info = jpeg.info();
  JpegPlan plan;
  plan.height = info.image_height;
  plan.width = info.image_width;
  if (plan.height * plan.width > kMaxImagePixels) {
    return TooLarge(plan.height, plan.width);
  }
  if (info.jpeg_color_space == JCS_CMYK || info.jpeg_color_space == JCS_YCCK) {
    return absl::InvalidArgumentError(
        "a CMYK JPEG: store the images as RGB or greyscale");
  }
  // libjpeg's buffers: an image of several scans (progressive, or
  // sequential but not interleaved) keeps every DCT coefficient (2 bytes a
  // sample) until its last scan; a single-scan one a few rows.
  const int64_t components = std::max(1, info.num_components);
  const int64_t coefficients = jpeg_has_multiple_scans(&info)
                                   ? plan.height * plan.width * components * 2
                                   : 0;
  plan.libjpeg_bytes = coefficients + (int64_t{16} << 20);
  jpeg.LimitMemory(plan.libjpeg_bytes);
  plan.grey_from_colour = channels == 1 && components >= 3;
  plan.decoded_channels = plan.grey_from_colour ? 3 : channels;
  plan.space = plan.decoded_channels == 1   ? JCS_GRAYSCALE
               : plan.decoded_channels == 3 ? JCS_RGB
                                            : JCS_EXT_RGBA;
  return plan;
}

absl::StatusOr<Image> DecodeJpeg(absl::string_view bytes, int channels,
                                 DecodeBudget& budget) {
  Jpeg jpeg(bytes);
  ASSIGN_OR_RETURN(const JpegPlan plan, PlanJpeg(jpeg, channels));
  const int64_t pixels = plan.height * plan.width;
  ASSIGN_OR_RETURN(
      DecodeBudget::Reservation reserved,
      budget.Reserve(
          plan.libjpeg_bytes + pixels * (plan.decoded_channels +
                                         (plan.grey_from_colour ? 1 : 0)),
          plan.height, plan.width));
  Image image;
  image.height = plan.height;
  image.width = plan.width;
  image.channels = plan.decoded_channels;
  image.pixels.resize(static_cast<size_t>(pixels * plan.decoded_channels));
  if (!jpeg.Decode(plan.space, plan.decoded_channels, image.pixels.data())) {
    return JpegError(jpeg);
  }
  if (plan.grey_from_colour) {
    std::vector<uint8_t> grey(static_cast<size_t>(pixels));
    ConvertChannels(image.pixels.data(), 3, pixels, 1, grey.data());
    image.pixels = std::move(grey);
    image.channels = 1;
  }
  return image;
}

// A JPEG's rows to `sink`, never the whole image: its size first (before
// anything is decompressed), then each row of width * channels pixels.
absl::Status DecodeJpegRows(absl::string_view bytes, int channels,
                            ImageRows& sink, DecodeBudget& budget) {
  Jpeg jpeg(bytes);
  ASSIGN_OR_RETURN(const JpegPlan plan, PlanJpeg(jpeg, channels));
  const int64_t width = plan.width;
  const int decoded_channels = plan.decoded_channels;
  const bool grey_from_colour = plan.grey_from_colour;
  ASSIGN_OR_RETURN(
      DecodeBudget::Reservation reserved,
      budget.Reserve(plan.libjpeg_bytes +
                         width * (Jpeg::kRowsAtOnce * decoded_channels + 1),
                     plan.height, width));
  RETURN_IF_ERROR(sink.Begin(plan.height, width));
  std::vector<uint8_t> row(
      static_cast<size_t>(Jpeg::kRowsAtOnce * width * decoded_channels));
  std::vector<uint8_t> grey(grey_from_colour ? static_cast<size_t>(width) : 0);
  struct Context {
    ImageRows* sink;
    int64_t width;
    uint8_t* grey;  // null: rows go as decoded
  } context{&sink, width, grey_from_colour ? grey.data() : nullptr};
  const bool done = jpeg.DecodeRows(
      plan.space, decoded_channels, row.data(),
      +[](void* opaque, int64_t y, const uint8_t* pixels) {
        auto* c = static_cast<Context*>(opaque);
        if (c->grey != nullptr) {
          ConvertChannels(pixels, 3, c->width, 1, c->grey);
          pixels = c->grey;
        }
        c->sink->Row(y, pixels);
      },
      &context);
  if (!done) return JpegError(jpeg);
  return absl::OkStatus();
}

// libpng's reader over `bytes`: errors end the read (longjmp back to the
// caller's setjmp) with the message kept; warnings are collected.
struct PngReader {
  absl::string_view bytes;
  size_t at = 0;
  char error[256] = {};
  std::vector<std::string> warnings;
};

void PngRead(png_structp png, png_bytep out, size_t size) {
  auto* reader = static_cast<PngReader*>(png_get_io_ptr(png));
  if (size > reader->bytes.size() - reader->at) {
    png_error(png, "the data ends inside a chunk (a truncated PNG)");
  }
  std::memcpy(out, reader->bytes.data() + reader->at, size);
  reader->at += size;
}

[[noreturn]] void PngFail(png_structp png, png_const_charp message) {
  auto* reader = static_cast<PngReader*>(png_get_error_ptr(png));
  std::snprintf(reader->error, sizeof(reader->error), "%s", message);
  png_longjmp(png, 1);
}

void PngWarn(png_structp png, png_const_charp message) {
  auto* reader = static_cast<PngReader*>(png_get_error_ptr(png));
  if (reader->warnings.size() < 8) reader->warnings.emplace_back(message);
}

// A warning about an ancillary chunk ("iCCP: known incorrect sRGB
// profile": a chunk name whose first letter is lower case) leaves the
// pixels intact; any other (extra or damaged image data) means they are
// not the file's.
bool DamagesPixels(const std::string& warning) {
  return !(warning.size() > 5 && warning[4] == ':' &&
           std::islower(static_cast<unsigned char>(warning[0])));
}

// A libpng reader over `bytes`, destroyed whatever happens. As Jpeg's, its
// steps return false with error() set; only C data lives between their
// setjmp and a longjmp.
class Png {
 public:
  explicit Png(absl::string_view bytes) {
    reader_.bytes = bytes;
    png_ = png_create_read_struct(PNG_LIBPNG_VER_STRING, &reader_, PngFail,
                                  PngWarn);
    if (png_ != nullptr) info_ = png_create_info_struct(png_);
  }
  ~Png() { png_destroy_read_struct(&png_, &info_, nullptr); }
  Png(const Png&) = delete;
  Png& operator=(const Png&) = delete;

  bool started() const { return png_ != nullptr && info_ != nullptr; }

  // Reads the header and sets the transforms: palette and low bit depths
  // expanded, transparency as alpha, 16-bit samples scaled to 8 by v / 257
  // rounded, interlacing undone.
  bool ReadInfo() {
    if (setjmp(png_jmpbuf(png_)) != 0) return false;
    png_set_read_fn(png_, &reader_, PngRead);
    png_set_user_limits(png_, 1 << 20, 1 << 20);
    png_read_info(png_, info_);
    const int colour = png_get_color_type(png_, info_);
    const int depth = png_get_bit_depth(png_, info_);
    if (colour == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png_);
    if (colour == PNG_COLOR_TYPE_GRAY && depth < 8) {
      png_set_expand_gray_1_2_4_to_8(png_);
    }
    if (png_get_valid(png_, info_, PNG_INFO_tRNS)) png_set_tRNS_to_alpha(png_);
    if (depth == 16) png_set_scale_16(png_);
    png_set_interlace_handling(png_);
    png_read_update_info(png_, info_);
    return true;
  }
  int64_t height() const { return png_get_image_height(png_, info_); }
  int64_t width() const { return png_get_image_width(png_, info_); }
  int channels() const { return png_get_channels(png_, info_); }
  size_t stride() const { return png_get_rowbytes(png_, info_); }

  // Reads every row (rows[y] holds stride() bytes) and the chunks after.
  bool ReadRows(png_bytepp rows) {
    if (setjmp(png_jmpbuf(png_)) != 0) return false;
    png_read_image(png_, rows);
    png_read_end(png_, nullptr);
    return true;
  }

  const char* error() const { return reader_.error; }
  const std::vector<std::string>& warnings() const { return reader_.warnings; }

 private:
  PngReader reader_;
  png_structp png_ = nullptr;
  png_infop info_ = nullptr;
};

// Decodes with libpng's full API (Png) and converts to `channels` as
// Pillow does. libpng's simplified API, used before, took 16-bit data
// without gAMA or sRGB for linear light and brightened it (a mid grey of
// 32896 became 188, not 128), and flattened alpha onto black.
absl::StatusOr<Image> DecodePng(absl::string_view bytes, int channels,
                                DecodeBudget& budget) {
  Png png(bytes);
  if (!png.started()) return absl::InternalError("libpng cannot start");
  auto corrupt = [](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("corrupt PNG: ", why));
  };
  if (!png.ReadInfo()) return corrupt(png.error());
  const int64_t height = png.height(), width = png.width();
  if (height * width > kMaxImagePixels) return TooLarge(height, width);
  const size_t stride = png.stride();
  ASSIGN_OR_RETURN(DecodeBudget::Reservation reserved,
                   budget.Reserve(static_cast<int64_t>(stride) * height +
                                      height * width * channels,
                                  height, width));
  std::vector<uint8_t> native(stride * static_cast<size_t>(height));
  std::vector<png_bytep> rows(static_cast<size_t>(height));
  for (int64_t y = 0; y < height; ++y) rows[y] = native.data() + y * stride;
  if (!png.ReadRows(rows.data())) return corrupt(png.error());
  for (const std::string& warning : png.warnings()) {
    if (DamagesPixels(warning)) return corrupt(warning);
  }
  Image image;
  image.height = height;
  image.width = width;
  image.channels = channels;
  image.pixels.resize(static_cast<size_t>(height * width * channels));
  ConvertChannels(native.data(), png.channels(), height * width, channels,
                  image.pixels.data());
  return image;
}

}  // namespace

bool ParseImageEncoding(absl::string_view name, ImageEncoding* out) {
  if (name == "jpeg") {
    *out = ImageEncoding::kJpeg;
  } else if (name == "png") {
    *out = ImageEncoding::kPng;
  } else if (name == "auto") {
    *out = ImageEncoding::kAuto;
  } else {
    return false;
  }
  return true;
}

const char* ImageEncodingName(ImageEncoding encoding) {
  switch (encoding) {
    case ImageEncoding::kJpeg:
      return "jpeg";
    case ImageEncoding::kPng:
      return "png";
    default:
      return "auto";
  }
}

absl::StatusOr<ImageInfo> ReadImageInfo(absl::string_view bytes) {
  absl::StatusOr<ImageEncoding> format = Detect(bytes, ImageEncoding::kAuto);
  if (!format.ok()) return format.status();
  ImageInfo out;
  out.format = *format;
  if (*format == ImageEncoding::kJpeg) {
    Jpeg jpeg(bytes);
    if (!jpeg.ReadHeader()) return JpegError(jpeg);
    out.height = jpeg.info().image_height;
    out.width = jpeg.info().image_width;
    out.channels = jpeg.info().num_components;
    return out;
  }
  png_image png;
  std::memset(&png, 0, sizeof(png));
  png.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_memory(&png, bytes.data(), bytes.size())) {
    const absl::Status error =
        absl::InvalidArgumentError(absl::StrCat("corrupt PNG: ", png.message));
    png_image_free(&png);
    return error;
  }
  out.height = png.height;
  out.width = png.width;
  out.channels = PNG_IMAGE_PIXEL_CHANNELS(png.format);
  png_image_free(&png);
  return out;
}

absl::StatusOr<Image> DecodeImage(absl::string_view bytes,
                                  ImageEncoding encoding, int channels,
                                  DecodeBudget& budget) {
  if (channels != 1 && channels != 3 && channels != 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("an image decodes to 1, 3 or 4 channels, not ", channels));
  }
  absl::StatusOr<ImageEncoding> format = Detect(bytes, encoding);
  if (!format.ok()) return format.status();
  return *format == ImageEncoding::kJpeg ? DecodeJpeg(bytes, channels, budget)
                                         : DecodePng(bytes, channels, budget);
}

absl::Status DecodeImageRows(absl::string_view bytes, ImageEncoding encoding,
                             int channels, ImageRows& sink,
                             DecodeBudget& budget) {
  if (channels != 1 && channels != 3 && channels != 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("an image decodes to 1, 3 or 4 channels, not ", channels));
  }
  ASSIGN_OR_RETURN(const ImageEncoding format, Detect(bytes, encoding));
  if (format == ImageEncoding::kJpeg) {
    return DecodeJpegRows(bytes, channels, sink, budget);
  }
  // A PNG whole (interlaced ones cannot come row by row), then its rows.
  ASSIGN_OR_RETURN(const Image image, DecodePng(bytes, channels, budget));
  RETURN_IF_ERROR(sink.Begin(image.height, image.width));
  const int64_t stride = image.width * channels;
  for (int64_t y = 0; y < image.height; ++y) {
    sink.Row(y, image.pixels.data() + y * stride);
  }
  return absl::OkStatus();
}

Image ResizeImage(const Image& image, int64_t height, int64_t width) {
  Image out;
  out.height = height;
  out.width = width;
  out.channels = image.channels;
  out.pixels.resize(static_cast<size_t>(height * width * image.channels));
  const int64_t c = image.channels;
  // Source coordinate of each output row and column, and the weights.
  auto source = [](int64_t i, int64_t out_size, int64_t in_size, int64_t* lo,
                   int64_t* hi, float* frac) {
    float at = (static_cast<float>(i) + 0.5f) * in_size / out_size - 0.5f;
    at = std::clamp(at, 0.0f, static_cast<float>(in_size - 1));
    *lo = static_cast<int64_t>(at);
    *hi = std::min(*lo + 1, in_size - 1);
    *frac = at - static_cast<float>(*lo);
  };
  for (int64_t y = 0; y < height; ++y) {
    int64_t y0, y1;
    float fy;
    source(y, height, image.height, &y0, &y1, &fy);
    for (int64_t x = 0; x < width; ++x) {
      int64_t x0, x1;
      float fx;
      source(x, width, image.width, &x0, &x1, &fx);
      for (int64_t k = 0; k < c; ++k) {
        auto at = [&](int64_t yy, int64_t xx) {
          return static_cast<float>(image.pixels[static_cast<size_t>(
              (yy * image.width + xx) * c + k)]);
        };
        const float top = at(y0, x0) + (at(y0, x1) - at(y0, x0)) * fx;
        const float bottom = at(y1, x0) + (at(y1, x1) - at(y1, x0)) * fx;
        const float value = top + (bottom - top) * fy;
        out.pixels[static_cast<size_t>((y * width + x) * c + k)] =
            static_cast<uint8_t>(std::clamp(std::lround(value), 0L, 255L));
      }
    }
  }
  return out;
}

Image CropImage(const Image& image, int64_t top, int64_t left, int64_t height,
                int64_t width) {
  Image out;
  out.height = height;
  out.width = width;
  out.channels = image.channels;
  out.pixels.resize(static_cast<size_t>(height * width * image.channels));
  const size_t row = static_cast<size_t>(width * image.channels);
  for (int64_t y = 0; y < height; ++y) {
    std::memcpy(
        out.pixels.data() + y * row,
        image.pixels.data() + ((top + y) * image.width + left) * image.channels,
        row);
  }
  return out;
}

void FlipImage(Image* image) {
  const int64_t c = image->channels;
  for (int64_t y = 0; y < image->height; ++y) {
    uint8_t* row = image->pixels.data() + y * image->width * c;
    for (int64_t l = 0, r = image->width - 1; l < r; ++l, --r) {
      for (int64_t k = 0; k < c; ++k) std::swap(row[l * c + k], row[r * c + k]);
    }
  }
}

namespace {

// PIL's Resample.c, for one axis: for each output index the first input
// index and the 22-bit fixed-point weights of the inputs it reads.
constexpr int kPilPrecisionBits = 32 - 8 - 2;

struct PilTaps {
  int64_t taps = 0;              // weights per output
  std::vector<int64_t> first;    // per output
  std::vector<int64_t> count;    // per output
  std::vector<int32_t> weights;  // [output][taps]
};

PilTaps PilBilinearTaps(int64_t in_size, int64_t out_size) {
  const double scale = static_cast<double>(in_size) / out_size;
  const double filter_scale = std::max(scale, 1.0);
  const double support = 1.0 * filter_scale;  // bilinear's support is 1
  PilTaps out;
  out.taps = static_cast<int64_t>(std::ceil(support)) * 2 + 1;
  out.first.resize(static_cast<size_t>(out_size));
  out.count.resize(static_cast<size_t>(out_size));
  out.weights.assign(static_cast<size_t>(out_size * out.taps), 0);
  std::vector<double> k(static_cast<size_t>(out.taps));
  for (int64_t o = 0; o < out_size; ++o) {
    const double center = (o + 0.5) * scale;
    int64_t lo = static_cast<int64_t>(center - support + 0.5);
    if (lo < 0) lo = 0;
    int64_t hi = static_cast<int64_t>(center + support + 0.5);
    if (hi > in_size) hi = in_size;
    const int64_t n = std::min(hi - lo, out.taps);
    double total = 0;
    const double ss = 1.0 / filter_scale;  // multiplied, as PIL does
    for (int64_t x = 0; x < n; ++x) {
      double d = (x + lo - center + 0.5) * ss;
      if (d < 0) d = -d;
      k[x] = d < 1.0 ? 1.0 - d : 0.0;
      total += k[x];
    }
    for (int64_t x = 0; x < n; ++x) {
      const double w = total != 0.0 ? k[x] / total : k[x];
      out.weights[o * out.taps + x] =
          static_cast<int32_t>(w < 0 ? -0.5 + w * (1 << kPilPrecisionBits)
                                     : 0.5 + w * (1 << kPilPrecisionBits));
    }
    out.first[o] = lo;
    out.count[o] = n;
  }
  return out;
}

uint8_t PilClip8(int64_t value) {
  if (value >= (int64_t{1} << kPilPrecisionBits << 8)) return 255;
  if (value <= 0) return 0;
  return static_cast<uint8_t>(value >> kPilPrecisionBits);
}

}  // namespace

Image ResizeImageAntialias(const Image& image, int64_t height, int64_t width) {
  const int64_t c = image.channels;
  Image across = image;
  if (width != image.width) {
    const PilTaps taps = PilBilinearTaps(image.width, width);
    across.width = width;
    across.pixels.assign(static_cast<size_t>(image.height * width * c), 0);
    for (int64_t y = 0; y < image.height; ++y) {
      const uint8_t* row = image.pixels.data() + y * image.width * c;
      for (int64_t x = 0; x < width; ++x) {
        const int32_t* w = taps.weights.data() + x * taps.taps;
        for (int64_t ch = 0; ch < c; ++ch) {
          int64_t sum = int64_t{1} << (kPilPrecisionBits - 1);
          for (int64_t t = 0; t < taps.count[x]; ++t) {
            sum += int64_t{row[(taps.first[x] + t) * c + ch]} * w[t];
          }
          across.pixels[(y * width + x) * c + ch] = PilClip8(sum);
        }
      }
    }
  }
  if (height == image.height) return across;
  const PilTaps taps = PilBilinearTaps(image.height, height);
  Image out;
  out.height = height;
  out.width = width;
  out.channels = c;
  out.pixels.assign(static_cast<size_t>(height * width * c), 0);
  const int64_t stride = width * c;
  for (int64_t y = 0; y < height; ++y) {
    const int32_t* w = taps.weights.data() + y * taps.taps;
    for (int64_t i = 0; i < stride; ++i) {
      int64_t sum = int64_t{1} << (kPilPrecisionBits - 1);
      for (int64_t t = 0; t < taps.count[y]; ++t) {
        sum += int64_t{across.pixels[(taps.first[y] + t) * stride + i]} * w[t];
      }
      out.pixels[y * stride + i] = PilClip8(sum);
    }
  }
  return out;
}

namespace {

#if defined(__x86_64__)
// 16 RGB pixels (48 bytes) into 16 bytes of each plane per step: each
// plane's bytes gathered from the three loads by byte shuffles.
__attribute__((target("ssse3"))) int64_t RgbToPlanesSsse3(const uint8_t* in,
                                                          int64_t count,
                                                          int64_t plane,
                                                          uint8_t* out) {
  const int8_t z = -128;  // a shuffle index that writes 0
  // Plane c takes bytes c, c + 3, ..., of the 48: those in load k at
  // positions (3i + c - 16k).
  const __m128i mask[3][3] = {
      {_mm_setr_epi8(0, 3, 6, 9, 12, 15, z, z, z, z, z, z, z, z, z, z),
       _mm_setr_epi8(z, z, z, z, z, z, 2, 5, 8, 11, 14, z, z, z, z, z),
       _mm_setr_epi8(z, z, z, z, z, z, z, z, z, z, z, 1, 4, 7, 10, 13)},
      {_mm_setr_epi8(1, 4, 7, 10, 13, z, z, z, z, z, z, z, z, z, z, z),
       _mm_setr_epi8(z, z, z, z, z, 0, 3, 6, 9, 12, 15, z, z, z, z, z),
       _mm_setr_epi8(z, z, z, z, z, z, z, z, z, z, z, 2, 5, 8, 11, 14)},
      {_mm_setr_epi8(2, 5, 8, 11, 14, z, z, z, z, z, z, z, z, z, z, z),
       _mm_setr_epi8(z, z, z, z, z, 1, 4, 7, 10, 13, z, z, z, z, z, z),
       _mm_setr_epi8(z, z, z, z, z, z, z, z, z, z, 0, 3, 6, 9, 12, 15)}};
  int64_t p = 0;
  for (; p + 16 <= count; p += 16) {
    const __m128i a =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + p * 3));
    const __m128i b =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + p * 3 + 16));
    const __m128i c =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(in + p * 3 + 32));
    for (int ch = 0; ch < 3; ++ch) {
      const __m128i gathered =
          _mm_or_si128(_mm_or_si128(_mm_shuffle_epi8(a, mask[ch][0]),
                                    _mm_shuffle_epi8(b, mask[ch][1])),
                       _mm_shuffle_epi8(c, mask[ch][2]));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out + ch * plane + p),
                       gathered);
    }
  }
  return p;
}
#endif

}  // namespace

void RowToPlanes(const uint8_t* row, int channels, int64_t width, int64_t plane,
                 bool mirrored, uint8_t* out) {
  if (mirrored) {
    for (int c = 0; c < channels; ++c) {
      uint8_t* to = out + c * plane;
      for (int64_t x = 0; x < width; ++x) {
        to[width - 1 - x] = row[x * channels + c];
      }
    }
    return;
  }
  if (channels == 1) {
    std::memcpy(out, row, static_cast<size_t>(width));
    return;
  }
  int64_t done = 0;
#if defined(__x86_64__)
  static const bool ssse3 = __builtin_cpu_supports("ssse3");
  if (channels == 3 && ssse3) done = RgbToPlanesSsse3(row, width, plane, out);
#endif
  for (int c = 0; c < channels; ++c) {
    uint8_t* to = out + c * plane;
    for (int64_t x = done; x < width; ++x) to[x] = row[x * channels + c];
  }
}

void ToChannelsFirst(const Image& image, uint8_t* out) {
  // The whole image as one row of height * width pixels.
  const int64_t plane = image.height * image.width;
  RowToPlanes(image.pixels.data(), static_cast<int>(image.channels), plane,
              plane, /*mirrored=*/false, out);
}

DecodeBudget::DecodeBudget(int64_t bytes) : bytes_(bytes) {}

DecodeBudget& DecodeBudget::Default() {
  static DecodeBudget* const budget = new DecodeBudget(kDefaultDecodeBudget);
  return *budget;
}

absl::StatusOr<DecodeBudget::Reservation> DecodeBudget::Reserve(int64_t bytes,
                                                                int64_t height,
                                                                int64_t width) {
  if (bytes > bytes_) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the image is ", width, "x", height,
        " (width x height): decoding it takes ", bytes >> 20,
        " MiB, more than the ", bytes_ >> 20,
        " MiB a worker's decode threads may hold at once; store smaller "
        "images"));
  }
  absl::MutexLock lock(&mu_);
  while (held_ + bytes > bytes_) released_.Wait(&mu_);
  held_ += bytes;
  return Reservation(this, bytes);
}

int64_t DecodeBudget::held() const {
  absl::MutexLock lock(&mu_);
  return held_;
}

void DecodeBudget::Release(int64_t bytes) {
  absl::MutexLock lock(&mu_);
  held_ -= bytes;
  released_.SignalAll();
}

DecodeBudget::Reservation::Reservation(DecodeBudget* budget, int64_t bytes)
    : budget_(budget), bytes_(bytes) {}

DecodeBudget::Reservation::Reservation(Reservation&& other) noexcept
    : budget_(std::exchange(other.budget_, nullptr)), bytes_(other.bytes_) {}

DecodeBudget::Reservation::~Reservation() {
  if (budget_ != nullptr) budget_->Release(bytes_);
}

}  // namespace lockstep::worker
