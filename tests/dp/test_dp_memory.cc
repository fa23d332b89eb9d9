// The memory report: bytes per rank for parameters, gradients and optimizer state follow the
// ZeRO paper's accounting (mixed-precision Adam: K = 12 bytes of state per parameter).
#include <gtest/gtest.h>

#include <braid/dp.hpp>
#include <numeric>
#include <string>
#include <vector>

#include "local_ranks.h"

namespace {

using braid::dp::DataParallel;
using braid::dp::MemoryReport;
using braid::dp::OptimizerKind;
using braid::dp::Options;
using braid::dp::Stage;

struct Layout {
  std::vector<size_t> counts;
  size_t bucketBytes;
};

// Builds a DataParallel on each of `nranks` ranks and returns each rank's report.
std::vector<MemoryReport> reports(int nranks, const Options& options, const Layout& layout,
                                  std::vector<int>* buckets = nullptr) {
  std::vector<MemoryReport> result(nranks);
  std::vector<int> bucketCounts(nranks);
  const std::string errors = local_ranks::onThreads(nranks, [&](braidComm_t comm, int rank) {
    Options o = options;
    o.bucketBytes = o.firstBucketBytes = layout.bucketBytes;
    DataParallel dp(comm, o);
    for (size_t count : layout.counts) dp.addParameter(count);
    dp.finalize();
    result[rank] = dp.memoryReport();
    bucketCounts[rank] = dp.bucketCount();
  });
  EXPECT_EQ(errors, "");
  if (buckets != nullptr) *buckets = bucketCounts;
  return result;
}

Options mixedPrecisionAdam(Stage stage) {
  Options o;
  o.stage = stage;
  o.precision = braidFloat16;
  o.optimizer.kind = OptimizerKind::kAdamW;
  return o;
}

// P = 12000 is divisible by 1..4 and one bucket holds everything: no padding, exact figures.
TEST(Memory, ExactWithoutPadding) {
  const Layout layout{{4000, 40, 7960}, 1u << 20};
  const size_t P = 12000;
  for (int n = 1; n <= 4; ++n) {
    SCOPED_TRACE("ranks " + std::to_string(n));
    for (const MemoryReport& m : reports(n, mixedPrecisionAdam(Stage::kDdp), layout)) {
      EXPECT_EQ(m.paddedParameterCount, P);
      EXPECT_EQ(m.parameterBytes, 2 * P);
      EXPECT_EQ(m.gradientBytes, 2 * P);
      EXPECT_EQ(m.optimizerStateBytes, 12 * P);
      EXPECT_EQ(m.total(), 16 * P);  // the ZeRO paper's baseline
    }
    for (const MemoryReport& m : reports(n, mixedPrecisionAdam(Stage::kZero1), layout)) {
      EXPECT_EQ(m.optimizerStateBytes, 12 * P / n);
      EXPECT_EQ(m.gradientBytes, 2 * P);
      EXPECT_EQ(m.gradientStagingBytes, 0u);
      EXPECT_EQ(m.total(), 4 * P + 12 * P / n);
    }
    for (const MemoryReport& m : reports(n, mixedPrecisionAdam(Stage::kZero2), layout)) {
      EXPECT_EQ(m.optimizerStateBytes, 12 * P / n);
      EXPECT_EQ(m.gradientBytes, 2 * P / n);
      EXPECT_EQ(m.gradientStagingBytes, 2 * P);  // one bucket: one staging buffer
      EXPECT_EQ(m.total() - m.gradientStagingBytes, 2 * P + 14 * P / n);
    }
  }
}

// fp32 gradients (Options::fp32Gradients) with fp16 parameters: 4 bytes per gradient element
// held, wherever the stage keeps gradients; parameters and optimizer state are unchanged.
TEST(Memory, Fp32GradientsTakeFourBytes) {
  const Layout layout{{4000, 40, 7960}, 1u << 20};
  const size_t P = 12000;
  for (int n = 1; n <= 4; ++n) {
    SCOPED_TRACE("ranks " + std::to_string(n));
    Options o = mixedPrecisionAdam(Stage::kDdp);
    o.fp32Gradients = true;
    for (const MemoryReport& m : reports(n, o, layout)) {
      EXPECT_EQ(m.parameterBytes, 2 * P);
      EXPECT_EQ(m.gradientBytes, 4 * P);
      EXPECT_EQ(m.total(), 18 * P);
    }
    o.stage = Stage::kZero1;
    for (const MemoryReport& m : reports(n, o, layout)) {
      EXPECT_EQ(m.gradientBytes, 4 * P);
      EXPECT_EQ(m.total(), 6 * P + 12 * P / n);
    }
    o.stage = Stage::kZero2;
    for (const MemoryReport& m : reports(n, o, layout)) {
      EXPECT_EQ(m.gradientBytes, 4 * P / n);
      EXPECT_EQ(m.gradientStagingBytes, 4 * P);
      EXPECT_EQ(m.total() - m.gradientStagingBytes, 2 * P + 16 * P / n);
    }
  }
}

// Awkward counts and many buckets: every bucket is padded to a multiple of N, so the padded
// count exceeds P by less than N per bucket, and the shard figures are exact in the padded count.
TEST(Memory, ShardsExactUpToPadding) {
  const Layout layout{{1001, 7, 333, 2, 997, 61, 5, 1283}, 1000};
  const size_t P = std::accumulate(layout.counts.begin(), layout.counts.end(), size_t{0});
  for (int n = 1; n <= 4; ++n) {
    SCOPED_TRACE("ranks " + std::to_string(n));
    for (Stage stage : {Stage::kZero1, Stage::kZero2}) {
      std::vector<int> buckets;
      for (const MemoryReport& m : reports(n, mixedPrecisionAdam(stage), layout, &buckets)) {
        const size_t padded = m.paddedParameterCount;
        EXPECT_EQ(m.parameterCount, P);
        EXPECT_EQ(padded % n, 0u);
        EXPECT_GE(padded, P);
        EXPECT_LT(padded - P, static_cast<size_t>(n) * buckets[0]);
        EXPECT_EQ(m.optimizerStateBytes, 12 * padded / n);
        EXPECT_EQ(m.gradientBytes, stage == Stage::kZero2 ? 2 * padded / n : 2 * padded);
      }
      EXPECT_GE(buckets[0], 3);
    }
  }
}

// State per parameter follows the optimizer and the precision: SGD with momentum keeps one
// moment (8 bytes with the fp32 master), fp32 training needs no separate master (8 for Adam).
TEST(Memory, StateFollowsOptimizerAndPrecision) {
  const Layout layout{{12000}, 1u << 20};
  const size_t P = 12000;
  Options sgd = mixedPrecisionAdam(Stage::kZero1);
  sgd.optimizer.kind = OptimizerKind::kSgd;
  Options plainSgd = sgd;
  plainSgd.optimizer.momentum = 0;
  Options fp32Adam = mixedPrecisionAdam(Stage::kZero1);
  fp32Adam.precision = braidFloat32;
  Options bf16Adam = mixedPrecisionAdam(Stage::kZero1);
  bf16Adam.precision = braidBfloat16;
  EXPECT_EQ(reports(4, sgd, layout)[0].optimizerStateBytes, 8 * P / 4);
  EXPECT_EQ(reports(4, plainSgd, layout)[0].optimizerStateBytes, 4 * P / 4);
  EXPECT_EQ(reports(4, fp32Adam, layout)[0].optimizerStateBytes, 8 * P / 4);
  EXPECT_EQ(reports(4, fp32Adam, layout)[0].parameterBytes, 4 * P);
  EXPECT_EQ(reports(4, bf16Adam, layout)[0].optimizerStateBytes, 12 * P / 4);
}

}  // namespace
