// tf.train.Example decoding against feature specs: every dtype from each
// kind of list, and every mismatch an error naming the feature, what was
// expected and what was found.
#include "worker/data/tf_example.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <png.h>

#include <cstring>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tensorflow/example.pb.h"

namespace lockstep::worker {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;

tfexample::Feature Int64s(const std::vector<int64_t>& values) {
  tfexample::Feature f;
  for (int64_t v : values) f.mutable_int64_list()->add_value(v);
  if (values.empty()) f.mutable_int64_list();
  return f;
}

tfexample::Feature Floats(const std::vector<float>& values) {
  tfexample::Feature f;
  for (float v : values) f.mutable_float_list()->add_value(v);
  if (values.empty()) f.mutable_float_list();
  return f;
}

tfexample::Feature Bytes(const std::vector<std::string>& values) {
  tfexample::Feature f;
  for (const std::string& v : values) f.mutable_bytes_list()->add_value(v);
  if (values.empty()) f.mutable_bytes_list();
  return f;
}

std::string ExampleOf(
    const std::vector<std::pair<std::string, tfexample::Feature>>& features) {
  tfexample::Example example;
  auto* map = example.mutable_features()->mutable_feature();
  for (const auto& [name, feature] : features) (*map)[name] = feature;
  return example.SerializeAsString();
}

// Decodes the one feature "f" of `feature` as `dtype` with `shape`.
absl::StatusOr<std::string> DecodeOne(const tfexample::Feature& feature,
                                      DType dtype, std::vector<int64_t> shape) {
  FeatureSpec spec{"f", dtype, std::move(shape)};
  auto decoder = ExampleDecoder::Create({spec});
  if (!decoder.ok()) return decoder.status();
  std::string out(static_cast<size_t>(decoder->column_bytes(0)), '\0');
  std::vector<absl::Span<char>> outputs = {absl::MakeSpan(out)};
  absl::Status status = decoder->Decode(ExampleOf({{"f", feature}}), outputs);
  if (!status.ok()) return status;
  return out;
}

template <typename T>
std::vector<T> As(const std::string& bytes) {
  std::vector<T> out(bytes.size() / sizeof(T));
  std::memcpy(out.data(), bytes.data(), out.size() * sizeof(T));
  return out;
}

// Each integer dtype's extremes from an int64_list, and raw bytes of it.
template <typename T>
void ExpectIntegers(DType dtype) {
  const std::vector<int64_t> values = {std::numeric_limits<T>::min(),
                                       std::numeric_limits<T>::max(), 1, 0};
  auto out = DecodeOne(Int64s(values), dtype, {2, 2});
  ASSERT_TRUE(out.ok()) << DTypeName(dtype) << ": " << out.status();
  const std::vector<T> expected(values.begin(), values.end());
  EXPECT_EQ(As<T>(*out), expected) << DTypeName(dtype);
  std::string raw(reinterpret_cast<const char*>(expected.data()),
                  expected.size() * sizeof(T));
  auto from_bytes = DecodeOne(Bytes({raw}), dtype, {4});
  ASSERT_TRUE(from_bytes.ok()) << from_bytes.status();
  EXPECT_EQ(*from_bytes, raw);
}

TEST(TfExampleTest, DTypeNamesAndSizes) {
  const std::vector<std::pair<DType, int>> all = {
      {DType::kUInt8, 1},  {DType::kInt8, 1},    {DType::kInt16, 2},
      {DType::kInt32, 4},  {DType::kInt64, 8},   {DType::kUInt16, 2},
      {DType::kUInt32, 4}, {DType::kFloat16, 2}, {DType::kBFloat16, 2},
      {DType::kFloat32, 4}};
  for (const auto& [dtype, size] : all) {
    EXPECT_EQ(DTypeSize(dtype), size);
    EXPECT_EQ(*ParseDType(DTypeName(dtype)), dtype);
  }
  auto unknown = ParseDType("complex64");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(unknown.status().message(),
              AllOf(HasSubstr("float64"), HasSubstr("bfloat16")));
}

TEST(TfExampleTest, EveryIntegerDTypeFromInt64ListAndRawBytes) {
  ExpectIntegers<uint8_t>(DType::kUInt8);
  ExpectIntegers<int8_t>(DType::kInt8);
  ExpectIntegers<int16_t>(DType::kInt16);
  ExpectIntegers<int32_t>(DType::kInt32);
  ExpectIntegers<int64_t>(DType::kInt64);
  ExpectIntegers<uint16_t>(DType::kUInt16);
  ExpectIntegers<uint32_t>(DType::kUInt32);
}

TEST(TfExampleTest, OutOfRangeIntegersNameFeatureValueAndRange) {
  const std::vector<std::pair<DType, std::pair<int64_t, int64_t>>> ranges = {
      {DType::kUInt8, {0, 255}},
      {DType::kInt8, {-128, 127}},
      {DType::kInt16, {-32768, 32767}},
      {DType::kUInt16, {0, 65535}},
      {DType::kInt32, {-2147483648LL, 2147483647LL}},
      {DType::kUInt32, {0, 4294967295LL}}};
  for (const auto& [dtype, range] : ranges) {
    for (int64_t bad : {range.first - 1, range.second + 1}) {
      auto out = DecodeOne(Int64s({0, bad}), dtype, {2});
      EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
      EXPECT_THAT(
          out.status().message(),
          AllOf(HasSubstr(
                    absl::StrCat("feature 'f' (", DTypeName(dtype), " [2])")),
                HasSubstr(absl::StrCat("value ", bad, " at position 1")),
                HasSubstr(absl::StrCat("out of range for ", DTypeName(dtype),
                                       " (", range.first, "..", range.second,
                                       ")"))));
    }
  }
}

TEST(TfExampleTest, FloatDTypesFromFloatList) {
  auto f32 = DecodeOne(Floats({1.5f, -2.0f, 3.25e10f}), DType::kFloat32, {3});
  ASSERT_TRUE(f32.ok()) << f32.status();
  EXPECT_EQ(As<float>(*f32), (std::vector<float>{1.5f, -2.0f, 3.25e10f}));
  // Rounded to nearest even; beyond float16's range, infinity.
  auto f16 =
      DecodeOne(Floats({1.5f, -2.0f, 65504.0f, 1e6f}), DType::kFloat16, {4});
  ASSERT_TRUE(f16.ok()) << f16.status();
  EXPECT_EQ(As<uint16_t>(*f16),
            (std::vector<uint16_t>{0x3E00, 0xC000, 0x7BFF, 0x7C00}));
  auto bf16 = DecodeOne(Floats({1.5f, -2.0f, 1e6f}), DType::kBFloat16, {3});
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  EXPECT_EQ(As<uint16_t>(*bf16),
            (std::vector<uint16_t>{0x3FC0, 0xC000, 0x4974}));
  for (DType dtype : {DType::kFloat16, DType::kBFloat16, DType::kFloat32}) {
    std::string raw(static_cast<size_t>(DTypeSize(dtype)) * 6, '\x3c');
    auto out = DecodeOne(Bytes({raw}), dtype, {2, 3});
    ASSERT_TRUE(out.ok()) << out.status();
    EXPECT_EQ(*out, raw);
  }
}

TEST(TfExampleTest, ScalarsAndEmptyShapes) {
  auto scalar = DecodeOne(Int64s({42}), DType::kInt64, {});
  ASSERT_TRUE(scalar.ok());
  EXPECT_EQ(As<int64_t>(*scalar), (std::vector<int64_t>{42}));
  EXPECT_TRUE(DecodeOne(Floats({}), DType::kFloat32, {0, 5}).ok());
  EXPECT_TRUE(DecodeOne(Bytes({""}), DType::kInt16, {0}).ok());
}

TEST(TfExampleTest, WrongKindSaysWhatWasExpectedAndFound) {
  auto floats_for_int = DecodeOne(Floats({1, 2, 3, 4}), DType::kInt32, {2, 2});
  EXPECT_EQ(floats_for_int.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(floats_for_int.status().message(),
              AllOf(HasSubstr("feature 'f' (int32 [2, 2])"),
                    HasSubstr("expected an int64_list of 4 values or a "
                              "bytes_list holding its 16 raw bytes"),
                    HasSubstr("found float_list")));
  auto ints_for_float = DecodeOne(Int64s({1, 2}), DType::kFloat32, {2});
  EXPECT_THAT(ints_for_float.status().message(),
              AllOf(HasSubstr("expected a float_list of 2 values"),
                    HasSubstr("found int64_list")));
  auto nothing = DecodeOne(tfexample::Feature(), DType::kUInt8, {1});
  EXPECT_THAT(nothing.status().message(), HasSubstr("found no list"));
}

TEST(TfExampleTest, WrongCountSaysBoth) {
  auto ints = DecodeOne(Int64s({1, 2, 3}), DType::kUInt8, {2, 2});
  EXPECT_EQ(ints.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(ints.status().message(),
              AllOf(HasSubstr("feature 'f' (uint8 [2, 2])"),
                    HasSubstr("expected 4 values, found 3 in its int64_list")));
  auto floats = DecodeOne(Floats({1, 2, 3, 4, 5}), DType::kBFloat16, {4});
  EXPECT_THAT(floats.status().message(),
              HasSubstr("expected 4 values, found 5 in its float_list"));
}

TEST(TfExampleTest, WrongByteSizeSaysBoth) {
  auto short_bytes =
      DecodeOne(Bytes({std::string(15, 'x')}), DType::kFloat32, {2, 2});
  EXPECT_EQ(short_bytes.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(short_bytes.status().message(),
              AllOf(HasSubstr("feature 'f' (float32 [2, 2])"),
                    HasSubstr("expected 16 raw bytes (4 x 4), found 15")));
  auto two = DecodeOne(Bytes({"ab", "cd"}), DType::kUInt8, {4});
  EXPECT_THAT(two.status().message(),
              HasSubstr("expected a bytes_list of one value (4 raw bytes), "
                        "found 2 values"));
  EXPECT_FALSE(DecodeOne(Bytes({}), DType::kUInt8, {4}).ok());
}

TEST(TfExampleTest, ColumnsGoContiguouslyIntoCallerMemory) {
  auto decoder = ExampleDecoder::Create(
      {{"image", DType::kUInt8, {2, 3}}, {"label", DType::kInt64, {}}});
  ASSERT_TRUE(decoder.ok());
  EXPECT_EQ(decoder->column_bytes(0), 6);
  EXPECT_EQ(decoder->column_bytes(1), 8);
  // A batch of two samples, each column's rows one after another.
  std::string images(12, '\0'), labels(16, '\0');
  for (int s = 0; s < 2; ++s) {
    const std::string example = ExampleOf(
        {{"image", Bytes({std::string(6, static_cast<char>('a' + s))})},
         {"label", Int64s({s + 5})},
         {"ignored", Floats({1})}});
    std::vector<absl::Span<char>> outputs = {
        absl::MakeSpan(images).subspan(static_cast<size_t>(6 * s), 6),
        absl::MakeSpan(labels).subspan(static_cast<size_t>(8 * s), 8)};
    ASSERT_TRUE(decoder->Decode(example, outputs).ok());
  }
  EXPECT_EQ(images, "aaaaaabbbbbb");
  EXPECT_EQ(As<int64_t>(labels), (std::vector<int64_t>{5, 6}));
}

// Bytes built by hand from the protobuf wire format (as TensorFlow writes an
// Example): {"label": int64_list [7], "x": float_list [1.5, -2],
// "raw": bytes_list ["\x01\x02"]}.
TEST(TfExampleTest, DecodesHandEncodedWireBytes) {
  const std::string wire(
      "\x0a\x32\x0a\x0e\x0a\x05\x6c\x61\x62\x65\x6c\x12\x05\x1a\x03\x0a\x01"
      "\x07\x0a\x11\x0a\x01\x78\x12\x0c\x12\x0a\x0a\x08\x00\x00\xc0\x3f\x00"
      "\x00\x00\xc0\x0a\x0d\x0a\x03\x72\x61\x77\x12\x06\x0a\x04\x0a\x02\x01"
      "\x02",
      52);
  std::string label(8, '\0'), x(8, '\0'), raw(2, '\0');
  std::vector<absl::Span<char>> outputs = {
      absl::MakeSpan(label), absl::MakeSpan(x), absl::MakeSpan(raw)};
  absl::Status status = DecodeExample(wire,
                                      {{"label", DType::kInt64, {}},
                                       {"x", DType::kFloat32, {2}},
                                       {"raw", DType::kUInt8, {2}}},
                                      outputs);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(As<int64_t>(label), (std::vector<int64_t>{7}));
  EXPECT_EQ(As<float>(x), (std::vector<float>{1.5f, -2.0f}));
  EXPECT_EQ(raw, "\x01\x02");
}

TEST(TfExampleTest, MissingFeatureListsWhatThereIs) {
  auto decoder = ExampleDecoder::Create({{"label", DType::kInt64, {}}});
  std::string out(8, '\0');
  std::vector<absl::Span<char>> outputs = {absl::MakeSpan(out)};
  absl::Status status = decoder->Decode(
      ExampleOf({{"b", Int64s({1})}, {"a\x1b[2J", Int64s({1})}}), outputs,
      "train.tfrecord record 3");
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(status.message()),
              AllOf(StartsWith("train.tfrecord record 3: "),
                    HasSubstr("feature 'label' (int64 []) is missing"),
                    HasSubstr("it has a\\x1b[2J, b")));
}

// TensorFlow's parser takes any bytes as a feature name, so this one does
// (proto/tensorflow/example.proto is proto2 for that).
TEST(TfExampleTest, NamesNeedNotBeUtf8) {
  const std::string name = "\xff\xfe-label";
  auto decoder = ExampleDecoder::Create({{name, DType::kInt32, {}}});
  ASSERT_TRUE(decoder.ok());
  std::string out(4, '\0');
  std::vector<absl::Span<char>> outputs = {absl::MakeSpan(out)};
  absl::Status status =
      decoder->Decode(ExampleOf({{name, Int64s({-3})}}), outputs);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(As<int32_t>(out), (std::vector<int32_t>{-3}));
}

TEST(TfExampleTest, UnparseableOrOversizedRecordsAreRefused) {
  auto decoder = ExampleDecoder::Create({{"f", DType::kUInt8, {1}}}, 64);
  ASSERT_TRUE(decoder.ok());
  std::string out(1, '\0');
  std::vector<absl::Span<char>> outputs = {absl::MakeSpan(out)};
  const std::string good = ExampleOf({{"f", Int64s({1})}});
  EXPECT_TRUE(decoder->Decode(good, outputs).ok());
  EXPECT_EQ(decoder->Decode(good.substr(0, good.size() - 1), outputs).code(),
            absl::StatusCode::kDataLoss);
  EXPECT_EQ(decoder->Decode("\xff\xff\xff\xff", outputs).code(),
            absl::StatusCode::kDataLoss);
  absl::Status big = decoder->Decode(
      ExampleOf({{"f", Int64s({1})}, {"pad", Bytes({std::string(100, 'p')})}}),
      outputs);
  EXPECT_EQ(big.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(big.message(), HasSubstr("bound of 64"));
}

TEST(TfExampleTest, BadSpecsAndOutputsAreRefused) {
  EXPECT_FALSE(ExampleDecoder::Create({{"", DType::kUInt8, {1}}}).ok());
  auto twice = ExampleDecoder::Create(
      {{"a", DType::kUInt8, {1}}, {"a", DType::kInt8, {1}}});
  EXPECT_THAT(twice.status().message(), HasSubstr("listed twice"));
  EXPECT_FALSE(ExampleDecoder::Create({{"a", DType::kUInt8, {-1}}}).ok());
  EXPECT_FALSE(
      ExampleDecoder::Create({{"a", DType::kFloat32, {1 << 20, 1 << 20}}})
          .ok());
  EXPECT_FALSE(ExampleDecoder::Create(
                   {{"a", DType::kUInt8, {int64_t{1} << 40, int64_t{1} << 40}}})
                   .ok());
  auto decoder = ExampleDecoder::Create({{"f", DType::kInt16, {2}}});
  std::string wrong(3, '\0');
  std::vector<absl::Span<char>> outputs = {absl::MakeSpan(wrong)};
  EXPECT_THAT(
      decoder->Decode(ExampleOf({{"f", Int64s({1, 2})}}), outputs).message(),
      HasSubstr("is 3 bytes, not 4"));
  EXPECT_FALSE(decoder->Decode(ExampleOf({{"f", Int64s({1, 2})}}), {}).ok());
}

}  // namespace
}  // namespace lockstep::worker

namespace lockstep::worker {
namespace {

// A 4x6 RGB PNG (libpng, lossless) whose pixel (y, x) is (y, x, 7).
std::string SmallPng() {
  std::vector<uint8_t> pixels;
  for (int y = 0; y < 4; ++y) {
    for (int x = 0; x < 6; ++x)
      pixels.insert(pixels.end(), {uint8_t(y), uint8_t(x), 7});
  }
  png_image image{};
  image.version = PNG_IMAGE_VERSION;
  image.width = 6;
  image.height = 4;
  image.format = PNG_FORMAT_RGB;
  png_alloc_size_t size = 0;
  png_image_write_to_memory(&image, nullptr, &size, 0, pixels.data(), 0,
                            nullptr);
  std::string out(size, '\0');
  png_image_write_to_memory(&image, out.data(), &size, 0, pixels.data(), 0,
                            nullptr);
  out.resize(size);
  return out;
}

// The first output (an image) decoded under the Augmentations of keys 0 to
// 63: each twice, which must give the same pixels; the distinct ones.
std::set<std::string> AugmentedImages(
    const ExampleDecoder& decoder, const std::string& record,
    const std::vector<absl::Span<char>>& outs) {
  std::set<std::string> seen;
  for (uint64_t key = 0; key < 64; ++key) {
    Augmentation augmentation{key};
    EXPECT_TRUE(decoder.Decode(record, outs, "r", &augmentation).ok());
    const std::string first(outs[0].data(), outs[0].size());
    EXPECT_TRUE(decoder.Decode(record, outs, "r", &augmentation).ok());
    EXPECT_EQ(std::string(outs[0].data(), outs[0].size()), first) << key;
    seen.insert(first);
  }
  return seen;
}

// A feature read from another key, an optional one missing, a list padded
// to max_len, an image cropped in the middle (and at random, the same for
// the same key), and undeclared features ignored.
TEST(TfExampleTest, RecordKeysOptionalListsAndImages) {
  FeatureSpec image{"image", DType::kUInt8, {2, 2, 3}};
  image.key = "image/encoded";
  image.image = true;
  image.random_crop = true;
  image.random_flip = true;
  FeatureSpec boxes{"boxes", DType::kFloat32, {4}};
  boxes.variable_length = true;
  FeatureSpec mask{"mask", DType::kInt64, {}};
  mask.optional = true;
  auto decoder = ExampleDecoder::Create({image, boxes, mask});
  ASSERT_TRUE(decoder.ok()) << decoder.status();
  const std::string record = ExampleOf({{"image/encoded", Bytes({SmallPng()})},
                                        {"boxes", Floats({0.5f, 0.25f})},
                                        {"unused", Int64s({1, 2, 3})}});
  std::string pixels(12, '\0'), list(16, '\0'), flag(8, 'x');
  std::vector<absl::Span<char>> outs = {
      absl::MakeSpan(pixels), absl::MakeSpan(list), absl::MakeSpan(flag)};
  ASSERT_TRUE(decoder->Decode(record, outs, "r").ok());
  // Centred: rows 1-2, columns 2-3; channels first ([C, H, W], as
  // torchvision's ToTensor): the rows' plane, the columns', the 7s.
  EXPECT_EQ(pixels, std::string("\x01\x01\x02\x02"
                                "\x02\x03\x02\x03"
                                "\x07\x07\x07\x07",
                                12));
  float values[4];
  std::memcpy(values, list.data(), 16);
  EXPECT_EQ(values[0], 0.5f);
  EXPECT_EQ(values[1], 0.25f);
  EXPECT_EQ(values[2], 0.0f);  // padded
  EXPECT_EQ(flag, std::string(8, '\0'));
  // Random crops and flips: a function of the key.
  EXPECT_GT(AugmentedImages(*decoder, record, outs).size(),
            8u);  // 3 x 5 windows, flipped or not
  // More values than max_len, and a required feature missing, are named.
  const std::string long_list =
      ExampleOf({{"image/encoded", Bytes({SmallPng()})},
                 {"boxes", Floats({1, 2, 3, 4, 5})}});
  EXPECT_THAT(
      std::string(decoder->Decode(long_list, outs, "r").message()),
      HasSubstr("holds 5 values in its float_list, more than max_len 4"));
  EXPECT_THAT(
      std::string(
          decoder->Decode(ExampleOf({{"boxes", Floats({1})}}), outs, "r")
              .message()),
      HasSubstr("(read from 'image/encoded') is missing"));
  const std::string broken =
      ExampleOf({{"image/encoded", Bytes({SmallPng().substr(0, 30)})}});
  EXPECT_THAT(
      std::string(
          decoder->Decode(broken, outs, "data.tfrecord record 3").message()),
      AllOf(StartsWith("data.tfrecord record 3: feature 'image'"),
            HasSubstr("corrupt PNG")));
}

// Issue 54, ImageNet as TF's scripts write it: labels from 1 (offset -1),
// and torchvision's RandomResizedCrop on the training split: windows of
// the declared scale and ratio, a function of the sample's key, scaled to
// [H, W]; without an Augmentation (the test split) the centre.
TEST(TfExampleTest, ImageNetLabelsAndRandomResizedCrops) {
  FeatureSpec label{"label", DType::kInt64, {}};
  label.key = "image/class/label";
  label.offset = -1;
  FeatureSpec image{"image", DType::kUInt8, {4, 4, 3}};
  image.key = "image/encoded";
  image.image = true;
  image.random_resized_crop = true;
  image.crop_scale[0] = 0.25;
  image.antialias = true;
  auto decoder = ExampleDecoder::Create({image, label});
  ASSERT_TRUE(decoder.ok()) << decoder.status();
  const std::string record = ExampleOf({{"image/encoded", Bytes({SmallPng()})},
                                        {"image/class/label", Int64s({1000})}});
  std::string pixels(48, '\0'), value(8, '\0');
  std::vector<absl::Span<char>> outs = {absl::MakeSpan(pixels),
                                        absl::MakeSpan(value)};
  ASSERT_TRUE(decoder->Decode(record, outs, "r").ok());
  int64_t decoded = 0;
  std::memcpy(&decoded, value.data(), 8);
  EXPECT_EQ(decoded, 999);
  // The 6x4 image's centre 4x4 (columns 1-4), as without augmentation.
  EXPECT_EQ(static_cast<uint8_t>(pixels[16 + 0]), 1);  // channel 1, (0, 0)
  const std::set<std::string> seen = AugmentedImages(*decoder, record, outs);
  EXPECT_GT(seen.size(), 16u);
  for (const std::string& image : seen) {
    // Channel 2 is 7 everywhere: any window, scaled, keeps it.
    EXPECT_EQ(image.substr(32), std::string(16, '\x07'));
  }
  // An offset that leaves the dtype's range is named.
  const std::string big = ExampleOf(
      {{"image/encoded", Bytes({SmallPng()})},
       {"image/class/label", Int64s({std::numeric_limits<int64_t>::min()})}});
  EXPECT_THAT(std::string(decoder->Decode(big, outs, "r").message()),
              HasSubstr("(offset -1) is out of range"));
}

}  // namespace
}  // namespace lockstep::worker
