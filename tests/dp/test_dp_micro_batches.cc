// A window of micro-batches as trainers drive one: gradient sync left on for every micro-batch
// (the default; PyTorch DDP then gives the sum of the micro-batches' averages), buckets readied in
// different orders on different ranks (DDP starts buckets in index order), a ZeRO-3 parameter set
// while its layer is gathered. The expected values are written here from each rank's known
// gradients, not by braid::dp. Ranks as threads; SGD with learning rate 1 and no momentum, so a
// parameter that starts at 0 ends at minus the window's gradient.
#include <gtest/gtest.h>

#include <braid/dp.hpp>
#include <cmath>
#include <mutex>
#include <string>
#include <vector>

#include "local_ranks.h"

namespace {

using braid::dp::DataParallel;
using braid::dp::OptimizerKind;
using braid::dp::Options;
using braid::dp::Stage;

Options plainSgd(Stage stage, braidDataType_t precision) {
  Options o;
  o.stage = stage;
  o.precision = precision;
  o.optimizer.kind = OptimizerKind::kSgd;
  o.optimizer.momentum = 0;
  o.optimizer.learningRate = 1;
  return o;
}

// Rank r's gradient of element i in micro-batch k: exact in fp16, as are the averages below.
float gradientOf(int rank, int microBatch, size_t i) {
  return static_cast<float>(rank + 1 + 4 * microBatch + static_cast<int>(i % 8));
}

struct Accumulation {
  Stage stage;
  braidDataType_t precision;
  int ranks;
};

class SyncOnEveryMicroBatch : public testing::TestWithParam<Accumulation> {};

// Three micro-batches, each reducing; 300k elements, so a bucket is still being reduced (in place,
// for DDP and ZeRO-1) when the next micro-batch starts writing into it. ZeRO-1 gave the average
// plus its own unreduced gradients again; DDP and ZeRO-1 raced the stream (wrong values that
// changed from run to run). fp16: each rank's gradient divided by the rank count is rounded.
TEST_P(SyncOnEveryMicroBatch, GivesTheSumOfTheMicroBatchesAverages) {
  const Accumulation a = GetParam();
  constexpr size_t kCount = 300000;
  constexpr int kMicroBatches = 3;
  const Options o = plainSgd(a.stage, a.precision);
  const double tolerance = a.precision == braidFloat16 ? 5e-3 : 1e-5;
  std::mutex mutex;
  std::vector<std::string> failures;
  const std::string errors = local_ranks::onThreads(a.ranks, [&](braidComm_t comm, int rank) {
    DataParallel dp(comm, o);
    const int w = dp.addParameter(kCount, "w");
    dp.finalize();
    dp.setParameter(w, std::vector<float>(kCount, 0.0f));
    for (int k = 0; k < kMicroBatches; ++k) {
      std::vector<float> g(kCount);
      for (size_t i = 0; i < kCount; ++i) g[i] = gradientOf(rank, k, i);
      braid::dp::accumulateFromFloat(g.data(), dp.gradient(w), dp.gradientType(), kCount);
      dp.markReady(w);
    }
    EXPECT_TRUE(dp.step().applied);
    std::vector<float> p(kCount);
    dp.gatherLayer(0);  // ZeRO-3; the other stages hold it whole
    dp.getParameter(w, p);
    dp.releaseLayer(0);
    for (size_t i = 0; i < kCount; ++i) {
      double window = 0;
      for (int k = 0; k < kMicroBatches; ++k) {
        double sum = 0;
        for (int r = 0; r < a.ranks; ++r) sum += gradientOf(r, k, i);
        window += sum / a.ranks;
      }
      if (!(std::fabs(p[i] + window) <= tolerance * window)) {  // NaN fails too
        std::lock_guard<std::mutex> lock(mutex);
        failures.push_back("rank " + std::to_string(rank) + " element " + std::to_string(i) + ": " +
                           std::to_string(p[i]) + " (expected " + std::to_string(-window) + ")");
        return;
      }
    }
  });
  EXPECT_EQ(errors, "");
  for (const std::string& failure : failures) ADD_FAILURE() << failure;
}

INSTANTIATE_TEST_SUITE_P(Dp, SyncOnEveryMicroBatch,
                         testing::Values(Accumulation{Stage::kDdp, braidFloat32, 3},
                                         Accumulation{Stage::kDdp, braidFloat16, 3},
                                         Accumulation{Stage::kZero1, braidFloat32, 2},
                                         Accumulation{Stage::kZero1, braidFloat16, 3},
                                         Accumulation{Stage::kZero2, braidFloat32, 3},
                                         Accumulation{Stage::kZero3, braidFloat16, 2}),
                         [](const testing::TestParamInfo<Accumulation>& info) {
                           return "Stage" + std::to_string(static_cast<int>(info.param.stage)) +
                                  (info.param.precision == braidFloat16 ? "Fp16" : "Fp32") +
                                  std::to_string(info.param.ranks) + "Ranks";
                         });

// Two parameters of one size in buckets of their own; rank 0 readies b first, the others a
// first. Their buckets must still meet their peers' same buckets: a's gradient is 3 on every rank,
// b's 300 (they were averaged with each other, 102 and 201, when buckets started as they became
// ready).
TEST(BucketOrder, RanksMayReadyParametersInDifferentOrders) {
  for (Stage stage : {Stage::kDdp, Stage::kZero1, Stage::kZero2}) {
    Options o = plainSgd(stage, braidFloat32);
    o.bucketBytes = o.firstBucketBytes = 4;  // a bucket per parameter
    constexpr size_t kCount = 4;
    const std::string errors = local_ranks::onThreads(3, [&](braidComm_t comm, int rank) {
      DataParallel dp(comm, o);
      const int a = dp.addParameter(kCount, "a"), b = dp.addParameter(kCount, "b");
      dp.finalize();
      for (int id : {a, b}) dp.setParameter(id, std::vector<float>(kCount, 0.0f));
      for (int id : rank == 0 ? std::vector<int>{b, a} : std::vector<int>{a, b}) {
        // Averages exact in fp32 after dividing first: 300 x float(1/3) rounds to 100.
        const std::vector<float> g(kCount, id == a ? 3.0f : 300.0f);
        braid::dp::accumulateFromFloat(g.data(), dp.gradient(id), dp.gradientType(), kCount);
        dp.markReady(id);
      }
      EXPECT_TRUE(dp.step().applied);
      std::vector<float> pa(kCount), pb(kCount);
      dp.getParameter(a, pa);
      dp.getParameter(b, pb);
      EXPECT_EQ(pa, std::vector<float>(kCount, -3.0f)) << "stage " << static_cast<int>(stage);
      EXPECT_EQ(pb, std::vector<float>(kCount, -300.0f)) << "stage " << static_cast<int>(stage);
    });
    EXPECT_EQ(errors, "");
  }
}

// Two windows, the first of three micro-batches synced, not, synced (PyTorch's no_sync in the
// middle), the second of one: what the first window accumulated aside (ZeRO-1) or in place must
// not leak into the second. Window w's gradient on rank r: (r + 1) * (w + 1) per micro-batch.
TEST(Windows, MixedSyncThenAFreshWindowGiveEachWindowsSum) {
  for (Stage stage : {Stage::kDdp, Stage::kZero1, Stage::kZero2}) {
    constexpr size_t kCount = 12;
    constexpr int kRanks = 3;
    const std::string errors = local_ranks::onThreads(kRanks, [&](braidComm_t comm, int rank) {
      DataParallel dp(comm, plainSgd(stage, braidFloat32));
      const int w = dp.addParameter(kCount, "w");
      dp.finalize();
      dp.setParameter(w, std::vector<float>(kCount, 0.0f));
      double expected = 0;
      for (int window = 0; window < 2; ++window) {
        const bool syncs[2][3] = {{true, false, true}, {true, true, true}};
        const int microBatches = window == 0 ? 3 : 1;
        for (int k = 0; k < microBatches; ++k) {
          dp.setGradientSync(syncs[window][k]);
          const std::vector<float> g(kCount, static_cast<float>((rank + 1) * (window + 1)));
          braid::dp::accumulateFromFloat(g.data(), dp.gradient(w), dp.gradientType(), kCount);
          dp.markReady(w);
          expected -= 2.0 * (window + 1);  // the ranks' average of (r + 1) * (w + 1)
        }
        EXPECT_TRUE(dp.step().applied);
        std::vector<float> p(kCount);
        dp.getParameter(w, p);
        EXPECT_EQ(p, std::vector<float>(kCount, static_cast<float>(expected)))
            << "stage " << static_cast<int>(stage) << " window " << window;
      }
    });
    EXPECT_EQ(errors, "");
  }
}

// ZeRO-2 with every rank readying buckets 3, 0, 1, 2 of 4 with 3 staging buffers: bucket 3 is
// complete but waits for bucket 0 (buckets start in index order) and keeps its buffer, so bucket
// 0 takes another that is free (it asked for buffer 0 mod 3, bucket 3's, and failed).
TEST(BucketOrder, Zero2StagesABucketBesideOneWaitingForItsTurn) {
  Options o = plainSgd(Stage::kZero2, braidFloat32);
  o.bucketBytes = o.firstBucketBytes = 4;  // a bucket per parameter
  o.stagingBuffers = 3;
  constexpr size_t kCount = 6;
  const std::string errors = local_ranks::onThreads(2, [&](braidComm_t comm, int rank) {
    DataParallel dp(comm, o);
    std::vector<int> ids;
    for (int i = 0; i < 4; ++i) ids.push_back(dp.addParameter(kCount));
    dp.finalize();
    for (int id : ids) dp.setParameter(id, std::vector<float>(kCount, 0.0f));
    for (int id : {0, 3, 2, 1}) {  // buckets 3, 0, 1, 2: they lie in reverse registration order
      const std::vector<float> g(kCount, static_cast<float>((rank + 1) * (id + 1)));
      braid::dp::accumulateFromFloat(g.data(), dp.gradient(id), dp.gradientType(), kCount);
      dp.markReady(id);
    }
    EXPECT_TRUE(dp.step().applied);
    for (int id : ids) {
      std::vector<float> p(kCount);
      dp.getParameter(id, p);
      EXPECT_EQ(p, std::vector<float>(kCount, -1.5f * (id + 1))) << "parameter " << id;
    }
  });
  EXPECT_EQ(errors, "");
}

// ZeRO-3: a parameter set while its layer is gathered is what the gathered copy then holds (it
// kept the old values until the layer was gathered again).
TEST(Zero3Parameters, SetWhileGatheredIsSeenAtOnce) {
  const std::string errors = local_ranks::onThreads(2, [](braidComm_t comm, int) {
    DataParallel dp(comm, plainSgd(Stage::kZero3, braidFloat32));
    const int w = dp.addParameter(6, "w");
    dp.finalize();
    dp.setParameter(w, std::vector<float>(6, 1.0f));
    dp.gatherLayer(0);
    dp.setParameter(w, std::vector<float>(6, 2.0f));
    std::vector<float> p(6);
    dp.getParameter(w, p);
    EXPECT_EQ(p, std::vector<float>(6, 2.0f));
    EXPECT_EQ(static_cast<const float*>(dp.parameter(w))[5], 2.0f);
    dp.releaseLayer(0);
    dp.gatherLayer(0);
    dp.getParameter(w, p);
    EXPECT_EQ(p, std::vector<float>(6, 2.0f));
    dp.releaseLayer(0);
  });
  EXPECT_EQ(errors, "");
}

}  // namespace
