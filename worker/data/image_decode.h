// Encoded images (JPEG through libjpeg-turbo, PNG through libpng) decoded
// into uint8 [H, W, C] pixels, and the augmentations a data set may declare
// (resize, random crop, random horizontal flip), as TFRecord features hold
// them (README.md, "Bringing your own data").
//
// The bytes are untrusted: the header is read first and an image above
// kMaxImagePixels is refused before anything is allocated for it; a
// corrupt or truncated image is an error (InvalidArgument, the caller says
// which file and record), never a crash. libjpeg's warnings about
// recoverable damage are errors too, and libpng's except those about an
// ancillary chunk (a bad colour profile): a half-grey picture is not data.
//
// Thread-safe: every call has its own decoder state.
#ifndef LOCKSTEP_WORKER_DATA_IMAGE_DECODE_H_
#define LOCKSTEP_WORKER_DATA_IMAGE_DECODE_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"

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

// The memory a worker's decode threads may hold at once for images: each
// decode reserves what the header says it will take (the pixels, and
// libjpeg's buffers: a progressive JPEG keeps every coefficient) before it
// allocates, and waits while others hold the rest; an image that alone
// needs more is refused. A few-KB file can declare 64 Mpixel, 256 MB of
// output, times the decode threads.
//
// Thread-safe.
inline constexpr int64_t kDefaultDecodeBudget = int64_t{1} << 30;  // 1 GiB

class DecodeBudget {
 public:
  explicit DecodeBudget(int64_t bytes);
  // The process's, of kDefaultDecodeBudget: what DecodeImage uses.
  static DecodeBudget& Default();

  // Bytes held until it is destroyed.
  class Reservation {
   public:
    Reservation(Reservation&& other) noexcept;
    Reservation& operator=(Reservation&&) = delete;
    ~Reservation();

   private:
    friend class DecodeBudget;
    Reservation(DecodeBudget* budget, int64_t bytes);
    DecodeBudget* budget_;
    int64_t bytes_;
  };

  // Waits until `bytes` fit beside what others hold. ResourceExhausted,
  // naming the image's size, when they exceed the whole budget.
  absl::StatusOr<Reservation> Reserve(int64_t bytes, int64_t height,
                                      int64_t width);
  // What reservations hold now.
  int64_t held() const;

 private:
  void Release(int64_t bytes);

  const int64_t bytes_;
  mutable absl::Mutex mu_;
  absl::CondVar released_;
  int64_t held_ ABSL_GUARDED_BY(mu_) = 0;
};

// Decodes `bytes` (of `encoding`; kAuto: by its signature) into `channels`
// channels, as Pillow's Image.open(...).convert() gives them: 1 (grey; from
// colour by ITU-R 601-2 luma), 3 (RGB; alpha dropped) or 4 (RGBA; opaque
// where the image has no alpha). libjpeg's defaults (islow DCT, fancy
// upsampling) as Pillow uses them, so a baseline JPEG decodes to the same
// pixels as PIL.Image.open. A 16-bit PNG is scaled to 8 bits by v / 257
// rounded (TensorFlow's decode_png to uint8, OpenCV). A JPEG of more than
// 1000 scans is refused. Memory comes from `budget`.
absl::StatusOr<Image> DecodeImage(
    absl::string_view bytes, ImageEncoding encoding, int channels,
    DecodeBudget& budget = DecodeBudget::Default());

// Where DecodeImageRows hands an image: its size, then its rows.
class ImageRows {
 public:
  virtual ~ImageRows() = default;
  // The decoded size, before any pixel is decompressed; an error stops
  // the decode and is DecodeImageRows's.
  virtual absl::Status Begin(int64_t height, int64_t width) = 0;
  // Row y (0 to height - 1, in order) of width x channels pixels, valid
  // during the call.
  virtual void Row(int64_t y, const uint8_t* pixels) = 0;
};

// DecodeImage's pixels row by row, without holding the whole image (a
// JPEG; a PNG is decoded whole, then handed over): for a caller that crops,
// flips and lays out the rows as they come.
absl::Status DecodeImageRows(absl::string_view bytes, ImageEncoding encoding,
                             int channels, ImageRows& sink,
                             DecodeBudget& budget = DecodeBudget::Default());

// Bilinear resize to `height` x `width` (pixel centres aligned, as
// OpenCV's INTER_LINEAR and TensorFlow's half_pixel_centers).
Image ResizeImage(const Image& image, int64_t height, int64_t width);

// PIL's Image.resize(..., BILINEAR) (what torchvision does to a PIL image):
// a triangle filter widened by the scale when shrinking (antialiased),
// weights in 22-bit fixed point, rows then columns, each pass rounded to
// 8 bits, so the pixels of grey and RGB images are PIL's. (PIL resizes
// RGBA premultiplied by alpha; this resizes the four channels alike, so a
// translucent RGBA image differs from PIL's.)
Image ResizeImageAntialias(const Image& image, int64_t height, int64_t width);

// The `height` x `width` window at (top, left); it must lie inside.
Image CropImage(const Image& image, int64_t top, int64_t left, int64_t height,
                int64_t width);

// Mirrored left to right.
void FlipImage(Image* image);

// The pixels channels first, [C, H, W] (torchvision's ToTensor layout),
// into `out` (height * width * channels bytes). RGB is deinterleaved 16
// pixels at a time with SSSE3 where the CPU has it.
void ToChannelsFirst(const Image& image, uint8_t* out);
// One row of `width` interleaved pixels into row 0 of each of `channels`
// planes `plane` bytes apart at `out`, mirrored if asked.
void RowToPlanes(const uint8_t* row, int channels, int64_t width, int64_t plane,
                 bool mirrored, uint8_t* out);

}  // namespace lockstep::worker

#endif  // LOCKSTEP_WORKER_DATA_IMAGE_DECODE_H_
