// Encoded images (JPEG through libjpeg-turbo, PNG through libpng) decoded
// into uint8 [H, W, C] pixels, and the augmentations a data set may declare
// (resize, random crop, random horizontal flip), as TFRecord features hold
// them (README.md, "Bringing your own data").
//
// The bytes are untrusted: the header is read first and an image above
// kMaxImagePixels is refused before anything is allocated for it; a
// corrupt or truncated image is an error (InvalidArgument, the caller says
// which file and record), never a crash. libjpeg's and libpng's warnings
// about recoverable damage are errors too: a half-grey picture is not data.
//
// Thread-safe: every call has its own decoder state.
#ifndef LOCKSTEP_WORKER_DATA_IMAGE_DECODE_H_
#define LOCKSTEP_WORKER_DATA_IMAGE_DECODE_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace lockstep::worker {

inline constexpr int64_t kMaxImagePixels = int64_t{1} << 26;  // 64 Mpixel

enum class ImageEncoding { kAuto, kJpeg, kPng };

// "jpeg", "png", "auto": nullopt-free parse for the job spec's names.
bool ParseImageEncoding(absl::string_view name, ImageEncoding* out);
const char* ImageEncodingName(ImageEncoding encoding);

struct Image {
  int64_t height = 0;
  int64_t width = 0;
  int64_t channels = 0;
  std::vector<uint8_t> pixels;  // [height, width, channels], row-major
};

// What the header says, without decoding: for `lockstep data inspect`.
struct ImageInfo {
  ImageEncoding format = ImageEncoding::kAuto;  // kJpeg or kPng
  int64_t height = 0;
  int64_t width = 0;
  int64_t channels = 0;  // as stored: 1 (grey), 2 (grey + alpha), 3, 4
};
absl::StatusOr<ImageInfo> ReadImageInfo(absl::string_view bytes);

// Decodes `bytes` (of `encoding`; kAuto: by its signature) into `channels`
// channels: 1 (grey), 3 (RGB) or 4 (RGBA; JPEG gets an opaque alpha).
// libjpeg's defaults (islow DCT, fancy upsampling) as Pillow uses them,
// so a baseline JPEG decodes to the same pixels as PIL.Image.open.
absl::StatusOr<Image> DecodeImage(absl::string_view bytes,
                                  ImageEncoding encoding, int channels);

// Bilinear resize to `height` x `width` (pixel centres aligned, as
// OpenCV's INTER_LINEAR and TensorFlow's half_pixel_centers).
Image ResizeImage(const Image& image, int64_t height, int64_t width);

// The `height` x `width` window at (top, left); it must lie inside.
Image CropImage(const Image& image, int64_t top, int64_t left, int64_t height,
                int64_t width);

// Mirrored left to right.
void FlipImage(Image* image);

}  // namespace lockstep::worker

#endif  // LOCKSTEP_WORKER_DATA_IMAGE_DECODE_H_
