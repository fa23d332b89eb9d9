// All-gather and reduce-scatter in ceil(log2 n) steps for host ranks, any n (Bruck et al., 1997):
// where a ring's n - 1 steps cost more than its bandwidth saves (small calls across many hosts).
// See docs/engine.md ("Log-step all-gather and reduce-scatter").
//  - All-gather: at step k (distance d = 2^k in ring order) each rank sends the blocks it holds,
//    min(d, n - d) of them from its own on, to the rank d before it, and receives as many from
//    the rank d after it, straight into their places in the output.
//  - Reduce-scatter: the all-gather's steps reversed in time and direction (largest distance
//    first, to the rank d after): each rank sends its partial sums of the blocks the receiver's
//    all-gather would have got from it, and adds those it receives into its own, so every block's
//    contributions meet at its owner. Partial sums of other ranks' blocks wait in the call's
//    scratch (CollContext::scratch, at least the input's size).
// Both move n - 1 blocks per rank, as the ring does, in log2 n handoffs instead of n - 1.
#pragma once

#include "coll/call_tag.h"
#include "coll/host_executor.h"

namespace braid {

void runBruckAllGather(CollContext& ctx, const CollArgs& a, const CallTag& tag);
void runBruckReduceScatter(CollContext& ctx, const CollArgs& a, const CallTag& tag);

}  // namespace braid
