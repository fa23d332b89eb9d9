#include "coll/host_recursive.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <span>
#include <vector>

#include "base/recursive_pairing.h"
#include "coll/host_exchange.h"
#include "kernels/host_reduce.h"

namespace braid {
namespace {

// Who takes part in the exchanges (the ranks in pairing order: every rank in ring order, or in the
// hierarchical all-reduce the leader of each host), this rank's place among them, and the ranks
// the pairing (base/recursive_pairing.h) names.
struct Team {
  std::span<const int> members;
  int position;
  RecursivePairing pairing;

  Team(std::span<const int> ranks, int rank)
      : members(ranks),
        position(
            static_cast<int>(std::find(members.begin(), members.end(), rank) - members.begin())),
        pairing(static_cast<int>(members.size())) {}
  int participants() const { return pairing.participants; }
  bool folded() const { return pairing.folded(position); }
  bool keepsFolded() const { return pairing.keepsFolded(position); }
  int index() const { return pairing.indexOf(position); }
  int rankOfIndex(int index) const { return members[pairing.positionOf(index)]; }
  int foldPartner() const { return members[pairing.foldPartner(position)]; }
};

Team everyRank(const CollContext& ctx) {
  return Team(ctx.ringOrder, ctx.rank);
}

// One call's buffers and reduction, for the steps below.
struct Reduction {
  const CollArgs& args;
  size_t elemBytes;
  kernels::ReduceFn reduce;
  int divisor;  // braidAvg's, applied by the step that completes an element
  const uint8_t* input;
  uint8_t* output;

  Reduction(const CollArgs& a, int nranks)
      : args(a),
        elemBytes(kernels::typeSize(a.type)),
        reduce(kernels::reduceFn(a.type, a.op)),
        divisor(a.op == braidAvg ? nranks : 1),
        input(static_cast<const uint8_t*>(a.sendbuff)),
        output(static_cast<uint8_t*>(a.recvbuff)) {}
  size_t bytes() const { return args.count * elemBytes; }

  // output[at..] = lower OP upper over `bytes`, where this rank's values come from `mine` and
  // the partner's from `theirs`; the partner with the lower position goes first on both sides.
  void combine(size_t at, const uint8_t* mine, const uint8_t* theirs, size_t bytes, bool mineLower,
               bool last) const {
    reduce(output + at, nullptr, mineLower ? mine : theirs, mineLower ? theirs : mine,
           bytes / elemBytes, last ? divisor : 1);
  }
};

// The whole part of a rank outside the exchanges: its values to `keeper`, the result back.
void handOver(CollContext& ctx, const CallTag& tag, int keeper, const Reduction& r) {
  exchange(ctx, tag, keeper, r.input, r.bytes(), 0, r.elemBytes, kTakeNothing);
  exchange(ctx, tag, keeper, nullptr, 0, r.bytes(), r.elemBytes,
           [&](const uint8_t* slot, size_t at, size_t bytes) {
             std::memcpy(r.output + at, slot, bytes);
           });
}

// A folded rank's whole part. True if this rank is one.
bool runFolded(CollContext& ctx, const CallTag& tag, const Team& team, const Reduction& r) {
  if (!team.folded()) return false;
  handOver(ctx, tag, team.foldPartner(), r);
  return true;
}

// A keeper's first step: output = its input OP its folded neighbour's. Returns where this rank's
// values now are.
const uint8_t* foldIn(CollContext& ctx, const CallTag& tag, const Team& team, const Reduction& r) {
  if (!team.keepsFolded()) return r.input;
  exchange(ctx, tag, team.foldPartner(), nullptr, 0, r.bytes(), r.elemBytes,
           [&](const uint8_t* slot, size_t at, size_t bytes) {
             r.combine(at, r.input + at, slot, bytes, true, false);
           });
  return r.output;
}

void handBackFolded(CollContext& ctx, const CallTag& tag, const Team& team, const Reduction& r) {
  if (!team.keepsFolded()) return;
  exchange(ctx, tag, team.foldPartner(), r.output, r.bytes(), 0, r.elemBytes, kTakeNothing);
}

// Blocks [lo, hi) of the participants' partition of the elements.
struct Blocks {
  int lo, hi;
  int mid() const { return lo + (hi - lo) / 2; }
};

// Where one call's recursive exchanges stand: the blocks this rank holds (complete, after the
// doubling exchanges), and per halving exchange, what it held before it and the partner link's
// slots posted once it had sent.
struct Held {
  Blocks blocks;
  std::vector<Blocks> before;
  std::vector<uint32_t> sentBy;
};

// The team's partition of the call's elements into blocks, one per participant.
struct Partition {
  size_t count, parts, elemBytes;
  size_t offset(int block) const { return count * static_cast<size_t>(block) / parts * elemBytes; }
  size_t length(Blocks b) const { return offset(b.hi) - offset(b.lo); }
};

// Recursive halving's reduce-scatter for the first `levels` partners: each exchange keeps half of
// the blocks this rank holds, reducing the partner's values for them into the output, and sends
// the partner the other half from where it lies (SendFrom::Place: a later exchange writes where
// it lies only in the all-gather exchange with the same partner, which first waits until it has
// gone). Returns where this rank's values now are.
const uint8_t* halve(CollContext& ctx, const CallTag& tag, const Team& team, const Reduction& r,
                     const Partition& p, const uint8_t* mine, int levels, Held& held) {
  const int index = team.index();
  for (int mask = 1; mask < (1 << levels); mask *= 2) {
    const Blocks whole = held.blocks;
    const bool lower = (index & mask) == 0;
    const Blocks keep = lower ? Blocks{whole.lo, whole.mid()} : Blocks{whole.mid(), whole.hi};
    const Blocks give = lower ? Blocks{whole.mid(), whole.hi} : Blocks{whole.lo, whole.mid()};
    const bool last = mask * 2 == team.participants();
    const int peer = team.rankOfIndex(index ^ mask);
    exchange(
        ctx, tag, peer, mine + p.offset(give.lo), p.length(give), p.length(keep), r.elemBytes,
        [&](const uint8_t* slot, size_t at, size_t bytes) {
          const size_t to = p.offset(keep.lo) + at;
          r.combine(to, mine + to, slot, bytes, lower, last);
        },
        SendFrom::Place);
    held.sentBy.push_back(ctx.sendTo[peer]->posted());
    held.before.push_back(whole);
    held.blocks = keep;
    mine = r.output;
  }
  return mine;
}

// Recursive doubling on the blocks held, with the partners beyond the first `levels`: each
// exchange sends them whole and reduces what comes back, so both partners end with the same bits.
// The sends go through slots: the reduction overwrites where they came from.
void doubleUp(CollContext& ctx, const CallTag& tag, const Team& team, const Reduction& r,
              const Partition& p, const uint8_t* mine, int levels, const Held& held) {
  const int index = team.index();
  const size_t base = p.offset(held.blocks.lo);
  for (int mask = 1 << levels; mask < team.participants(); mask *= 2) {
    const bool lower = (index & mask) == 0;
    const bool last = mask * 2 == team.participants();
    exchange(ctx, tag, team.rankOfIndex(index ^ mask), mine + base, p.length(held.blocks),
             p.length(held.blocks), r.elemBytes, [&](const uint8_t* slot, size_t at, size_t bytes) {
               r.combine(base + at, mine + base + at, slot, bytes, lower, last);
             });
    mine = r.output;
  }
}

// Recursive doubling's all-gather back through the halving partners, last first: each exchange
// sends what this rank holds complete and receives the other half of what it held before that
// halving (where that halving's send lay). Then waits until every halving send has gone.
void gatherBack(CollContext& ctx, const CallTag& tag, const Team& team, const Reduction& r,
                const Partition& p, Held& held) {
  const int index = team.index();
  for (int step = static_cast<int>(held.before.size()) - 1; step >= 0; --step) {
    const Blocks whole = held.before[step];
    const bool lowerHalf = held.blocks.lo == whole.lo;
    const Blocks theirs = lowerHalf ? Blocks{whole.mid(), whole.hi} : Blocks{whole.lo, whole.mid()};
    const int peer = team.rankOfIndex(index ^ (1 << step));
    SendConnector& to = *ctx.sendTo[peer];
    if (to.postsFromPlace()) to.awaitTaken(held.sentBy[step], *ctx.dog);
    exchange(
        ctx, tag, peer, r.output + p.offset(held.blocks.lo), p.length(held.blocks),
        p.length(theirs), r.elemBytes,
        [&](const uint8_t* slot, size_t at, size_t bytes) {
          std::memcpy(r.output + p.offset(theirs.lo) + at, slot, bytes);
        },
        SendFrom::Place);
    held.blocks = whole;
  }
  for (int step = 0; step < static_cast<int>(held.before.size()); ++step) {
    SendConnector& to = *ctx.sendTo[team.rankOfIndex(index ^ (1 << step))];
    if (to.postsFromPlace()) to.awaitTaken(to.posted(), *ctx.dog);
  }
}

// The exchanges among the team, this rank's values at `mine`: output = the team's result. The
// first `halvingLevels` partners halve (and gather back at the end), the rest double on the part
// held: 0 is recursive doubling, log2(participants) is Rabenseifner's halving. Each halving level
// trades a handoff more for half the bytes of the doubling exchanges after it; a call with fewer
// elements than participants doubles throughout.
void recursiveSteps(CollContext& ctx, const CallTag& tag, const Team& team, const Reduction& r,
                    const uint8_t* mine, int halvingLevels) {
  const size_t parts = static_cast<size_t>(team.participants());
  const int levels = r.args.count < parts
                         ? 0
                         : std::min(halvingLevels, static_cast<int>(std::bit_width(parts)) - 1);
  const Partition p{r.args.count, parts, r.elemBytes};
  Held held{{0, team.participants()}, {}, {}};
  mine = halve(ctx, tag, team, r, p, mine, levels, held);
  doubleUp(ctx, tag, team, r, p, mine, levels, held);
  gatherBack(ctx, tag, team, r, p, held);
}

// The team's all-reduce: the surplus ranks folded in, the steps, the result handed back.
void runTeam(CollContext& ctx, const CallTag& tag, const Team& team, const Reduction& r,
             int halvingLevels) {
  if (runFolded(ctx, tag, team, r)) return;
  recursiveSteps(ctx, tag, team, r, foldIn(ctx, tag, team, r), halvingLevels);
  handBackFolded(ctx, tag, team, r);
}

// A host's leader: its ranks' inputs reduced into its output (leader first, the rest in ring
// order), which is the call's result where it is the only host (Avg divided by the last).
void gatherHost(CollContext& ctx, const CallTag& tag, const Reduction& r) {
  const uint8_t* mine = r.input;
  for (size_t i = 1; i < ctx.hostRanks.size(); ++i) {
    const bool last = ctx.hostLeaders.size() == 1 && i + 1 == ctx.hostRanks.size();
    exchange(ctx, tag, ctx.hostRanks[i], nullptr, 0, r.bytes(), r.elemBytes,
             [&](const uint8_t* slot, size_t at, size_t bytes) {
               r.combine(at, mine + at, slot, bytes, true, last);
             });
    mine = r.output;
  }
  if (mine == r.input && r.input != r.output) std::memcpy(r.output, r.input, r.bytes());
}

}  // namespace

void runRecursiveAllReduce(CollContext& ctx, const CollArgs& a, const CallTag& tag,
                           int halvingLevels) {
  runTeam(ctx, tag, everyRank(ctx), Reduction(a, ctx.nranks), halvingLevels);
}

void runHierarchicalAllReduce(CollContext& ctx, const CollArgs& a, const CallTag& tag,
                              int halvingLevels) {
  const Reduction r(a, ctx.nranks);
  const int leader = ctx.hostRanks.front();
  if (ctx.rank != leader) return handOver(ctx, tag, leader, r);
  gatherHost(ctx, tag, r);
  if (ctx.hostLeaders.size() > 1) {
    Reduction partial = r;  // the leader's values are its host's, in its output
    partial.input = r.output;
    runTeam(ctx, tag, Team(ctx.hostLeaders, ctx.rank), partial, halvingLevels);
  }
  for (size_t i = 1; i < ctx.hostRanks.size(); ++i)
    exchange(ctx, tag, ctx.hostRanks[i], r.output, r.bytes(), 0, r.elemBytes, kTakeNothing);
}

}  // namespace braid
