// Fuzz target: tf.train.Example records decoded against a fixed feature
// spec with every dtype, all columns at once and each column alone (so each
// conversion is reached without the others present). Each output is exactly
// its column's size on the heap (AddressSanitizer sees one byte past it); a
// decode that succeeds is repeatable, and the int64 scalar "label" is checked
// against protobuf's own parse.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "tensorflow/example.pb.h"
#include "tests/fuzz/fuzz_files.h"
#include "worker/data/tf_example.h"

namespace {

using lockstep::fuzz::Check;
namespace w = lockstep::worker;

std::vector<w::FeatureSpec> Specs() {
  return {{"image", w::DType::kUInt8, {2, 3}}, {"label", w::DType::kInt64, {}},
          {"f32", w::DType::kFloat32, {2}},    {"f16", w::DType::kFloat16, {2}},
          {"bf16", w::DType::kBFloat16, {1}},  {"i8", w::DType::kInt8, {2}},
          {"i16", w::DType::kInt16, {1}},      {"i32", w::DType::kInt32, {1}},
          {"u16", w::DType::kUInt16, {2}},     {"u32", w::DType::kUInt32, {1}}};
}

// Decodes `input` with `decoder` into fresh columns; OK or not.
bool Decode(const w::ExampleDecoder& decoder, absl::string_view input,
            std::vector<std::vector<char>>* columns) {
  columns->clear();
  std::vector<absl::Span<char>> outputs;
  for (size_t k = 0; k < decoder.specs().size(); ++k) {
    columns->emplace_back(static_cast<size_t>(decoder.column_bytes(k)));
  }
  for (auto& column : *columns) outputs.push_back(absl::MakeSpan(column));
  return decoder.Decode(input, outputs, "fuzz").ok();
}

// What protobuf says "label" is, when it is a one-value int64_list.
bool LabelOracle(absl::string_view input, int64_t* label) {
  lockstep::tfexample::Example example;
  if (!example.ParseFromArray(input.data(), static_cast<int>(input.size()))) {
    return false;
  }
  auto it = example.features().feature().find("label");
  if (it == example.features().feature().end() ||
      !it->second.has_int64_list() ||
      it->second.int64_list().value_size() != 1) {
    return false;
  }
  *label = it->second.int64_list().value(0);
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const auto* all = new w::ExampleDecoder(
      *w::ExampleDecoder::Create(Specs(), /*max_example_bytes=*/1 << 20));
  static const auto* each = [] {
    auto* decoders = new std::vector<w::ExampleDecoder>;
    for (const w::FeatureSpec& spec : Specs()) {
      decoders->push_back(*w::ExampleDecoder::Create({spec}, 1 << 20));
    }
    return decoders;
  }();
  absl::string_view input(reinterpret_cast<const char*>(data), size);
  std::vector<std::vector<char>> columns, again;
  if (Decode(*all, input, &columns)) {
    Check(Decode(*all, input, &again) && again == columns,
          "decoding the same Example twice differs");
  }
  for (const w::ExampleDecoder& decoder : *each) {
    if (!Decode(decoder, input, &columns)) continue;
    int64_t label = 0;
    if (decoder.specs()[0].name == "label" && LabelOracle(input, &label)) {
      int64_t decoded;
      std::memcpy(&decoded, columns[0].data(), 8);
      Check(decoded == label, "the decoded label differs from protobuf's");
    }
  }
  return 0;
}
