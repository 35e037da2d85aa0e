// Fuzz target: encoded images as a TFRecord feature holds them. The input's
// first byte picks the channels (1, 3 or 4) and whether to resize, crop
// and flip; the rest is the JPEG or PNG. Whatever decodes must hold exactly
// height x width x channels bytes within the pixel bound, and the
// augmentations must keep their shapes.
#include <cstddef>
#include <cstdint>

#include "tests/fuzz/fuzz_files.h"
#include "worker/data/image_decode.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using lockstep::fuzz::Check;
  using namespace lockstep::worker;
  if (size < 1) return 0;
  const int channels = (data[0] & 3) == 0 ? 1 : (data[0] & 3) == 1 ? 3 : 4;
  absl::string_view bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  auto info = ReadImageInfo(bytes);
  auto image = DecodeImage(bytes, ImageEncoding::kAuto, channels);
  if (!image.ok()) return 0;
  Check(info.ok(), "an image decodes but its header does not read");
  Check(image->height > 0 && image->width > 0, "an empty image decoded");
  Check(image->height * image->width <= kMaxImagePixels,
        "an image above the pixel bound decoded");
  Check(static_cast<int64_t>(image->pixels.size()) ==
            image->height * image->width * channels,
        "decoded pixels differ from height x width x channels");
  if (image->height * image->width > (1 << 16)) return 0;
  Image out = *image;
  if (data[0] & 4) {
    out = ResizeImage(out, 1 + data[0] % 7, 1 + (data[0] >> 3) % 7);
    Check(static_cast<int64_t>(out.pixels.size()) ==
              out.height * out.width * channels,
          "a resized image has the wrong size");
  }
  if (data[0] & 8) {
    const int64_t h = (out.height + 1) / 2, w = (out.width + 1) / 2;
    out = CropImage(out, out.height - h, out.width - w, h, w);
    Check(out.height == h && out.width == w, "a crop has the wrong shape");
  }
  if (data[0] & 16) FlipImage(&out);
  return 0;
}
