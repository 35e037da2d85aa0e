// Decoding tf.train.Example records against feature specs (tf_example.h).
#include "worker/data/tf_example.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/status_macros.h"
#include "common/terminal_text.h"
#include "tensorflow/example.pb.h"
#include "worker/collective/half.h"

// A column is the host's representation of its values, copied as is; the
// format is little-endian, and so must the host be.
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "tf_example.cc writes columns in host byte order");

namespace lockstep::worker {
namespace {

struct DTypeInfo {
  DType dtype;
  const char* name;
  int size;
  bool integer;
  int64_t min;  // integers only
  int64_t max;
};

constexpr int64_t kInt64Min = std::numeric_limits<int64_t>::min();
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

constexpr DTypeInfo kDTypes[] = {
    {DType::kUInt8, "uint8", 1, true, 0, 255},
    {DType::kInt8, "int8", 1, true, -128, 127},
    {DType::kInt16, "int16", 2, true, -32768, 32767},
    {DType::kInt32, "int32", 4, true, -2147483648LL, 2147483647LL},
    {DType::kInt64, "int64", 8, true, kInt64Min, kInt64Max},
    {DType::kUInt16, "uint16", 2, true, 0, 65535},
    {DType::kUInt32, "uint32", 4, true, 0, 4294967295LL},
    {DType::kFloat16, "float16", 2, false, 0, 0},
    {DType::kBFloat16, "bfloat16", 2, false, 0, 0},
    {DType::kFloat32, "float32", 4, false, 0, 0},
    {DType::kFloat64, "float64", 8, false, 0, 0},
    {DType::kBool, "bool", 1, true, 0, 1},
    {DType::kUInt64, "uint64", 8, true, 0, kInt64Max},
};

const DTypeInfo& Info(DType dtype) {
  for (const DTypeInfo& info : kDTypes) {
    if (info.dtype == dtype) return info;
  }
  return kDTypes[0];  // unreachable for a valid enum value
}

// "uint8 [28, 28]": how a spec is named in errors.
std::string Describe(const FeatureSpec& spec) {
  return absl::StrCat("'", TerminalSafe(spec.name), "' (",
                      DTypeName(spec.dtype), " [",
                      absl::StrJoin(spec.shape, ", "), "])");
}

absl::string_view KindName(tfexample::Feature::KindCase kind) {
  switch (kind) {
    case tfexample::Feature::kBytesList:
      return "bytes_list";
    case tfexample::Feature::kFloatList:
      return "float_list";
    case tfexample::Feature::kInt64List:
      return "int64_list";
    default:
      return "no list (an empty Feature)";
  }
}

// Stores `value`, known to be in range, as `dtype` at `out`.
void StoreInteger(DType dtype, int64_t value, char* out) {
  switch (Info(dtype).size) {
    case 1: {
      const auto v = static_cast<uint8_t>(value);
      std::memcpy(out, &v, 1);
      break;
    }
    case 2: {
      const auto v = static_cast<uint16_t>(value);
      std::memcpy(out, &v, 2);
      break;
    }
    case 4: {
      const auto v = static_cast<uint32_t>(value);
      std::memcpy(out, &v, 4);
      break;
    }
    default:
      std::memcpy(out, &value, 8);
  }
}

// One feature decoded into its column; errors say what is wrong, the caller
// says where.
class FeatureDecoder {
 public:
  FeatureDecoder(const FeatureSpec& spec, int64_t elements, char* out,
                 const Augmentation* augment)
      : spec_(spec),
        info_(Info(spec.dtype)),
        elements_(elements),
        out_(out),
        augment_(augment) {}

  absl::Status Decode(const tfexample::Feature& feature) const {
    if (spec_.image) {
      if (feature.kind_case() != tfexample::Feature::kBytesList) {
        return Error(
            absl::StrCat("expected a bytes_list holding one encoded "
                         "image; found ",
                         KindName(feature.kind_case())));
      }
      return FromImage(feature.bytes_list());
    }
    switch (feature.kind_case()) {
      case tfexample::Feature::kInt64List:
        return FromInt64s(feature.int64_list());
      case tfexample::Feature::kFloatList:
        return FromFloats(feature.float_list());
      case tfexample::Feature::kBytesList:
        return FromBytes(feature.bytes_list());
      default:
        return WrongKind(feature.kind_case());
    }
  }

 private:
  absl::Status Error(absl::string_view what) const {
    return absl::InvalidArgumentError(
        absl::StrCat("feature ", Describe(spec_), ": ", what));
  }
  absl::Status WrongKind(tfexample::Feature::KindCase found) const {
    return Error(absl::StrCat(
        "expected ", info_.integer ? "an int64_list" : "a float_list", " of ",
        elements_, " values or a bytes_list holding its ",
        elements_ * info_.size, " raw bytes; found ", KindName(found)));
  }
  absl::Status CheckCount(int found, absl::string_view kind) const {
    if (found == elements_) return absl::OkStatus();
    if (spec_.variable_length && found <= elements_) {
      // Zero-padded past the values it has.
      std::memset(out_ + int64_t{found} * info_.size, 0,
                  static_cast<size_t>((elements_ - found) * info_.size));
      return absl::OkStatus();
    }
    if (spec_.variable_length) {
      return Error(absl::StrCat("holds ", found, " values in its ", kind,
                                ", more than max_len ", elements_));
    }
    return Error(absl::StrCat("expected ", elements_, " values, found ", found,
                              " in its ", kind));
  }

  absl::Status FromInt64s(const tfexample::Int64List& list) const {
    if (!info_.integer) return WrongKind(tfexample::Feature::kInt64List);
    RETURN_IF_ERROR(CheckCount(list.value_size(), "int64_list"));
    for (int i = 0; i < list.value_size(); ++i) {
      int64_t value = 0;
      if (__builtin_add_overflow(list.value(i), spec_.offset, &value) ||
          value < info_.min || value > info_.max) {
        return Error(absl::StrCat(
            "value ", list.value(i), " at position ", i,
            spec_.offset != 0 ? absl::StrCat(" (offset ", spec_.offset, ")")
                              : "",
            " is out of range for ", info_.name, " (", info_.min, "..",
            info_.max, ")"));
      }
      StoreInteger(spec_.dtype, value, out_ + int64_t{i} * info_.size);
    }
    return absl::OkStatus();
  }

  absl::Status FromFloats(const tfexample::FloatList& list) const {
    if (info_.integer) return WrongKind(tfexample::Feature::kFloatList);
    RETURN_IF_ERROR(CheckCount(list.value_size(), "float_list"));
    for (int i = 0; i < list.value_size(); ++i) {
      const float value = list.value(i);
      char* at = out_ + int64_t{i} * info_.size;
      if (spec_.dtype == DType::kFloat32) {
        std::memcpy(at, &value, 4);
        continue;
      }
      if (spec_.dtype == DType::kFloat64) {
        const double wide = value;
        std::memcpy(at, &wide, 8);
        continue;
      }
      const uint16_t bits = spec_.dtype == DType::kFloat16
                                ? FloatToHalf(value)
                                : FloatToBFloat16(value);
      std::memcpy(at, &bits, 2);
    }
    return absl::OkStatus();
  }

  absl::Status FromBytes(const tfexample::BytesList& list) const {
    const int64_t want = elements_ * info_.size;
    if (list.value_size() != 1) {
      return Error(absl::StrCat("expected a bytes_list of one value (", want,
                                " raw bytes), found ", list.value_size(),
                                " values"));
    }
    const std::string& raw = list.value(0);
    if (static_cast<int64_t>(raw.size()) != want) {
      return Error(absl::StrCat("expected ", want, " raw bytes (", elements_,
                                " x ", info_.size, "), found ", raw.size(),
                                " in its bytes_list"));
    }
    std::memcpy(out_, raw.data(), raw.size());
    return absl::OkStatus();
  }

  struct CropWindow {
    int64_t top = 0, left = 0, height = 0, width = 0;
  };

  // An image taken row by row into the column: the declared [H, W] window
  // (centred, or a random crop) of each decoded row, channels first,
  // mirrored when the flip is drawn. needs_resize() when the decoded size
  // is not the one `resize` asks for: nothing was written then.
  template <typename Draw>
  class StreamedImage : public ImageRows {
   public:
    StreamedImage(const FeatureDecoder& decoder, Draw& draw, uint8_t* out)
        : decoder_(decoder), draw_(draw), out_(out) {}

    absl::Status Begin(int64_t height, int64_t width) override {
      const FeatureSpec& spec = decoder_.spec_;
      if (spec.resize_height > 0 &&
          (height != spec.resize_height || width != spec.resize_width)) {
        needs_resize_ = true;
        return absl::CancelledError("resized whole");
      }
      const int64_t h = spec.shape[0], w = spec.shape[1];
      if (height < h || width < w) {
        return absl::InvalidArgumentError(
            absl::StrCat("the image is ", width, "x", height,
                         " (width x height), smaller than the column's ", w,
                         "x", h, "; declare .resize to scale it first"));
      }
      top_ = (height - h) / 2;
      left_ = (width - w) / 2;
      const bool augment = decoder_.augment_ != nullptr;
      if (augment && spec.random_crop) {
        top_ = static_cast<int64_t>(draw_(height - h + 1));
        left_ = static_cast<int64_t>(draw_(width - w + 1));
      }
      mirrored_ = augment && spec.random_flip && draw_(2) == 1;
      return absl::OkStatus();
    }

    void Row(int64_t y, const uint8_t* pixels) override {
      const FeatureSpec& spec = decoder_.spec_;
      const int64_t h = spec.shape[0], w = spec.shape[1];
      if (y < top_ || y >= top_ + h) return;
      const int channels = static_cast<int>(spec.shape[2]);
      // Through a row of planes here (one cache-resident line each), then
      // to the column's planes: stores far apart while the decoder's row
      // is read alias it and stall.
      planes_.resize(static_cast<size_t>(channels * w));
      RowToPlanes(pixels + left_ * channels, channels, w, w, mirrored_,
                  planes_.data());
      for (int c = 0; c < channels; ++c) {
        std::memcpy(out_ + c * h * w + (y - top_) * w, planes_.data() + c * w,
                    static_cast<size_t>(w));
      }
    }

    bool needs_resize() const { return needs_resize_; }

   private:
    const FeatureDecoder& decoder_;
    Draw& draw_;
    uint8_t* const out_;
    std::vector<uint8_t> planes_;
    int64_t top_ = 0, left_ = 0;
    bool mirrored_ = false;
    bool needs_resize_ = false;
  };

  // torchvision's RandomResizedCrop.get_params with lockstep's draws: up
  // to 10 windows of a uniform share of the area in crop_scale and a
  // log-uniform width / height in crop_ratio, the first that fits placed
  // uniformly; else the centre, its ratio clamped to crop_ratio.
  template <typename Draw>
  CropWindow RandomResizedWindow(const Image& image, Draw& draw) const {
    auto uniform = [&draw](double low, double high) {
      const double unit =
          static_cast<double>(draw(uint64_t{1} << 53)) / (uint64_t{1} << 53);
      return low + (high - low) * unit;
    };
    const double area = static_cast<double>(image.height * image.width);
    const double log_low = std::log(spec_.crop_ratio[0]);
    const double log_high = std::log(spec_.crop_ratio[1]);
    for (int attempt = 0; attempt < 10; ++attempt) {
      const double target =
          area * uniform(spec_.crop_scale[0], spec_.crop_scale[1]);
      const double aspect = std::exp(uniform(log_low, log_high));
      const auto w =
          static_cast<int64_t>(std::nearbyint(std::sqrt(target * aspect)));
      const auto h =
          static_cast<int64_t>(std::nearbyint(std::sqrt(target / aspect)));
      if (w > 0 && w <= image.width && h > 0 && h <= image.height) {
        CropWindow window;
        window.height = h;
        window.width = w;
        window.top = static_cast<int64_t>(draw(image.height - h + 1));
        window.left = static_cast<int64_t>(draw(image.width - w + 1));
        return window;
      }
    }
    CropWindow window;
    const double ratio = static_cast<double>(image.width) / image.height;
    window.width = image.width;
    window.height = image.height;
    if (ratio < spec_.crop_ratio[0]) {
      window.height = std::max<int64_t>(
          1, static_cast<int64_t>(
                 std::nearbyint(window.width / spec_.crop_ratio[0])));
    } else if (ratio > spec_.crop_ratio[1]) {
      window.width = std::max<int64_t>(
          1, static_cast<int64_t>(
                 std::nearbyint(window.height * spec_.crop_ratio[1])));
    }
    window.top = (image.height - window.height) / 2;
    window.left = (image.width - window.width) / 2;
    return window;
  }

  absl::Status FromImage(const tfexample::BytesList& list) const {
    if (list.value_size() != 1) {
      return Error(
          absl::StrCat("expected a bytes_list of one encoded image, "
                       "found ",
                       list.value_size(), " values"));
    }
    const int64_t height = spec_.shape[0], width = spec_.shape[1];
    const int channels = static_cast<int>(spec_.shape[2]);
    // The draws: a generator seeded by the sample's key.
    uint64_t state = augment_ != nullptr ? augment_->key : 0;
    auto draw = [&state](uint64_t bound) {
      uint64_t z = (state += 0x9E3779B97F4A7C15ull);
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
      z ^= z >> 31;
      return bound == 0 ? 0 : z % bound;
    };
    if (augment_ == nullptr || !spec_.random_resized_crop) {
      // Without a resize, the rows go straight into the column as they are
      // decoded (cropped, mirrored, channels first): no whole image is
      // held. The crop and flip are drawn as below, in the same order.
      StreamedImage rows(*this, draw, reinterpret_cast<uint8_t*>(out_));
      absl::Status streamed =
          DecodeImageRows(list.value(0), spec_.encoding, channels, rows);
      if (!rows.needs_resize()) {
        return streamed.ok() ? absl::OkStatus() : Error(streamed.message());
      }
      state = augment_ != nullptr ? augment_->key : 0;  // nothing drawn
    }
    absl::StatusOr<Image> decoded =
        DecodeImage(list.value(0), spec_.encoding, channels);
    if (!decoded.ok()) return Error(decoded.status().message());
    Image image = *std::move(decoded);
    auto resize = [this](const Image& from, int64_t h, int64_t w) {
      return spec_.antialias ? ResizeImageAntialias(from, h, w)
                             : ResizeImage(from, h, w);
    };
    if (augment_ != nullptr && spec_.random_resized_crop) {
      const CropWindow window = RandomResizedWindow(image, draw);
      image = resize(CropImage(image, window.top, window.left, window.height,
                               window.width),
                     height, width);
    } else if (spec_.resize_height > 0 &&
               (image.height != spec_.resize_height ||
                image.width != spec_.resize_width)) {
      image = resize(image, spec_.resize_height, spec_.resize_width);
    }
    if (image.height < height || image.width < width) {
      return Error(absl::StrCat("the image is ", image.width, "x", image.height,
                                " (width x height), smaller than the column's ",
                                width, "x", height,
                                "; declare .resize to scale it first"));
    }
    int64_t top = (image.height - height) / 2;
    int64_t left = (image.width - width) / 2;
    if (augment_ != nullptr && spec_.random_crop) {
      top = static_cast<int64_t>(draw(image.height - height + 1));
      left = static_cast<int64_t>(draw(image.width - width + 1));
    }
    if (image.height != height || image.width != width) {
      image = CropImage(image, top, left, height, width);
    }
    if (augment_ != nullptr && spec_.random_flip && draw(2) == 1) {
      FlipImage(&image);
    }
    // Channels first, [C, H, W], as torchvision's ToTensor and the
    // convolutional models take them.
    ToChannelsFirst(image, reinterpret_cast<uint8_t*>(out_));
    return absl::OkStatus();
  }

  const FeatureSpec& spec_;
  const DTypeInfo& info_;
  const int64_t elements_;
  char* const out_;
  const Augmentation* const augment_;
};

// "it has: a, b, c": the names an Example does have, for a missing one.
// Names come from the record: shown safely, few and short.
std::string PresentNames(const tfexample::Features& features) {
  std::vector<std::string> names;
  for (const auto& entry : features.feature()) {
    names.push_back(TerminalSafe(entry.first.substr(0, 64)));
  }
  if (names.empty()) return "it has no features";
  std::sort(names.begin(), names.end());
  constexpr size_t kShown = 10;
  std::string out = absl::StrCat(
      "it has ",
      absl::StrJoin(names.begin(),
                    names.begin() + std::min(names.size(), kShown), ", "));
  if (names.size() > kShown) {
    absl::StrAppend(&out, " and ", names.size() - kShown, " more");
  }
  return out;
}

}  // namespace

int DTypeSize(DType dtype) { return Info(dtype).size; }

absl::string_view DTypeName(DType dtype) { return Info(dtype).name; }

absl::StatusOr<DType> ParseDType(absl::string_view name) {
  std::vector<absl::string_view> names;
  for (const DTypeInfo& info : kDTypes) {
    if (name == info.name) return info.dtype;
    names.push_back(info.name);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown dtype \"", TerminalSafe(name), "\"; use one of ",
                   absl::StrJoin(names, ", ")));
}

absl::StatusOr<ExampleDecoder> ExampleDecoder::Create(
    std::vector<FeatureSpec> specs, uint64_t max_example_bytes) {
  std::vector<int64_t> elements, bytes;
  absl::flat_hash_set<std::string> seen;
  for (const FeatureSpec& spec : specs) {
    if (spec.name.empty()) {
      return absl::InvalidArgumentError("a feature spec has no name");
    }
    if (!seen.insert(spec.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("feature ", Describe(spec), " is listed twice"));
    }
    int64_t count = 1;
    for (int64_t dim : spec.shape) {
      // Divided, not multiplied: count * dim could pass 64 bits.
      if (dim < 0 || (dim > 0 && count > kMaxFeatureBytes / dim)) {
        return absl::InvalidArgumentError(
            absl::StrCat("feature ", Describe(spec),
                         ": each dimension must be >= 0 and "
                         "the column at most ",
                         kMaxFeatureBytes, " bytes"));
      }
      count *= dim;
    }
    if (count * DTypeSize(spec.dtype) > kMaxFeatureBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("feature ", Describe(spec), " is more than ",
                       kMaxFeatureBytes, " bytes per sample"));
    }
    if (spec.image &&
        (spec.dtype != DType::kUInt8 || spec.shape.size() != 3 ||
         (spec.shape[2] != 1 && spec.shape[2] != 3 && spec.shape[2] != 4) ||
         spec.shape[0] < 1 || spec.shape[1] < 1 ||
         (spec.resize_height > 0 && (spec.resize_height < spec.shape[0] ||
                                     spec.resize_width < spec.shape[1])))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "feature ", Describe(spec),
          ": an encoded image decodes into uint8 [H, W, C], C 1, 3 or 4, "
          "resized (if at all) to at least [H, W]"));
    }
    if (spec.variable_length && spec.shape.size() != 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "feature ", Describe(spec), ": a variable-length list is [max_len]"));
    }
    elements.push_back(count);
    bytes.push_back(count * DTypeSize(spec.dtype));
  }
  return ExampleDecoder(std::move(specs), std::move(elements), std::move(bytes),
                        max_example_bytes);
}

ExampleDecoder::ExampleDecoder(std::vector<FeatureSpec> specs,
                               std::vector<int64_t> elements,
                               std::vector<int64_t> bytes,
                               uint64_t max_example_bytes)
    : specs_(std::move(specs)),
      elements_(std::move(elements)),
      bytes_(std::move(bytes)),
      max_example_bytes_(max_example_bytes) {}

absl::Status ExampleDecoder::Decode(absl::string_view example,
                                    absl::Span<const absl::Span<char>> outputs,
                                    absl::string_view origin,
                                    const Augmentation* augment) const {
  const std::string where = origin.empty() ? "" : absl::StrCat(origin, ": ");
  if (outputs.size() != specs_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, outputs.size(), " output columns for ",
                     specs_.size(), " feature specs"));
  }
  for (size_t k = 0; k < specs_.size(); ++k) {
    if (static_cast<int64_t>(outputs[k].size()) != bytes_[k]) {
      return absl::InvalidArgumentError(
          absl::StrCat(where, "the output for feature ", Describe(specs_[k]),
                       " is ", outputs[k].size(), " bytes, not ", bytes_[k]));
    }
  }
  // Parsing costs memory in proportion to the bytes; the bound comes first.
  const uint64_t bound =
      std::min<uint64_t>(max_example_bytes_, std::numeric_limits<int>::max());
  if (example.size() > bound) {
    return absl::InvalidArgumentError(
        absl::StrCat(where, "the Example is ", example.size(),
                     " bytes, more than the bound of ", bound));
  }
  tfexample::Example parsed;
  if (!parsed.ParseFromArray(example.data(),
                             static_cast<int>(example.size()))) {
    return absl::DataLossError(
        absl::StrCat(where, "its ", example.size(),
                     " bytes do not parse as a tf.train.Example"));
  }
  const auto& features = parsed.features().feature();
  for (size_t k = 0; k < specs_.size(); ++k) {
    const FeatureSpec& spec = specs_[k];
    auto it = features.find(spec.key.empty() ? spec.name : spec.key);
    if (it == features.end()) {
      if (spec.optional) {
        std::memset(outputs[k].data(), 0, outputs[k].size());
        continue;
      }
      return absl::InvalidArgumentError(absl::StrCat(
          where, "feature ", Describe(spec),
          spec.key.empty()
              ? ""
              : absl::StrCat(" (read from '", TerminalSafe(spec.key), "')"),
          " is missing; ", PresentNames(parsed.features())));
    }
    FeatureDecoder decoder(spec, elements_[k], outputs[k].data(), augment);
    absl::Status status = decoder.Decode(it->second);
    if (!status.ok()) {
      return absl::Status(status.code(), absl::StrCat(where, status.message()));
    }
  }
  return absl::OkStatus();
}

absl::Status DecodeExample(absl::string_view example,
                           const std::vector<FeatureSpec>& specs,
                           absl::Span<const absl::Span<char>> outputs) {
  ASSIGN_OR_RETURN(ExampleDecoder decoder, ExampleDecoder::Create(specs));
  return decoder.Decode(example, outputs);
}

}  // namespace lockstep::worker
