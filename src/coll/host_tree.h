// All-reduce, broadcast and reduce on the double binary trees for host ranks: the tree engine
// (coll/tree_engine.h) over the connectors, each tree (base/binary_trees.h: trees of the hosts, a
// chain inside each, laid over the ring order; a broadcast's or reduce's root at the top of both)
// taking half the elements, one after
// the other. Its steps grow with log2 of the ranks, as recursive doubling's
// (coll/host_recursive.h): an all-reduce's slots follow each other up the levels, then its
// results down; a broadcast's or reduce's slots follow each other down or up. The model
// (plan/model.cc) prices it, and BRAID_ALGO=tree forces it. See docs/engine.md.
#pragma once

#include "coll/call_tag.h"
#include "coll/host_executor.h"

namespace braid {

// a.coll: AllReduce, Broadcast or Reduce (whose ranks have agreed on the root: the executor's pass
// of tags round the ring). A broadcast or reduce that fits in a FIFO slot runs on one tree: the
// second would only add its depth.
void runTreeCollective(CollContext& ctx, const CollArgs& a, const CallTag& tag);

}  // namespace braid
