// JPEG and PNG decoding and the image augmentations (image_decode.h).
#include "worker/data/image_decode.h"

#include <jpeglib.h>
#include <png.h>

#include <algorithm>
#include <cmath>
#include <csetjmp>
#include <cstdio>
#include <cstring>

#include "absl/strings/str_cat.h"

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

// A decompressor over `bytes`, destroyed whatever happens.
class Jpeg {
 public:
  explicit Jpeg(absl::string_view bytes) {
    info_.err = jpeg_std_error(&errors_.manager);
    errors_.manager.error_exit = JpegFail;
    errors_.manager.emit_message = JpegMessage;
    errors_.message[0] = '\0';
    jpeg_create_decompress(&info_);
    jpeg_mem_src(&info_, reinterpret_cast<const unsigned char*>(bytes.data()),
                 static_cast<unsigned long>(bytes.size()));
  }
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
  bool Decode(int channels, uint8_t* out) {
    if (setjmp(errors_.jump) != 0) return false;
    info_.out_color_space = channels == 1   ? JCS_GRAYSCALE
                            : channels == 3 ? JCS_RGB
                                            : JCS_EXT_RGBA;
    jpeg_start_decompress(&info_);
    const size_t stride = static_cast<size_t>(info_.output_width) * channels;
    while (info_.output_scanline < info_.output_height) {
      JSAMPROW row = out + info_.output_scanline * stride;
      jpeg_read_scanlines(&info_, &row, 1);
    }
    jpeg_finish_decompress(&info_);
    return true;
  }

  jpeg_decompress_struct& info() { return info_; }
  const char* message() const { return errors_.message; }

 private:
  jpeg_decompress_struct info_;
  JpegErrors errors_;
};

absl::Status JpegError(const Jpeg& jpeg) {
  return absl::InvalidArgumentError(
      absl::StrCat("corrupt JPEG: ", jpeg.message()));
}

absl::StatusOr<Image> DecodeJpeg(absl::string_view bytes, int channels) {
  Jpeg jpeg(bytes);
  if (!jpeg.ReadHeader()) return JpegError(jpeg);
  jpeg_decompress_struct& info = jpeg.info();
  const int64_t height = info.image_height, width = info.image_width;
  if (height * width > kMaxImagePixels) return TooLarge(height, width);
  if (info.jpeg_color_space == JCS_CMYK || info.jpeg_color_space == JCS_YCCK) {
    return absl::InvalidArgumentError(
        "a CMYK JPEG: store the images as RGB or greyscale");
  }
  Image image;
  image.height = height;
  image.width = width;
  image.channels = channels;
  image.pixels.resize(static_cast<size_t>(height * width * channels));
  if (!jpeg.Decode(channels, image.pixels.data())) return JpegError(jpeg);
  return image;
}

absl::StatusOr<Image> DecodePng(absl::string_view bytes, int channels) {
  png_image png;
  std::memset(&png, 0, sizeof(png));
  png.version = PNG_IMAGE_VERSION;
  if (!png_image_begin_read_from_memory(&png, bytes.data(), bytes.size())) {
    const absl::Status error =
        absl::InvalidArgumentError(absl::StrCat("corrupt PNG: ", png.message));
    png_image_free(&png);
    return error;
  }
  const int64_t height = png.height, width = png.width;
  if (height * width > kMaxImagePixels) {
    png_image_free(&png);
    return TooLarge(height, width);
  }
  png.format = channels == 1   ? PNG_FORMAT_GRAY
               : channels == 3 ? PNG_FORMAT_RGB
                               : PNG_FORMAT_RGBA;
  Image image;
  image.height = height;
  image.width = width;
  image.channels = channels;
  image.pixels.resize(static_cast<size_t>(height * width * channels));
  // The background of a transparent image flattened to grey or RGB: black.
  png_color black = {0, 0, 0};
  if (!png_image_finish_read(&png, &black, image.pixels.data(), 0, nullptr)) {
    const absl::Status error =
        absl::InvalidArgumentError(absl::StrCat("corrupt PNG: ", png.message));
    png_image_free(&png);
    return error;
  }
  if ((png.warning_or_error & 2) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("corrupt PNG: ", png.message));
  }
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
                                  ImageEncoding encoding, int channels) {
  if (channels != 1 && channels != 3 && channels != 4) {
    return absl::InvalidArgumentError(
        absl::StrCat("an image decodes to 1, 3 or 4 channels, not ", channels));
  }
  absl::StatusOr<ImageEncoding> format = Detect(bytes, encoding);
  if (!format.ok()) return format.status();
  return *format == ImageEncoding::kJpeg ? DecodeJpeg(bytes, channels)
                                         : DecodePng(bytes, channels);
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

}  // namespace lockstep::worker
