// The double binary tree's shape (base/binary_trees.h), checked against what a tree collective
// needs of it, for every size up to 70 and every root: each tree spans every position with one
// top, parents and children agree, no path is longer than floor(log2 n) edges; without a root, no
// position is interior in both trees (one leaf of both where n is odd); with one, it is the top.
// The trees of hosts (TreesOfHosts) likewise for 1-20 hosts of 1-9 ranks, even and not: a path
// crosses hosts at most once per level of the hosts' trees, no host meets more than three edges
// of a tree from other hosts, and one host, or one rank per host, gives the binary trees.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "base/binary_trees.h"

namespace {

using braid::BinaryTrees;
using braid::TreeNode;
using braid::TreesOfHosts;

int floorLog2(int n) {
  int d = 0;
  while ((2 << d) <= n) ++d;
  return d;
}

// Every failure of one tree, as sentences; no path may be longer than maxDepth edges.
template <class Trees>
std::vector<std::string> treeFaults(const Trees& trees, int tree, int maxDepth) {
  const int n = trees.positions();
  std::vector<std::string> faults;
  auto fault = [&](int p, const std::string& what) {
    faults.push_back("n " + std::to_string(n) + " tree " + std::to_string(tree) + " position " +
                     std::to_string(p) + ": " + what);
  };
  int tops = 0, children = 0;
  for (int p = 0; p < n; ++p) {
    const TreeNode node = trees.node(tree, p);
    if (node.parent < 0) ++tops;
    children += node.nChildren;
    if (node.nChildren == 2 && node.children[0] == node.children[1]) fault(p, "one child twice");
    if (node.parent >= n || node.nChildren < 0 || node.nChildren > 2) fault(p, "out of range");
    if (node.parent >= 0) {
      const TreeNode up = trees.node(tree, node.parent);
      const std::set<int> siblings(up.children, up.children + up.nChildren);
      if (siblings.count(p) == 0) fault(p, "its parent does not name it as a child");
    }
    for (int c = 0; c < node.nChildren; ++c)
      if (node.children[c] < 0 || node.children[c] >= n ||
          trees.node(tree, node.children[c]).parent != p)
        fault(p, "a child does not name it as its parent");
    int depth = 0;  // walking up must reach the top within the bound
    for (int q = p; trees.node(tree, q).parent >= 0 && depth <= n; q = trees.node(tree, q).parent)
      ++depth;
    if (depth > maxDepth) fault(p, "depth " + std::to_string(depth));
  }
  if (tops != 1) fault(-1, std::to_string(tops) + " tops");
  if (children != n - 1) fault(-1, std::to_string(children) + " children in all");
  return faults;
}

TEST(BinaryTrees, EachTreeSpansEveryPositionWithinLogDepth) {
  for (int n = 1; n <= 70; ++n) {
    const BinaryTrees trees(n);
    EXPECT_EQ(trees.depth(), floorLog2(n));
    for (int tree = 0; tree < 2; ++tree)
      for (const std::string& f : treeFaults(trees, tree, floorLog2(n))) ADD_FAILURE() << f;
  }
}

TEST(BinaryTrees, NoPositionForwardsOnBothTrees) {
  for (int n = 2; n <= 70; ++n) {
    const BinaryTrees trees(n);
    int leafOfBoth = 0;
    for (int p = 0; p < n; ++p) {
      const bool interior0 = trees.node(0, p).nChildren > 0;
      const bool interior1 = trees.node(1, p).nChildren > 0;
      EXPECT_FALSE(interior0 && interior1) << "n " << n << " position " << p;
      if (!interior0 && !interior1) ++leafOfBoth;
    }
    EXPECT_EQ(leafOfBoth, n % 2 == 1 && n > 1 ? 1 : 0) << "n " << n;
  }
}

TEST(BinaryTrees, ANamedRootIsTheTopOfBothTrees) {
  for (int n = 1; n <= 70; ++n)
    for (int root = 0; root < n; ++root) {
      const BinaryTrees trees(n, root);
      for (int tree = 0; tree < 2; ++tree) {
        EXPECT_EQ(trees.node(tree, root).parent, -1) << "n " << n << " root " << root;
        for (const std::string& f : treeFaults(trees, tree, floorLog2(n))) ADD_FAILURE() << f;
      }
    }
}

// Each rank's neighbours write to FIFOs of their own, found by neighbourEnd on both sides: a
// parent and its children name each other's ends alike, and no two neighbours share one.
template <class Trees>
void expectNeighbourEndsAgree(const Trees& trees, const std::string& what) {
  const int n = trees.positions();
  for (int tree = 0; tree < 2; ++tree)
    for (int p = 0; p < n; ++p) {
      const braid::TreeNode node = trees.node(tree, p);
      std::vector<int> neighbours(node.children, node.children + node.nChildren);
      if (node.parent >= 0) neighbours.push_back(node.parent);
      std::vector<bool> taken(braid::TreeNode::kEnds, false);
      for (int q : neighbours) {
        const int end = trees.neighbourEnd(tree, p, q);
        ASSERT_GE(end, 0) << what << " tree " << tree << " position " << p << " from " << q;
        EXPECT_FALSE(taken[end]) << what << " position " << p << " end " << end;
        taken[end] = true;
        // The neighbour's view: p is its parent where q is p's child, and the other way round.
        const int back = trees.neighbourEnd(tree, q, p);
        EXPECT_EQ(back == 0, q != node.parent) << what << " " << p << " <-> " << q;
        EXPECT_GE(back, 0);
      }
      EXPECT_EQ(trees.neighbourEnd(tree, p, p), -1);
    }
}

TEST(BinaryTrees, NeighbourEndsAreDistinctAndAgreeOnBothSides) {
  for (int n = 1; n <= 70; ++n) expectNeighbourEndsAgree(BinaryTrees(n), "n " + std::to_string(n));
}

// A CUDA communicator's tree channels (transport/p2p.h and the cost model alike): one for one
// channel, else an even number (each tree half of them), at most 8.
TEST(BinaryTrees, TreeChannelsAreOneOrEvenAndBounded) {
  const int channels[] = {1, 2, 3, 4, 7, 8, 9, 16, 32};
  const int trees[] = {1, 2, 2, 4, 6, 8, 8, 8, 8};
  for (size_t i = 0; i < std::size(channels); ++i)
    EXPECT_EQ(braid::treeChannelsOf(channels[i]), trees[i]) << channels[i] << " channels";
}

// Positions 0..n-1 on hosts of `perHost` ranks, the last host short by `short_` (at least one).
std::vector<uint64_t> hostsOf(int hosts, int perHost, int short_ = 0) {
  std::vector<uint64_t> hostOf;
  for (int h = 0; h < hosts; ++h)
    for (int r = 0; r < (h == hosts - 1 ? perHost - short_ : perHost); ++r) hostOf.push_back(h);
  return hostOf;
}

template <class F>
void forEachHostShape(F&& f) {
  for (int hosts = 1; hosts <= 20; ++hosts)
    for (int perHost = 1; perHost <= 9; ++perHost)
      for (int short_ : {0, perHost / 2}) {
        const std::vector<uint64_t> hostOf = hostsOf(hosts, perHost, short_);
        f(hostOf, hosts, perHost,
          std::to_string(hosts) + " hosts x " + std::to_string(perHost) + " short " +
              std::to_string(short_));
      }
}

// A path climbs a host's chain to its head, or to its second rank and over to the head, per level
// of the hosts' trees, and down the last host's chain: 2 floor(log2 hosts) + perHost - 1 edges.
TEST(TreesOfHosts, EachTreeSpansEveryPositionWithAChainInsideEachHost) {
  forEachHostShape(
      [](const std::vector<uint64_t>& hostOf, int hosts, int perHost, const std::string& what) {
        const TreesOfHosts trees(hostOf);
        const int bound = hosts == 1 ? floorLog2(perHost) : 2 * floorLog2(hosts) + perHost - 1;
        EXPECT_LE(trees.depth(), bound) << what;
        for (int tree = 0; tree < 2; ++tree)
          for (const std::string& f : treeFaults(trees, tree, trees.depth()))
            ADD_FAILURE() << what << ": " << f;
        expectNeighbourEndsAgree(trees, what);
      });
}

TEST(TreesOfHosts, PathsCrossHostsOncePerLevelAndAHostMeetsAtMostThreeEdges) {
  forEachHostShape(
      [](const std::vector<uint64_t>& hostOf, int hosts, int, const std::string& what) {
        const TreesOfHosts trees(hostOf);
        const int n = trees.positions();
        for (int tree = 0; tree < 2; ++tree) {
          std::vector<int> edgesOut(hosts, 0);
          for (int p = 0; p < n; ++p) {
            int crossings = 0;
            for (int q = p; trees.node(tree, q).parent >= 0; q = trees.node(tree, q).parent)
              crossings += hostOf[q] != hostOf[trees.node(tree, q).parent] ? 1 : 0;
            EXPECT_LE(crossings, floorLog2(hosts)) << what << " tree " << tree << " position " << p;
            const int parent = trees.node(tree, p).parent;
            if (parent >= 0 && hostOf[parent] != hostOf[p]) {
              ++edgesOut[hostOf[p]];
              ++edgesOut[hostOf[parent]];
            }
          }
          for (int h = 0; h < hosts; ++h) EXPECT_LE(edgesOut[h], 3) << what << " host " << h;
        }
      });
}

// One host, or a rank per host: the binary trees over the ranks, node for node, rooted or not.
TEST(TreesOfHosts, OneHostOrOneRankPerHostIsTheBinaryTrees) {
  auto expectSame = [](const TreesOfHosts& ours, const BinaryTrees& binary,
                       const std::string& what) {
    for (int tree = 0; tree < 2; ++tree)
      for (int p = 0; p < binary.positions(); ++p) {
        const TreeNode a = ours.node(tree, p), b = binary.node(tree, p);
        EXPECT_EQ(a.parent, b.parent) << what << " tree " << tree << " position " << p;
        ASSERT_EQ(a.nChildren, b.nChildren) << what << " tree " << tree << " position " << p;
        for (int c = 0; c < a.nChildren; ++c) EXPECT_EQ(a.children[c], b.children[c]) << what;
      }
  };
  for (int n = 1; n <= 40; ++n) {
    const std::string what = "n " + std::to_string(n);
    expectSame(TreesOfHosts(hostsOf(1, n)), BinaryTrees(n), what + " on one host");
    expectSame(TreesOfHosts(hostsOf(n, 1)), BinaryTrees(n), what + " one per host");
    for (int root = 0; root < n; root += 3) {
      expectSame(TreesOfHosts(hostsOf(1, n), root), BinaryTrees(n, root), what + " rooted");
      expectSame(TreesOfHosts(hostsOf(n, 1), root), BinaryTrees(n, root), what + " rooted");
    }
  }
}

// A broadcast's or reduce's root: the top of both trees, its chain starting at it.
TEST(TreesOfHosts, ANamedRootIsTheTopOfBothTrees) {
  forEachHostShape([](const std::vector<uint64_t>& hostOf, int, int, const std::string& what) {
    const int n = static_cast<int>(hostOf.size());
    for (int root = 0; root < n; ++root) {
      const TreesOfHosts trees(hostOf, root);
      for (int tree = 0; tree < 2; ++tree) {
        EXPECT_EQ(trees.node(tree, root).parent, -1) << what << " root " << root;
        for (const std::string& f : treeFaults(trees, tree, trees.depth()))
          ADD_FAILURE() << what << " root " << root << ": " << f;
      }
    }
  });
}

// A ring order that starts inside a host meets it twice: two groups, still one tree each.
TEST(TreesOfHosts, AHostMetTwiceInTheRingOrderMakesTwoGroups) {
  const std::vector<uint64_t> hostOf = {0, 0, 1, 1, 1, 2, 2, 2, 0};
  const TreesOfHosts trees(hostOf);
  for (int tree = 0; tree < 2; ++tree)
    for (const std::string& f : treeFaults(trees, tree, trees.depth())) ADD_FAILURE() << f;
  // Four groups ({0, 1}, {2, 3, 4}, {5, 6, 7}, {8}): the hosts' trees of four are 2 deep.
  EXPECT_LE(trees.depth(), 2 * 2 + 2);
}

}  // namespace
