// Dynamic loss scaling: the scale's state machine, and the cross-rank agreement that makes every
// rank skip the step in which any rank's gradient overflowed.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "mlp_training.h"

namespace {

using braid::dp::LossScaler;
using braid::dp::LossScalerOptions;
using braid::dp::Stage;

TEST(LossScaler, DefaultsFollowGradScaler) {
  LossScaler scaler;
  EXPECT_EQ(scaler.scale(), 65536.0);
  for (int i = 0; i < 1999; ++i) scaler.update(false);
  EXPECT_EQ(scaler.scale(), 65536.0);
  scaler.update(false);  // the 2000th clean step in a row
  EXPECT_EQ(scaler.scale(), 131072.0);
  scaler.update(true);
  EXPECT_EQ(scaler.scale(), 65536.0);
  EXPECT_EQ(scaler.cleanSteps(), 0);
}

TEST(LossScaler, OverflowRestartsTheCleanWindow) {
  LossScalerOptions options;
  options.growthInterval = 3;
  LossScaler scaler(options);
  scaler.update(false);
  scaler.update(false);
  scaler.update(true);  // 65536 -> 32768, window restarts
  scaler.update(false);
  scaler.update(false);
  EXPECT_EQ(scaler.scale(), 32768.0);
  scaler.update(false);
  EXPECT_EQ(scaler.scale(), 65536.0);
}

TEST(LossScaler, NeverBelowTheMinimum) {
  LossScalerOptions options;
  options.initialScale = 4;
  options.minScale = 1;
  LossScaler scaler(options);
  for (double expected : {2.0, 1.0, 1.0, 1.0}) {
    scaler.update(true);
    EXPECT_EQ(scaler.scale(), expected);
  }
}

TEST(LossScaler, HysteresisToleratesOverflowsInARow) {
  LossScalerOptions options;
  options.hysteresis = 3;
  LossScaler scaler(options);
  scaler.update(true);
  scaler.update(true);
  EXPECT_EQ(scaler.scale(), 65536.0);
  scaler.update(false);  // a clean step restores the tolerance
  scaler.update(true);
  scaler.update(true);
  EXPECT_EQ(scaler.scale(), 65536.0);
  scaler.update(true);  // the third in a row
  EXPECT_EQ(scaler.scale(), 32768.0);
  scaler.update(true);
  scaler.update(true);
  EXPECT_EQ(scaler.scale(), 32768.0);
}

TEST(LossScaler, RejectsNonsense) {
  for (auto change :
       std::vector<void (*)(LossScalerOptions&)>{[](LossScalerOptions& o) { o.minScale = 0; },
                                                 [](LossScalerOptions& o) { o.initialScale = 0.5; },
                                                 [](LossScalerOptions& o) { o.backoffFactor = 1; },
                                                 [](LossScalerOptions& o) { o.growthFactor = 0.5; },
                                                 [](LossScalerOptions& o) { o.growthInterval = 0; },
                                                 [](LossScalerOptions& o) { o.hysteresis = 0; }}) {
    LossScalerOptions options;
    change(options);
    try {
      LossScaler scaler(options);
      ADD_FAILURE() << "accepted invalid options";
    } catch (const braid::dp::Error& e) {
      EXPECT_EQ(e.code(), braidInvalidArgument);
    }
  }
}

// Three ranks (processes: nothing but the collectives can carry the verdict) train in fp16; at
// step kPlanted rank 1 finds an inf in one gradient element. After the reduction the inf sits on
// one rank (under ZeRO, the element's owner, not necessarily rank 1): only the all-reduced verdict
// lets every rank know.
constexpr int kPlanted = 2;
constexpr int kGrowthInterval = 4;

mlp::TrainConfig plantedRun(Stage stage, int steps, bool plant) {
  mlp::TrainConfig config;
  config.ranks = 3;
  config.steps = steps;
  config.globalBatch = 12;
  config.widths = {8, 12, 3};
  config.timeoutMs = 30000;
  config.launch = local_ranks::Launch::kProcesses;
  config.options.stage = stage;
  config.options.precision = braidFloat16;
  config.options.lossScaling = true;
  config.options.lossScaler.initialScale = 1024;
  config.options.lossScaler.growthInterval = kGrowthInterval;
  config.options.bucketBytes = config.options.firstBucketBytes = 64;  // several buckets
  if (plant)
    config.editGradient = [](int rank, int step, int layer, std::span<float> dWeights) {
      if (rank == 1 && step == kPlanted && layer == 0)
        dWeights[dWeights.size() / 2] = std::numeric_limits<float>::infinity();
    };
  return config;
}

class PlantedOverflow : public testing::TestWithParam<Stage> {};

TEST_P(PlantedOverflow, EveryRankSkipsAndTheScaleHalvesThenGrows) {
  const int steps = kPlanted + 1 + kGrowthInterval + 1;
  const mlp::TrainResult run = mlp::train(plantedRun(GetParam(), steps, true));
  ASSERT_EQ(run.errors(), "");
  for (const mlp::RankResult& r : run.ranks) {
    for (int s = 0; s < steps; ++s) {
      EXPECT_EQ(r.steps[s].applied, s != kPlanted) << "step " << s;
      // 1024 until the overflow, halved for the next kGrowthInterval clean steps, then doubled.
      const double expected = s <= kPlanted ? 1024 : s <= kPlanted + kGrowthInterval ? 512 : 1024;
      EXPECT_EQ(r.steps[s].lossScale, expected) << "step " << s;
    }
    EXPECT_TRUE(std::isinf(r.steps[kPlanted].gradNorm));
    EXPECT_EQ(r.parameters, run.ranks[0].parameters) << "ranks disagree on the parameters";
  }
}

// A skipped step changes nothing: training through the planted step ends where training that
// stops before it does.
TEST_P(PlantedOverflow, SkippedStepLeavesParametersUntouched) {
  const mlp::TrainResult skipped = mlp::train(plantedRun(GetParam(), kPlanted + 1, true));
  const mlp::TrainResult stopped = mlp::train(plantedRun(GetParam(), kPlanted, false));
  ASSERT_EQ(skipped.errors(), "");
  ASSERT_EQ(stopped.errors(), "");
  for (int r = 0; r < 3; ++r)
    EXPECT_EQ(skipped.ranks[r].parameters, stopped.ranks[r].parameters) << "rank " << r;
}

std::string stageName(const testing::TestParamInfo<Stage>& info) {
  const char* names[] = {"ddp", "zero1", "zero2"};
  return names[static_cast<int>(info.param)];
}

INSTANTIATE_TEST_SUITE_P(Dp, PlantedOverflow,
                         testing::Values(Stage::kDdp, Stage::kZero1, Stage::kZero2), stageName);

// Without loss scaling (fp32) a non-finite gradient still skips the step; the scale stays 1.
TEST(PlantedOverflowFp32, SkipsWithoutScaling) {
  mlp::TrainConfig config = plantedRun(Stage::kZero2, kPlanted + 2, true);
  config.options.precision = braidFloat32;
  config.options.lossScaling = false;
  const mlp::TrainResult run = mlp::train(config);
  ASSERT_EQ(run.errors(), "");
  for (const mlp::RankResult& r : run.ranks)
    for (int s = 0; s < config.steps; ++s) {
      EXPECT_EQ(r.steps[s].applied, s != kPlanted) << "step " << s;
      EXPECT_EQ(r.steps[s].lossScale, 1.0);
    }
}

}  // namespace
