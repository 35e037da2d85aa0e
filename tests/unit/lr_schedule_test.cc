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
  LrSchedule lr(Spec("none", 64, 0), 256);
  EXPECT_DOUBLE_EQ(lr.scaled_lr(), 0.1);
  EXPECT_DOUBLE_EQ(lr.At(0), 0.1);
}

TEST(LrScheduleTest, LinearScalesByBatchRatio) {
  LrSchedule lr(Spec("linear", 64, 0), 256);
  EXPECT_DOUBLE_EQ(lr.scaled_lr(), 0.4);
  EXPECT_DOUBLE_EQ(lr.At(1000), 0.4);
}

TEST(LrScheduleTest, SqrtScalesBySquareRootOfRatio) {
  LrSchedule lr(Spec("sqrt", 64, 0), 256);
  EXPECT_DOUBLE_EQ(lr.scaled_lr(), 0.2);
}

TEST(LrScheduleTest, ReferenceDefaultsToTheGlobalBatch) {
  LrSchedule lr(Spec("linear", 0, 0), 256);
  EXPECT_DOUBLE_EQ(lr.scaled_lr(), 0.1);
}

TEST(LrScheduleTest, WarmupRisesLinearlyFromBaseLr) {
  LrSchedule lr(Spec("linear", 64, 10), 256);  // 0.1 -> 0.4 over 10 steps
  EXPECT_DOUBLE_EQ(lr.At(0), 0.1);
  EXPECT_NEAR(lr.At(5), 0.25, 1e-12);
  EXPECT_NEAR(lr.At(9), 0.37, 1e-12);
  EXPECT_DOUBLE_EQ(lr.At(10), 0.4);
  EXPECT_DOUBLE_EQ(lr.At(11), 0.4);
  for (int step = 1; step <= 10; ++step)
    EXPECT_GT(lr.At(step), lr.At(step - 1));
}

}  // namespace
}  // namespace lockstep::worker
