// Job specs: parsing, defaults, `--set` overrides, batch-size resolution and
// every rule that rejects a spec.
#include "common/job_spec.h"

#include <gmock/gmock.h>
#include <google/protobuf/descriptor.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/labels.h"

namespace lockstep {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

#define ASSERT_OK_OVERRIDE(assignment, spec)                  \
  do {                                                        \
    absl::Status status = ApplyOverride(assignment, &(spec)); \
    ASSERT_TRUE(status.ok()) << status;                       \
  } while (0)

v1::JobSpec Parse(const char* json) {
  auto spec = ParseJobSpec(json);
  EXPECT_TRUE(spec.ok()) << spec.status();
  v1::JobSpec result = spec.ok() ? *spec : v1::JobSpec();
  ApplyDefaults(&result);
  return result;
}

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

// ---- issue 14: overflow, NaN and unbounded fields
// ----------------------------

// 4 x 2^30 overflowed `int` to 0 and `% 0` killed the CLI and the
// coordinator with SIGFPE.
TEST(JobSpecBoundsTest, OverflowingAccumulationIsRefusedNotDividedByZero) {
  v1::JobSpec spec = Parse(R"({"num_workers": 4, "global_batch_size": 64,
                               "accumulation_steps": 1073741824})");
  absl::Status status = ValidateJobSpec(spec, 4);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              HasSubstr("job spec: accumulation_steps is 1073741824; at most "
                        "65536"));
  // ResolveBatch alone (the coordinator's generation start) refuses too.
  auto plan = ResolveBatch(spec, 4);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(plan.status().message(), HasSubstr("accumulation_steps"));
  // Elastic (min_workers): the split is only resolved when workers connect;
  // the spec is refused at submit all the same.
  v1::JobSpec elastic = Parse(R"({"min_workers": 4, "global_batch_size": 64,
                                  "accumulation_steps": 1073741824})");
  EXPECT_THAT(ValidateJobSpec(elastic).message(),
              HasSubstr("accumulation_steps is 1073741824"));
}

TEST(JobSpecBoundsTest, ProductOfBatchSizesIsComputedIn64Bits) {
  // Each within its bound; the product 2^20 x 2^16 x 2^16 is not.
  v1::JobSpec spec = Parse(R"({"per_replica_batch_size": 1048576,
                               "accumulation_steps": 65536})");
  EXPECT_THAT(ValidateJobSpec(spec).message(),
              HasSubstr("per_replica_batch_size x accumulation_steps"));
  auto plan = ResolveBatch(spec, 65536);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(plan.status().message(),
              AllOf(HasSubstr("= 4503599627370496"), HasSubstr("at most")));
  // Within one replica's bound, past the global one over many replicas.
  v1::JobSpec wide = Parse(R"({"per_replica_batch_size": 1024})");
  EXPECT_TRUE(ValidateJobSpec(wide).ok());
  EXPECT_THAT(ResolveBatch(wide, 65536).status().message(),
              HasSubstr("1024 x 65536 x 1 = 67108864; at most 16777216"));
  EXPECT_FALSE(ResolveBatch(wide, 65537).ok());  // too many replicas
  EXPECT_FALSE(ResolveBatch(wide, 0).ok());
  // A global batch smaller than replicas x accumulation never gives 0.
  v1::JobSpec small = Parse(R"({"global_batch_size": 4,
                                "accumulation_steps": 65536})");
  EXPECT_THAT(ResolveBatch(small, 65536).status().message(),
              HasSubstr("use a multiple of 4294967296"));
}

TEST(JobSpecBoundsTest, HugeCountsNameTheFieldAndTheBound) {
  const struct {
    const char* json;
    const char* message;
  } cases[] = {
      {R"({"global_batch_size": 64, "epochs": 2147483647})",
       "epochs is 2147483647; at most 1000000"},
      {R"({"global_batch_size": 64, "max_restarts": 2147483647})",
       "max_restarts is 2147483647; at most 10000"},
      {R"({"per_replica_batch_size": 2147483647})",
       "per_replica_batch_size is 2147483647; at most 1048576"},
      {R"({"global_batch_size": 2147483647})",
       "global_batch_size is 2147483647; at most 16777216"},
      {R"({"global_batch_size": 64, "max_steps": "9223372036854775807"})",
       "max_steps is 9223372036854775807; at most 1000000000000"},
      {R"({"global_batch_size": 64, "num_workers": 2147483647})",
       "num_workers is 2147483647; at most 65536"},
      {R"({"global_batch_size": 64, "communication": {"bucket_mb": 1e300}})",
       "communication.bucket_mb is 1e+300; at most 65536"},
      {R"({"global_batch_size": 64, "checkpoint": {"keep": 2147483647}})",
       "checkpoint.keep is 2147483647; at most 1000"},
  };
  for (const auto& c : cases) {
    absl::Status status = ValidateJobSpec(Parse(c.json));
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.json;
    EXPECT_THAT(status.message(), HasSubstr(c.message)) << c.json;
  }
}

TEST(JobSpecBoundsTest, NanAndInfinitiesAreRefusedInEveryFloatField) {
  const struct {
    const char* json;
    const char* message;
  } cases[] = {
      {R"({"global_batch_size": 64, "base_lr": "Infinity"})",
       "base_lr is inf; give a finite number"},
      {R"({"global_batch_size": 64, "optimizer": {"momentum": "NaN"}})",
       "optimizer.momentum is nan; give a finite number"},
      {R"({"global_batch_size": 64, "min_lr": "-Infinity"})", "min_lr is -inf"},
      {R"({"global_batch_size": 64, "model": {"dropout": "NaN"}})",
       "model.dropout is nan"},
      {R"({"global_batch_size": 64, "loss_scale": "Infinity"})",
       "loss_scale is inf"},
  };
  for (const auto& c : cases) {
    absl::Status status = ValidateJobSpec(Parse(c.json));
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.json;
    EXPECT_THAT(status.message(), HasSubstr(c.message)) << c.json;
  }
}

TEST(JobSpecBoundsTest, AThreeMegabyteNameIsRefusedWithoutEchoingIt) {
  v1::JobSpec spec = Parse(R"({"global_batch_size": 64})");
  spec.set_name(std::string(3 << 20, 'x'));
  absl::Status status = ValidateJobSpec(spec);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(status.message(),
              HasSubstr("name is 3145728 bytes long; at most 256"));
  EXPECT_LT(status.message().size(), 200u);
  spec.set_name("");
  spec.set_precision(std::string(1 << 20, 'y'));  // not echoed by the choice
  EXPECT_THAT(ValidateJobSpec(spec).message(),
              HasSubstr("precision is 1048576 bytes long; at most 32"));
  spec.set_precision("fp32");
  spec.set_export_path(std::string(5000, '/'));
  EXPECT_THAT(ValidateJobSpec(spec).message(),
              HasSubstr("export is 5000 bytes long; at most 4096"));
}

// Sets every string field of `message` (nested ones too) in turn to `value`
// and expects ValidateJobSpec on `spec` to refuse it, naming the field.
void ExpectEveryStringFieldRefuses(v1::JobSpec* spec,
                                   google::protobuf::Message* message,
                                   const std::string& prefix,
                                   const std::string& value, int* checked) {
  const google::protobuf::Descriptor* descriptor = message->GetDescriptor();
  const google::protobuf::Reflection* reflection = message->GetReflection();
  for (int i = 0; i < descriptor->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* field = descriptor->field(i);
    const std::string path =
        prefix + (field->has_json_name() ? field->json_name() : field->name());
    if (field->is_repeated()) continue;  // data.features: its own test
    if (field->message_type() != nullptr) {
      ExpectEveryStringFieldRefuses(spec,
                                    reflection->MutableMessage(message, field),
                                    path + ".", value, checked);
    } else if (field->cpp_type() ==
               google::protobuf::FieldDescriptor::CPPTYPE_STRING) {
      const std::string before = reflection->GetString(*message, field);
      reflection->SetString(message, field, value);
      absl::Status status = ValidateJobSpec(*spec);
      EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << path;
      EXPECT_THAT(status.message(),
                  HasSubstr(absl::StrCat(path, " holds a control character")))
          << path;
      reflection->SetString(message, field, before);
      ++*checked;
    }
  }
}

TEST(JobSpecBoundsTest, ControlCharactersAreRefusedInEveryStringField) {
  v1::JobSpec spec = Parse(R"({"global_batch_size": 64})");
  ASSERT_TRUE(ValidateJobSpec(spec).ok());
  for (const std::string& value :
       {std::string("/etc\0/../tmp/x", 14), std::string("a\nb"),
        std::string("x\x1b[2J"), std::string("\x7f")}) {
    int checked = 0;
    ExpectEveryStringFieldRefuses(&spec, &spec, "", value, &checked);
    EXPECT_GE(checked, 10);
  }
  spec.mutable_checkpoint()->set_backup_dir(std::string("/etc\0/../tmp/x", 14));
  EXPECT_THAT(ValidateJobSpec(spec).message(),
              HasSubstr("checkpoint.backup_dir holds a control character "
                        "(byte 0x00 at offset 4)"));
}

// Every scalar field, nested ones included, has a bound: a new field that
// lacks one fails here rather than going unchecked.
void ExpectEveryFieldBounded(const google::protobuf::Descriptor* descriptor,
                             const std::string& prefix) {
  for (int i = 0; i < descriptor->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* field = descriptor->field(i);
    const std::string path =
        prefix + (field->has_json_name() ? field->json_name() : field->name());
    if (field->is_repeated()) {
      // The repeated fields: ValidateWorkload bounds data.features' and
      // data.columns' entries (JobSpecTest.WorkloadDefaultsAndRules,
      // JobSpecTest.DataFormsAreChecked), CheckLabels the labels'
      // (JobSpecTest.SchedulingFieldsAreChecked).
      EXPECT_TRUE(path == "data.features" || path == "data.columns" ||
                  path == "placement.labels")
          << path << ": bound its elements too";
      continue;
    }
    if (field->message_type() != nullptr) {
      ExpectEveryFieldBounded(field->message_type(), path + ".");
    } else if (field->cpp_type() !=
               google::protobuf::FieldDescriptor::CPPTYPE_BOOL) {
      EXPECT_TRUE(JobSpecFieldBound(path).has_value())
          << path << " has no bound in common/job_spec.cc";
    }
  }
}

TEST(JobSpecTest, SchedulingFieldsAreChecked) {
  v1::JobSpec spec = Parse(R"({"global_batch_size": 64, "priority": 5,
      "placement": {"device": "cuda", "labels": {"zone": "a"}}})");
  EXPECT_TRUE(ValidateJobSpec(spec).ok()) << ValidateJobSpec(spec);
  for (
      const char* bad : {
          R"({"global_batch_size": 64, "priority": 1000001})",
          R"({"global_batch_size": 64, "priority": -1000001})",
          R"({"global_batch_size": 64, "priority": 1, "priority_class": "x"})",
          R"({"global_batch_size": 64, "placement": {"device": "tpu"}})",
          R"({"global_batch_size": 64, "placement": {"labels": {"z": "a b"}}})",
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

TEST(JobSpecBoundsTest, EveryFieldHasABound) {
  ExpectEveryFieldBounded(v1::JobSpec::descriptor(), "");
  EXPECT_EQ(JobSpecFieldBound("accumulation_steps"), 65536);
  EXPECT_FALSE(JobSpecFieldBound("no_such_field").has_value());
}

TEST(JobSpecBoundsTest, ResumeBatchRangeChecksTheCheckpointsNumbers) {
  for (auto [global, replicas, accumulation] : {std::tuple{0, 2, 1},
                                                {-64, 2, 1},
                                                {64, 0, 1},
                                                {64, 2, -1},
                                                {64, 2, 1 << 30},
                                                {1 << 30, 2, 1}}) {
    auto plan = ResumeBatch(global, replicas, accumulation, "checkpoint c");
    EXPECT_EQ(plan.status().code(), absl::StatusCode::kFailedPrecondition)
        << global << " " << replicas << " " << accumulation;
  }
  auto plan = ResumeBatch(64, 4, 65536, "checkpoint c");  // 64 % 2^18
  EXPECT_THAT(plan.status().message(), HasSubstr("does not divide"));
}

// The workload's fields: defaults, and the rules that refuse a spec before
// any worker opens a file.
TEST(JobSpecTest, WorkloadDefaultsAndRules) {
  v1::JobSpec lm = Parse(R"({"global_batch_size": 64,
                             "task": {"type": "language_model"},
                             "data": {"format": "tokens", "dir": "/d"}})");
  EXPECT_EQ(lm.model().name(), "gpt");
  EXPECT_EQ(lm.model().n_layer(), 4);
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
}

}  // namespace
}  // namespace lockstep
