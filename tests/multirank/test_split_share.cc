// splitShare and shrinkShare: children of braidCommSplit/braidCommShrink that share their parent's
// links. 4 ranks as threads and as processes: a shared child maps no shared memory of its own (an
// unshared one does: counted in /proc/self/maps), parent and child calls alternate and every
// result is checked against a reference computed here, a group holding both is refused by name,
// and either may be destroyed first while the other goes on. Through the config of the split and
// inherited from the parent's.
#include <gtest/gtest.h>

#include <fstream>
#include <string>
#include <vector>

#include "multirank/rank_launcher.h"

namespace braid_test {
namespace {

constexpr int kRanks = 4;
constexpr size_t kCount = 100003;  // several FIFO slots: the ring, not the one-shot exchange

// Shared-memory segments of braid this process has mapped.
int braidMappings() {
  std::ifstream maps("/proc/self/maps");
  int count = 0;
  for (std::string line; std::getline(maps, line);)
    count += line.find("memfd:braid-") != std::string::npos;
  return count;
}

float input(int rank, size_t i, int call) {
  return static_cast<float>((rank + 1) * (call + 1) + static_cast<int>(i % 7));
}

// A checked all-reduce on `comm` whose ranks are `members` (parent ranks, in its rank order).
void checkedAllReduce(braidComm_t comm, int rank, const std::vector<int>& members, int call,
                      Failures& failures, const std::string& what) {
  std::vector<float> in(kCount), out(kCount, -1.0f);
  for (size_t i = 0; i < kCount; ++i) in[i] = input(members[rank], i, call);
  braidResult_t r =
      braidAllReduce(in.data(), out.data(), kCount, braidFloat32, braidSum, comm, nullptr);
  if (r != braidSuccess) return failures.push_back(what + ": " + describeResult(r, comm));
  for (size_t i = 0; i < kCount; ++i) {
    float expected = 0;
    for (int m : members) expected += input(m, i, call);
    if (out[i] != expected)
      return failures.push_back(what + ": element " + std::to_string(i) + " is " +
                                std::to_string(out[i]) + ", expected " + std::to_string(expected));
  }
}

enum class Via { SplitConfig, ParentConfig, ShrinkConfig, Unshared };

Failures runShare(const RankEnv& env, Via via, bool processes) {
  Failures failures;
  braidConfig_t config = BRAID_CONFIG_INITIALIZER;
  config.device = "cpu";
  config.timeoutMs = kOpTimeoutMs;
  if (via == Via::ParentConfig) config.splitShare = 1;
  braidComm_t parent = nullptr;
  braidResult_t r = braidCommInitRankConfig(&parent, env.nranks, env.id, env.rank, &config);
  if (r != braidSuccess) return {"init: " + describeResult(r, parent)};
  const int mappedByParent = braidMappings();

  braidConfig_t childConfig = BRAID_CONFIG_INITIALIZER;
  childConfig.device = "cpu";
  childConfig.timeoutMs = kOpTimeoutMs;
  if (via == Via::SplitConfig) childConfig.splitShare = 1;
  if (via == Via::ShrinkConfig) childConfig.shrinkShare = 1;
  braidComm_t child = nullptr;
  std::vector<int> members;  // the child's ranks, as parent ranks
  if (via == Via::ShrinkConfig) {
    int excluded[] = {3};
    if (env.rank == 3) {  // not a member: takes no part
      braidCommDestroy(parent);
      return failures;
    }
    r = braidCommShrink(parent, excluded, 1, &child, &childConfig, BRAID_SHRINK_DEFAULT);
    members = {0, 1, 2};
  } else {
    // Colors by parity, keys reversed: child rank order differs from the parent's.
    r = braidCommSplit(parent, env.rank % 2, -env.rank, &child,
                       via == Via::ParentConfig ? nullptr : &childConfig);
    members = env.rank % 2 == 0 ? std::vector<int>{2, 0} : std::vector<int>{3, 1};
  }
  if (r != braidSuccess) return {"split: " + describeResult(r, parent)};
  int childRank = -1;
  braidCommUserRank(child, &childRank);
  if (members[childRank] != env.rank)
    failures.push_back("child rank " + std::to_string(childRank) + " is not parent rank " +
                       std::to_string(env.rank) + "'s place");

  const bool shared = via != Via::Unshared;
  if (processes) {
    const int mapped = braidMappings();
    if (shared && mapped != mappedByParent)
      failures.push_back(
          "a shared child mapped shared memory of its own: " + std::to_string(mappedByParent) +
          " braid mappings before, " + std::to_string(mapped) + " after");
    if (!shared && mapped <= mappedByParent)
      failures.push_back("an unshared child mapped no shared memory (" + std::to_string(mapped) +
                         " mappings): the measure cannot tell");
  }

  std::vector<int> everyone;
  for (int q = 0; q < env.nranks; ++q) everyone.push_back(q);
  if (via == Via::ShrinkConfig) everyone = {0, 1, 2, 3};
  for (int round = 0; round < 3; ++round) {
    if (via != Via::ShrinkConfig)  // the shrunk parent lacks rank 3 at its calls
      checkedAllReduce(parent, env.rank, everyone, 2 * round, failures, "parent");
    checkedAllReduce(child, childRank, members, 2 * round + 1, failures, "child");
  }

  if (shared) {
    // Refused in one group, on the NULL stream and on one host stream (whose task runs a group's
    // calls together) alike.
    braidStream_t hostStream = nullptr;
    if (braidStreamCreate(&hostStream) != braidSuccess) return {"braidStreamCreate"};
    for (braidStream_t stream : {braidStream_t{}, hostStream}) {
      float x = 1, y = 1;
      braidGroupStart();
      braidAllReduce(&x, &x, 1, braidFloat32, braidSum, parent, stream);
      braidAllReduce(&y, &y, 1, braidFloat32, braidSum, child, stream);
      r = braidGroupEnd();
      const std::string sentence = braidGetLastError(nullptr);
      if (r != braidInvalidUsage || sentence.find("share their links") == std::string::npos)
        failures.push_back(std::string("a group with parent and shared child") +
                           (stream != nullptr ? " on a host stream: " : ": ") +
                           describeResult(r, nullptr));
    }
    if (braidStreamDestroy(hostStream) != braidSuccess) failures.push_back("braidStreamDestroy");
  }

  // The parent goes first; the child keeps the links.
  if (braidCommDestroy(parent) != braidSuccess) failures.push_back("destroying the parent");
  checkedAllReduce(child, childRank, members, 9, failures, "child after the parent");
  if (braidCommDestroy(child) != braidSuccess) failures.push_back("destroying the child");
  return failures;
}

struct Param {
  Launch how;
  Via via;
};

class SplitShare : public testing::TestWithParam<Param> {};

TEST_P(SplitShare, ChildrenShareTheLinksAndTakeTurns) {
  const Param p = GetParam();
  Failures failures = launchRanks(
      p.how, kRanks,
      {[&](const RankEnv& env) { return runShare(env, p.via, p.how == Launch::Processes); },
       nullptr},
      std::chrono::seconds(2 * kOpTimeoutMs / 1000));
  EXPECT_TRUE(failures.empty()) << testing::PrintToString(failures);
}

std::string paramName(const testing::TestParamInfo<Param>& info) {
  static const char* const kVia[] = {"split_config", "parent_config", "shrink_config", "unshared"};
  return std::string(info.param.how == Launch::Threads ? "threads_" : "processes_") +
         kVia[static_cast<int>(info.param.via)];
}

const Param kParams[] = {
    {Launch::Threads, Via::SplitConfig},    {Launch::Processes, Via::SplitConfig},
    {Launch::Processes, Via::ParentConfig}, {Launch::Threads, Via::ShrinkConfig},
    {Launch::Processes, Via::ShrinkConfig}, {Launch::Processes, Via::Unshared}};

INSTANTIATE_TEST_SUITE_P(Ways, SplitShare, testing::ValuesIn(kParams), paramName);

}  // namespace
}  // namespace braid_test
