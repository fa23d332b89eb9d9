// PreMulSum's scalar residences (read at creation, or at the call after it changed), braidAvg of
// floats as NCCL's (a PreMulSum by 1/n), and CommSplit's colors and keys (NOCOLOR included), as
// threads and processes, 1-4 ranks; and PreMulSum and split from one thread in a group. (Every
// collective over every dtype and op, PreMulSum and split communicators included, is the multirank
// grid's: test_grid.cc.) Outputs are poisoned first and checked against references computed here.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "multirank/grid_common.h"
#include "multirank/rank_launcher.h"

namespace braid_test {
namespace {

constexpr int32_t kPoison = -12345;

// PreMulSum: rank r's input times its scalar, summed. Scalars are read at creation
// (HostImmediate) or at the call (Device: changed after creation, so the call must see the new
// value). int32, float32 and float16 on all-reduce, reduce-scatter and reduce; small integers, so
// every type is exact.
std::string preMulSum(braidComm_t comm, int rank, int n, braidDataType_t type,
                      braidScalarResidence_t residence, braidCollective_t which) {
  const size_t count = 1031, elem = type == braidFloat16 ? 2 : 4;
  const size_t inCount = which == braidCollReduceScatter ? count * n : count;
  auto encode = [&](int v, uint8_t* at) {
    if (type == braidInt32) *reinterpret_cast<int32_t*>(at) = v;
    if (type == braidFloat32) *reinterpret_cast<float*>(at) = static_cast<float>(v);
    if (type == braidFloat16) *reinterpret_cast<uint16_t*>(at) = floatToHalf(static_cast<float>(v));
  };
  auto input = [](int r, size_t i) { return (r + 1) * static_cast<int>(i % 5 + 1); };
  std::vector<uint8_t> scalar(elem), send(inCount * elem), recv(count * elem, 0xEE);
  encode(rank + 2, scalar.data());
  braidRedOp_t op;
  braidResult_t r = braidRedOpCreatePreMulSum(&op, scalar.data(), type, residence, comm);
  if (r != braidSuccess) return "create: " + describeResult(r, comm);
  encode(rank + 3, scalar.data());  // seen by Device operators only
  const int bump = residence == braidScalarDevice ? 3 : 2;
  for (size_t i = 0; i < inCount; ++i) encode(input(rank, i), send.data() + i * elem);
  if (which == braidCollAllReduce)
    r = braidAllReduce(send.data(), recv.data(), count, type, op, comm, nullptr);
  else if (which == braidCollReduceScatter)
    r = braidReduceScatter(send.data(), recv.data(), count, type, op, comm, nullptr);
  else
    r = braidReduce(send.data(), recv.data(), count, type, op, 0, comm, nullptr);
  if (r != braidSuccess) return "call: " + describeResult(r, comm);
  if (braidRedOpDestroy(op, comm) != braidSuccess) return "destroy: " + describeResult(r, comm);
  if (which == braidCollReduce && rank != 0) return "";
  std::vector<uint8_t> want(count * elem);
  for (size_t i = 0; i < count; ++i) {
    const size_t at = which == braidCollReduceScatter ? rank * count + i : i;
    int sum = 0;
    for (int k = 0; k < n; ++k) sum += (k + bump) * input(k, at);
    encode(sum, want.data() + i * elem);
  }
  return recv == want ? "" : "wrong result";
}

Failures preMulSumCases(const RankEnv& env) {
  braidComm_t comm = nullptr;
  braidResult_t r = initRank(&comm, env);
  if (r != braidSuccess) return {"init: " + describeResult(r, nullptr)};
  Failures failures;
  for (braidDataType_t type : {braidInt32, braidFloat32, braidFloat16})
    for (braidScalarResidence_t residence : {braidScalarHostImmediate, braidScalarDevice})
      for (braidCollective_t which : {braidCollAllReduce, braidCollReduceScatter, braidCollReduce})
        if (std::string f = preMulSum(comm, env.rank, env.nranks, type, residence, which);
            !f.empty())
          failures.push_back("type " + std::to_string(type) + " residence " +
                             std::to_string(residence) + " collective " + std::to_string(which) +
                             ": " + f);
  braidCommDestroy(comm);
  return failures;
}

// braidAvg of floats divides before the sum, as NCCL's: each input times 1/n rounded to the type,
// then a sum. Every rank's input is the type's largest power of two, whose average the type holds
// though the sum does not. For 1-4 ranks every order of summation gives that power of two exactly
// (fp16's 1/3 rounds to 0.33325195: 32768 times it is 10920, and 3 x 10920 = 32760 is a tie that
// rounds to 32768); summing first gives infinity, or for fp8 its saturated maximum divided.
struct TopPowerOfTwo {
  braidDataType_t type;
  size_t bytes;
  uint64_t bits;
};
constexpr TopPowerOfTwo kTopPowersOfTwo[] = {
    {braidFloat16, 2, 0x7800},     {braidBfloat16, 2, 0x7f00},
    {braidFloat32, 4, 0x7f000000}, {braidFloat64, 8, 0x7fe0000000000000},
    {braidFloat8e4m3, 1, 0x78},    {braidFloat8e5m2, 1, 0x78}};

std::string averageOfTopPowers(braidComm_t comm, int rank, int n, const TopPowerOfTwo& top,
                               braidCollective_t which) {
  const size_t count = 1031, inCount = which == braidCollReduceScatter ? count * n : count;
  std::vector<uint8_t> send(inCount * top.bytes), recv(count * top.bytes, 0xEE), want(recv.size());
  for (size_t i = 0; i < inCount; ++i)
    std::memcpy(send.data() + i * top.bytes, &top.bits, top.bytes);
  for (size_t i = 0; i < count; ++i) std::memcpy(want.data() + i * top.bytes, &top.bits, top.bytes);
  braidResult_t r;
  if (which == braidCollAllReduce)
    r = braidAllReduce(send.data(), recv.data(), count, top.type, braidAvg, comm, nullptr);
  else if (which == braidCollReduceScatter)
    r = braidReduceScatter(send.data(), recv.data(), count, top.type, braidAvg, comm, nullptr);
  else
    r = braidReduce(send.data(), recv.data(), count, top.type, braidAvg, 0, comm, nullptr);
  if (r != braidSuccess) return "call: " + describeResult(r, comm);
  if (which == braidCollReduce && rank != 0) return "";
  if (recv == want) return "";
  uint64_t got = 0;
  std::memcpy(&got, recv.data(), top.bytes);
  return "element 0 has bits " + std::to_string(got) + ", expected " + std::to_string(top.bits);
}

Failures averageCases(const RankEnv& env) {
  braidComm_t comm = nullptr;
  braidResult_t r = initRank(&comm, env);
  if (r != braidSuccess) return {"init: " + describeResult(r, nullptr)};
  Failures failures;
  const std::pair<braidCollective_t, const char*> collectives[] = {
      {braidCollAllReduce, "all-reduce"},
      {braidCollReduceScatter, "reduce-scatter"},
      {braidCollReduce, "reduce"}};
  for (const TopPowerOfTwo& top : kTopPowersOfTwo)
    for (const auto& [which, name] : collectives)
      if (std::string f = averageOfTopPowers(comm, env.rank, env.nranks, top, which); !f.empty())
        failures.push_back(std::string(dtypeName(top.type)) + " " + name + ": " + f);
  braidCommDestroy(comm);
  return failures;
}

// Colors by rank parity, the last of 3 or more ranks out (BRAID_SPLIT_NOCOLOR); keys reverse the
// order, so new rank order is descending parent rank.
int colorOf(int rank, int n) {
  return n >= 3 && rank == n - 1 ? BRAID_SPLIT_NOCOLOR : rank % 2;
}

// The parent ranks of `color`, in the new communicator's rank order.
std::vector<int> membersOf(int color, int n) {
  std::vector<int> members;
  for (int r = n - 1; r >= 0; --r)
    if (colorOf(r, n) == color) members.push_back(r);
  return members;
}

// Checks a communicator split from rank `rank` of `n`: its size, this rank's place, and an
// all-reduce over its members only.
std::string checkChild(braidComm_t child, int rank, int n) {
  const int color = colorOf(rank, n);
  if (color == BRAID_SPLIT_NOCOLOR)
    return child == nullptr ? "" : "a rank without a color got a communicator";
  if (child == nullptr) return "no communicator";
  const std::vector<int> members = membersOf(color, n);
  int count = 0, newRank = -1;
  braidCommCount(child, &count);
  braidCommUserRank(child, &newRank);
  const int wantRank =
      static_cast<int>(std::find(members.begin(), members.end(), rank) - members.begin());
  if (count != static_cast<int>(members.size()) || newRank != wantRank)
    return "size " + std::to_string(count) + " rank " + std::to_string(newRank) + ", expected " +
           std::to_string(members.size()) + " and " + std::to_string(wantRank);
  int32_t mine = rank + 1, sum = kPoison, want = 0;
  for (int m : members) want += m + 1;
  braidResult_t r = braidAllReduce(&mine, &sum, 1, braidInt32, braidSum, child, nullptr);
  if (r != braidSuccess) return "all-reduce: " + describeResult(r, child);
  return sum == want
             ? ""
             : "all-reduce gave " + std::to_string(sum) + ", expected " + std::to_string(want);
}

Failures splitThenReduce(const RankEnv& env) {
  braidComm_t comm = nullptr;
  braidResult_t r = initRank(&comm, env);
  if (r != braidSuccess) return {"init: " + describeResult(r, nullptr)};
  braidComm_t child = nullptr;
  r = braidCommSplit(comm, colorOf(env.rank, env.nranks), -env.rank, &child, nullptr);
  Failures failures;
  if (r != braidSuccess) {
    failures.push_back("braidCommSplit: " + describeResult(r, comm));
  } else if (std::string f = checkChild(child, env.rank, env.nranks); !f.empty()) {
    failures.push_back(f);
  }
  if (child != nullptr) braidCommDestroy(child);
  braidCommDestroy(comm);
  return failures;
}

std::string paramName(const testing::TestParamInfo<RanksParam>& info) {
  return ranksParamName(info.param);
}

class MoreCollectives : public testing::TestWithParam<RanksParam> {};

TEST_P(MoreCollectives, PreMulSumScalesEachRanksInput) {
  Failures failures = launchRanks(GetParam().how, GetParam().nranks, {preMulSumCases, nullptr},
                                  std::chrono::seconds(2 * kOpTimeoutMs / 1000));
  EXPECT_TRUE(failures.empty()) << testing::PrintToString(failures);
}

TEST_P(MoreCollectives, AvgOfFloatsDividesBeforeTheSumAsNcclDoes) {
  Failures failures = launchRanks(GetParam().how, GetParam().nranks, {averageCases, nullptr},
                                  std::chrono::seconds(2 * kOpTimeoutMs / 1000));
  EXPECT_TRUE(failures.empty()) << testing::PrintToString(failures);
}

TEST_P(MoreCollectives, CommSplitByColorAndKey) {
  Failures failures = launchRanks(GetParam().how, GetParam().nranks, {splitThenReduce, nullptr},
                                  std::chrono::seconds(2 * kOpTimeoutMs / 1000));
  EXPECT_TRUE(failures.empty()) << testing::PrintToString(failures);
}

INSTANTIATE_TEST_SUITE_P(
    Ranks, MoreCollectives,
    testing::Values(RanksParam{Launch::Threads, 1}, RanksParam{Launch::Threads, 2},
                    RanksParam{Launch::Threads, 3}, RanksParam{Launch::Threads, 4},
                    RanksParam{Launch::Processes, 2}, RanksParam{Launch::Processes, 3},
                    RanksParam{Launch::Processes, 4}),
    paramName);

// One thread drives four ranks (braidCommInitAll): their splits go in one group.
TEST(CommSplit, OfRanksDrivenFromOneThreadInAGroup) {
  constexpr int n = 4;
  braidComm_t comms[n] = {};
  ASSERT_EQ(braidCommInitAll(comms, n, nullptr), braidSuccess) << braidGetLastError(nullptr);
  braidComm_t children[n] = {};
  braidGroupStart();
  for (int r = 0; r < n; ++r) braidCommSplit(comms[r], colorOf(r, n), -r, &children[r], nullptr);
  ASSERT_EQ(braidGroupEnd(), braidSuccess) << braidGetLastError(nullptr);
  int32_t mine[n], sums[n];
  braidGroupStart();
  for (int r = 0; r < n; ++r) {
    mine[r] = r + 1;
    sums[r] = kPoison;
    if (children[r] != nullptr)
      braidAllReduce(&mine[r], &sums[r], 1, braidInt32, braidSum, children[r], nullptr);
  }
  ASSERT_EQ(braidGroupEnd(), braidSuccess) << braidGetLastError(nullptr);
  for (int r = 0; r < n; ++r) {
    if (colorOf(r, n) == BRAID_SPLIT_NOCOLOR) {
      EXPECT_EQ(children[r], nullptr);
      continue;
    }
    int want = 0;
    for (int m : membersOf(colorOf(r, n), n)) want += m + 1;
    EXPECT_EQ(sums[r], want) << "rank " << r;
  }
  for (braidComm_t child : children)
    if (child != nullptr) braidCommDestroy(child);
  for (braidComm_t comm : comms) braidCommDestroy(comm);
}

// Ranks of one process made with several unique ids, as nccl.h's scalable init; then revoking a
// communicator stops its peer's operation in flight, which would otherwise wait for its timeout.
TEST(Management, ScalableInitThenRevokeStopsAWaitingPeer) {
  braidUniqueId ids[2];
  for (braidUniqueId& id : ids) ASSERT_EQ(braidGetUniqueId(&id), braidSuccess);
  braidComm_t comms[2] = {};
  braidGroupStart();
  for (int r = 0; r < 2; ++r) braidCommInitRankScalable(&comms[r], 2, r, 2, ids, nullptr);
  ASSERT_EQ(braidGroupEnd(), braidSuccess) << braidGetLastError(nullptr);
  int32_t value = 0;
  braidResult_t waited = braidSuccess;
  std::thread receiver([&] { waited = braidRecv(&value, 1, braidInt32, 1, comms[0], nullptr); });
  EXPECT_EQ(braidCommRevoke(comms[1], 3), braidInvalidArgument);
  ASSERT_EQ(braidCommRevoke(comms[1], 0), braidSuccess);
  receiver.join();
  EXPECT_EQ(waited, braidRemoteError);
  EXPECT_NE(std::string(braidGetLastError(comms[0])).find("rank 1 called braidCommRevoke"),
            std::string::npos)
      << braidGetLastError(comms[0]);
  EXPECT_EQ(braidAllReduce(&value, &value, 1, braidInt32, braidSum, comms[1], nullptr),
            braidRemoteError);
  for (braidComm_t comm : comms) braidCommDestroy(comm);
}

// All-to-all, gather and scatter share the other calls' checks and their words.
TEST(Personalized, BadArgumentsAreNamed) {
  braidComm_t comm = nullptr;
  ASSERT_EQ(braidCommInitAll(&comm, 1, nullptr), braidSuccess);
  int32_t value = 1, other = 2;
  auto expectNamed = [&](braidResult_t result, const char* words) {
    EXPECT_EQ(result, braidInvalidArgument) << words;
    EXPECT_NE(std::string(braidGetLastError(comm)).find(words), std::string::npos)
        << braidGetLastError(comm);
  };
  expectNamed(braidAlltoAll(nullptr, &value, 1, braidInt32, comm, nullptr),
              "braidAlltoAll on rank 0: sendbuff is NULL but count is 1 (expected 4 bytes)");
  expectNamed(braidScatter(&value, &other, 1, static_cast<braidDataType_t>(99), 0, comm, nullptr),
              "braidScatter on rank 0: datatype 99 is not a braidDataType_t");
  expectNamed(braidGather(&value, &other, SIZE_MAX / 2, braidInt32, 0, comm, nullptr),
              "braidGather on rank 0: count 9223372036854775807 overflows the address space (at "
              "most");
  expectNamed(braidAlltoAll(&value, &value, 1, braidInt32, comm, nullptr),
              "braidAlltoAll on rank 0: sendbuff and recvbuff overlap");
  braidCommDestroy(comm);
}

TEST(CommSplit, BadArgumentsAreNamed) {
  braidComm_t comm = nullptr;
  ASSERT_EQ(braidCommInitAll(&comm, 1, nullptr), braidSuccess);
  braidComm_t child = nullptr;
  EXPECT_EQ(braidCommSplit(comm, -5, 0, &child, nullptr), braidInvalidArgument);
  EXPECT_NE(std::string(braidGetLastError(comm)).find("color -5"), std::string::npos)
      << braidGetLastError(comm);
  EXPECT_EQ(braidCommSplit(comm, 0, 0, nullptr, nullptr), braidInvalidArgument);
  EXPECT_EQ(braidCommSplit(nullptr, 0, 0, &child, nullptr), braidInvalidArgument);
  int32_t value = 1;
  EXPECT_EQ(braidGather(&value, &value, 1, braidInt32, 3, comm, nullptr), braidInvalidArgument);
  EXPECT_NE(std::string(braidGetLastError(comm)).find("braidGather on rank 0: root 3"),
            std::string::npos)
      << braidGetLastError(comm);
  braidCommDestroy(comm);
}

}  // namespace
}  // namespace braid_test
