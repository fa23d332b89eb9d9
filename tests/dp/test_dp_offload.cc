// OffloadTier::kFile: the optimizer state (fp32 master weights and moments of the owned shard) in
// a file per rank, paged in and out around each bucket's update on a thread of its own.
// Equivalence: every stage x precision x optimizer trains to the same parameters, bit for bit, as
// with the state resident, on 1 and 2 ranks (threads), over 200 steps of a problem whose
// gradients depend on the parameters (so a wrong page of state would show). Memory: the state
// leaves the resident set (RSS measured), two buckets' worth staying. Errors: a directory that
// cannot hold the file.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <braid/dp.hpp>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "dp/synthetic_training.h"
#include "local_ranks.h"

namespace {

using braid::dp::DataParallel;
using braid::dp::OffloadTier;
using braid::dp::OptimizerKind;
using braid::dp::Options;
using braid::dp::Stage;

struct Config {
  const char* name;
  Stage stage;
  braidDataType_t precision;
  OptimizerKind optimizer;
};

class OffloadEquivalence : public testing::TestWithParam<Config> {};

TEST_P(OffloadEquivalence, OffloadedTrainsBitForBitAsResident) {
  const Config& c = GetParam();
  Options resident;
  resident.stage = c.stage;
  resident.precision = c.precision;
  resident.lossScaling = c.precision == braidFloat16;
  resident.optimizer.kind = c.optimizer;
  resident.optimizer.learningRate = 1e-2;
  resident.optimizer.weightDecay = 0.01;
  resident.optimizer.maxGradNorm = 5;
  resident.bucketBytes = 4096;  // several buckets: several pages of state per step
  resident.firstBucketBytes = 1024;
  // kHost on a CPU communicator: the state was in host memory already (the GPU test covers the
  // step on the host of a CUDA communicator).
  for (OffloadTier tier : {OffloadTier::kFile, OffloadTier::kHost})
    for (int nranks : {1, 2}) {
      SCOPED_TRACE(std::to_string(nranks) + " ranks, tier " +
                   std::to_string(static_cast<int>(tier)));
      Options offloaded = resident;
      offloaded.offload.tier = tier;
      offloaded.offload.directory = testing::TempDir();
      const auto expected = synthetic::train(nranks, resident, 200);
      const auto got = synthetic::train(nranks, offloaded, 200);
      ASSERT_EQ(got.size(), expected.size());
      for (int r = 0; r < nranks; ++r) {
        ASSERT_EQ(got[r].size(), expected[r].size()) << "rank " << r;
        for (size_t p = 0; p < got[r].size(); ++p) {
          ASSERT_EQ(got[r][p].size(), expected[r][p].size()) << "rank " << r;
          EXPECT_EQ(std::memcmp(got[r][p].data(), expected[r][p].data(), got[r][p].size() * 4), 0)
              << "rank " << r << " parameter " << p << ": first value " << got[r][p][0] << " vs "
              << expected[r][p][0];
        }
        EXPECT_NE(expected[r][0][0], 0.5f) << "the parameters did not train";
      }
    }
}

INSTANTIATE_TEST_SUITE_P(
    Dp, OffloadEquivalence,
    testing::Values(Config{"ddp_fp32_adamw", Stage::kDdp, braidFloat32, OptimizerKind::kAdamW},
                    Config{"zero1_fp16_adam", Stage::kZero1, braidFloat16, OptimizerKind::kAdam},
                    Config{"zero2_bf16_sgd", Stage::kZero2, braidBfloat16, OptimizerKind::kSgd},
                    Config{"zero2_fp32_adamw", Stage::kZero2, braidFloat32, OptimizerKind::kAdamW}),
    [](const testing::TestParamInfo<Config>& info) { return std::string(info.param.name); });

size_t residentSetBytes() {
  std::ifstream statm("/proc/self/statm");
  size_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * static_cast<size_t>(sysconf(_SC_PAGESIZE));
}

// One rank, 4 Mi fp32 parameters (64 of 64 Ki) with AdamW: 32 MiB of moments. Resident they join
// the resident set at the first step; in the file only two 1 MiB buckets' worth of each moment
// does. The growth of RSS over construction, finalize and one step is measured for both.
TEST(OffloadMemory, TheStateLeavesTheResidentSet) {
  constexpr size_t kParams = 64, kEach = size_t{64} << 10, kCount = kParams * kEach;
  auto growth = [&](OffloadTier tier, braid::dp::MemoryReport* report) {
    size_t grown = 0;
    const std::string errors = local_ranks::onThreads(1, [&](braidComm_t comm, int) {
      Options o;
      o.optimizer.kind = OptimizerKind::kAdamW;
      o.bucketBytes = 1 << 20;
      o.firstBucketBytes = 1 << 20;
      o.offload.tier = tier;
      o.offload.directory = testing::TempDir();
      const std::vector<float> values(kEach, 0.25f), ones(kEach, 1.0f);
      const size_t before = residentSetBytes();
      DataParallel dp(comm, o);
      for (size_t p = 0; p < kParams; ++p) dp.addParameter(kEach);
      dp.finalize();
      for (int id = 0; id < static_cast<int>(kParams); ++id) dp.setParameter(id, values);
      for (int id = static_cast<int>(kParams); id-- > 0;) {
        braid::dp::accumulateFromFloat(ones.data(), dp.gradient(id), dp.gradientType(), kEach);
        dp.markReady(id);
      }
      dp.step();
      grown = residentSetBytes() - before;
      *report = dp.memoryReport();
    });
    EXPECT_EQ(errors, "");
    return grown;
  };
  braid::dp::MemoryReport resident{}, file{};
  const size_t residentGrowth = growth(OffloadTier::kNone, &resident);
  const size_t fileGrowth = growth(OffloadTier::kFile, &file);
  const size_t stateBytes = 2 * kCount * sizeof(float);
  EXPECT_EQ(resident.optimizerStateBytes, stateBytes);
  EXPECT_EQ(resident.offloadedStateBytes, 0u);
  EXPECT_EQ(file.offloadedStateBytes, stateBytes);
  EXPECT_EQ(file.optimizerStateBytes, 2 * 2 * (size_t{1} << 20));  // 2 slots x 2 moments x 1 MiB
  std::printf(
      "RSS growth over init and one step: state resident %.1f MiB, in a file %.1f MiB "
      "(the state: %.1f MiB)\n",
      residentGrowth / 1048576.0, fileGrowth / 1048576.0, stateBytes / 1048576.0);
  EXPECT_GE(residentGrowth, fileGrowth + stateBytes * 8 / 10)
      << "resident " << residentGrowth << " bytes, file " << fileGrowth << " bytes";
}

// A directory that cannot hold the state file is named, and finalize() may be called again once
// it can (the failed one left no half-made layout behind).
TEST(OffloadErrors, ADirectoryThatCannotHoldTheFileIsNamedAndFinalizeMayRetry) {
  const std::string directory =
      testing::TempDir() + "braid-offload-later-" + std::to_string(getpid());
  rmdir(directory.c_str());
  const std::string errors = local_ranks::onThreads(1, [&](braidComm_t comm, int) {
    Options o;
    o.offload.tier = OffloadTier::kFile;
    o.offload.directory = directory;
    DataParallel dp(comm, o);
    dp.addParameter(10);
    try {
      dp.finalize();
      ADD_FAILURE() << "finalize() made a state file in a directory that does not exist";
    } catch (const braid::dp::Error& e) {
      EXPECT_EQ(e.code(), braidSystemError);
      EXPECT_NE(std::string(e.what()).find(directory + "/braid-dp-state-rank0"), std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("OffloadOptions::directory"), std::string::npos)
          << e.what();
    }
    ASSERT_EQ(mkdir(directory.c_str(), 0700), 0);
    dp.finalize();
    const braid::dp::MemoryReport m = dp.memoryReport();
    EXPECT_EQ(m.paddedParameterCount, 10u);
    EXPECT_EQ(m.offloadedStateBytes, 2 * 10 * sizeof(float));  // AdamW's two moments
  });
  EXPECT_EQ(errors, "");
  rmdir(directory.c_str());
}

}  // namespace
