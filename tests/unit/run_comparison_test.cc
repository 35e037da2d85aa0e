// Whether finished runs computed the same function (common/run_comparison.h),
// the one implementation behind CompareJobs, `lockstep compare` and
// lockstep.compare.
#include "common/run_comparison.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace lockstep {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

// A finished run of `losses.size()` steps on `replicas` workers, global
// batch 64 and scaled LR 0.1 unless `spec` or the plan says otherwise.
v1::JobStatus Finished(const std::string& id, int replicas,
                       const std::string& digest, std::vector<float> losses,
                       v1::JobSpec spec = v1::JobSpec()) {
  v1::JobStatus status;
  status.set_job_id(id);
  status.set_step(static_cast<int64_t>(losses.size()));
  spec.set_seed(1);
  spec.set_base_lr(0.1);
  *status.mutable_spec() = spec;
  for (float loss : losses) status.add_step_losses(loss);
  v1::TrainingPlan* plan = status.mutable_plan();
  plan->set_replicas(replicas);
  plan->set_global_batch_size(64);
  plan->set_scaled_lr(0.1);
  plan->set_total_steps(static_cast<int64_t>(losses.size()));
  v1::RankResult* rank = status.add_ranks();
  rank->set_rank(0);
  rank->set_model_digest(digest);
  return status;
}

const std::string kD1(64, '1'), kD2(64, '2'), kD3(64, '3');

TEST(RunComparisonTest, TheSameFunctionOnOneOrTwoWorkers) {
  const v1::JobStatus a = Finished("a", 1, kD1, {2.0, 1.0});
  RunVerdict v = CompareRuns(a, Finished("b", 1, kD1, {2.0, 1.0}));
  EXPECT_TRUE(v.same_function);
  EXPECT_THAT(v.text, HasSubstr("bit-identical"));
  v = CompareRuns(a, Finished("b", 2, kD2, {2.0, 1.5}));
  EXPECT_TRUE(v.same_function);
  EXPECT_THAT(v.text, HasSubstr("same function on 1 and 2 workers"));
  EXPECT_THAT(v.text, HasSubstr("at most 0.5 over 2 common steps"));
}

TEST(RunComparisonTest, WhatShapesTrainingDiffersHoweverDeep) {
  const v1::JobStatus a = Finished("a", 1, kD1, {2.0, 1.0});
  v1::JobSpec decay;
  decay.mutable_optimizer()->set_weight_decay(0.1);
  RunVerdict v = CompareRuns(a, Finished("b", 2, kD2, {2.0, 1.0}, decay));
  EXPECT_FALSE(v.same_function);
  EXPECT_THAT(v.text, HasSubstr("optimizer.weight_decay (unset vs 0.1)"));
  // Not where it ran, saved or reported.
  v1::JobSpec elsewhere;
  elsewhere.set_name("x");
  elsewhere.mutable_checkpoint()->set_backup_dir("/b");
  elsewhere.set_log_every_steps(7);
  EXPECT_TRUE(CompareRuns(a, Finished("b", 1, kD1, {2.0, 1.0}, elsewhere))
                  .same_function);
  // How gradients travel is not the function, except their rounding.
  v1::JobSpec ring;
  ring.mutable_communication()->set_algorithm("ring");
  ring.mutable_communication()->set_bucket_mb(4);
  ring.mutable_communication()->set_compression("none");
  EXPECT_TRUE(
      CompareRuns(a, Finished("b", 1, kD1, {2.0, 1.0}, ring)).same_function);
  v1::JobSpec bf16;
  bf16.mutable_communication()->set_compression("bf16");
  v = CompareRuns(a, Finished("b", 2, kD2, {2.0, 1.0}, bf16));
  EXPECT_FALSE(v.same_function);
  EXPECT_THAT(v.text,
              HasSubstr("communication.compression (\"none\" vs \"bf16\")"));
}

TEST(RunComparisonTest, SameSettingsOtherModelsAndUnfinishedRuns) {
  const v1::JobStatus a = Finished("a", 1, kD1, {2.0, 1.0});
  RunVerdict v = CompareRuns(a, Finished("b", 1, kD3, {2.0, 1.0}));
  EXPECT_FALSE(v.same_function);
  EXPECT_THAT(v.text, HasSubstr("CPU kernels"));
  v = CompareRuns(a, Finished("b", 1, "", {2.0}));
  EXPECT_FALSE(v.same_function);
  EXPECT_THAT(v.text, HasSubstr("cannot tell yet"));
  EXPECT_EQ(CompareAllRuns({a, a, a}).size(), 3u);
}

TEST(RunComparisonTest, WarningsNameWhatMakesCurvesDiverge) {
  const v1::JobStatus a = Finished("a", 1, kD1, {2.0, 1.0});
  EXPECT_THAT(CompareWarnings({a, a}), IsEmpty());
  v1::JobStatus bigger = Finished("b", 2, kD2, {2.0, 1.0});
  bigger.mutable_plan()->set_global_batch_size(128);
  EXPECT_THAT(CompareWarnings({a, bigger}),
              ElementsAre(HasSubstr("the runs differ in global batch (a 64, "
                                    "b 128)")));
  v1::JobSpec linear;
  linear.set_lr_scaling("linear");
  v1::JobStatus scaled = Finished("c", 1, kD2, {2.0, 1.0}, linear);
  EXPECT_THAT(CompareWarnings({a, scaled}),
              ElementsAre(HasSubstr("the runs differ in lr_scaling")));
  v1::JobStatus faster = Finished("d", 1, kD2, {2.0, 1.0});
  faster.mutable_plan()->set_scaled_lr(0.2);
  EXPECT_THAT(CompareWarnings({a, faster}),
              ElementsAre(HasSubstr("the same global batch but different "
                                    "learning rates (a 0.1, d 0.2)")));
}

}  // namespace
}  // namespace lockstep
