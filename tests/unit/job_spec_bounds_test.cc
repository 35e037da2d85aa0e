// Job specs from an untrusted source: every field has a bound, counts that
// would overflow, NaN and infinities, huge and control-character strings,
// and a checkpoint's batch numbers are refused with the field named.
#include <gmock/gmock.h>
#include <google/protobuf/descriptor.h>
#include <gtest/gtest.h>

#include <string>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "common/job_spec.h"
#include "tests/unit/parsed_spec.h"

namespace lockstep {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

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

}  // namespace
}  // namespace lockstep
