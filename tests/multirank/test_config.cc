// Communicator configuration beyond blocking and commName: the planner's channel bounds
// (minChannels/maxChannels, nccl.h's minCTAs/maxCTAs), netName, algorithms, and their inheritance
// by split and shrunk communicators; and the logging environment read again by braidResetDebugInit.
// Ranks as threads; the plan is read back with braidCommDescribePlan.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstddef>
#include <cstdio>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "braid/braid.h"

#if BRAID_TEST_CUDA_RUNTIME
#include <cuda_runtime_api.h>
#endif

namespace {

constexpr int kRanks = 3;

// Initializes kRanks communicators on threads, each with `config`; returns each rank's result.
std::vector<braidResult_t> initAll(braidComm_t (&comms)[kRanks], const braidConfig_t& config) {
  braidUniqueId id;
  EXPECT_EQ(braidGetUniqueId(&id), braidSuccess);
  std::vector<braidResult_t> results(kRanks);
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r)
    threads.emplace_back([&, r] {
      braidConfig_t mine = config;
      results[r] = braidCommInitRankConfig(&comms[r], kRanks, id, r, &mine);
    });
  for (auto& t : threads) t.join();
  return results;
}

// "over N channel(s)" from the plan's description.
int plannedChannels(braidComm_t comm) {
  const char* text = nullptr;
  if (braidCommDescribePlan(comm, &text) != braidSuccess) return -1;
  const std::string plan = text;
  const size_t at = plan.find(" over ");
  return at == std::string::npos ? -1 : std::stoi(plan.substr(at + 6));
}

braidConfig_t channels(int min, int max) {
  braidConfig_t config = BRAID_CONFIG_INITIALIZER;
  config.device = "cpu";
  config.minChannels = min;
  config.maxChannels = max;
  return config;
}

TEST(Config, ChannelBoundsShapeThePlan) {
  for (int n : {1, 2, 4}) {
    braidComm_t comms[kRanks] = {};
    const auto results = initAll(comms, channels(n, n));
    for (int r = 0; r < kRanks; ++r) {
      ASSERT_EQ(results[r], braidSuccess) << braidGetLastError(nullptr);
      EXPECT_EQ(plannedChannels(comms[r]), n) << "rank " << r;
    }
    for (braidComm_t c : comms) EXPECT_EQ(braidCommDestroy(c), braidSuccess);
  }
}

TEST(Config, SplitAndShrunkCommunicatorsInheritTheBounds) {
  braidComm_t comms[kRanks] = {};
  const auto results = initAll(comms, channels(2, 2));
  for (braidResult_t r : results) ASSERT_EQ(r, braidSuccess);
  braidComm_t split[kRanks] = {}, shrunk[kRanks] = {};
  int excluded[] = {1};
  ASSERT_EQ(braidGroupStart(), braidSuccess);
  for (int r = 0; r < kRanks; ++r) braidCommSplit(comms[r], 0, r, &split[r], nullptr);
  ASSERT_EQ(braidGroupEnd(), braidSuccess) << braidGetLastError(nullptr);
  ASSERT_EQ(braidGroupStart(), braidSuccess);
  for (int r : {0, 2}) braidCommShrink(comms[r], excluded, 1, &shrunk[r], nullptr, 0);
  ASSERT_EQ(braidGroupEnd(), braidSuccess) << braidGetLastError(nullptr);
  for (int r = 0; r < kRanks; ++r) EXPECT_EQ(plannedChannels(split[r]), 2) << "rank " << r;
  for (int r : {0, 2}) EXPECT_EQ(plannedChannels(shrunk[r]), 2) << "rank " << r;
  for (braidComm_t c : shrunk) EXPECT_EQ(braidCommDestroy(c), braidSuccess);
  for (braidComm_t c : split) EXPECT_EQ(braidCommDestroy(c), braidSuccess);
  for (braidComm_t c : comms) EXPECT_EQ(braidCommDestroy(c), braidSuccess);
}

TEST(Config, BadBoundsFlagsAndNetworksAreRefusedByName) {
  struct Bad {
    braidConfig_t config;
    std::string expected;
  };
  braidConfig_t ib = BRAID_CONFIG_INITIALIZER;
  ib.netName = "IB";
  braidConfig_t tree = BRAID_CONFIG_INITIALIZER;
  tree.algorithms = "ring,pat";
  braidConfig_t blocking = BRAID_CONFIG_INITIALIZER;
  blocking.blocking = 7;  // as NCCL: "Invalid config blocking attribute value"
  braidConfig_t splitShare = BRAID_CONFIG_INITIALIZER;
  splitShare.splitShare = -2;
  std::vector<Bad> cases = {
      {channels(3, 2), "config minChannels and maxChannels are 3 and 2: expected 1 <= min <= max"},
      {channels(0, BRAID_CONFIG_UNDEF_INT), "config minChannels and maxChannels are 0 and"},
      {ib, "config netName 'IB' is not a network braid has"},
      {blocking, "rank 0: config blocking is 7 (expected 0 or 1)"},
      {splitShare, "rank 0: config splitShare is -2 (expected 0 or 1)"},
      {tree,
       "rank 0: config algorithms=ring,pat: unknown value 'pat' (expected a comma-separated "
       "list of ring, direct, doubling, halving, tree, hier-doubling, "
       "hier-halving, bruck, hier)"},
  };
  braidUniqueId id;
  ASSERT_EQ(braidGetUniqueId(&id), braidSuccess);
  for (Bad& bad : cases) {
    braidComm_t comm = nullptr;
    EXPECT_EQ(braidCommInitRankConfig(&comm, 2, id, 0, &bad.config), braidInvalidArgument);
    EXPECT_NE(std::string(braidGetLastError(nullptr)).find(bad.expected), std::string::npos)
        << braidGetLastError(nullptr);
    EXPECT_EQ(comm, nullptr);
  }
}

// The algorithms a config allows are the ones its communicator chooses from, whatever BRAID_ALGO
// says; a config made before the field existed (a smaller size) is read without it.
TEST(Config, AlgorithmsNarrowTheChoice) {
  for (const char* algorithms : {"doubling", "halving", "tree", "ring"}) {
    braidConfig_t config = BRAID_CONFIG_INITIALIZER;
    config.device = "cpu";
    config.algorithms = algorithms;
    braidComm_t comms[kRanks] = {};
    for (braidResult_t r : initAll(comms, config)) ASSERT_EQ(r, braidSuccess);
    braidPrediction_t chosen{};
    ASSERT_EQ(braidCommPredict(comms[0], braidCollAllReduce, 4096, &chosen), braidSuccess);
    EXPECT_STREQ(chosen.algorithm, algorithms);
    for (braidComm_t c : comms) EXPECT_EQ(braidCommDestroy(c), braidSuccess);
  }
  braidConfig_t older = BRAID_CONFIG_INITIALIZER;
  older.device = "cpu";
  older.algorithms = "not read";
  older.size = offsetof(braidConfig_t, algorithms);
  braidComm_t comms[kRanks] = {};
  for (braidResult_t r : initAll(comms, older)) EXPECT_EQ(r, braidSuccess);
  for (braidComm_t c : comms) EXPECT_EQ(braidCommDestroy(c), braidSuccess);
}

// Every rank chooses each call's algorithm on its own, from the same facts: ranks whose settings
// differ would run one call two ways, so their communicator is refused on every rank, by name.
TEST(Config, RanksThatWouldChooseApartAreRefused) {
  braidUniqueId id;
  ASSERT_EQ(braidGetUniqueId(&id), braidSuccess);
  std::vector<braidResult_t> results(kRanks);
  std::vector<std::string> errors(kRanks);
  braidComm_t comms[kRanks] = {};
  std::vector<std::thread> threads;
  for (int r = 0; r < kRanks; ++r)
    threads.emplace_back([&, r] {
      braidConfig_t config = BRAID_CONFIG_INITIALIZER;
      config.device = "cpu";
      config.algorithms = r == 1 ? "ring" : "doubling";
      results[r] = braidCommInitRankConfig(&comms[r], kRanks, id, r, &config);
      errors[r] = braidGetLastError(nullptr);
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(results[r], braidInvalidUsage) << "rank " << r;
    EXPECT_NE(errors[r].find(r == 1 ? "rank 1: rank 0 chooses algorithms from other settings"
                                    : "rank 1 chooses algorithms from other settings"),
              std::string::npos)
        << errors[r];
  }
}

TEST(Config, SocketIsTheNetworkBraidHas) {
  braidConfig_t config = BRAID_CONFIG_INITIALIZER;
  config.device = "cpu";
  config.netName = "socket";  // NCCL's name for TCP, in any case
  braidComm_t comms[kRanks] = {};
  for (braidResult_t r : initAll(comms, config)) EXPECT_EQ(r, braidSuccess);
  for (braidComm_t c : comms) EXPECT_EQ(braidCommDestroy(c), braidSuccess);
}

// Device "cuda" is refused in one sentence that says why: the CUDA runtime's own words where no
// device can be used (no driver, no GPU: this machine), that CUDA communicators are not there yet
// where one can, that the build has no CUDA where it had no nvcc.
// Where no CUDA device can be used (here: no driver), device "cuda" is refused in one sentence
// with the runtime's own words; where one can, tests/gpu covers CUDA communicators.
TEST(Config, CudaIsRefusedInOneSentenceSayingWhy) {
#if BRAID_TEST_CUDA_RUNTIME
  int devices = 0;
  const cudaError_t probe = cudaGetDeviceCount(&devices);
  if (probe == cudaSuccess && devices > 0)
    GTEST_SKIP() << "a CUDA device is here: device 'cuda' makes a CUDA communicator (tests/gpu)";
#endif
  braidConfig_t config = BRAID_CONFIG_INITIALIZER;
  config.device = "cuda";
  braidUniqueId id;
  ASSERT_EQ(braidGetUniqueId(&id), braidSuccess);
  braidComm_t comm = nullptr;
  const braidResult_t result = braidCommInitRankConfig(&comm, 1, id, 0, &config);
  const std::string error = braidGetLastError(nullptr);
  EXPECT_EQ(comm, nullptr);
  EXPECT_EQ(result, braidUnhandledCudaError) << error;
  EXPECT_EQ(error.find('\n'), std::string::npos) << error;
  EXPECT_NE(error.find("rank 0: device 'cuda' was requested"), std::string::npos) << error;
  EXPECT_NE(error.find("use device 'cpu'"), std::string::npos) << error;
#if BRAID_TEST_CUDA_RUNTIME
  EXPECT_NE(error.find(probe != cudaSuccess ? cudaGetErrorName(probe) : "finds no device"),
            std::string::npos)
      << error;
#else
  EXPECT_NE(error.find("this build of braid has no CUDA"), std::string::npos) << error;
#endif
}

std::string contents(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Initializes and destroys a one-rank communicator, which logs its plan at INFO (INIT).
void initOneRank() {
  braidComm_t comm = nullptr;
  ASSERT_EQ(braidCommInitAll(&comm, 1, nullptr), braidSuccess);
  ASSERT_EQ(braidCommDestroy(comm), braidSuccess);
}

TEST(Logging, ResetDebugInitReadsTheEnvironmentAgain) {
  const std::string base = testing::TempDir() + "braid_log_" + std::to_string(getpid());
  const std::string first = base + "_first.txt", second = base + "_second.txt";
  std::remove(first.c_str());
  std::remove(second.c_str());
  setenv("BRAID_DEBUG", "INFO", 1);
  setenv("BRAID_DEBUG_SUBSYS", "INIT", 1);
  setenv("BRAID_DEBUG_FILE", first.c_str(), 1);
  braidResetDebugInit();
  initOneRank();
  const std::string logged = contents(first);
  EXPECT_NE(logged.find("BRAID INFO"), std::string::npos) << logged;

  setenv("BRAID_DEBUG_FILE", second.c_str(), 1);
  braidResetDebugInit();
  initOneRank();
  EXPECT_EQ(contents(first), logged) << "the first file is no longer written";
  EXPECT_NE(contents(second).find("BRAID INFO"), std::string::npos) << "the second file is";

  const std::string before = contents(second);
  setenv("BRAID_DEBUG", "NONE", 1);
  braidResetDebugInit();
  initOneRank();
  EXPECT_EQ(contents(second), before) << "nothing is logged at NONE";

  unsetenv("BRAID_DEBUG");
  unsetenv("BRAID_DEBUG_SUBSYS");
  unsetenv("BRAID_DEBUG_FILE");
  braidResetDebugInit();
  std::remove(first.c_str());
  std::remove(second.c_str());
}

}  // namespace
