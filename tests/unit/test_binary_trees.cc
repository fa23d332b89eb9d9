// The double binary tree's shape (base/binary_trees.h), checked against what a tree collective
// needs of it, for every size up to 70 and every root: each tree spans every position with one
// top, parents and children agree, no path is longer than floor(log2 n) edges; without a root, no
// position is interior in both trees (one leaf of both where n is odd); with one, it is the top.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "base/binary_trees.h"

namespace {

using braid::BinaryTrees;
using braid::TreeNode;

int floorLog2(int n) {
  int d = 0;
  while ((2 << d) <= n) ++d;
  return d;
}

// Every failure of one tree, as sentences.
std::vector<std::string> treeFaults(const BinaryTrees& trees, int tree) {
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
    if (depth > floorLog2(n)) fault(p, "depth " + std::to_string(depth));
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
      for (const std::string& f : treeFaults(trees, tree)) ADD_FAILURE() << f;
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
        for (const std::string& f : treeFaults(trees, tree)) ADD_FAILURE() << f;
      }
    }
}

// Each rank's neighbours write to FIFOs of their own, found by neighbourEnd on both sides: a
// parent and its children name each other's ends alike, and no two neighbours share one.
TEST(BinaryTrees, NeighbourEndsAreDistinctAndAgreeOnBothSides) {
  for (int n = 1; n <= 70; ++n) {
    const BinaryTrees trees(n);
    for (int tree = 0; tree < 2; ++tree)
      for (int p = 0; p < n; ++p) {
        const braid::TreeNode node = trees.node(tree, p);
        std::vector<int> neighbours(node.children, node.children + node.nChildren);
        if (node.parent >= 0) neighbours.push_back(node.parent);
        std::vector<bool> taken(braid::TreeNode::kEnds, false);
        for (int q : neighbours) {
          const int end = trees.neighbourEnd(tree, p, q);
          ASSERT_GE(end, 0) << "n " << n << " tree " << tree << " position " << p << " from " << q;
          EXPECT_FALSE(taken[end]) << "n " << n << " position " << p << " end " << end;
          taken[end] = true;
          // The neighbour's view: p is its parent where q is p's child, and the other way round.
          const int back = trees.neighbourEnd(tree, q, p);
          EXPECT_EQ(back == 0, q != node.parent) << "n " << n << " " << p << " <-> " << q;
          EXPECT_GE(back, 0);
        }
        EXPECT_EQ(trees.neighbourEnd(tree, p, p), -1);
      }
  }
}

// A CUDA communicator's tree channels (transport/p2p.h and the cost model alike): one for one
// channel, else an even number (each tree half of them), at most 8.
TEST(BinaryTrees, TreeChannelsAreOneOrEvenAndBounded) {
  const int channels[] = {1, 2, 3, 4, 7, 8, 9, 16, 32};
  const int trees[] = {1, 2, 2, 4, 6, 8, 8, 8, 8};
  for (size_t i = 0; i < std::size(channels); ++i)
    EXPECT_EQ(braid::treeChannelsOf(channels[i]), trees[i]) << channels[i] << " channels";
}

}  // namespace
