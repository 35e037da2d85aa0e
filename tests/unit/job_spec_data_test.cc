// The data forms' job spec fields: token globs and offsets, CSV columns,
// image features and their augmentations, variable-length lists, the
// evaluation schedule.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <utility>

#include "common/job_spec.h"
#include "tests/unit/parsed_spec.h"

namespace lockstep {
namespace {

using ::testing::HasSubstr;

// The new data forms' fields: token globs and offsets, CSV columns, image
// features and their augmentations, variable-length lists, the evaluation
// schedule; each bad one refused with a message that names the field.
TEST(JobSpecTest, DataFormsAreChecked) {
  for (const char* good : {
           R"({"global_batch_size": 64, "task": {"type": "language_model"},
               "model": "gpt", "data": {"format": "tokens", "train": "t-*.bin",
               "test": "v-*.bin", "window_offset": "random"}})",
           R"({"global_batch_size": 64, "task": {"type": "language_model"},
               "model": "gpt", "data": {"format": "tokens", "train": "t-*.bin",
               "test": "v-*.bin", "concatenate": true,
               "separator_token": 50256, "token_dtype": "uint32"}})",
           R"({"global_batch_size": 64, "data": {"format": "csv",
               "columns": {"x": ["a", "b"], "label": ["y"]},
               "features": {"x": {"normalize": "per_feature"}}}})",
           R"({"global_batch_size": 64, "data": {"format": "tfrecord",
               "train": "a*", "test": "b*", "features": {
               "image": {"from": "image/encoded", "encoding": "jpeg",
                 "dtype": "uint8", "shape": [32, 32, 3], "resize": [40, 40],
                 "random_crop": true, "random_flip": true},
               "boxes": {"dtype": "float32", "max_len": 8, "optional": true},
               "label": {"dtype": "int64", "shape": []}}}})",
           R"({"global_batch_size": 64, "data": {"format": "tfrecord",
               "train": "a*", "test": "b*", "features": {
               "image": {"from": "image/encoded", "encoding": "jpeg",
                 "dtype": "uint8", "shape": [224, 224, 3],
                 "resize": [256, 256], "resize_filter": "antialias",
                 "random_resized_crop": {"scale": [0.08, 1]},
                 "random_flip": true,
                 "channel_mean": [0.485, 0.456, 0.406],
                 "channel_std": [0.229, 0.224, 0.225]},
               "label": {"from": "image/class/label", "dtype": "int64",
                 "shape": [], "offset": -1}}}})",
           R"({"global_batch_size": 64, "eval_every_steps": 50,
               "eval_batches": 4})",
           R"({"global_batch_size": 64, "data": {"format": "tfrecord",
               "train": "a", "test": "b", "skip_corrupt": 1000,
               "features": {"x": {"dtype": "float32", "shape": [1]}}}})",
       }) {
    const v1::JobSpec spec = Parse(good);
    EXPECT_TRUE(ValidateJobSpec(spec).ok())
        << good << ": " << ValidateJobSpec(spec);
  }
  const std::pair<const char*, const char*> bad[] = {
      {R"({"global_batch_size": 64, "data": {"window_offset": "random"}})",
       "are for data.format \"tokens\""},
      {R"({"global_batch_size": 64, "data": {"concatenate": true}})",
       "are for data.format \"tokens\""},
      {R"({"global_batch_size": 64, "model": "gpt", "task": {"type":
          "language_model"}, "data": {"format": "tokens",
          "separator_token": 0}})",
       "set data.concatenate too"},
      {R"({"global_batch_size": 64, "model": "gpt", "task": {"type":
          "language_model"}, "data": {"format": "tokens", "concatenate": true,
          "separator_token": 65536}})",
       "data.separator_token must be in [0, 65535] for uint16"},
      {R"({"global_batch_size": 64, "model": "gpt", "task": {"type":
          "language_model"}, "data": {"format": "tokens", "train": "a*"}})",
       "both data.train and data.test"},
      {R"({"global_batch_size": 64, "data": {"format": "csv"}})",
       "needs data.columns"},
      {R"({"global_batch_size": 64, "data": {"skip_corrupt": 3}})",
       "data.skip_corrupt skips unreadable TFRecord records"},
      {R"({"global_batch_size": 64, "data": {"format": "tfrecord",
          "train": "a", "test": "b", "skip_corrupt": 1001,
          "features": {"x": {"dtype": "float32", "shape": [1]}}}})",
       "data.skip_corrupt is 1001"},
      {R"({"global_batch_size": 64, "data": {"format": "tfrecord",
          "train": "a", "test": "b", "skip_corrupt": -1,
          "features": {"x": {"dtype": "float32", "shape": [1]}}}})",
       "data.skip_corrupt must be in [0, 1000]"},
      {R"({"global_batch_size": 64, "data": {"format": "tfrecord",
          "train": "a", "test": "b", "features": {"y": {"dtype": "float32",
          "shape": [], "offset": -1}}}})",
       ".offset is added to an integer feature's values"},
      {R"({"global_batch_size": 64, "data": {"format": "tfrecord",
          "train": "a", "test": "b", "features": {"i": {"dtype": "uint8",
          "shape": [4, 4, 3], "encoding": "png",
          "random_resized_crop": {"scale": [0.5, 1.5]}}}}})",
       "random_resized_crop takes scale [low, high] in (0, 1]"},
      {R"({"global_batch_size": 64, "data": {"format": "tfrecord",
          "train": "a", "test": "b", "features": {"i": {"dtype": "uint8",
          "shape": [4, 4, 3], "encoding": "png", "random_crop": true,
          "random_resized_crop": {}}}}})",
       "in place of random_crop"},
      {R"({"global_batch_size": 64, "data": {"format": "tfrecord",
          "train": "a", "test": "b", "features": {"i": {"dtype": "uint8",
          "shape": [4, 4, 3], "encoding": "png", "resize_filter": "lanczos"}}}})",
       "resize_filter must be bilinear or antialias"},
      {R"({"global_batch_size": 64, "data": {"format": "npy", "features": {
          "x": {"channel_mean": [0.5, 0.5], "channel_std": [0.2]}}}})",
       "channel_mean and .channel_std are one finite mean and one positive"},
      {R"({"global_batch_size": 64, "data": {"format": "npy", "features": {
          "x": {"channel_mean": [0.5], "channel_std": [0]}}}})",
       "positive std per channel"},
      {R"({"global_batch_size": 64, "data": {"format": "npy", "features": {
          "y": {"class_names": true}}}})",
       "are for data.format \"csv\""},
      {R"({"global_batch_size": 64, "data": {"format": "csv",
          "columns": {"y": ["label"]}, "features": {
          "y": {"classes": ["a", "b"]}}}})",
       "set .class_names too"},
      {R"({"global_batch_size": 64, "data": {"format": "csv",
          "columns": {"y": ["label"]}, "features": {
          "y": {"class_names": true, "classes": ["a", "a"]}}}})",
       "must be distinct names"},
      {R"({"global_batch_size": 64, "data": {"format": "csv",
          "columns": {"y": ["label"]}, "features": {
          "y": {"class_names": true, "fill_missing": 0}}}})",
       "drop .dtype and .fill_missing"},
      {R"({"global_batch_size": 64, "data": {"format": "csv",
          "columns": {"x": ["a"]}, "features": {
          "x": {"dtype": "int64", "fill_missing": 0}}}})",
       "drop dtype int64"},
      {R"({"global_batch_size": 64, "data": {"format": "csv",
          "columns": {"x": []}}})",
       "lists no CSV column"},
      {R"({"global_batch_size": 64, "data": {"format": "csv",
          "columns": {"x": [1]}}})",
       "must list CSV column names"},
      {R"({"global_batch_size": 64, "data": {"columns": {"x": ["a"]}}})",
       "data.columns groups the columns of data.format \"csv\""},
      {R"({"global_batch_size": 64, "data": {"format": "tfrecord",
          "train": "a", "test": "b", "features": {"i": {"dtype": "float32",
          "shape": [4, 4, 3], "encoding": "jpeg"}}}})",
       "decodes into dtype uint8"},
      {R"({"global_batch_size": 64, "data": {"format": "tfrecord",
          "train": "a", "test": "b", "features": {"i": {"dtype": "uint8",
          "shape": [4, 4, 3], "encoding": "gif"}}}})",
       "encoding must be jpeg, png or auto"},
      {R"({"global_batch_size": 64, "data": {"format": "tfrecord",
          "train": "a", "test": "b", "features": {"i": {"dtype": "uint8",
          "shape": [8, 8, 3], "encoding": "png", "resize": [4, 4]}}}})",
       "at least the shape's [H, W]"},
      {R"({"global_batch_size": 64, "data": {"format": "tfrecord",
          "train": "a", "test": "b", "features": {"i": {"dtype": "uint8",
          "shape": [8], "random_flip": true}}}})",
       "for encoded images"},
      {R"({"global_batch_size": 64, "data": {"format": "tfrecord",
          "train": "a", "test": "b", "features": {"i": {"dtype": "int64",
          "shape": [8], "max_len": 8}}}})",
       "declared without a shape"},
      {R"({"global_batch_size": 64, "data": {"format": "npy",
          "features": {"x": {"from": "y"}}}})",
       "are for data.format \"tfrecord\""},
      {R"({"global_batch_size": 64, "data": {"features": {"x":
          {"normalize": "per_feature", "std": 2}}}})",
       "drop .mean and .std"},
      {R"({"global_batch_size": 64, "data": {"features": {"x":
          {"normalize": "whiten"}}}})",
       "normalize must be scalar or per_feature"},
      {R"({"global_batch_size": 64, "eval_batches": 4})",
       "set eval_every_steps too"},
      {R"({"global_batch_size": 64, "eval_every_steps": -1})",
       "eval_every_steps and eval_batches must be >= 0"},
  };
  for (const auto& [json, message] : bad) {
    auto parsed = ParseJobSpec(json);
    if (parsed.ok()) ApplyDefaults(&*parsed);
    const absl::Status status =
        parsed.ok() ? ValidateJobSpec(*parsed) : parsed.status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << json;
    EXPECT_THAT(status.message(), HasSubstr(message)) << json;
  }
}

}  // namespace
}  // namespace lockstep
