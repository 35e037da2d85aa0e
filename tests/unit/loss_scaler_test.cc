// Dynamic loss scaling: back off on overflow, grow after good steps.
#include "worker/train/loss_scaler.h"

#include <gtest/gtest.h>

namespace lockstep::worker {
namespace {

LossScaler::Options Small() {
  LossScaler::Options options;
  options.initial_scale = 1024;
  options.growth_interval = 3;
  options.min_scale = 1;
  options.max_scale = 4096;
  return options;
}

TEST(LossScalerTest, DisabledAppliesEveryStepAtScaleOne) {
  LossScaler scaler;
  EXPECT_EQ(scaler.scale(), 1);
  EXPECT_TRUE(scaler.Update(false));
  EXPECT_TRUE(scaler.Update(true));
  EXPECT_EQ(scaler.scale(), 1);
  EXPECT_EQ(scaler.skipped_steps(), 0);
}

TEST(LossScalerTest, OverflowSkipsTheStepAndHalvesTheScale) {
  LossScaler scaler(true, Small());
  EXPECT_EQ(scaler.scale(), 1024);
  EXPECT_TRUE(scaler.Update(true));
  EXPECT_EQ(scaler.good_steps(), 1);
  EXPECT_FALSE(scaler.Update(false));
  EXPECT_EQ(scaler.scale(), 512);
  EXPECT_EQ(scaler.good_steps(), 0);
  EXPECT_EQ(scaler.skipped_steps(), 1);
  EXPECT_FALSE(scaler.Update(false));
  EXPECT_EQ(scaler.scale(), 256);
  EXPECT_EQ(scaler.consecutive_skips(), 2);
  EXPECT_TRUE(scaler.Update(true));
  EXPECT_EQ(scaler.consecutive_skips(), 0);
  EXPECT_EQ(scaler.skipped_steps(), 2);
}

TEST(LossScalerTest, GrowsAfterTheIntervalOfGoodStepsUpToTheMaximum) {
  LossScaler scaler(true, Small());
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(scaler.Update(true));
  EXPECT_EQ(scaler.scale(), 2048);
  EXPECT_EQ(scaler.good_steps(), 0);
  for (int i = 0; i < 9; ++i) scaler.Update(true);
  EXPECT_EQ(scaler.scale(), 4096);  // capped
}

TEST(LossScalerTest, NeverFallsBelowTheMinimum) {
  LossScaler scaler(true, Small());
  for (int i = 0; i < 20; ++i) EXPECT_FALSE(scaler.Update(false));
  EXPECT_EQ(scaler.scale(), 1);
  EXPECT_EQ(scaler.skipped_steps(), 20);
}

TEST(LossScalerTest, RestoreContinuesWhereTheCheckpointLeft) {
  LossScaler scaler(true, Small());
  scaler.Restore(128, 2, 7);
  EXPECT_EQ(scaler.scale(), 128);
  EXPECT_TRUE(scaler.Update(true));  // the third good step: grows
  EXPECT_EQ(scaler.scale(), 256);
  EXPECT_EQ(scaler.skipped_steps(), 7);
  LossScaler disabled;
  disabled.Restore(128, 2, 7);
  EXPECT_EQ(disabled.scale(), 1);
}

}  // namespace
}  // namespace lockstep::worker
