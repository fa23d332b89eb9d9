// All-reduce in log2(n) exchanges between partners, for host ranks: where a ring's 2(n-1) steps
// cost more than its bandwidth saves (many hosts, small and mid-size messages). See
// docs/engine.md ("Log-step all-reduces").
//  - Doubling (recursive doubling): each exchange sends the whole vector to the partner and
//    reduces what comes back; log2(n) steps, n-1 vectors' worth of work per rank.
//  - Halving (Rabenseifner): recursive halving reduce-scatter, then recursive doubling
//    all-gather; 2 log2(n) steps moving 2(n-1)/n of the vector, as much as a ring.
//  - Between them: the first k partners halve, the rest double on the part held, and the halving
//    partners gather back: log2(n) + k steps; each halving level costs a step and halves the
//    bytes of the doubling after it. The model chooses k per size (plan::Model::halvingLevels).
// Partners are chosen by ring position, nearest first (base/recursive_pairing.h): where a host's
// ranks sit together in the ring (the planner's order) and number a power of two, the largest
// exchanges stay inside a host and the network carries each host's share once. A rank count that is
// not a power of two first folds its surplus ranks into their neighbours and hands them the result
// at the end. Every element is reduced in the same order on every rank (lower positions first), so
// every rank holds the same bits.
#pragma once

#include "coll/call_tag.h"
#include "coll/host_executor.h"

namespace braid {

// `halvingLevels` partners halve (0: recursive doubling; log2(n) or more: Rabenseifner's). A call
// with fewer elements than participating ranks doubles throughout.
void runRecursiveAllReduce(CollContext& ctx, const CollArgs& a, const CallTag& tag,
                           int halvingLevels);
// Hierarchical: the ranks of each host hand their inputs to its leader (its first rank in ring
// order) over the host's own transport and get the result back from it; only the leaders cross
// the network, in the recursive exchanges among themselves (`halvingLevels` as above, the surplus
// folded as above). Where cores are few, the host's other ranks sleep while the leaders exchange.
void runHierarchicalAllReduce(CollContext& ctx, const CollArgs& a, const CallTag& tag,
                              int halvingLevels);

}  // namespace braid
