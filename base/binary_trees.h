// The two binary trees a tree collective runs on, by ring position (the planner's order, so a
// host's ranks sit together): each rank is interior in at most one of them, so with half the data
// on each tree no rank forwards more than its share (NCCL's double binary tree; this formulation
// is braid's own). Positions are labelled 1..n; in the first tree, label l whose lowest set bit is
// b has children l - b/2 and l + b/2 and its parent one level up (l + b where bit 2b of l is
// clear, l - b where it is set), the top being the largest power of two <= n. A child beyond n is
// replaced by its nearest descendant within n, and a label whose parent lies beyond n hangs from
// the first ancestor within n; so every odd label is a leaf and every even one interior, and the
// depth is floor(log2 n). The second tree relabels the first: mirrored (l -> n + 1 - l) where n is
// even, shifted by one (l -> l % n + 1) where n is odd, either way swapping odd and even labels
// (but for one leaf of both where n is odd). A root may be named: each tree's labels are then
// rotated so that it is at the top. The executors (coll/) run the trees and the cost model
// (plan/) prices them: one rule for both, here, since neither layer may include the other.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace braid {

// One position's neighbours in a tree, as positions (-1: none). Children in ascending label order.
// A neighbour's end is where it meets this one: 0 the parent, 1 + c child c. Each neighbour of a
// rank writes to a FIFO of its own there (transport/p2p.h).
struct TreeNode {
  static constexpr int kEnds = 3;
  int parent = -1;
  int children[2] = {-1, -1};
  int nChildren = 0;

  // The neighbour at `end`; -1 where none.
  int at(int end) const { return end == 0 ? parent : children[end - 1]; }
  // The end `neighbour` is at; -1 where it is no neighbour.
  int endOf(int neighbour) const {
    for (int end = 0; end < kEnds && neighbour >= 0; ++end)
      if (at(end) == neighbour) return end;
    return -1;
  }
};

// The tree channels of a CUDA communicator of `channels` channels (transport/p2p.h), as the cost
// model prices them too: one where it has one, else an even number (half on each tree), at most
// kMaxTreeChannels: trees serve small and mid-size calls, where more blocks buy little.
constexpr int kMaxTreeChannels = 8;
constexpr int treeChannelsOf(int channels) {
  return channels <= 1
             ? 1
             : (channels / 2 * 2 < kMaxTreeChannels ? channels / 2 * 2 : kMaxTreeChannels);
}

class BinaryTrees {
 public:
  // Trees over n >= 1 positions, each rank interior in at most one (an all-reduce's).
  explicit BinaryTrees(int n) : n_(n) {
    while (top_ * 2 <= n_) top_ *= 2;
  }
  // Trees with position `root` at the top of both (a broadcast's, a reduce's); a rank may then
  // be interior in both.
  BinaryTrees(int n, int root) : BinaryTrees(n) {
    for (int t = 0; t < 2; ++t) offset_[t] = mod(root - unlabel(t, top_));
  }
  int positions() const { return n_; }
  // Edges from the top to the deepest leaf.
  int depth() const {
    int d = 0;
    for (int b = top_; b > 1; b /= 2) ++d;
    return d;
  }
  TreeNode node(int tree, int position) const {
    TreeNode node;
    const int l = label(tree, position);
    if (l != top_) node.parent = positionOf(tree, parentLabel(l));
    const int half = lowBit(l) / 2;
    if (half == 0) return node;  // odd: a leaf
    node.children[node.nChildren++] = positionOf(tree, l - half);
    int right = l + half;  // beyond n: its left descendants, nearest first
    for (int step = half / 2; right > n_ && step > 0; step /= 2) right -= step;
    if (right <= n_) node.children[node.nChildren++] = positionOf(tree, right);
    return node;
  }
  // Which of `position`'s neighbours on `tree` `neighbour` is (TreeNode::endOf).
  int neighbourEnd(int tree, int position, int neighbour) const {
    return node(tree, position).endOf(neighbour);
  }

 private:
  static int lowBit(int l) { return l & -l; }
  int mod(int p) const { return ((p % n_) + n_) % n_; }
  // The first tree's parent of label l (l != top), over labels within n.
  int parentLabel(int l) const {
    do {
      const int b = lowBit(l);
      l = (l & (2 * b)) != 0 ? l - b : l + b;
    } while (l > n_);
    return l;
  }
  // Labels of tree `t` from offsets (position - offset, mod n) and back.
  int relabel(int t, int l) const {
    if (t == 0) return l;
    return n_ % 2 == 0 ? n_ + 1 - l : l % n_ + 1;
  }
  int unrelabel(int t, int l) const {
    if (t == 0) return l;
    return n_ % 2 == 0 ? n_ + 1 - l : (l == 1 ? n_ : l - 1);
  }
  int label(int t, int position) const {
    return relabel(t, mod(position - offset_[t] + top_ - 1) + 1);
  }
  int unlabel(int t, int l) const { return mod(unrelabel(t, l) - top_); }
  int positionOf(int t, int l) const { return mod(unlabel(t, l) + offset_[t]); }

  int n_;
  int top_ = 1;             // the top label
  int offset_[2] = {0, 0};  // per tree: the position labelled as offset 0
};

// NCCL's shape across hosts: the double binary trees (BinaryTrees) over the hosts, a chain through
// the ranks inside each. Positions (the ring order) are grouped by `hostOf` into runs of one host
// (the planner lays a host's ranks together; a host met in two runs makes two groups). A group's
// first position, its head, meets the parent group (at the position that parent lends it) and
// the first child group; the second position meets the second child group; the chain runs through
// the rest, head first. So no rank has more than two children, a host's NIC carries at most three
// edges of each tree (per group: a host met twice meets up to six), and a path from the top crosses
// hosts once per level of the hosts' tree; the ranks of a chain are interior in both trees, as
// NCCL's are. With one group the ranks of the host take BinaryTrees themselves (a chain of n ranks
// would be n - 1 deep), and a group of one rank is BinaryTrees' node of its host, so one rank per
// host is BinaryTrees over the ranks. A named root is the top of both trees: its group at the top
// of the hosts' trees, its chain starting at it.
class TreesOfHosts {
 public:
  explicit TreesOfHosts(std::span<const uint64_t> hostOf, int root = -1) {
    const int n = static_cast<int>(hostOf.size());
    std::vector<std::vector<int>> groups;
    std::vector<int> groupOf(hostOf.size());
    for (int p = 0; p < n; ++p) {
      if (p == 0 || hostOf[p] != hostOf[p - 1]) groups.emplace_back();
      groups.back().push_back(p);
      groupOf[p] = static_cast<int>(groups.size()) - 1;
    }
    const int nGroups = static_cast<int>(groups.size());
    if (root >= 0) {  // the root's chain starts at it (its order otherwise kept, round the group)
      std::vector<int>& chain = groups[groupOf[root]];
      while (chain.front() != root) {
        chain.push_back(chain.front());
        chain.erase(chain.begin());
      }
    }
    for (int t = 0; t < 2; ++t) nodes_[t].assign(hostOf.size(), TreeNode{});
    if (nGroups == 1) {
      const BinaryTrees trees = root >= 0 ? BinaryTrees(n, root) : BinaryTrees(n);
      for (int t = 0; t < 2; ++t)
        for (int p = 0; p < n; ++p) nodes_[t][p] = trees.node(t, p);
    } else {
      const BinaryTrees hosts =
          root >= 0 ? BinaryTrees(nGroups, groupOf[root]) : BinaryTrees(nGroups);
      for (int t = 0; t < 2; ++t)
        for (int g = 0; g < nGroups; ++g) joinGroup(t, groups, g, hosts.node(t, g));
    }
    for (int t = 0; t < 2; ++t)
      for (int p = 0; p < n; ++p) {
        int d = 0;
        for (int q = p; nodes_[t][q].parent >= 0; q = nodes_[t][q].parent) ++d;
        if (d > depth_) depth_ = d;
      }
  }
  int positions() const { return static_cast<int>(nodes_[0].size()); }
  // Edges from the top to the deepest leaf, of the deeper tree.
  int depth() const { return depth_; }
  TreeNode node(int tree, int position) const { return nodes_[tree][position]; }
  // Which of `position`'s neighbours on `tree` `neighbour` is (TreeNode::endOf).
  int neighbourEnd(int tree, int position, int neighbour) const {
    return node(tree, position).endOf(neighbour);
  }

 private:
  // Group g's chain on tree t, and its links to the child groups of `host` (its hosts' tree node).
  void joinGroup(int t, const std::vector<std::vector<int>>& groups, int g, const TreeNode& host) {
    const std::vector<int>& chain = groups[g];
    const int k = static_cast<int>(chain.size());
    auto link = [&](int parent, int child) {
      TreeNode& up = nodes_[t][parent];
      up.children[up.nChildren++] = child;
      nodes_[t][child].parent = parent;
    };
    for (int c = 0; c < host.nChildren; ++c)  // the second child group meets the second rank
      link(chain[c == 1 && k > 1 ? 1 : 0], groups[host.children[c]].front());
    for (int i = 1; i < k; ++i) link(chain[i - 1], chain[i]);
  }

  std::vector<TreeNode> nodes_[2];
  int depth_ = 0;
};

}  // namespace braid
