// All-reduce on the double binary tree for host ranks: the tree engine (coll/tree_engine.h) over
// the connectors, each tree (base/binary_trees.h, laid over the ring order) taking half the
// elements, one after the other. Its steps grow with log2 of the ranks, as recursive doubling's
// (coll/host_recursive.h), but each moves a FIFO slot and waits for it to come back down: the
// model (plan/model.cc) prices it, and BRAID_ALGO=tree forces it. See docs/engine.md.
#pragma once

#include "coll/call_tag.h"
#include "coll/host_executor.h"

namespace braid {

void runTreeAllReduce(CollContext& ctx, const CollArgs& a, const CallTag& tag);

}  // namespace braid
