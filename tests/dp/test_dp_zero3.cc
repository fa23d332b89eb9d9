// ZeRO-3 (Stage::kZero3): parameters sharded like the optimizer state, a layer gathered whole just
// before it computes (the next one prefetched) and freed after, gradients reduce-scattered as
// they are produced. Equivalence: ZeRO-3 trains bit for bit as ZeRO-2 (the same reduce-scatter,
// the same update of the same shard; ZeRO-2 is checked against single-rank training in
// test_dp_equivalence), for fp32 AdamW, fp16 Adam with loss scaling and bf16 SGD, on 1, 2 and 3
// ranks, 200 steps. Memory: 16P/N per rank with mixed-precision Adam, plus staging and one layer
// gathered, exactly. Communication: 3P per step (two gathers and a reduce-scatter), counted.
// Usage errors: an ungathered layer's parameters, a step with a layer still gathered, a layer out
// of range, a layer begun after finalize().
#include <gtest/gtest.h>

#include <braid/dp.hpp>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "dp/synthetic_training.h"
#include "local_ranks.h"

namespace {

using braid::dp::DataParallel;
using braid::dp::OptimizerKind;
using braid::dp::Options;
using braid::dp::Stage;
using synthetic::kLayers;
using synthetic::Model;
using synthetic::registerModel;
using synthetic::train;
using synthetic::trainStep;

struct Config {
  const char* name;
  braidDataType_t precision;
  OptimizerKind optimizer;
};

class Zero3Equivalence : public testing::TestWithParam<Config> {};

TEST_P(Zero3Equivalence, TrainsBitForBitAsZero2) {
  const Config& c = GetParam();
  Options zero2;
  zero2.stage = Stage::kZero2;
  zero2.precision = c.precision;
  zero2.lossScaling = c.precision == braidFloat16;
  zero2.optimizer.kind = c.optimizer;
  zero2.optimizer.learningRate = 1e-2;
  zero2.optimizer.maxGradNorm = 5;
  zero2.bucketBytes = 2048;  // several buckets per layer
  zero2.firstBucketBytes = 512;
  zero2.stagingBuffers = 4;
  Options zero3 = zero2;
  zero3.stage = Stage::kZero3;
  for (int nranks : {1, 2, 3}) {
    SCOPED_TRACE(std::to_string(nranks) + " ranks");
    const auto expected = train(nranks, zero2, 200);
    const auto got = train(nranks, zero3, 200);
    for (int r = 0; r < nranks; ++r) {
      ASSERT_EQ(got[r].size(), expected[r].size());
      for (size_t p = 0; p < got[r].size(); ++p) {
        ASSERT_EQ(got[r][p].size(), expected[r][p].size());
        EXPECT_EQ(std::memcmp(got[r][p].data(), expected[r][p].data(), got[r][p].size() * 4), 0)
            << "rank " << r << " parameter " << p << ": " << got[r][p][0] << " vs "
            << expected[r][p][0];
      }
      EXPECT_EQ(std::memcmp(got[r][0].data(), got[0][0].data(), got[0][0].size() * 4), 0)
          << "rank " << r << " ends elsewhere than rank 0";
      EXPECT_NE(got[r][0][0], 0.5f) << "the first parameter did not train";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Dp, Zero3Equivalence,
                         testing::Values(Config{"fp32_adamw", braidFloat32, OptimizerKind::kAdamW},
                                         Config{"fp16_adam", braidFloat16, OptimizerKind::kAdam},
                                         Config{"bf16_sgd", braidBfloat16, OptimizerKind::kSgd}),
                         [](const testing::TestParamInfo<Config>& info) {
                           return std::string(info.param.name);
                         });

// Mixed-precision Adam on 4 ranks: the fp16 working shard (2P/N), the fp16 gradient shard (2P/N)
// and the fp32 master weights and moments (12P/N) make 16P/N; the staging buffers and two adjacent
// layers gathered (one computing, the next prefetched) come on top. Each step moves 3P elements
// through collectives: a gather of every layer in the forward pass and another in the backward
// pass, and the gradients' reduce-scatter.
TEST(Zero3, MemoryIs16POverNAndEachStepMoves3P) {
  constexpr int kRanks = 4;
  const std::string errors = local_ranks::onThreads(kRanks, [&](braidComm_t comm, int rank) {
    Options o;
    o.stage = Stage::kZero3;
    o.precision = braidFloat16;
    o.optimizer.kind = OptimizerKind::kAdamW;
    o.bucketBytes = 1 << 20;  // a bucket per layer
    o.stagingBuffers = 2;
    DataParallel dp(comm, o);
    const Model m = registerModel(dp);
    dp.finalize();
    const braid::dp::MemoryReport r = dp.memoryReport();
    const size_t P = r.paddedParameterCount;
    size_t expectedP = 0, largest = 0;
    std::vector<size_t> padded;  // each layer's bucket, padded to the ranks
    for (const auto& layer : kLayers) {
      size_t inLayer = 0;
      for (size_t count : layer) inLayer += count;
      padded.push_back((inLayer + kRanks - 1) / kRanks * kRanks);
      expectedP += padded.back();
      largest = std::max(largest, padded.back());
    }
    size_t adjacent = 0;  // a layer gathered, the next prefetched
    for (size_t l = 0; l + 1 < padded.size(); ++l)
      adjacent = std::max(adjacent, padded[l] + padded[l + 1]);
    EXPECT_EQ(P, expectedP);
    EXPECT_EQ(r.parameterBytes, 2 * P / kRanks);
    EXPECT_EQ(r.gradientBytes, 2 * P / kRanks);
    EXPECT_EQ(r.optimizerStateBytes, 12 * P / kRanks);
    EXPECT_EQ(r.parameterBytes + r.gradientBytes + r.optimizerStateBytes, 16 * P / kRanks);
    EXPECT_EQ(r.gatheredBytes, 2 * adjacent);
    EXPECT_EQ(r.gradientStagingBytes, 2 * 2 * largest);  // 2 buffers of the largest bucket
    const uint64_t before = dp.collectiveBytes();
    trainStep(dp, m, 0, rank);
    EXPECT_EQ(dp.collectiveBytes() - before, 3 * 2 * P) << "bytes: 3P elements of 2 bytes";
  });
  EXPECT_EQ(errors, "");
}

TEST(Zero3, UsageErrorsNameWhatWasExpected) {
  const std::string errors = local_ranks::onThreads(2, [&](braidComm_t comm, int) {
    Options o;
    o.stage = Stage::kZero3;
    DataParallel dp(comm, o);
    const Model m = registerModel(dp);
    dp.finalize();
    auto expectError = [&](const std::function<void()>& call, braidResult_t code,
                           const char* words) {
      try {
        call();
        ADD_FAILURE() << "no error; expected one saying '" << words << "'";
      } catch (const braid::dp::Error& e) {
        EXPECT_EQ(e.code(), code) << e.what();
        EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
      }
    };
    expectError([&] { dp.parameter(m.ids[1][0]); }, braidInvalidUsage, "expected gatherLayer(1)");
    expectError([&] { dp.gatherLayer(7); }, braidInvalidArgument, "layer out of range");
    expectError([&] { dp.beginLayer(); }, braidInvalidUsage, "beginLayer() after finalize()");
    dp.gatherLayer(0);  // both ranks: a collective
    expectError([&] { dp.step(); }, braidInvalidUsage, "step() while layer 0 is gathered");
    dp.releaseLayer(0);
  });
  EXPECT_EQ(errors, "");
}

}  // namespace
