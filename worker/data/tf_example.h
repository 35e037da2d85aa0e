// Decoding tf.train.Example records (as stored in TFRecord files) into
// fixed-shape columns, without TensorFlow: proto/tensorflow/example.proto is
// wire-compatible with TensorFlow's. Each feature of a FeatureSpec is looked
// up by name and must hold exactly the spec's element count:
//
//   int64_list  -> an integer dtype; each value range-checked into it
//   float_list  -> float32, or float16 / bfloat16 (rounded to nearest even;
//                  beyond their range, infinity)
//   bytes_list  -> any dtype, when it holds one value: the column's raw
//                  little-endian bytes (tf.io.serialize_tensor's payload,
//                  numpy's tobytes()), exactly elements x dtype size of them;
//                  or an encoded JPEG/PNG image (FeatureSpec::image)
//
// A variable-length feature holds up to its column's elements, and an
// optional one may be missing; features the spec does not list are
// ignored.
//
// A record is untrusted bytes: it is refused above a size bound before it is
// parsed, and every mismatch is an InvalidArgument error naming the record
// (the caller's `origin`), the feature, what the spec expects and what the
// record holds:
//
//   "train-00000.tfrecord record 17: feature 'label' (uint8 []): value 300
//    at position 0 is out of range for uint8 (0..255)"
//
// Bytes that do not parse as an Example are DataLoss.
#ifndef LOCKSTEP_WORKER_DATA_TF_EXAMPLE_H_
#define LOCKSTEP_WORKER_DATA_TF_EXAMPLE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/dtype.h"
#include "worker/data/image_decode.h"
#include "worker/data/tfrecord.h"

namespace lockstep::worker {

// The element types a column can have (common/dtype.h); each is stored
// little-endian.
using DType = ::lockstep::Dtype;

// Bytes per element: 1, 2, 4 or 8.
int DTypeSize(DType dtype);
// "uint8", "int8", ..., "float16", "bfloat16", "float32".
absl::string_view DTypeName(DType dtype);
// The inverse of DTypeName; InvalidArgument listing the names otherwise.
absl::StatusOr<DType> ParseDType(absl::string_view name);

// One column of a sample: the feature `name` (or `key` in the record),
// decoded to `dtype` with `shape` (row-major; empty for a scalar).
struct FeatureSpec {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  std::string key;  // the record's name for it; empty: `name`
  // A record without the feature: zeros, not an error.
  bool optional = false;
  // A list of up to shape[0] numbers, zero-padded.
  bool variable_length = false;
  // An encoded image in a bytes_list, decoded (image_decode.h) into the
  // [H, W, C] of `shape`: resized to resize_height x resize_width first
  // when they are set, then cropped to [H, W] (centred; at random with
  // random_crop under an Augmentation), flipped half of the time with
  // random_flip under one; written channels first, uint8 [C, H, W], as
  // torchvision's ToTensor lays an image out.
  bool image = false;
  ImageEncoding encoding = ImageEncoding::kAuto;
  int64_t resize_height = 0;
  int64_t resize_width = 0;
  bool random_crop = false;
  bool random_flip = false;
  // PIL's antialiased bilinear for every resize (ResizeImageAntialias).
  bool antialias = false;
  // Under an Augmentation, torchvision's RandomResizedCrop in place of the
  // resize and the random crop: a window of crop_scale of the image's area
  // and crop_ratio width / height, scaled to [H, W].
  bool random_resized_crop = false;
  double crop_scale[2] = {0.08, 1.0};
  double crop_ratio[2] = {3.0 / 4.0, 4.0 / 3.0};
  // Integer features: added to every value.
  int64_t offset = 0;
};

// The draws of one sample's random augmentations: a function of (seed,
// epoch, sample) so that they do not depend on the world size.
struct Augmentation {
  uint64_t key = 0;
};

// The largest column a spec may declare, per sample.
inline constexpr int64_t kMaxFeatureBytes = int64_t{1} << 30;

// Decodes serialized Examples against a fixed list of specs, checked once.
// Immutable after Create; Decode is const and thread-safe.
class ExampleDecoder {
 public:
  // InvalidArgument for an empty or repeated name, a negative dimension or
  // a column above kMaxFeatureBytes. An Example above `max_example_bytes`
  // is refused by Decode.
  static absl::StatusOr<ExampleDecoder> Create(
      std::vector<FeatureSpec> specs,
      uint64_t max_example_bytes = kMaxTfRecordBytes);

  const std::vector<FeatureSpec>& specs() const { return specs_; }
  // Elements and bytes of column k for one sample.
  int64_t column_elements(size_t k) const { return elements_[k]; }
  int64_t column_bytes(size_t k) const { return bytes_[k]; }

  // Decodes `example` (a serialized tf.train.Example) and writes column k's
  // bytes to outputs[k], which must be exactly column_bytes(k) long. On
  // error the outputs hold partial data. `origin` ("file record 17") starts
  // every error message.
  // `augment`: the sample's random augmentations (null: none, images are
  // centre-cropped).
  absl::Status Decode(absl::string_view example,
                      absl::Span<const absl::Span<char>> outputs,
                      absl::string_view origin = "",
                      const Augmentation* augment = nullptr) const;

 private:
  ExampleDecoder(std::vector<FeatureSpec> specs, std::vector<int64_t> elements,
                 std::vector<int64_t> bytes, uint64_t max_example_bytes);

  std::vector<FeatureSpec> specs_;
  std::vector<int64_t> elements_;
  std::vector<int64_t> bytes_;
  uint64_t max_example_bytes_;
};

// ExampleDecoder::Create(specs) then Decode, for one-off use.
absl::Status DecodeExample(absl::string_view example,
                           const std::vector<FeatureSpec>& specs,
                           absl::Span<const absl::Span<char>> outputs);

}  // namespace lockstep::worker

#endif  // LOCKSTEP_WORKER_DATA_TF_EXAMPLE_H_
