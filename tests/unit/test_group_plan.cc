// A group's calls as passes (coll/group_plan.h): which calls fuse, and that a fused pass's layout
// gives every member its own result. The layout is checked by running the collectives' meaning on
// plain arrays of every rank: each member alone, and the fused call over the staging buffers that
// fusedPass's copies fill and empty; the two must agree to the byte.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <stdexcept>
#include <utility>
#include <vector>

#include "coll/call_tag.h"
#include "coll/group_plan.h"

namespace {

using braid::CollArgs;
using braid::Collective;
using braid::GroupPass;

const braid::GroupFuseLimits kLimits{1024, 4096, nullptr, nullptr};

CollArgs call(Collective c, size_t count, braidDataType_t type = braidFloat32,
              braidRedOp_t op = braidSum, int root = 0) {
  return CollArgs{c, nullptr, nullptr, count, type, op, root};
}

std::vector<GroupPass::Kind> kinds(const braid::GroupPlan& plan) {
  std::vector<GroupPass::Kind> out;
  for (const GroupPass& p : plan.passes) out.push_back(p.kind);
  return out;
}

// The group's calls pass `k` of `plan` runs, by place.
std::vector<size_t> callsOf(const braid::GroupPlan& plan, size_t k) {
  const GroupPass& pass = plan.passes.at(k);
  return {plan.order.begin() + static_cast<ptrdiff_t>(pass.first),
          plan.order.begin() + static_cast<ptrdiff_t>(pass.first + pass.count)};
}

using K = GroupPass::Kind;

TEST(GroupPlan, ConsecutiveSmallCallsThatAgreeFuse) {
  const std::vector<CollArgs> calls = {call(Collective::AllReduce, 10),
                                       call(Collective::AllReduce, 20),
                                       call(Collective::AllReduce, 30)};
  const auto plan = braid::planGroup(calls, 4, kLimits);
  ASSERT_EQ(plan.passes.size(), 1u);
  EXPECT_EQ(plan.passes[0].kind, K::Fused);
  EXPECT_EQ(callsOf(plan, 0), (std::vector<size_t>{0, 1, 2}));
}

TEST(GroupPlan, CallsThatDisagreeOrAreLargeRunAlone) {
  const std::vector<CollArgs> calls = {
      call(Collective::AllReduce, 10),                             // alone: next differs in op
      call(Collective::AllReduce, 10, braidFloat32, braidMax),     // fuses with the next
      call(Collective::AllReduce, 10, braidFloat32, braidMax),     //
      call(Collective::AllReduce, 10, braidFloat64, braidMax),     // alone: type differs
      call(Collective::AllReduce, 257),                            // alone: 1028 bytes > 1024
      call(Collective::Broadcast, 10, braidFloat32, braidSum, 1),  // alone: root differs
      call(Collective::Broadcast, 10, braidFloat32, braidSum, 2),  //
      call(Collective::AllReduce, 0),                              // alone: nothing to fuse
      call(Collective::AllReduce, 0),                              //
  };
  EXPECT_EQ(kinds(braid::planGroup(calls, 4, kLimits)),
            (std::vector<K>{K::Alone, K::Fused, K::Alone, K::Alone, K::Alone, K::Alone, K::Alone,
                            K::Alone}));
}

TEST(GroupPlan, APreMulSumOperatorRunsAlone) {
  const auto custom = static_cast<braidRedOp_t>(braidNumOps + 1);
  const std::vector<CollArgs> calls = {call(Collective::AllReduce, 10, braidFloat32, custom),
                                       call(Collective::AllReduce, 10, braidFloat32, custom)};
  EXPECT_EQ(kinds(braid::planGroup(calls, 2, kLimits)), (std::vector<K>{K::Alone, K::Alone}));
}

// A group's sends and receives differ from rank to rank; its collectives do not. The collectives
// alone decide their passes, so every rank runs the same ones whatever sends and receives lie
// between its calls: those between two collective passes run together, those among a fused run's
// calls after it.
TEST(GroupPlan, SendsAndReceivesNeitherSplitNorMoveTheCollectivePasses) {
  using C = Collective;
  const CollArgs ar = call(C::AllReduce, 10), send = call(C::Send, 10), recv = call(C::Recv, 10);
  auto plan = [](const std::vector<CollArgs>& calls) {
    return braid::planGroup(calls, 2, kLimits);
  };
  const auto none = plan({ar, ar, ar});
  const auto between = plan({ar, send, recv, ar, ar});
  const auto around = plan({send, ar, ar, recv, ar, send});
  EXPECT_EQ(kinds(none), (std::vector<K>{K::Fused}));
  EXPECT_EQ(kinds(between), (std::vector<K>{K::Fused, K::SendRecv}));
  EXPECT_EQ(callsOf(between, 0), (std::vector<size_t>{0, 3, 4}));
  EXPECT_EQ(callsOf(between, 1), (std::vector<size_t>{1, 2}));
  EXPECT_EQ(kinds(around), (std::vector<K>{K::SendRecv, K::Fused, K::SendRecv}));
  EXPECT_EQ(callsOf(around, 1), (std::vector<size_t>{1, 2, 4}));
  EXPECT_EQ(callsOf(around, 2), (std::vector<size_t>{3, 5}));
  // Calls alone keep their order, the sends and receives between them in their place.
  const CollArgs max = call(C::AllReduce, 10, braidFloat32, braidMax);
  const auto alone = plan({ar, send, max, recv});
  EXPECT_EQ(kinds(alone), (std::vector<K>{K::Alone, K::SendRecv, K::Alone, K::SendRecv}));
  EXPECT_EQ(callsOf(alone, 2), (std::vector<size_t>{2}));
  // A run not worth fusing keeps its calls alone, each in its place.
  const std::vector<CollArgs> spaced = {ar, send, ar, recv, ar};
  const braid::GroupFuseLimits copiesCostMore = {1024, 4096, [](const CollArgs&) { return 0.0; },
                                                 [](size_t) { return 1.0; }};
  const auto apart = braid::planGroup(spaced, 2, copiesCostMore);
  EXPECT_EQ(kinds(apart), (std::vector<K>{K::Alone, K::SendRecv, K::Alone, K::SendRecv, K::Alone}));
  EXPECT_EQ(apart.order, (std::vector<size_t>{0, 1, 2, 3, 4}));
}

// The collective passes of `plan` as ordinals among the group's collectives: what every rank
// must plan alike, whatever its sends and receives.
std::vector<std::pair<K, std::vector<size_t>>> collectivePasses(const std::vector<CollArgs>& calls,
                                                                const braid::GroupPlan& plan) {
  std::vector<size_t> ordinal(calls.size());
  for (size_t i = 0, k = 0; i < calls.size(); ++i)
    if (!braid::isSendOrRecv(calls[i].coll)) ordinal[i] = k++;
  std::vector<std::pair<K, std::vector<size_t>>> out;
  for (size_t p = 0; p < plan.passes.size(); ++p) {
    if (plan.passes[p].kind == K::SendRecv) continue;
    std::vector<size_t> members;
    for (size_t call : callsOf(plan, p)) members.push_back(ordinal[call]);
    out.emplace_back(plan.passes[p].kind, members);
  }
  return out;
}

// A send before any subset of the collectives, and at the end (2^11 groups): the same collective
// passes as without sends; every call once in the order; a send after every collective that came
// before it in the group.
TEST(GroupPlan, EveryPlacementOfSendsLeavesTheSameCollectivePasses) {
  using C = Collective;
  const CollArgs ar = call(C::AllReduce, 10), max = call(C::AllReduce, 10, braidFloat32, braidMax);
  const std::vector<CollArgs> collectives = {
      ar, ar, max, max, call(C::AllReduce, 300), ar, ar, call(C::Gather, 4), ar, ar};
  const auto reference = collectivePasses(collectives, braid::planGroup(collectives, 2, kLimits));
  EXPECT_EQ(kinds(braid::planGroup(collectives, 2, kLimits)),
            (std::vector<K>{K::Fused, K::Fused, K::Alone, K::Fused, K::Alone, K::Fused}));
  for (unsigned mask = 0; mask < (1u << (collectives.size() + 1)); ++mask) {
    std::vector<CollArgs> calls;
    for (size_t k = 0; k <= collectives.size(); ++k) {
      if (mask & (1u << k)) calls.push_back(call(C::Send, 1));
      if (k < collectives.size()) calls.push_back(collectives[k]);
    }
    const braid::GroupPlan plan = braid::planGroup(calls, 2, kLimits);
    ASSERT_EQ(collectivePasses(calls, plan), reference) << "sends before mask " << mask;
    std::vector<size_t> sorted = plan.order;
    std::sort(sorted.begin(), sorted.end());
    std::vector<size_t> every(calls.size());
    for (size_t i = 0; i < every.size(); ++i) every[i] = i;
    ASSERT_EQ(sorted, every) << "mask " << mask;
    for (size_t at = 0; at < plan.order.size(); ++at) {
      if (!braid::isSendOrRecv(calls[plan.order[at]].coll)) continue;
      for (size_t before = 0; before < plan.order[at]; ++before)
        ASSERT_NE(
            std::find(plan.order.begin(), plan.order.begin() + static_cast<ptrdiff_t>(at), before),
            plan.order.begin() + static_cast<ptrdiff_t>(at))
            << "mask " << mask << ": call " << before << " runs after the send " << plan.order[at];
    }
  }
}

TEST(GroupPlan, APassHoldsAtMostItsLimitAndGatheredBytesCountAllRanks) {
  // All-gathers of 64 floats on 4 ranks: 1024 gathered bytes each, 4 to a pass of 4096.
  std::vector<CollArgs> calls(9, call(Collective::AllGather, 64));
  const auto plan = braid::planGroup(calls, 4, kLimits);
  EXPECT_EQ(kinds(plan), (std::vector<K>{K::Fused, K::Fused, K::Alone}));
  EXPECT_EQ(plan.passes[0].count, 4u);
  EXPECT_EQ(plan.passes[1].count, 4u);
  // On 5 ranks each gathers 1280 bytes: above the call limit, none fuses.
  EXPECT_EQ(braid::planGroup(calls, 5, kLimits).passes.size(), 9u);
  // A limit of 0 fuses nothing.
  EXPECT_EQ(braid::planGroup(calls, 4, {0, 4096, {}, {}}).passes.size(), 9u);
}

// Priced as a model would: a fixed latency per call plus bytes at 1 GB/s, and copies at 10 GB/s.
braid::GroupFuseLimits priced(double latencyUs) {
  return {1 << 20, 16 << 20,
          [latencyUs](const CollArgs& c) { return latencyUs + braid::callSizeBytes(c, 2) / 1e3; },
          [](size_t bytes) { return bytes / 1e4; }};
}

TEST(GroupPlan, ARunFusesWhereTheModelPricesItBelowItsCallsOneByOne) {
  // 4 all-reduces of 64 KiB on 2 ranks: one by one 4 x (L + 65.5) us; fused L + 262 us, plus
  // 4 x 128 KiB copied (52 us). They fuse once the latency L saved (3 L) exceeds the copies.
  const std::vector<CollArgs> calls(4, call(Collective::AllReduce, 16 << 10));
  EXPECT_EQ(kinds(braid::planGroup(calls, 2, priced(10))),
            (std::vector<K>{K::Alone, K::Alone, K::Alone, K::Alone}));
  EXPECT_EQ(kinds(braid::planGroup(calls, 2, priced(20))), (std::vector<K>{K::Fused}));
  // Calls alone keep their places: the next run is planned on its own.
  std::vector<CollArgs> mixed = calls;
  mixed.push_back(call(Collective::AllGather, 4));
  mixed.push_back(call(Collective::AllGather, 4));
  const auto plan = braid::planGroup(mixed, 2, priced(10));
  EXPECT_EQ(kinds(plan), (std::vector<K>{K::Alone, K::Alone, K::Alone, K::Alone, K::Fused}));
  for (size_t k = 0; k < 4; ++k) EXPECT_EQ(callsOf(plan, k), std::vector<size_t>{k});
  EXPECT_EQ(callsOf(plan, 4), (std::vector<size_t>{4, 5}));
}

// A gather's or scatter's marker (the root agreement its sends and receives follow) has no price
// in the model: a call that cannot fuse runs alone without being priced. The communicator's
// pricing failed on it ("array::at"), failing every group that held a gather or scatter beside
// another collective.
TEST(GroupPlan, ACallThatCannotFuseRunsAloneUnpriced) {
  braid::GroupFuseLimits limits = priced(20);
  limits.callUs = [](const CollArgs& c) {
    if (braid::isPointToPoint(c.coll)) throw std::logic_error("priced a point-to-point call");
    return 20 + braid::callSizeBytes(c, 2) / 1e3;
  };
  const std::vector<CollArgs> calls = {
      call(Collective::Gather, 0),    call(Collective::Send, 4),    call(Collective::AllReduce, 8),
      call(Collective::AllReduce, 8), call(Collective::Scatter, 0), call(Collective::Recv, 4),
      call(Collective::AllReduce, 8)};
  braid::GroupPlan plan;
  ASSERT_NO_THROW(plan = braid::planGroup(calls, 2, limits));
  EXPECT_EQ(kinds(plan),
            (std::vector<K>{K::Alone, K::SendRecv, K::Fused, K::Alone, K::SendRecv, K::Alone}));
}

// The collectives' meaning on every rank's arrays of floats (sum; root 1 for the rooted ones).
constexpr int kRoot = 1;
using Buffers = std::vector<std::vector<float>>;  // [rank]

void reference(Collective c, size_t count, const Buffers& in, Buffers& out) {
  const int n = static_cast<int>(in.size());
  for (int r = 0; r < n; ++r) {
    for (size_t i = 0; i < out[r].size(); ++i) {
      switch (c) {
        case Collective::AllReduce:
        case Collective::Reduce: {
          if (c == Collective::Reduce && r != kRoot) break;
          float sum = 0;
          for (int s = 0; s < n; ++s) sum += in[s][i];
          out[r][i] = sum;
          break;
        }
        case Collective::Broadcast: out[r][i] = in[kRoot][i]; break;
        case Collective::AllGather: out[r][i] = in[i / count][i % count]; break;
        case Collective::ReduceScatter: {
          float sum = 0;
          for (int s = 0; s < n; ++s) sum += in[s][r * count + i];
          out[r][i] = sum;
          break;
        }
        default: FAIL();
      }
    }
  }
}

size_t inputCount(Collective c, size_t count, int n) {
  return c == Collective::ReduceScatter ? count * n : count;
}
size_t outputCount(Collective c, size_t count, int n) {
  return c == Collective::AllGather ? count * n : count;
}

// Members of `counts` elements on `n` ranks: each alone against the fused pass.
void checkFusedLayout(Collective c, int n, const std::vector<size_t>& counts) {
  SCOPED_TRACE(testing::Message() << braid::apiName(c) << " on " << n << " ranks");
  std::vector<Buffers> in(counts.size(), Buffers(n)), alone(counts.size(), Buffers(n)),
      fused(counts.size(), Buffers(n));
  for (size_t m = 0; m < counts.size(); ++m)
    for (int r = 0; r < n; ++r) {
      in[m][r].resize(inputCount(c, counts[m], n));
      for (size_t i = 0; i < in[m][r].size(); ++i) in[m][r][i] = 1000.f * m + 100.f * r + i;
      alone[m][r].assign(outputCount(c, counts[m], n), -1.f);  // poisoned
      fused[m][r].assign(outputCount(c, counts[m], n), -1.f);
    }
  for (size_t m = 0; m < counts.size(); ++m) reference(c, counts[m], in[m], alone[m]);
  // Every rank stages its inputs, the fused call runs on the staging buffers, and every rank
  // copies its outputs back.
  Buffers stagingIn(n), stagingOut(n);
  size_t total = 0;
  for (size_t count : counts) total += count;
  std::vector<braid::FusedPass> passes;
  for (int r = 0; r < n; ++r) {
    std::vector<CollArgs> members;
    for (size_t m = 0; m < counts.size(); ++m)
      members.push_back(
          {c, in[m][r].data(), fused[m][r].data(), counts[m], braidFloat32, braidSum, kRoot});
    passes.push_back(braid::fusedPass(members, n, r));
    const braid::FusedPass& pass = passes.back();
    EXPECT_EQ(pass.call.count, total);
    stagingIn[r].assign(pass.stagingBytes / sizeof(float), -2.f);
    for (const braid::StagedCopy& copy : pass.inputs)
      std::memcpy(reinterpret_cast<uint8_t*>(stagingIn[r].data()) + copy.staged,
                  reinterpret_cast<const uint8_t*>(in[copy.member][r].data()) + copy.own,
                  copy.bytes);
  }
  // The fused call reads its input at sendOffset and writes its output at recvOffset.
  Buffers callIn(n), callOut(n);
  for (int r = 0; r < n; ++r) {
    const float* from = stagingIn[r].data() + passes[r].sendOffset / sizeof(float);
    callIn[r].assign(from, from + inputCount(c, total, n));
    callOut[r].assign(outputCount(c, total, n), -3.f);
  }
  reference(c, total, callIn, callOut);
  for (int r = 0; r < n; ++r) {
    stagingOut[r] = stagingIn[r];
    std::copy(callOut[r].begin(), callOut[r].end(),
              stagingOut[r].begin() + passes[r].recvOffset / sizeof(float));
    for (const braid::StagedCopy& copy : passes[r].outputs)
      std::memcpy(reinterpret_cast<uint8_t*>(fused[copy.member][r].data()) + copy.own,
                  reinterpret_cast<const uint8_t*>(stagingOut[r].data()) + copy.staged, copy.bytes);
  }
  for (size_t m = 0; m < counts.size(); ++m)
    for (int r = 0; r < n; ++r)
      EXPECT_EQ(fused[m][r], alone[m][r]) << "member " << m << " rank " << r;
}

TEST(GroupPlan, AFusedPassGivesEveryMemberItsOwnResult) {
  for (Collective c : {Collective::AllReduce, Collective::Broadcast, Collective::Reduce,
                       Collective::AllGather, Collective::ReduceScatter})
    for (int n : {2, 3, 5}) checkFusedLayout(c, n, {3, 1, 7, 4});
}

std::optional<std::pair<size_t, size_t>> laterReads(const std::vector<CollArgs>& members,
                                                    int rank) {
  return braid::laterReadsEarlierOutput(members, braid::fusedPass(members, 2, rank));
}

TEST(GroupPlan, ALaterCallReadingAnEarlierOutputIsFound) {
  std::vector<float> a(16), b(16), c(16);
  const std::vector<CollArgs> chained = {
      {Collective::AllReduce, a.data(), b.data(), 16, braidFloat32, braidSum, 0},
      {Collective::AllReduce, c.data(), c.data(), 16, braidFloat32, braidSum, 0},
      {Collective::AllReduce, b.data() + 8, a.data(), 4, braidFloat32, braidSum, 0}};
  const auto pair = laterReads(chained, 0);
  ASSERT_TRUE(pair.has_value());
  EXPECT_EQ(pair->first, 0u);
  EXPECT_EQ(pair->second, 2u);
  // In place, each on its own buffer; and a later call writing what an earlier one read: the
  // pass keeps both as calls one by one would.
  const std::vector<CollArgs> apart = {
      {Collective::AllReduce, a.data(), a.data(), 16, braidFloat32, braidSum, 0},
      {Collective::AllReduce, c.data(), b.data(), 16, braidFloat32, braidSum, 0},
      {Collective::AllReduce, b.data(), c.data(), 16, braidFloat32, braidSum, 0}};
  const auto later = laterReads(apart, 0);
  ASSERT_TRUE(later.has_value());  // the third reads b, which the second wrote
  EXPECT_EQ(*later, std::make_pair(size_t{1}, size_t{2}));
  const std::vector<CollArgs> disjoint = {
      {Collective::AllReduce, a.data(), a.data(), 16, braidFloat32, braidSum, 0},
      {Collective::AllReduce, c.data(), b.data(), 16, braidFloat32, braidSum, 0},
      {Collective::AllReduce, c.data(), c.data(), 16, braidFloat32, braidSum, 0}};
  EXPECT_FALSE(laterReads(disjoint, 0).has_value());
  // A broadcast's input is read on its root only: elsewhere nothing is read.
  const std::vector<CollArgs> broadcasts = {
      {Collective::Broadcast, a.data(), b.data(), 16, braidFloat32, braidSum, 1},
      {Collective::Broadcast, b.data(), c.data(), 16, braidFloat32, braidSum, 1}};
  EXPECT_FALSE(laterReads(broadcasts, 0).has_value());
  EXPECT_TRUE(laterReads(broadcasts, 1).has_value());
}

// Random layouts of all-reduces on slices of one array, few members (checked pair by pair) and
// many (the sweep): a pair is found exactly where a brute-force search over every pair finds one,
// and what is found is such a pair.
TEST(GroupPlan, TheReadAfterWriteSearchAgreesWithEveryPair) {
  std::vector<float> array(20000);
  uint64_t state = 12345;
  auto next = [&](uint64_t bound) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return (state >> 33) % bound;
  };
  for (int trial = 0; trial < 2000; ++trial) {
    std::vector<CollArgs> members;
    const size_t k = 2 + next(60), span = 100 + next(19000);
    for (size_t i = 0; i < k; ++i) {
      const size_t in = next(span), out = next(span), count = 1 + next(16);
      members.push_back({Collective::AllReduce, array.data() + in, array.data() + out, count,
                         braidFloat32, braidSum, 0});
    }
    auto reads = [&](size_t later, size_t earlier) {
      const float* r = static_cast<const float*>(members[later].sendbuff);
      const float* w = static_cast<const float*>(members[earlier].recvbuff);
      return r < w + members[earlier].count && w < r + members[later].count;
    };
    bool any = false;
    for (size_t later = 1; later < k; ++later)
      for (size_t earlier = 0; earlier < later; ++earlier) any = any || reads(later, earlier);
    const auto found = laterReads(members, 0);
    ASSERT_EQ(found.has_value(), any) << "trial " << trial;
    if (found) {
      EXPECT_LT(found->first, found->second);
      EXPECT_TRUE(reads(found->second, found->first)) << "trial " << trial;
    }
  }
}

}  // namespace
