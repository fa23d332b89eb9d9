// The ring schedule, checked by simulating it: every rank's blocks carry the set of ranks whose
// input they contain, and each primitive moves or merges those sets as its name says.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <deque>
#include <map>
#include <vector>

#include "coll/schedule.h"

namespace braid {
namespace {

using Contrib = uint64_t;  // bit r: rank r's input is in this element

struct Sim {
  int n;
  size_t count, chunk, align;
  Collective coll;
  int root = 0;
  std::vector<int> order;  // ranks in ring order; empty: rank = position
  // Per rank: input and output buffers of contribution masks; FIFO per receiving rank.
  std::vector<std::vector<Contrib>> in, out;
  std::vector<std::deque<std::vector<Contrib>>> fifo;
  std::vector<std::vector<bool>> written;

  size_t inSize() const { return coll == Collective::ReduceScatter ? count * n : count; }
  size_t outSize() const { return coll == Collective::AllGather ? count * n : count; }

  void setUp() {
    in.assign(n, {});
    out.assign(n, {});
    written.assign(n, std::vector<bool>(outSize(), false));
    fifo.assign(n, {});
    for (int r = 0; r < n; ++r) {
      in[r].assign(inSize(), Contrib(1) << r);
      out[r].assign(outSize(), 0);
    }
  }

  int position(int rank) const {
    if (coll == Collective::Broadcast) return modRanks(rank - root, n);
    if (coll == Collective::Reduce) return modRanks(rank - root - 1, n);
    if (!order.empty())
      return static_cast<int>(std::find(order.begin(), order.end(), rank) - order.begin());
    return rank;
  }
  int rankAt(int pos) const {
    if (coll == Collective::Broadcast) return modRanks(pos + root, n);
    if (coll == Collective::Reduce) return modRanks(pos + root + 1, n);
    if (!order.empty()) return order[pos];
    return pos;
  }

  // Runs one primitive of rank r; returns false if it must wait for data.
  bool step(int r, size_t loop, int s) {
    const int pos = position(r);
    const RingOp op =
        ringOp(coll, n, pos, count, chunk, align, loop, s, order.empty() ? nullptr : order.data());
    EXPECT_LE(op.count, chunk);
    std::vector<Contrib> received;
    if (primReceives(op.prim)) {
      if (fifo[r].empty()) return false;
      received = fifo[r].front();
      fifo[r].pop_front();
      EXPECT_EQ(received.size(), op.count) << "chunk size mismatch";
    }
    std::vector<Contrib> result(op.count);
    for (size_t i = 0; i < op.count; ++i) {
      const Contrib local = in[r][op.inOffset + i];
      switch (op.prim) {
        case Prim::Send:
        case Prim::CopySend: result[i] = local; break;
        case Prim::RecvReduceSend:
        case Prim::RecvReduceCopySend:
        case Prim::RecvReduceCopy:
          EXPECT_EQ(received[i] & local, 0u) << "a contribution was reduced twice";
          result[i] = received[i] | local;
          break;
        default: result[i] = received[i];
      }
    }
    const bool writesOutput = op.prim == Prim::CopySend || op.prim == Prim::RecvReduceCopySend ||
                              op.prim == Prim::RecvCopySend || op.prim == Prim::Recv ||
                              op.prim == Prim::RecvReduceCopy;
    if (writesOutput)
      for (size_t i = 0; i < op.count; ++i) {
        EXPECT_FALSE(written[r][op.outOffset + i]) << "output element written twice";
        written[r][op.outOffset + i] = true;
        out[r][op.outOffset + i] = result[i];
      }
    if (primSends(op.prim)) fifo[rankAt(modRanks(pos + 1, n))].push_back(result);
    return true;
  }

  // Every rank runs its schedule; ranks advance round-robin, waiting when their FIFO is empty.
  void run() {
    setUp();
    const size_t loops = ringLoops(coll, n, count, chunk);
    const int steps = ringSteps(coll, n);
    std::vector<size_t> progress(n, 0);
    const size_t total = loops * steps;
    for (bool moved = true; moved;) {
      moved = false;
      for (int r = 0; r < n; ++r)
        while (progress[r] < total && step(r, progress[r] / steps, progress[r] % steps)) {
          ++progress[r];
          moved = true;
        }
    }
    for (int r = 0; r < n; ++r) ASSERT_EQ(progress[r], total) << "rank " << r << " deadlocked";
  }
};

const Contrib kAll(int n) {
  return n == 64 ? ~Contrib(0) : (Contrib(1) << n) - 1;
}

class ScheduleTest : public ::testing::TestWithParam<std::tuple<int, size_t>> {};

TEST_P(ScheduleTest, AllReduceGivesEveryRankEveryContribution) {
  auto [n, count] = GetParam();
  Sim sim{n, count, 8, 4, Collective::AllReduce};
  sim.run();
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < count; ++i) {
      ASSERT_TRUE(sim.written[r][i]) << "rank " << r << " element " << i << " never written";
      ASSERT_EQ(sim.out[r][i], kAll(n)) << "rank " << r << " element " << i;
    }
}

TEST_P(ScheduleTest, ReduceScatterGivesEachRankItsReducedBlock) {
  auto [n, count] = GetParam();
  Sim sim{n, count, 8, 4, Collective::ReduceScatter};
  sim.run();
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < count; ++i) ASSERT_EQ(sim.out[r][i], kAll(n)) << r << "/" << i;
}

TEST_P(ScheduleTest, AllGatherPlacesEveryRanksBlock) {
  auto [n, count] = GetParam();
  Sim sim{n, count, 8, 4, Collective::AllGather};
  sim.run();
  for (int r = 0; r < n; ++r)
    for (int b = 0; b < n; ++b)
      for (size_t i = 0; i < count; ++i)
        ASSERT_EQ(sim.out[r][b * count + i], Contrib(1) << b) << r << "/" << b << "/" << i;
}

// Rings whose order is not the rank order (host-contiguous rings): each rank still gets its own
// reduce-scatter block, and all-gather puts each rank's input at that rank's offset.
TEST_P(ScheduleTest, BlocksBelongToRanksWhateverTheRingOrder) {
  auto [n, count] = GetParam();
  std::vector<int> order(n);
  for (int p = 0; p < n; ++p) order[p] = p;
  std::sort(order.begin(), order.end());
  std::reverse(order.begin(), order.end());
  std::swap(order[0], order[n / 2]);  // e.g. n = 4: 2 3 1 0
  Sim rs{n, count, 8, 4, Collective::ReduceScatter, 0, order};
  rs.run();
  for (int r = 0; r < n; ++r)
    for (size_t i = 0; i < count; ++i) ASSERT_EQ(rs.out[r][i], kAll(n)) << r << "/" << i;
  Sim ag{n, count, 8, 4, Collective::AllGather, 0, order};
  ag.run();
  for (int r = 0; r < n; ++r)
    for (int b = 0; b < n; ++b)
      for (size_t i = 0; i < count; ++i)
        ASSERT_EQ(ag.out[r][b * count + i], Contrib(1) << b) << r << "/" << b << "/" << i;
}

TEST_P(ScheduleTest, BroadcastAndReduceFollowTheRootsChain) {
  auto [n, count] = GetParam();
  for (int root : {0, n - 1, n / 2}) {
    Sim bcast{n, count, 8, 4, Collective::Broadcast, root};
    bcast.run();
    for (int r = 0; r < n; ++r)
      for (size_t i = 0; i < count; ++i) ASSERT_EQ(bcast.out[r][i], Contrib(1) << root);
    Sim reduce{n, count, 8, 4, Collective::Reduce, root};
    reduce.run();
    for (size_t i = 0; i < count; ++i) ASSERT_EQ(reduce.out[root][i], kAll(n));
    for (int r = 0; r < n; ++r)
      if (r != root)
        for (size_t i = 0; i < count; ++i) ASSERT_FALSE(reduce.written[r][i]);
  }
}

INSTANTIATE_TEST_SUITE_P(RanksAndCounts, ScheduleTest,
                         ::testing::Combine(::testing::Values(2, 3, 4, 5, 8),
                                            ::testing::Values(1, 7, 8, 31, 64, 1031)));

TEST(Schedule, AllReduceBlocksStayAligned) {
  // 4-element alignment: every block of a full loop starts on a multiple of 4.
  for (int step = 0; step < ringSteps(Collective::AllReduce, 3); ++step) {
    RingOp op = ringOp(Collective::AllReduce, 3, 1, 1000, 64, 4, 2, step);
    EXPECT_EQ(op.inOffset % 4, 0u);
  }
}

}  // namespace
}  // namespace braid
