// The tree engine's device form (coll/tree_engine.h) on CPU threads standing in for thread blocks:
// all-reduce, broadcast and reduce on a double binary tree (base/binary_trees.h; one channel per
// tree, each a share of the elements), every dtype x op x count, in place and not, roots first and
// last, 1-16 ranks (every tree shape those sizes make), ranks placed on the trees through a ring
// order that is not the identity; every element against the multirank grid's independent
// reference (device_cases.h), the outputs poisoned first. FIFOs carry the cases one after another,
// as a communicator's do. Built with ThreadSanitizer too (label tsan).
#include <gtest/gtest.h>

#include <barrier>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/binary_trees.h"
#include "coll/tree_engine.h"
#include "device/cpu_group.h"
#include "device/device_cases.h"

namespace braid_test {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kDeadline = std::chrono::seconds(120);
constexpr int kTrees = 2;

struct TreeShape {
  int ranks, threads, slots;
};

std::string treeShapeName(const TreeShape& s) {
  return std::to_string(s.ranks) + "ranks_" + std::to_string(s.threads) + "threads_" +
         std::to_string(s.slots) + "slots";
}

// The collectives a tree runs, of the grid's cases. The grid's inputs keep results exact for 8
// ranks (grid_common.h); beyond, not for fp8 elements but by max and min (sums need more than their
// 3-4 significant bits), products of fp16 elements (they leave its range), nor averages of 8-bit
// integers (their sums wrap before the division).
std::vector<Case> treeCases(const TreeShape& s) {
  auto exactBeyond8 = [](const Case& c) {
    const bool fp8 = c.type == braidFloat8e4m3 || c.type == braidFloat8e5m2;
    const bool byte = c.type == braidInt8 || c.type == braidUint8;
    const bool ordering = c.op == braidMax || c.op == braidMin;
    return !(fp8 && reduces(c.collective) && !ordering) &&
           !(c.op == braidProd && c.type == braidFloat16) && !(c.op == braidAvg && byte);
  };
  std::vector<Case> cases;
  for (const Case& c : casesFor(Shape{s.ranks, kTrees, s.threads, s.slots, Algorithm::Simple}))
    if ((c.collective == Collective::AllReduce || c.collective == Collective::Broadcast ||
         c.collective == Collective::Reduce) &&
        (s.ranks <= 8 || exactBeyond8(c)))
      cases.push_back(c);
  return cases;
}

class TreeGrid {
 public:
  explicit TreeGrid(const TreeShape& s)
      : shape_(s),
        cases_(treeCases(s)),
        words_(fifoCount()),
        slots_(fifoCount()),
        buffers_(static_cast<size_t>(s.ranks)),
        gridBarrier_(s.ranks * kTrees * s.threads),
        blocks_(s.ranks * kTrees, s.threads) {
    for (auto& slots : slots_) slots.assign(kSlotBytes * s.slots + 64, 0);
    // Ring position p holds rank (3p + 1) mod n where that is a permutation, else p reversed.
    for (int p = 0; p < s.ranks; ++p) ringOrder_.push_back((s.ranks - 1 - p));
    if (s.ranks % 3 != 0)
      for (int p = 0; p < s.ranks; ++p) ringOrder_[p] = (3 * p + 1) % s.ranks;
    positionOf_.resize(s.ranks);
    for (int p = 0; p < s.ranks; ++p) positionOf_[ringOrder_[p]] = p;
  }

  std::vector<std::string> run() {
    std::vector<std::thread> threads;
    for (int rank = 0; rank < shape_.ranks; ++rank)
      for (int tree = 0; tree < kTrees; ++tree)
        for (int t = 0; t < shape_.threads; ++t)
          threads.emplace_back([this, rank, tree, t] { thread(rank, tree, t); });
    for (auto& t : threads) t.join();
    return failures_;
  }

 private:
  size_t fifoCount() const { return static_cast<size_t>(kTrees * shape_.ranks * shape_.ranks); }
  size_t fifoIndex(int tree, int sender, int receiver) const {
    return static_cast<size_t>((tree * shape_.ranks + sender) * shape_.ranks + receiver);
  }
  uint8_t* slotsOf(size_t fifo) {
    return reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(slots_[fifo].data()) + 63) / 64 *
                                      64);
  }
  // The ports between `rank` and `peer` on `tree`.
  braid::FifoViewPorts portsTo(int tree, int rank, int peer) {
    const size_t in = fifoIndex(tree, peer, rank), out = fifoIndex(tree, rank, peer);
    const auto slots = static_cast<uint32_t>(shape_.slots);
    return {braid::FifoEnds{{&words_[in], slotsOf(in), kSlotBytes, slots},
                            {&words_[out], slotsOf(out), kSlotBytes, slots}}};
  }

  void thread(int rank, int tree, int t) {
    const bool rankLeader = tree == 0 && t == 0;
    for (const Case& c : cases_) {
      if (rankLeader) layoutRank(c, rank, shape_.ranks, buffers_[rank]);
      gridBarrier_.arrive_and_wait();
      const bool ok = runBlock(c, rank, tree, t);
      gridBarrier_.arrive_and_wait();
      if (!ok && t == 0)
        fail(c,
             "rank " + std::to_string(rank) + " tree " + std::to_string(tree) + ": a wait gave up");
      if (rankLeader) {
        const std::string wrong = checkRank(c, rank, shape_.ranks, buffers_[rank]);
        if (!wrong.empty()) fail(c, wrong);
      }
      gridBarrier_.arrive_and_wait();
    }
  }

  void fail(const Case& c, const std::string& what) {
    const std::lock_guard<std::mutex> lock(failuresMutex_);
    if (failures_.size() < 20)
      failures_.push_back(describe(c, Shape{shape_.ranks, kTrees, shape_.threads, shape_.slots,
                                            Algorithm::Simple}) +
                          " (tree " + treeShapeName(shape_) + "): " + what);
  }

  bool runBlock(const Case& c, int rank, int tree, int t) {
    const int n = shape_.ranks;
    const bool rooted = c.collective != Collective::AllReduce;
    const braid::BinaryTrees trees =
        rooted ? braid::BinaryTrees(n, positionOf_[c.root]) : braid::BinaryTrees(n);
    const braid::TreeNode node = trees.node(tree, positionOf_[rank]);
    braid::TreePorts<braid::FifoViewPorts> ports{};
    if (node.parent >= 0) ports.parent = portsTo(tree, rank, ringOrder_[node.parent]);
    for (int k = 0; k < node.nChildren; ++k)
      ports.children[k] = portsTo(tree, rank, ringOrder_[node.children[k]]);
    CpuGroup group = blocks_.group(rank * kTrees + tree, t, Clock::now() + kDeadline);
    const RankBuffers& b = buffers_[rank];
    bool ok = true;
    withReduction(c.type, c.op, [&](auto reduction, auto prescaled) {
      using R = decltype(reduction);
      using T = typename R::Storage;
      constexpr bool kPrescaled = decltype(prescaled)::value;
      const size_t begin = braid::treeShareBegin<T>(c.count, tree, kTrees);
      const size_t end = braid::treeShareBegin<T>(c.count, tree + 1, kTrees);
      const braid::TreeCall<T> call{c.collective,
                                    reinterpret_cast<const T*>(b.input) + begin,
                                    reinterpret_cast<T*>(b.output) + begin,
                                    end - begin,
                                    c.op == braidAvg ? n : 1,
                                    node.parent >= 0,
                                    node.nChildren};
      T scale{};  // PreMulSum's, as the grid's element type makes it, in the storage's bits
      visitDtype(c.type, [&](auto element) {
        const auto value = premulScalar<decltype(element)>(rank);
        std::memcpy(&scale, &value, sizeof scale);
      });
      ok = braid::runTreeOnViews<R, kPrescaled>(group, call, ports, scale);
    });
    return ok;
  }

  TreeShape shape_;
  std::vector<Case> cases_;
  std::vector<braid::FifoWords> words_;
  std::vector<std::vector<uint8_t>> slots_;
  std::vector<RankBuffers> buffers_;
  std::vector<int> ringOrder_, positionOf_;
  std::barrier<> gridBarrier_;
  CpuBlocks blocks_;  // a block per (rank, tree)
  std::mutex failuresMutex_;
  std::vector<std::string> failures_;
};

class TreeForm : public testing::TestWithParam<TreeShape> {};

TEST_P(TreeForm, EveryCollectiveMatchesTheReference) {
  for (const std::string& f : TreeGrid(GetParam()).run()) ADD_FAILURE() << f;
}

std::vector<TreeShape> treeShapes() {
  std::vector<TreeShape> shapes;
#if defined(__SANITIZE_THREAD__)
  for (int ranks : {1, 2, 3, 6, 9}) shapes.push_back({ranks, 4, 2});
#else
  // Fewer threads per block from 9 ranks: two cores run every thread of the grid.
  for (int ranks = 1; ranks <= 16; ++ranks) shapes.push_back({ranks, ranks <= 8 ? 4 : 2, 2});
  shapes.push_back({5, 1, 1});
  shapes.push_back({7, 32, 4});
#endif
  return shapes;
}

INSTANTIATE_TEST_SUITE_P(Grid, TreeForm, testing::ValuesIn(treeShapes()),
                         [](const testing::TestParamInfo<TreeShape>& info) {
                           return treeShapeName(info.param);
                         });

}  // namespace
}  // namespace braid_test
