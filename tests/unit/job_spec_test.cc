// Job specs: parsing, defaults, `--set` overrides, batch-size resolution and
// the rules that reject a spec (the bounds on every field:
// job_spec_bounds_test.cc; the data forms: job_spec_data_test.cc).
#include "common/job_spec.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/labels.h"
#include "tests/unit/parsed_spec.h"

namespace lockstep {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

#define ASSERT_OK_OVERRIDE(assignment, spec)                  \
  do {                                                        \
    absl::Status status = ApplyOverride(assignment, &(spec)); \
    ASSERT_TRUE(status.ok()) << status;                       \
  } while (0)

TEST(JobSpecTest, DefaultsAreApplied) {
  v1::JobSpec spec = Parse(R"({"global_batch_size": 64})");
  EXPECT_EQ(spec.model().name(), "mlp");
  EXPECT_EQ(spec.precision(), "fp32");
  EXPECT_EQ(spec.epochs(), 1);
  EXPECT_EQ(spec.optimizer().type(), "sgd");
  EXPECT_DOUBLE_EQ(spec.optimizer().momentum(), 0.9);
  EXPECT_DOUBLE_EQ(spec.base_lr(), 0.1);
  EXPECT_EQ(spec.lr_scaling(), "none");
  EXPECT_EQ(spec.data().dir(), kDefaultDataDir);
  EXPECT_TRUE(ValidateJobSpec(spec, 2).ok());
}

TEST(JobSpecTest, ModelIsANameOrAnObject) {
  EXPECT_EQ(Parse(R"({"global_batch_size": 8, "model": "cnn"})").model().name(),
            "cnn");
  v1::JobSpec spec = Parse(
      R"({"global_batch_size": 8, "precision": "bf16",
          "model": {"name": "resnet", "dropout": 0.25}})");
  EXPECT_EQ(spec.model().name(), "resnet");
  EXPECT_DOUBLE_EQ(spec.model().dropout(), 0.25);
  EXPECT_EQ(spec.precision(), "bf16");
  spec = Parse(R"({"global_batch_size": 8,
                   "model": {"torchscript": "/models/net.pt"}})");
  EXPECT_EQ(spec.model().name(), "");
  EXPECT_EQ(spec.model().torchscript(), "/models/net.pt");
  EXPECT_TRUE(ValidateJobSpec(spec).ok());
}

// Every job spec in examples/ loads and validates as it is, so a new
// example is tested the day it is added.
TEST(JobSpecTest, EveryExampleIsValid) {
  const std::filesystem::path dir =
      std::filesystem::path(LOCKSTEP_SOURCE_DIR) / "examples";
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() == ".json") {
      names.push_back(entry.path().string());
    }
  }
  std::sort(names.begin(), names.end());
  ASSERT_GE(names.size(), 3u) << "no job specs found in " << dir;
  for (const std::string& name : names) {
    auto spec = LoadJobSpec(name);
    ASSERT_TRUE(spec.ok()) << name << ": " << spec.status();
    ApplyDefaults(&*spec);
    EXPECT_TRUE(ValidateJobSpec(*spec, 2).ok()) << name;
  }
}

// The shorthand is expanded in the text: a 64-bit seed keeps every digit,
// and only the top-level "model" is touched.
TEST(JobSpecTest, ModelShorthandKeepsEveryOtherValueExact) {
  v1::JobSpec spec = Parse(
      R"({ "seed" : 18446744073709551557, "name": "a \"model\": \"x\"",
           "model" :"resnet", "max_steps": 9007199254740993,
           "global_batch_size": 8})");
  EXPECT_EQ(spec.seed(), 18446744073709551557ull);
  EXPECT_EQ(spec.max_steps(), 9007199254740993ll);
  EXPECT_EQ(spec.name(), "a \"model\": \"x\"");
  EXPECT_EQ(spec.model().name(), "resnet");
}

TEST(JobSpecTest, AdamDefaultsToItsOwnLearningRate) {
  v1::JobSpec spec =
      Parse(R"({"global_batch_size": 64, "optimizer": {"type": "adam"}})");
  EXPECT_DOUBLE_EQ(spec.base_lr(), 1e-3);
  EXPECT_DOUBLE_EQ(spec.optimizer().momentum(), 0);
}

TEST(JobSpecTest, AcceptsCamelCaseNames) {
  v1::JobSpec spec = Parse(R"({"perReplicaBatchSize": 32})");
  EXPECT_EQ(spec.per_replica_batch_size(), 32);
}

TEST(JobSpecTest, UnknownFieldIsRejectedAndNamed) {
  auto spec =
      ParseJobSpec(R"({"global_batch_size": 64, "epocs": 2})", "job.json");
  ASSERT_FALSE(spec.ok());
  EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(spec.status().message(),
              AllOf(HasSubstr("job.json"), HasSubstr("epocs")));
}

TEST(JobSpecTest, MalformedJsonIsRejected) {
  EXPECT_FALSE(ParseJobSpec("{\"epochs\": ").ok());
  EXPECT_FALSE(ParseJobSpec(R"({"epochs": "many"})").ok());
}

TEST(JobSpecTest, ExactlyOneBatchSize) {
  v1::JobSpec neither = Parse(R"({})");
  EXPECT_THAT(ValidateJobSpec(neither).message(), HasSubstr("exactly one"));
  v1::JobSpec both =
      Parse(R"({"global_batch_size": 64, "per_replica_batch_size": 32})");
  EXPECT_THAT(ValidateJobSpec(both).message(), HasSubstr("exactly one"));
}

TEST(JobSpecTest, IndivisibleGlobalBatchNamesBothNumbers) {
  v1::JobSpec spec = Parse(R"({"global_batch_size": 64})");
  absl::Status status = ValidateJobSpec(spec, 3);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              AllOf(HasSubstr("global_batch_size 64"), HasSubstr("3 replicas"),
                    HasSubstr("63 or 66")));
}

TEST(JobSpecTest, ResolveBatch) {
  v1::JobSpec global = Parse(R"({"global_batch_size": 128})");
  auto plan = ResolveBatch(global, 4);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->per_replica, 32);
  EXPECT_EQ(plan->global, 128);
  v1::JobSpec per_replica = Parse(R"({"per_replica_batch_size": 32})");
  plan = ResolveBatch(per_replica, 3);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->global, 96);
}

struct BadSpec {
  const char* json;
  const char* message;
};

class JobSpecInvalidTest : public ::testing::TestWithParam<BadSpec> {};

TEST_P(JobSpecInvalidTest, IsRejected) {
  v1::JobSpec spec = Parse(GetParam().json);
  absl::Status status = ValidateJobSpec(spec);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr(GetParam().message));
}

INSTANTIATE_TEST_SUITE_P(
    Rules, JobSpecInvalidTest,
    ::testing::Values(
        BadSpec{R"({"global_batch_size": 8, "model": "resnet9"})",
                "model.name is \"resnet9\"; choose one of mlp, cnn, resnet"},
        BadSpec{R"({"global_batch_size": 8,
                    "model": {"name": "cnn", "torchscript": "/m.pt"}})",
                "both set"},
        BadSpec{R"({"global_batch_size": 8, "model": {"dropout": 1}})",
                "model.dropout must be in [0, 1)"},
        BadSpec{R"({"global_batch_size": 8, "precision": "fp8"})",
                "precision is \"fp8\"; choose one of fp32, bf16, fp16"},
        BadSpec{R"({"global_batch_size": 8, "loss_scale": 0.5})",
                "loss_scale must be >= 1"},
        BadSpec{R"({"global_batch_size": 8, "lr_scaling": "cubic"})",
                "lr_scaling"},
        BadSpec{R"({"global_batch_size": 8,
                    "communication": {"algorithm": "tree"}})",
                "communication.algorithm is \"tree\"; choose one of direct, "
                "ring"},
        BadSpec{R"({"global_batch_size": 8, "optimizer": {"type": "lion"}})",
                "optimizer.type"},
        BadSpec{R"({"global_batch_size": -8})", "must be positive"},
        BadSpec{R"({"per_replica_batch_size": 0})", "must be positive"},
        BadSpec{R"({"global_batch_size": 8, "epochs": -1})", "epochs"},
        BadSpec{R"({"global_batch_size": 8, "base_lr": -0.1})", "base_lr"},
        BadSpec{R"({"global_batch_size": 8, "warmup_steps": -1})",
                "warmup_steps"},
        BadSpec{R"({"global_batch_size": 8, "optimizer": {"momentum": 1.5}})",
                "momentum"},
        BadSpec{R"({"global_batch_size": 8, "data": {"format": "csv"}})",
                "data.format"},
        BadSpec{R"({"global_batch_size": 8, "lr_decay": "linear"})",
                "lr_decay"},
        BadSpec{R"({"global_batch_size": 8, "lr_decay": "step"})",
                "lr_decay_steps"},
        BadSpec{R"({"global_batch_size": 8, "lr_decay_rate": 1.5})",
                "lr_decay_rate"},
        BadSpec{R"({"global_batch_size": 8, "clip_grad_norm": -1})",
                "clip_grad_norm"},
        BadSpec{R"({"global_batch_size": 8, "accumulation_steps": -2})",
                "accumulation_steps"},
        BadSpec{R"({"global_batch_size": 8,
                    "checkpoint": {"save_every_steps": 10}})",
                "checkpoint.backup_dir"},
        BadSpec{R"({"global_batch_size": 8,
                    "checkpoint": {"upload_last": true}})",
                "checkpoint.upload_last needs checkpoint.backup_dir"},
        BadSpec{R"({"global_batch_size": 8,
                    "checkpoint": {"backup_dir": "/b", "keep": 0}})",
                "checkpoint.keep"},
        BadSpec{R"({"global_batch_size": 8,
                    "checkpoint": {"backup_dir": "/b", "save_every_steps": -1}})",
                "checkpoint.save_every_steps"}));

TEST(JobSpecTest, AccumulationIsPartOfTheGlobalBatch) {
  v1::JobSpec spec =
      Parse(R"({"global_batch_size": 64, "accumulation_steps": 2})");
  auto plan = ResolveBatch(spec, 2);
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->per_replica, 16);
  EXPECT_EQ(plan->accumulation, 2);
  EXPECT_EQ(plan->rank_batch(), 32);
  auto odd = ResolveBatch(spec, 3);
  ASSERT_FALSE(odd.ok());
  EXPECT_THAT(odd.status().message(),
              AllOf(HasSubstr("3 replicas x 2 accumulation steps"),
                    HasSubstr("multiple of 6")));
  v1::JobSpec per_replica =
      Parse(R"({"per_replica_batch_size": 16, "accumulation_steps": 2})");
  EXPECT_EQ(ResolveBatch(per_replica, 2)->global, 64);
}

TEST(JobSpecTest, BackupDirAloneSavesEveryEpochKeepingThree) {
  v1::JobSpec spec = Parse(
      R"({"global_batch_size": 8, "checkpoint": {"backup_dir": "/b"},
          "export": "/out/model.pt"})");
  EXPECT_TRUE(ValidateJobSpec(spec).ok());
  EXPECT_TRUE(spec.checkpoint().save_every_epoch());
  EXPECT_EQ(spec.checkpoint().keep(), 3);
  EXPECT_TRUE(spec.checkpoint().async());
  EXPECT_FALSE(spec.checkpoint().keep_backups());
  EXPECT_EQ(spec.export_path(), "/out/model.pt");
}

TEST(JobSpecTest, ResumeKeepsTheGlobalBatchOrSaysWhichWorldSizesFit) {
  auto plan = ResumeBatch(64, 2, 1, "checkpoint ckpt-000000040");
  ASSERT_TRUE(plan.ok());
  EXPECT_EQ(plan->global, 64);
  EXPECT_EQ(plan->per_replica, 32);
  auto odd = ResumeBatch(64, 3, 1, "checkpoint ckpt-000000040");
  ASSERT_FALSE(odd.ok());
  EXPECT_EQ(odd.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(odd.status().message(),
              AllOf(HasSubstr("ckpt-000000040"), HasSubstr("global batch 64"),
                    HasSubstr("3 replicas"), HasSubstr("2, 4")));
}

TEST(JobSpecTest, OverridesSetAnyField) {
  v1::JobSpec spec = Parse(R"({"global_batch_size": 64})");
  ASSERT_OK_OVERRIDE("epochs=3", spec);
  ASSERT_OK_OVERRIDE("model=cnn", spec);
  ASSERT_OK_OVERRIDE("optimizer.type=adam", spec);
  ASSERT_OK_OVERRIDE("base_lr=0.05", spec);
  ASSERT_OK_OVERRIDE("seed=42", spec);
  ASSERT_OK_OVERRIDE("max_steps=50", spec);
  EXPECT_EQ(spec.epochs(), 3);
  EXPECT_EQ(spec.model().name(), "cnn");
  ASSERT_OK_OVERRIDE("model.torchscript=/models/net.pt", spec);
  EXPECT_EQ(spec.model().name(), "");
  EXPECT_EQ(spec.model().torchscript(), "/models/net.pt");
  EXPECT_EQ(spec.optimizer().type(), "adam");
  EXPECT_DOUBLE_EQ(spec.base_lr(), 0.05);
  EXPECT_EQ(spec.seed(), 42u);
  EXPECT_EQ(spec.max_steps(), 50);
  EXPECT_EQ(spec.global_batch_size(), 64);
}

TEST(JobSpecTest, OverrideOfUnknownFieldFails) {
  v1::JobSpec spec = Parse(R"({"global_batch_size": 64})");
  absl::Status status = ApplyOverride("epocs=3", &spec);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(), HasSubstr("epocs"));
  EXPECT_FALSE(ApplyOverride("epochs", &spec).ok());
  EXPECT_FALSE(ApplyOverride("epochs=lots", &spec).ok());
}

}  // namespace
}  // namespace lockstep

namespace lockstep {
namespace {

TEST(JobSpecOverrideTest, SettingOneBatchSizeReplacesTheOther) {
  auto spec = ParseJobSpec(R"({"global_batch_size": 64})");
  ASSERT_OK_OVERRIDE("per_replica_batch_size=32", *spec);
  EXPECT_FALSE(spec->has_global_batch_size());
  EXPECT_EQ(spec->per_replica_batch_size(), 32);
  ASSERT_OK_OVERRIDE("global_batch_size=128", *spec);
  EXPECT_FALSE(spec->has_per_replica_batch_size());
  EXPECT_EQ(spec->global_batch_size(), 128);
}

TEST(JobSpecTest, SchedulingFieldsAreChecked) {
  v1::JobSpec spec = Parse(R"({"global_batch_size": 64, "priority": 5,
      "placement": {"device": "cuda", "labels": {"zone": "a"}},
      "time_limit_seconds": 14400})");
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
  for (
      const char* bad : {
          R"({"global_batch_size": 64, "priority": 1000001})",
          R"({"global_batch_size": 64, "priority": -1000001})",
          R"({"global_batch_size": 64, "priority": 1, "priority_class": "x"})",
          R"({"global_batch_size": 64, "placement": {"device": "tpu"}})",
          R"({"global_batch_size": 64, "placement": {"labels": {"z": "a b"}}})",
          R"({"global_batch_size": 64, "time_limit_seconds": -1})",
          R"({"global_batch_size": 64, "time_limit_seconds": 31622401})",
      }) {
    auto parsed = ParseJobSpec(bad);
    const absl::Status status =
        parsed.ok() ? ValidateJobSpec(*parsed) : parsed.status();
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << bad;
  }
  v1::JobSpec many = spec;
  for (int i = 0; i <= kMaxLabels; ++i) {
    (*many.mutable_placement()->mutable_labels())[absl::StrCat("k", i)] = "v";
  }
  EXPECT_THAT(ValidateJobSpec(many).message(), HasSubstr("at most 16"));
}

// Issue 36: what the export holds, and only with an export.
TEST(JobSpecTest, ExportFormatIsAChoiceThatNeedsAnExport) {
  for (const char* format : {"archive", "torchscript", "state_dict"}) {
    const std::string json = absl::StrCat(
        R"({"global_batch_size": 64, "export": "/x/m.pt", "export_format": ")",
        format, R"("})");
    v1::JobSpec spec = Parse(json.c_str());
    EXPECT_TRUE(ValidateJobSpec(spec).ok()) << format;
  }
  EXPECT_THAT(ValidateJobSpec(Parse(R"({"global_batch_size": 64,
      "export": "/x/m.pt", "export_format": "onnx"})"))
                  .message(),
              HasSubstr("export_format"));
  EXPECT_THAT(ValidateJobSpec(Parse(R"({"global_batch_size": 64,
      "export_format": "state_dict"})"))
                  .message(),
              HasSubstr("needs export"));
}

// "auto" picks the all-reduce algorithm by timing, so the sum order depends
// on the network: a reproducible job must name one.
TEST(JobSpecTest, AutoAlgorithmIsNotForAReproducibleJob) {
  EXPECT_TRUE(ValidateJobSpec(Parse(R"({"global_batch_size": 64,
      "communication": {"algorithm": "auto"}})"))
                  .ok());
  EXPECT_THAT(ValidateJobSpec(Parse(R"({"global_batch_size": 64,
      "reproducible": true, "communication": {"algorithm": "auto"}})"))
                  .message(),
              HasSubstr("a reproducible job names \"direct\" or \"ring\""));
  EXPECT_TRUE(ValidateJobSpec(Parse(R"({"global_batch_size": 64,
      "reproducible": true, "communication": {"algorithm": "ring"}})"))
                  .ok());
}

// The gradient's wire format: fp32 unless the job asks for bf16, which is
// the Gloo all-reduce's alone.
TEST(JobSpecTest, CompressionIsNoneOrBf16) {
  EXPECT_EQ(Parse(R"({"global_batch_size": 64})").communication().compression(),
            "none");
  EXPECT_TRUE(ValidateJobSpec(Parse(R"({"global_batch_size": 64,
      "communication": {"compression": "bf16"}})"))
                  .ok());
  EXPECT_THAT(ValidateJobSpec(Parse(R"({"global_batch_size": 64,
      "communication": {"compression": "fp8"}})"))
                  .message(),
              HasSubstr("communication.compression is \"fp8\"; choose one "
                        "of none, bf16"));
  EXPECT_THAT(ValidateJobSpec(Parse(R"({"global_batch_size": 64,
      "communication": {"backend": "nccl", "compression": "bf16"}})"))
                  .message(),
              HasSubstr("set communication.backend \"gloo\" or \"auto\""));
}

// The workload's fields: defaults, and the rules that refuse a spec before
// any worker opens a file.
TEST(JobSpecTest, WorkloadDefaultsAndRules) {
  v1::JobSpec lm = Parse(R"({"global_batch_size": 64,
                             "task": {"type": "language_model"},
                             "data": {"format": "tokens", "dir": "/d"}})");
  EXPECT_EQ(lm.model().name(), "gpt");
  EXPECT_EQ(lm.model().n_layer(), 4);
  EXPECT_TRUE(lm.model().has_fused() && lm.model().fused());
  EXPECT_EQ(lm.data().block_size(), 64);
  EXPECT_EQ(lm.data().window_stride(), 64);
  EXPECT_EQ(lm.data().token_dtype(), "uint16");
  EXPECT_TRUE(ValidateJobSpec(lm).ok()) << ValidateJobSpec(lm);
  v1::JobSpec images = Parse(R"({"global_batch_size": 64})");
  EXPECT_EQ(images.task().type(), "classification");
  EXPECT_EQ(images.task().num_classes(), 10);
  EXPECT_EQ(images.data().shuffle(), "global");

  auto refused = [](const char* json) {
    v1::JobSpec spec = Parse(json);
    absl::Status status = ValidateJobSpec(spec);
    EXPECT_TRUE(absl::IsInvalidArgument(status)) << json;
    return std::string(status.message());
  };
  EXPECT_THAT(refused(R"({"global_batch_size": 64, "model": "gpt"})"),
              HasSubstr("set task.type \"language_model\""));
  EXPECT_THAT(refused(R"({"global_batch_size": 64,
                          "task": {"type": "language_model"}, "model": "cnn",
                          "data": {"format": "tokens"}})"),
              HasSubstr("trains model \"gpt\""));
  EXPECT_THAT(refused(R"({"global_batch_size": 64,
                          "task": {"num_classes": 1}})"),
              HasSubstr("num_classes must be >= 2"));
  EXPECT_THAT(refused(R"({"global_batch_size": 64,
                          "data": {"format": "tfrecord", "train": "*.rec",
                                   "test": "t.rec"}})"),
              HasSubstr("data.features"));
  EXPECT_THAT(refused(R"({"global_batch_size": 64,
                          "data": {"format": "npy", "train": "../x/*.npy"}})"),
              HasSubstr("steps out of data.dir"));
  EXPECT_THAT(refused(R"({"global_batch_size": 64,
                          "data": {"format": "npy", "train": "/x/*.npy"}})"),
              HasSubstr("is absolute"));
  EXPECT_THAT(refused(R"({"global_batch_size": 64, "data": {"format": "npy",
                          "features": {"x": {"shape": [0]}}}})"),
              HasSubstr("positive sizes"));
  EXPECT_THAT(refused(R"({"global_batch_size": 64, "data": {"format": "npy",
                          "features": {"x": {"dtype": "complex64"}}}})"),
              HasSubstr("choose one of uint8"));
  EXPECT_THAT(refused(R"({"global_batch_size": 64, "data": {"format": "npy",
                          "features": {"x\u001b[2J": {"dtype": "int8"}}}})"),
              HasSubstr("is not a column name"));
  {
    v1::JobSpec many = Parse(R"({"global_batch_size": 64})");
    for (int i = 0; i < 65; ++i) {
      (*many.mutable_data()->mutable_features())[absl::StrCat("c", i)];
    }
    EXPECT_THAT(ValidateJobSpec(many).message(), HasSubstr("at most 64"));
  }
  EXPECT_THAT(refused(R"({"global_batch_size": 64,
                          "task": {"type": "regression", "loss": "hinge"}})"),
              HasSubstr("task.loss"));
  EXPECT_THAT(refused(R"({"global_batch_size": 64,
                          "task": {"type": "language_model"},
                          "data": {"format": "tokens"}, "model": {"name": "gpt",
                          "n_head": 3, "n_embd": 128}})"),
              HasSubstr("multiple of n_head"));
  EXPECT_THAT(refused(R"({"global_batch_size": 64,
                          "model": {"name": "cnn", "fused": false}})"),
              HasSubstr("model.fused chooses the gpt's attention"));
  v1::JobSpec unfused = Parse(R"({"global_batch_size": 64,
                                  "task": {"type": "language_model"},
                                  "data": {"format": "tokens", "dir": "/d"},
                                  "model": {"name": "gpt", "fused": false}})");
  EXPECT_FALSE(unfused.model().fused());
  EXPECT_TRUE(ValidateJobSpec(unfused).ok());
}

}  // namespace
}  // namespace lockstep
