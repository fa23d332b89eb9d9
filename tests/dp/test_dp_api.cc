// braid::dp's smaller parts: element conversion, large-batch helpers, bucket layout, and the
// usage errors a trainer can make (each must be a clear braid::dp::Error, not a hang or a crash).
#include <gtest/gtest.h>

#include <braid/dp.hpp>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "local_ranks.h"

namespace {

using braid::dp::DataParallel;
using braid::dp::Options;
using braid::dp::Stage;

uint16_t halfBits(float x) {
  uint16_t bits;
  braid::dp::convertFromFloat(&x, &bits, braidFloat16, 1);
  return bits;
}
uint16_t bfloat16Bits(float x) {
  uint16_t bits;
  braid::dp::convertFromFloat(&x, &bits, braidBfloat16, 1);
  return bits;
}
float fromBits(uint16_t bits, braidDataType_t type) {
  float x;
  braid::dp::convertToFloat(&bits, type, &x, 1);
  return x;
}

TEST(Convert, HalfKnownValues) {
  EXPECT_EQ(halfBits(1.0f), 0x3c00);
  EXPECT_EQ(halfBits(-2.0f), 0xc000);
  EXPECT_EQ(halfBits(65504.0f), 0x7bff);  // the largest finite half
  EXPECT_EQ(halfBits(65520.0f), 0x7c00);  // rounds up to inf
  EXPECT_EQ(halfBits(1.0f / 3), 0x3555);
  EXPECT_EQ(halfBits(std::ldexp(1.0f, -24)), 0x0001);         // the smallest subnormal
  EXPECT_EQ(halfBits(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // a tie rounds to even
  EXPECT_EQ(halfBits(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  EXPECT_TRUE(std::isnan(fromBits(0x7e00, braidFloat16)));
  EXPECT_EQ(fromBits(0x7c00, braidFloat16), std::numeric_limits<float>::infinity());
}

TEST(Convert, EveryHalfRoundTrips) {
  for (uint32_t bits = 0; bits < 0x10000; ++bits) {
    const float x = fromBits(static_cast<uint16_t>(bits), braidFloat16);
    if (std::isnan(x)) continue;
    ASSERT_EQ(halfBits(x), bits) << "half 0x" << std::hex << bits;
  }
}

TEST(Convert, Bfloat16RoundsToNearestEven) {
  auto fromWord = [](uint32_t word) {
    float x;
    std::memcpy(&x, &word, 4);
    return x;
  };
  EXPECT_EQ(bfloat16Bits(1.0f), 0x3f80);
  EXPECT_EQ(bfloat16Bits(fromWord(0x3f808000)), 0x3f80);  // tie, even stays
  EXPECT_EQ(bfloat16Bits(fromWord(0x3f818000)), 0x3f82);  // tie, odd rounds up
  EXPECT_EQ(bfloat16Bits(fromWord(0x3f808001)), 0x3f81);
  EXPECT_EQ(bfloat16Bits(fromWord(0x7f7fffff)), 0x7f80);  // the largest float rounds to inf
  EXPECT_TRUE(std::isnan(fromBits(bfloat16Bits(std::nanf("")), braidBfloat16)));
  EXPECT_EQ(fromBits(0x4049, braidBfloat16), 3.140625f);
}

TEST(Convert, AccumulateRoundsOnce) {
  uint16_t sum = halfBits(1.0f);
  const float add = std::ldexp(1.0f, -11);  // half an ulp of 1: alone it would vanish
  const float twice[] = {add + add};
  braid::dp::accumulateFromFloat(twice, &sum, braidFloat16, 1);
  EXPECT_EQ(sum, 0x3c01);
  float fp32 = 1.5f;
  braid::dp::accumulateFromFloat(twice, &fp32, braidFloat32, 1);
  EXPECT_EQ(fp32, 1.5f + 2 * add);
}

TEST(Convert, RejectsTypesGradientsCannotHave) {
  try {
    braid::dp::elementSize(braidInt32);
    ADD_FAILURE() << "braidInt32 accepted";
  } catch (const braid::dp::Error& e) {
    EXPECT_EQ(e.code(), braidInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("braidFloat16"), std::string::npos) << e.what();
  }
}

TEST(LargeBatch, LinearScalingAndWarmup) {
  EXPECT_DOUBLE_EQ(braid::dp::scaleLearningRate(0.1, 256, 8192), 3.2);  // Goyal et al.
  EXPECT_DOUBLE_EQ(braid::dp::warmupLearningRate(0.1, 3.2, 0, 100), 0.1);
  EXPECT_DOUBLE_EQ(braid::dp::warmupLearningRate(0.1, 3.2, 50, 100), 1.65);
  EXPECT_DOUBLE_EQ(braid::dp::warmupLearningRate(0.1, 3.2, 100, 100), 3.2);
  EXPECT_DOUBLE_EQ(braid::dp::warmupLearningRate(0.1, 3.2, 1000, 100), 3.2);
  EXPECT_DOUBLE_EQ(braid::dp::warmupLearningRate(0.1, 3.2, 0, 0), 3.2);
  EXPECT_THROW(braid::dp::scaleLearningRate(0.1, 0, 8), braid::dp::Error);
  EXPECT_THROW(braid::dp::warmupLearningRate(0.1, 1, -1, 5), braid::dp::Error);
}

// Runs `body` on one rank and returns what it threw ("" if nothing).
std::string errorFrom(const Options& options, const std::function<void(DataParallel&)>& body) {
  std::string what;
  const std::string errors = local_ranks::onThreads(1, [&](braidComm_t comm, int) {
    DataParallel dp(comm, options);
    try {
      body(dp);
    } catch (const braid::dp::Error& e) {
      EXPECT_NE(e.code(), braidSuccess);
      what = e.what();
    }
  });
  EXPECT_EQ(errors, "");
  return what;
}

// DDP's assignment: reverse order, the first bucket capped smaller, a bucket closes once full.
TEST(Buckets, ReverseOrderFirstBucketSmaller) {
  Options o;
  o.firstBucketBytes = 4000;
  o.bucketBytes = 8000;
  const std::string what = errorFrom(o, [](DataParallel& dp) {
    for (int i = 0; i < 10; ++i) dp.addParameter(1000);  // 4000 bytes each
    dp.finalize();
    // {p9}, {p8, p7}, {p6, p5}, {p4, p3}, {p2, p1}, {p0}
    EXPECT_EQ(dp.bucketCount(), 6);
  });
  EXPECT_EQ(what, "");
}

struct Misuse {
  const char* name;
  const char* expected;  // part of the message
  std::function<void(DataParallel&)> body;
};

class Usage : public testing::TestWithParam<Misuse> {};

void twoParameters(DataParallel& dp) {
  dp.addParameter(5, "w");
  dp.addParameter(3, "b");
  dp.finalize();
}

TEST_P(Usage, FailsClearly) {
  Options o;
  o.stage = Stage::kZero2;
  o.stagingBuffers = 1;
  o.bucketBytes = o.firstBucketBytes = 4;  // one bucket per parameter
  const std::string what = errorFrom(o, GetParam().body);
  EXPECT_NE(what.find(GetParam().expected), std::string::npos) << what;
}

INSTANTIATE_TEST_SUITE_P(
    Dp, Usage,
    testing::Values(Misuse{"AddAfterFinalize", "after finalize",
                           [](DataParallel& dp) {
                             twoParameters(dp);
                             dp.addParameter(1);
                           }},
                    Misuse{"UseBeforeFinalize", "before finalize",
                           [](DataParallel& dp) {
                             dp.addParameter(1);
                             dp.markReady(0);
                           }},
                    Misuse{"IdOutOfRange", "out of range",
                           [](DataParallel& dp) {
                             twoParameters(dp);
                             dp.gradient(2);
                           }},
                    Misuse{"WrongInitialValueCount", "(expected 5)",
                           [](DataParallel& dp) {
                             twoParameters(dp);
                             dp.setParameter(0, std::vector<float>(4));
                           }},
                    Misuse{"ReadyTwice", "twice",
                           [](DataParallel& dp) {
                             twoParameters(dp);
                             dp.markReady(1);
                             dp.markReady(1);
                           }},
                    Misuse{"GradientAfterReady", "after markReady",
                           [](DataParallel& dp) {
                             twoParameters(dp);
                             dp.markReady(1);
                             dp.gradient(1);
                           }},
                    Misuse{"StepMidMicroBatch", "'w' is not",
                           [](DataParallel& dp) {
                             twoParameters(dp);
                             dp.markReady(1);
                             dp.step();
                           }},
                    Misuse{"StepAfterNoSync", "after a no-sync micro-batch",
                           [](DataParallel& dp) {
                             twoParameters(dp);
                             dp.setGradientSync(false);
                             dp.markReady(1);
                             dp.markReady(0);
                             dp.step();
                           }},
                    Misuse{"SyncSwitchMidMicroBatch", "between micro-batches",
                           [](DataParallel& dp) {
                             twoParameters(dp);
                             dp.markReady(1);
                             dp.setGradientSync(false);
                           }},
                    Misuse{"TooFewStagingBuffers", "raise Options::stagingBuffers",
                           [](DataParallel& dp) {
                             twoParameters(dp);
                             dp.gradient(1);  // bucket 0 takes the only staging buffer ...
                             dp.gradient(0);  // ... while bucket 1 needs it
                           }}),
    [](const testing::TestParamInfo<Misuse>& info) { return std::string(info.param.name); });

TEST(Usage, RejectsPrecisionGradientsCannotHave) {
  Options o;
  o.precision = braidInt8;
  const std::string errors =
      local_ranks::onThreads(1, [&](braidComm_t comm, int) { DataParallel dp(comm, o); });
  EXPECT_NE(errors.find("is not supported"), std::string::npos) << errors;
}

// gradient() holds the precision's type unless fp32Gradients asks for fp32.
TEST(Usage, GradientTypeFollowsOptions) {
  struct Expected {
    braidDataType_t precision;
    bool fp32Gradients;
    braidDataType_t gradientType;
  };
  for (const Expected& e :
       {Expected{braidFloat16, false, braidFloat16}, Expected{braidFloat16, true, braidFloat32},
        Expected{braidBfloat16, false, braidBfloat16}, Expected{braidBfloat16, true, braidFloat32},
        Expected{braidFloat32, true, braidFloat32}}) {
    Options o;
    o.precision = e.precision;
    o.fp32Gradients = e.fp32Gradients;
    const std::string errors = local_ranks::onThreads(1, [&](braidComm_t comm, int) {
      DataParallel dp(comm, o);
      EXPECT_EQ(dp.gradientType(), e.gradientType)
          << "precision " << e.precision << ", fp32Gradients " << e.fp32Gradients;
    });
    EXPECT_EQ(errors, "");
  }
}

// A complete step with the right calls works (the misuse cases above start from the same state).
TEST(Usage, WellFormedStepSucceeds) {
  Options o;
  o.stage = Stage::kZero2;
  o.stagingBuffers = 1;
  o.bucketBytes = o.firstBucketBytes = 4;
  const std::string what = errorFrom(o, [](DataParallel& dp) {
    twoParameters(dp);
    for (int micro = 0; micro < 2; ++micro) {
      dp.setGradientSync(micro == 1);
      for (int id : {1, 0}) {
        const float ones[5] = {1, 1, 1, 1, 1};
        braid::dp::accumulateFromFloat(ones, dp.gradient(id), braidFloat32, id == 0 ? 5 : 3);
        dp.markReady(id);
      }
    }
    const braid::dp::StepResult r = dp.step();
    EXPECT_TRUE(r.applied);
    EXPECT_DOUBLE_EQ(r.gradNorm, std::sqrt(8.0 * 4));  // two micro-batches of ones
  });
  EXPECT_EQ(what, "");
}

}  // namespace
