// braidCommShrink (nccl.h's ncclCommShrink): the ranks not excluded make a communicator of their
// own, in their old order, without the excluded ranks taking any part. As threads and processes,
// excluding the first rank, a middle one, several, none; after a rank was SIGKILLed (the survivors
// see it fail, shrink with BRAID_SHRINK_ABORT and go on); from one thread inside a group; survivors
// that disagree on the list; bad arguments. Results are checked against values computed here.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "braid/braid.h"
#include "fault/child_processes.h"
#include "multirank/rank_launcher.h"

namespace braid_test {
namespace {

constexpr size_t kCount = 1031;

int32_t contribution(int parentRank, size_t i) {
  return 100 * (parentRank + 1) + static_cast<int32_t>(i % 13);
}

std::vector<int> survivorsOf(int nranks, const std::vector<int>& excluded) {
  std::vector<int> survivors;
  for (int r = 0; r < nranks; ++r)
    if (std::find(excluded.begin(), excluded.end(), r) == excluded.end()) survivors.push_back(r);
  return survivors;
}

// On a communicator of `survivors` (parent ranks in new-rank order), this rank being parent rank
// `parentRank`: its size and rank, an all-reduce and an all-gather of contributions keyed by
// parent rank, so that a wrong membership or order shows. Empty when all is right.
std::string checkChild(braidComm_t child, int parentRank, const std::vector<int>& survivors) {
  const int expectedRank = static_cast<int>(
      std::find(survivors.begin(), survivors.end(), parentRank) - survivors.begin());
  const int n = static_cast<int>(survivors.size());
  int count = -1, rank = -1;
  if (braidCommCount(child, &count) != braidSuccess || count != n)
    return "count is " + std::to_string(count) + ", expected " + std::to_string(n);
  if (braidCommUserRank(child, &rank) != braidSuccess || rank != expectedRank)
    return "rank is " + std::to_string(rank) + ", expected " + std::to_string(expectedRank);
  std::vector<int32_t> send(kCount), sum(kCount, -1), gathered(kCount * n, -1);
  for (size_t i = 0; i < kCount; ++i) send[i] = contribution(parentRank, i);
  braidResult_t r =
      braidAllReduce(send.data(), sum.data(), kCount, braidInt32, braidSum, child, nullptr);
  if (r != braidSuccess) return "braidAllReduce: " + describeResult(r, child);
  r = braidAllGather(send.data(), gathered.data(), kCount, braidInt32, child, nullptr);
  if (r != braidSuccess) return "braidAllGather: " + describeResult(r, child);
  for (size_t i = 0; i < kCount; ++i) {
    int32_t want = 0;
    for (int s : survivors) want += contribution(s, i);
    if (sum[i] != want)
      return "sum element " + std::to_string(i) + " is " + std::to_string(sum[i]) + ", expected " +
             std::to_string(want);
    for (int k = 0; k < n; ++k)
      if (gathered[k * kCount + i] != contribution(survivors[k], i))
        return "gathered block " + std::to_string(k) + " element " + std::to_string(i) + " is " +
               std::to_string(gathered[k * kCount + i]) + ", expected parent rank " +
               std::to_string(survivors[k]) + "'s";
  }
  return "";
}

struct ShrinkCase {
  Launch launch;
  std::vector<int> excluded;
  std::string name;
};

class Shrink : public testing::TestWithParam<ShrinkCase> {};

TEST_P(Shrink, SurvivorsFormACommunicatorInTheirOrder) {
  constexpr int kRanks = 4;
  const ShrinkCase& c = GetParam();
  const std::vector<int> survivors = survivorsOf(kRanks, c.excluded);
  RankProgram program;
  program.run = [&](const RankEnv& env) -> Failures {
    braidComm_t parent = nullptr;
    braidResult_t r = initRank(&parent, env);
    if (r != braidSuccess) return {"init: " + describeResult(r, nullptr)};
    Failures failures;
    if (std::find(c.excluded.begin(), c.excluded.end(), env.rank) == c.excluded.end()) {
      std::vector<int> excluded = c.excluded;
      braidComm_t child = nullptr;
      r = braidCommShrink(parent, excluded.data(), static_cast<int>(excluded.size()), &child,
                          nullptr, BRAID_SHRINK_DEFAULT);
      if (r != braidSuccess) {
        failures.push_back("braidCommShrink: " + describeResult(r, parent));
      } else if (std::string why = checkChild(child, env.rank, survivors); !why.empty()) {
        failures.push_back(why);
      }
      if (child != nullptr && braidCommDestroy(child) != braidSuccess)
        failures.push_back("destroying the child failed");
    }
    if (braidCommDestroy(parent) != braidSuccess) failures.push_back("destroying the parent");
    return failures;
  };
  program.describeStep = [](int64_t) { return std::string("shrinking"); };
  const Failures failures = launchRanks(c.launch, kRanks, program, std::chrono::seconds(60));
  EXPECT_TRUE(failures.empty()) << testing::PrintToString(failures);
}

std::vector<ShrinkCase> shrinkCases() {
  std::vector<ShrinkCase> cases;
  for (Launch launch : {Launch::Threads, Launch::Processes}) {
    const std::string how = launch == Launch::Threads ? "threads" : "processes";
    cases.push_back({launch, {1}, how + "_without_rank1"});
    cases.push_back({launch, {0}, how + "_without_rank0"});
    cases.push_back({launch, {3, 0}, how + "_without_ranks0and3"});
    cases.push_back({launch, {}, how + "_without_none"});
    cases.push_back({launch, {0, 1, 2}, how + "_to_rank3_alone"});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Ranks, Shrink, testing::ValuesIn(shrinkCases()),
                         [](const testing::TestParamInfo<ShrinkCase>& info) {
                           return info.param.name;
                         });

// The use NCCL made it for: a rank dies; the survivors' operation fails naming it; they shrink
// with BRAID_SHRINK_ABORT, excluding it, and the new communicator works.
TEST(ShrinkAfterKill, SurvivorsOfASigkilledRankGoOnWithoutIt) {
  constexpr int kRanks = 4, kVictim = 2, kTimeoutMs = 20000;
  struct Report {
    int allReduceResult = braidSuccess;
    int shrinkResult = -1;
    char detail[768] = {};
  };
  struct Shared {
    braidUniqueId id{};
    Report ranks[kRanks];
  };
  SharedBlock<Shared> shared;
  ASSERT_EQ(braidGetUniqueId(&shared->id), braidSuccess);
  auto runRank = [&](int rank) -> int {
    Report& me = shared->ranks[rank];
    braidConfig_t config = BRAID_CONFIG_INITIALIZER;
    config.timeoutMs = kTimeoutMs;
    config.device = "cpu";
    braidComm_t parent = nullptr;
    if (braidCommInitRankConfig(&parent, kRanks, shared->id, rank, &config) != braidSuccess)
      return 10;
    std::vector<int32_t> send(kCount), recv(kCount);
    for (size_t i = 0; i < kCount; ++i) send[i] = contribution(rank, i);
    // Lines the ranks up: the victim dies after everyone finished this one.
    if (braidAllReduce(send.data(), recv.data(), kCount, braidInt32, braidSum, parent, nullptr) !=
        braidSuccess)
      return 11;
    if (rank == kVictim) raise(SIGKILL);
    braidResult_t r = braidSuccess;
    for (int attempt = 0; attempt < 20 && r == braidSuccess; ++attempt)
      r = braidAllReduce(send.data(), recv.data(), kCount, braidInt32, braidSum, parent, nullptr);
    me.allReduceResult = r;
    std::snprintf(me.detail, sizeof me.detail, "%s", braidGetLastError(parent));
    int excluded[] = {kVictim};
    braidComm_t child = nullptr;
    me.shrinkResult = braidCommShrink(parent, excluded, 1, &child, nullptr, BRAID_SHRINK_ABORT);
    if (me.shrinkResult != braidSuccess) {
      std::snprintf(me.detail, sizeof me.detail, "%s", braidGetLastError(parent));
      return 12;
    }
    const std::string why = checkChild(child, rank, survivorsOf(kRanks, {kVictim}));
    std::snprintf(me.detail, sizeof me.detail, "%s", why.c_str());
    braidCommDestroy(child);
    braidCommAbort(parent);
    return why.empty() ? 0 : 13;
  };
  std::vector<pid_t> pids;
  for (int rank = 0; rank < kRanks; ++rank)
    pids.push_back(forkChild([&, rank] { return runRank(rank); }));
  const auto children = waitChildren(pids, Clock::now() + std::chrono::seconds(90));
  EXPECT_TRUE(WIFSIGNALED(children[kVictim].status)) << describe(children[kVictim]);
  const std::string deadRank =
      "rank " + std::to_string(kVictim) + " (pid " + std::to_string(pids[kVictim]) + ")";
  for (int rank = 0; rank < kRanks; ++rank) {
    if (rank == kVictim) continue;
    const Report& report = shared->ranks[rank];
    SCOPED_TRACE("rank " + std::to_string(rank) + ": " + describe(children[rank]) + ": " +
                 report.detail);
    EXPECT_EQ(report.allReduceResult, braidRemoteError);
    EXPECT_EQ(report.shrinkResult, braidSuccess);
    EXPECT_TRUE(WIFEXITED(children[rank].status) && WEXITSTATUS(children[rank].status) == 0);
  }
}

// One thread drives four communicators and shrinks three of them inside a group.
TEST(ShrinkInAGroup, OneThreadShrinksSeveralRanks) {
  constexpr int kRanks = 4;
  braidComm_t parents[kRanks] = {};
  ASSERT_EQ(braidCommInitAll(parents, kRanks, nullptr), braidSuccess);
  int excluded[] = {1};
  braidComm_t children[kRanks] = {};
  ASSERT_EQ(braidGroupStart(), braidSuccess);
  for (int r : {0, 2, 3})
    ASSERT_EQ(braidCommShrink(parents[r], excluded, 1, &children[r], nullptr, BRAID_SHRINK_DEFAULT),
              braidSuccess);
  ASSERT_EQ(braidGroupEnd(), braidSuccess) << braidGetLastError(nullptr);
  std::vector<std::string> results(kRanks);
  std::vector<std::thread> threads;
  for (int r : {0, 2, 3})
    threads.emplace_back([&, r] { results[r] = checkChild(children[r], r, {0, 2, 3}); });
  for (auto& t : threads) t.join();
  for (int r : {0, 2, 3}) {
    EXPECT_EQ(results[r], "") << "rank " << r;
    EXPECT_EQ(braidCommDestroy(children[r]), braidSuccess);
  }
  for (braidComm_t p : parents) EXPECT_EQ(braidCommDestroy(p), braidSuccess);
}

// Ranks 0 and 2 exclude rank 3, rank 1 excludes ranks 2 and 3: rank 1 reaches a root that serves
// another communicator and is refused, naming both; the others wait for rank 1 until their
// timeout and say it never came.
TEST(ShrinkDisagreement, ARankWithAnotherListIsRefusedNamingBothCommunicators) {
  constexpr int kRanks = 4, kTimeoutMs = 3000;
  std::vector<std::string> errors(kRanks);
  std::vector<braidResult_t> results(kRanks, braidSuccess);
  braidComm_t parents[kRanks] = {};
  ASSERT_EQ(braidCommInitAll(parents, kRanks, nullptr), braidSuccess);
  std::vector<std::thread> threads;
  for (int r : {0, 1, 2}) {
    threads.emplace_back([&, r] {
      std::vector<int> excluded = r == 1 ? std::vector<int>{2, 3} : std::vector<int>{3};
      braidConfig_t config = BRAID_CONFIG_INITIALIZER;
      config.timeoutMs = kTimeoutMs;
      braidComm_t child = nullptr;
      results[r] = braidCommShrink(parents[r], excluded.data(), static_cast<int>(excluded.size()),
                                   &child, &config, BRAID_SHRINK_DEFAULT);
      errors[r] = braidGetLastError(parents[r]);
      braidCommDestroy(child);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(results[1], braidInvalidUsage) << errors[1];
  EXPECT_NE(errors[1].find("cannot meet"), std::string::npos) << errors[1];
  for (int r : {0, 2}) {
    EXPECT_NE(results[r], braidSuccess) << "rank " << r;
    EXPECT_NE(errors[r].find("rank 1"), std::string::npos) << "rank " << r << ": " << errors[r];
  }
  for (braidComm_t p : parents) EXPECT_EQ(braidCommDestroy(p), braidSuccess);
}

TEST(ShrinkArguments, BadOnesAreRefusedByName) {
  constexpr int kRanks = 3;
  braidComm_t parents[kRanks] = {};
  ASSERT_EQ(braidCommInitAll(parents, kRanks, nullptr), braidSuccess);
  braidComm_t child = nullptr;
  struct Bad {
    std::vector<int> list;
    int count;
    int flags;
    const char* expected;
  };
  const Bad cases[] = {
      {{1}, -1, BRAID_SHRINK_DEFAULT, "excludeRanksCount -1"},
      {{}, 1, BRAID_SHRINK_DEFAULT, "excludeRanksCount 1 with excludeRanksList"},
      {{3}, 1, BRAID_SHRINK_DEFAULT, "excludeRanksList[0] is 3 (expected a rank in 0..2)"},
      {{2, 0}, 2, BRAID_SHRINK_DEFAULT, "excludeRanksList[1] is this rank"},
      {{1, 1}, 2, BRAID_SHRINK_DEFAULT, "excludeRanksList[1] repeats rank 1"},
      {{1}, 1, 2, "shrinkFlags 2"},
  };
  for (const Bad& bad : cases) {
    std::vector<int> list = bad.list;
    EXPECT_EQ(braidCommShrink(parents[0], list.empty() ? nullptr : list.data(), bad.count, &child,
                              nullptr, bad.flags),
              braidInvalidArgument)
        << bad.expected;
    EXPECT_NE(std::string(braidGetLastError(parents[0])).find(bad.expected), std::string::npos)
        << braidGetLastError(parents[0]);
    EXPECT_EQ(child, nullptr);
  }
  int one[] = {1};
  EXPECT_EQ(braidCommShrink(parents[0], one, 1, nullptr, nullptr, 0), braidInvalidArgument);
  for (braidComm_t p : parents) EXPECT_EQ(braidCommDestroy(p), braidSuccess);
}

}  // namespace
}  // namespace braid_test
