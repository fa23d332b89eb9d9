// The tree engine's device form (coll/tree_engine.h) on CPU threads standing in for thread blocks:
// all-reduce, broadcast and reduce on a double binary tree (base/binary_trees.h; one channel per
// tree, each a share of the elements), every dtype x op x count, in place and not, roots first and
// last, 1-16 ranks (every tree shape those sizes make; and as trees of hosts with a chain inside
// each, TreesOfHosts: 1-8 ranks per host, the last host short), in the Simple protocol and the
// low-latency one (LlPorts: flagged lines), ranks placed on the trees through a ring order that is
// not the identity; every element against the multirank grid's independent reference
// (device_cases.h), the outputs poisoned first. FIFOs carry the cases one after another, as a
// communicator's do. Work lists (runTreeWorksOnViews, a group's tree all-reduces in one launch):
// every block runs runs of all-reduces of one datatype and operator, counts 0 to beyond the FIFO,
// in place and not, one call after another with no meeting between them, each its own buffers,
// all checked at the end. Built with ThreadSanitizer too (label tsan). The device variant
// (BRAID_DEVICE_FORM_NET) also runs every tree edge through the network proxy over loopback TCP, as
// a CUDA communicator's tree neighbours on other hosts are reached (device/net_hops.h).
#include <gtest/gtest.h>

#include <barrier>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "base/binary_trees.h"
#include "coll/tree_engine.h"
#include "device/cpu_group.h"
#include "device/device_cases.h"

#if BRAID_DEVICE_FORM_NET
#include "device/net_hops.h"
#endif

namespace braid_test {
namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kDeadline = std::chrono::seconds(120);
constexpr int kTrees = 2;

// backToBack: as the host runs the trees (coll/host_tree.cc): one block per rank taking tree 0
// then tree 1 over each pair's one FIFO, every case's call right after the last with no meeting
// between them (each case its own buffers, all checked at the end), so one rank's next call, of
// another collective or root, overlaps its peers' last one.
// listed: a block per (rank, tree) as in lockstep, running the all-reduces as work lists (a list
// per run of one datatype and operator; Avg's calls a list each, as its kernels run one), every
// list right after the last.
struct TreeShape {
  int ranks, threads, slots;
  bool backToBack = false;
  bool lowLatency = false;
  bool network = false;  // every edge through the network proxy
  int ranksPerHost = 0;  // ring positions per host, in order (TreesOfHosts); 0: one host
  bool listed = false;
};

std::string treeShapeName(const TreeShape& s) {
  return std::string(s.network ? "net_" : "") + (s.lowLatency ? "ll_" : "") +
         (s.backToBack ? "backtoback_" : "") + (s.listed ? "lists_" : "") +
         std::to_string(s.ranks) + "ranks_" +
         (s.ranksPerHost > 0 ? std::to_string(s.ranksPerHost) + "perhost_" : "") +
         std::to_string(s.threads) + "threads_" + std::to_string(s.slots) + "slots";
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
  // Back to back and listed, every case's buffers live at once: three types of every width class.
  auto kept = [&](const Case& c) {
    return !(s.backToBack || s.listed) || c.type == braidInt8 || c.type == braidBfloat16 ||
           c.type == braidFloat64;
  };
  // Lists: the device tree's calls, all-reduces (a rooted call's trees move with its root).
  auto listable = [&](const Case& c) { return !s.listed || c.collective == Collective::AllReduce; };
  for (const Case& c : casesFor(Shape{s.ranks, kTrees, s.threads, s.slots, Algorithm::Simple}))
    if ((c.collective == Collective::AllReduce || c.collective == Collective::Broadcast ||
         c.collective == Collective::Reduce) &&
        (s.ranks <= 8 || exactBeyond8(c)) && kept(c) && listable(c))
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
        buffers_(s.backToBack || s.listed ? cases_.size() : 1, std::vector<RankBuffers>(s.ranks)),
        gridBarrier_(s.ranks * blocksPerRank() * s.threads),
        blocks_(s.ranks * blocksPerRank(), s.threads) {
    for (auto& slots : slots_) slots.assign(kSlotBytes * s.slots + 64, 0);
    if (s.backToBack || s.listed)
      for (size_t i = 0; i < cases_.size(); ++i)
        for (int rank = 0; rank < s.ranks; ++rank)
          layoutRank(cases_[i], rank, s.ranks, buffers_[i][rank]);
    // Ring position p holds rank (3p + 1) mod n where that is a permutation, else p reversed.
    for (int p = 0; p < s.ranks; ++p) ringOrder_.push_back((s.ranks - 1 - p));
    if (s.ranks % 3 != 0)
      for (int p = 0; p < s.ranks; ++p) ringOrder_[p] = (3 * p + 1) % s.ranks;
    positionOf_.resize(s.ranks);
    for (int p = 0; p < s.ranks; ++p) positionOf_[ringOrder_[p]] = p;
    for (int p = 0; p < s.ranks; ++p)
      hostOfPosition_.push_back(s.ranksPerHost > 0 ? static_cast<uint64_t>(p / s.ranksPerHost) : 0);
#if BRAID_DEVICE_FORM_NET
    if (s.network) connectNetwork();
#endif
  }

  std::vector<std::string> run() {
    std::vector<std::thread> threads;
    for (int rank = 0; rank < shape_.ranks; ++rank)
      for (int block = 0; block < blocksPerRank(); ++block)
        for (int t = 0; t < shape_.threads; ++t)
          threads.emplace_back([this, rank, block, t] {
            if (shape_.backToBack) return backToBack(rank, t);
            if (shape_.listed) return lists(rank, block, t);
            lockstep(rank, block, t);
          });
    for (auto& t : threads) t.join();
    return failures_;
  }

 private:
  int blocksPerRank() const {
    return shape_.backToBack ? 1 : kTrees;
  }
  size_t fifoCount() const {
    return static_cast<size_t>(blocksPerRank() * shape_.ranks * shape_.ranks);
  }
  // A block's FIFOs: per tree in lockstep, one per pair (both trees in turn) back to back.
  size_t fifoIndex(int tree, int sender, int receiver) const {
    const int set = shape_.backToBack ? 0 : tree;
    return static_cast<size_t>((set * shape_.ranks + sender) * shape_.ranks + receiver);
  }
  uint8_t* slotsOf(size_t fifo) {
    return reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(slots_[fifo].data()) + 63) / 64 *
                                      64);
  }
#if BRAID_DEVICE_FORM_NET
  // Every pair's FIFO of every set a hop of its own (a rooted call's tree edges change with its
  // root).
  void connectNetwork() {
    hops_ =
        std::make_unique<NetHops>(shape_.ranks, fifoCount(),
                                  braid::FifoGeometry{kSlotBytes, shape_.slots}, shape_.lowLatency);
    for (int set = 0; set < blocksPerRank(); ++set)
      for (int sender = 0; sender < shape_.ranks; ++sender)
        for (int receiver = 0; receiver < shape_.ranks; ++receiver)
          if (sender != receiver)
            hops_->connect(fifoIndex(set, sender, receiver), sender, receiver);
    hops_->start();
  }
#endif

  // The ports between `rank` and `peer` on `tree`.
  template <class Ports>
  Ports portsTo(int tree, int rank, int peer) {
    const size_t in = fifoIndex(tree, peer, rank), out = fifoIndex(tree, rank, peer);
    const auto slots = static_cast<uint32_t>(shape_.slots);
    Ports ports{braid::FifoEnds{{&words_[in], slotsOf(in), kSlotBytes, slots},
                                {&words_[out], slotsOf(out), kSlotBytes, slots}}};
#if BRAID_DEVICE_FORM_NET
    if (shape_.network) {
      hops_->receiveThrough(in, ports.in);
      hops_->sendThrough(out, ports.out);
    }
#endif
    return ports;
  }
  template <class Ports>
  braid::TreePorts<Ports> treePorts(const braid::TreeNode& node, int tree, int rank) {
    braid::TreePorts<Ports> ports{};
    if (node.parent >= 0) ports.parent = portsTo<Ports>(tree, rank, ringOrder_[node.parent]);
    for (int k = 0; k < node.nChildren; ++k)
      ports.children[k] = portsTo<Ports>(tree, rank, ringOrder_[node.children[k]]);
    return ports;
  }

  // Every block meets the others before and after each case.
  void lockstep(int rank, int tree, int t) {
    const bool rankLeader = tree == 0 && t == 0;
    RankBuffers& b = buffers_[0][rank];
    for (size_t i = 0; i < cases_.size(); ++i) {
      const Case& c = cases_[i];
      if (rankLeader) layoutRank(c, rank, shape_.ranks, b);
      gridBarrier_.arrive_and_wait();
      const bool ok = runList(i, i + 1, rank, tree, t);
      gridBarrier_.arrive_and_wait();
      if (!ok && t == 0)
        fail(c,
             "rank " + std::to_string(rank) + " tree " + std::to_string(tree) + ": a wait gave up");
      if (rankLeader) check(c, rank, b);
      gridBarrier_.arrive_and_wait();
    }
  }

  void backToBack(int rank, int t) {
    for (size_t i = 0; i < cases_.size(); ++i)
      for (int tree = 0; tree < kTrees; ++tree)
        if (!runList(i, i + 1, rank, tree, t) && t == 0)
          fail(cases_[i], "rank " + std::to_string(rank) + " tree " + std::to_string(tree) +
                              ": a wait gave up");
    gridBarrier_.arrive_and_wait();
    if (t == 0)
      for (size_t i = 0; i < cases_.size(); ++i) check(cases_[i], rank, buffers_[i][rank]);
  }

  // Every list of a block's tree, one after another; once every block ran them all, each rank's
  // every call checked.
  void lists(int rank, int tree, int t) {
    for (size_t first = 0, end = 0; first < cases_.size(); first = end) {
      end = first + 1;
      auto sameKernel = [&](const Case& c) {
        return c.type == cases_[first].type && c.op == cases_[first].op && c.op != braidAvg;
      };
      while (end < cases_.size() && sameKernel(cases_[first]) && sameKernel(cases_[end])) ++end;
      if (!runList(first, end, rank, tree, t) && t == 0)
        fail(cases_[first], "rank " + std::to_string(rank) + " tree " + std::to_string(tree) +
                                ": a wait gave up in the list of " + std::to_string(end - first));
    }
    gridBarrier_.arrive_and_wait();
    if (tree == 0 && t == 0)
      for (size_t i = 0; i < cases_.size(); ++i) check(cases_[i], rank, buffers_[i][rank]);
  }

  void check(const Case& c, int rank, const RankBuffers& b) {
    const std::string wrong = checkRank(c, rank, shape_.ranks, b);
    if (!wrong.empty()) fail(c, wrong);
  }

  void fail(const Case& c, const std::string& what) {
    const std::lock_guard<std::mutex> lock(failuresMutex_);
    if (failures_.size() < 20)
      failures_.push_back(describe(c, Shape{shape_.ranks, kTrees, shape_.threads, shape_.slots,
                                            Algorithm::Simple}) +
                          " (tree " + treeShapeName(shape_) + "): " + what);
  }

  // Cases [first, end), of one datatype and operator, as one work list of this rank's block on
  // `tree` (one case: the list of one a call is): its scalar read where the block finds it, or
  // given by value, in turn.
  bool runList(size_t first, size_t end, int rank, int tree, int t) {
    const Case& c = cases_[first];
    const int n = shape_.ranks;
    const bool rooted = c.collective != Collective::AllReduce;
    const braid::TreesOfHosts trees(hostOfPosition_, rooted ? positionOf_[c.root] : -1);
    const braid::TreeNode node = trees.node(tree, positionOf_[rank]);
    const int block = rank * blocksPerRank() + (shape_.backToBack ? 0 : tree);
    CpuGroup group = blocks_.group(block, t, Clock::now() + kDeadline);
    const braid::TreePlace place{node.parent >= 0, node.nChildren, tree, kTrees};
    bool ok = true;
    withReduction(c.type, c.op, [&](auto reduction, auto prescaled) {
      using R = decltype(reduction);
      using T = typename R::Storage;
      constexpr bool kPrescaled = decltype(prescaled)::value;
      std::vector<T> scales;  // each call's: they differ from call to call
      for (size_t i = first; i < end; ++i) scales.push_back(premulScalarBits<T>(cases_[i], rank));
      std::vector<braid::TreeWork<T>> works;
      for (size_t i = first; i < end; ++i) {
        const RankBuffers& b = buffers_[shape_.backToBack || shape_.listed ? i : 0][rank];
        braid::TreeWork<T> work{cases_[i].collective, reinterpret_cast<const T*>(b.input),
                                reinterpret_cast<T*>(b.output), cases_[i].count,
                                c.op == braidAvg ? n : 1};
        if (i % 2 == 0)
          work.scale = &scales[i - first];
        else
          work.scaleValue = scales[i - first];
        works.push_back(work);
      }
      const int size = static_cast<int>(works.size());
      ok = shape_.lowLatency
               ? braid::runTreeWorksOnViews<R, kPrescaled>(
                     group, works.data(), size, place, treePorts<braid::LlPorts>(node, tree, rank))
               : braid::runTreeWorksOnViews<R, kPrescaled>(
                     group, works.data(), size, place,
                     treePorts<braid::FifoViewPorts>(node, tree, rank));
    });
    return ok;
  }

  TreeShape shape_;
  std::vector<Case> cases_;
  std::vector<braid::FifoWords> words_;
  std::vector<std::vector<uint8_t>> slots_;
  std::vector<std::vector<RankBuffers>> buffers_;  // per case back to back, else one, by rank
  std::vector<int> ringOrder_, positionOf_;
  std::vector<uint64_t> hostOfPosition_;
  std::barrier<> gridBarrier_;
  CpuBlocks blocks_;  // a block per (rank, tree), or per rank back to back
  std::mutex failuresMutex_;
  std::vector<std::string> failures_;
#if BRAID_DEVICE_FORM_NET
  std::unique_ptr<NetHops> hops_;  // by fifoIndex
#endif
};

class TreeForm : public testing::TestWithParam<TreeShape> {};

TEST_P(TreeForm, EveryCollectiveMatchesTheReference) {
  for (const std::string& f : TreeGrid(GetParam()).run()) ADD_FAILURE() << f;
}

std::vector<TreeShape> treeShapes() {
  std::vector<TreeShape> shapes;
#if defined(__SANITIZE_THREAD__)
  for (int ranks : {1, 2, 3, 6, 9}) shapes.push_back({ranks, 4, 2});
  shapes.push_back({5, 2, 1, true});
  for (int ranks : {2, 3, 6}) shapes.push_back({ranks, 4, 2, false, true});
  shapes.push_back({5, 2, 1, true, true});
  for (bool lowLatency : {false, true}) shapes.push_back({7, 2, 2, false, lowLatency, false, 3});
  for (bool lowLatency : {false, true})
    shapes.push_back({3, 4, 2, false, lowLatency, false, 0, true});
#else
  for (int ranks : {2, 3, 5, 8}) shapes.push_back({ranks, 2, 1, true});
  shapes.push_back({6, 4, 2, true});
  // Fewer threads per block from 9 ranks: two cores run every thread of the grid.
  for (int ranks = 1; ranks <= 16; ++ranks) shapes.push_back({ranks, ranks <= 8 ? 4 : 2, 2});
  shapes.push_back({5, 1, 1});
  shapes.push_back({7, 32, 4});
  // The low-latency protocol: every tree shape to 8 ranks, some beyond, a slot per FIFO.
  for (int ranks : {2, 3, 5, 8}) shapes.push_back({ranks, 2, 1, true, true});
  for (int ranks : {1, 2, 3, 4, 5, 6, 7, 8, 11, 16})
    shapes.push_back({ranks, ranks <= 8 ? 4 : 2, 2, false, true});
  shapes.push_back({5, 1, 1, false, true});
  shapes.push_back({7, 32, 4, false, true});
  // Trees of hosts with a chain inside each: even hosts, a short last one, a rank per host.
  for (bool lowLatency : {false, true}) {
    for (auto [ranks, perHost] : {std::pair{8, 2}, {12, 4}, {7, 3}, {16, 8}, {6, 1}})
      shapes.push_back({ranks, 2, 2, false, lowLatency, false, perHost});
    shapes.push_back({8, 2, 1, true, lowLatency, false, 3});
  }
  // Work lists: 1-8 ranks, one slot and two, 1 and 4 threads; trees of hosts.
  for (bool lowLatency : {false, true}) {
    for (int ranks : {1, 2, 3, 5, 8})
      shapes.push_back({ranks, 4, 2, false, lowLatency, false, 0, true});
    shapes.push_back({4, 1, 2, false, lowLatency, false, 0, true});
    shapes.push_back({6, 2, 2, false, lowLatency, false, 2, true});
  }
  shapes.push_back({5, 2, 1, false, false, false, 0, true});
#endif
#if BRAID_DEVICE_FORM_NET
  // Every edge through the network, in both protocols, as trees of hosts run.
  for (bool lowLatency : {false, true}) {
    for (int ranks : {2, 3, 5}) shapes.push_back({ranks, 2, 2, false, lowLatency, true});
    shapes.push_back({4, 2, 2, true, lowLatency, true});
    shapes.push_back({6, 2, 2, false, lowLatency, true, 2});
    shapes.push_back({4, 2, 2, false, lowLatency, true, 0, true});
  }
#endif
  return shapes;
}

INSTANTIATE_TEST_SUITE_P(Grid, TreeForm, testing::ValuesIn(treeShapes()),
                         [](const testing::TestParamInfo<TreeShape>& info) {
                           return treeShapeName(info.param);
                         });

}  // namespace
}  // namespace braid_test
