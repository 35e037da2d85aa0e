// The learning-rate schedule: batch-size scaling, warmup, cosine and step
// decay.
#include "worker/train/lr_schedule.h"

#include <gtest/gtest.h>

#include <cmath>

namespace lockstep::worker {
namespace {

v1::JobSpec Spec(const char* scaling, int reference, int warmup) {
  v1::JobSpec spec;
  spec.set_base_lr(0.1);
  spec.set_lr_scaling(scaling);
  spec.set_reference_batch_size(reference);
  spec.set_warmup_steps(warmup);
  return spec;
}

TEST(LrScheduleTest, NoneKeepsBaseLr) {
  LrSchedule lr(Spec("none", 64, 0), 256, 1000);
  EXPECT_DOUBLE_EQ(lr.scaled_lr(), 0.1);
  EXPECT_DOUBLE_EQ(lr.At(0), 0.1);
}

TEST(LrScheduleTest, LinearScalesByBatchRatio) {
  LrSchedule lr(Spec("linear", 64, 0), 256, 1000);
  EXPECT_DOUBLE_EQ(lr.scaled_lr(), 0.4);
  EXPECT_DOUBLE_EQ(lr.At(1000), 0.4);
}

TEST(LrScheduleTest, SqrtScalesBySquareRootOfRatio) {
  LrSchedule lr(Spec("sqrt", 64, 0), 256, 1000);
  EXPECT_DOUBLE_EQ(lr.scaled_lr(), 0.2);
}

TEST(LrScheduleTest, ReferenceDefaultsToTheGlobalBatch) {
  LrSchedule lr(Spec("linear", 0, 0), 256, 1000);
  EXPECT_DOUBLE_EQ(lr.scaled_lr(), 0.1);
}

TEST(LrScheduleTest, WarmupRisesLinearlyFromBaseLr) {
  LrSchedule lr(Spec("linear", 64, 10), 256, 1000);  // 0.1 -> 0.4 over 10 steps
  EXPECT_DOUBLE_EQ(lr.At(0), 0.1);
  EXPECT_NEAR(lr.At(5), 0.25, 1e-12);
  EXPECT_NEAR(lr.At(9), 0.37, 1e-12);
  EXPECT_DOUBLE_EQ(lr.At(10), 0.4);
  EXPECT_DOUBLE_EQ(lr.At(11), 0.4);
  for (int step = 1; step <= 10; ++step)
    EXPECT_GT(lr.At(step), lr.At(step - 1));
}

// Warmup from 0.1 to 0.4 over 10 steps, then half a cosine down to 0.04 at
// step 110, held there after.
TEST(LrScheduleTest, CosineDecaysToMinLrOverTheRestOfTraining) {
  v1::JobSpec spec = Spec("linear", 64, 10);
  spec.set_lr_decay("cosine");
  spec.set_min_lr(0.04);
  LrSchedule lr(spec, 256, 110);
  EXPECT_DOUBLE_EQ(lr.At(5), 0.25);
  EXPECT_DOUBLE_EQ(lr.At(10), 0.4);
  EXPECT_NEAR(lr.At(60), 0.22, 1e-12);  // halfway: the mean of 0.4 and 0.04
  EXPECT_NEAR(lr.At(35), 0.04 + 0.36 * 0.5 * (1 + std::cos(M_PI / 4)), 1e-12);
  EXPECT_NEAR(lr.At(110), 0.04, 1e-12);
  EXPECT_NEAR(lr.At(500), 0.04, 1e-12);
}

TEST(LrScheduleTest, StepDecayMultipliesEveryNSteps) {
  v1::JobSpec spec = Spec("none", 64, 0);
  spec.set_lr_decay("step");
  spec.set_lr_decay_steps(100);
  spec.set_lr_decay_rate(0.5);
  LrSchedule lr(spec, 64, 1000);
  EXPECT_DOUBLE_EQ(lr.At(0), 0.1);
  EXPECT_DOUBLE_EQ(lr.At(99), 0.1);
  EXPECT_DOUBLE_EQ(lr.At(100), 0.05);
  EXPECT_DOUBLE_EQ(lr.At(250), 0.025);
}

TEST(LrScheduleTest, StepDecayCountsFromTheEndOfWarmup) {
  v1::JobSpec spec = Spec("none", 64, 20);
  spec.set_lr_decay("step");
  spec.set_lr_decay_steps(10);
  LrSchedule lr(spec, 64, 1000);  // rate unset: 0.1
  EXPECT_DOUBLE_EQ(lr.At(29), 0.1);
  EXPECT_NEAR(lr.At(30), 0.01, 1e-15);
}

}  // namespace
}  // namespace lockstep::worker
