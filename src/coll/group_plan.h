// A group's calls of one communicator (braidGroupStart/End) as the passes that run them (NCCL's
// task -> plan step): each run of consecutive small collectives that agree (collective, datatype,
// built-in operator, root) as one call over a staging buffer where the communicator's model prices
// that below the calls one by one (k all-reduces of a few KiB then pay one call's latency instead
// of k, the copies in and out costing less); every other collective alone; the sends and receives
// between two collective passes together. The collectives alone decide their passes, from what
// every rank's collectives share (collective, count, datatype, operator, root) and the model, which
// every rank builds alike, never a buffer's address: every rank plans the same collective passes,
// while its sends and receives, which differ from rank to rank, fall between them (those among a
// fused run's calls after it: a group's calls have no order).
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <span>
#include <utility>
#include <vector>

#include "coll/call.h"

namespace braid {

struct GroupFuseLimits {
  size_t callMaxBytes = 0;  // a collective of at most this many bytes may join a fused pass
  size_t passMaxBytes = 0;  // a fused pass's calls hold at most this many bytes together
  // Microseconds of a call as the model prices it, and of copying `bytes` on a host core; a run
  // fuses where the fused call and its copies cost less than its calls one by one. Null: every
  // run within the limits fuses.
  std::function<double(const CollArgs& call)> callUs;
  std::function<double(size_t bytes)> copyUs;
};

struct GroupPass {
  enum class Kind { Alone, SendRecv, Fused };
  Kind kind = Kind::Alone;
  size_t first = 0;  // the plan's order [first, first + count)
  size_t count = 1;
};

// The passes in the order they run, each a stretch of `order`: the group's calls by place, in the
// group's own order unless sends or receives among a fused run's calls go after it.
struct GroupPlan {
  std::vector<size_t> order;
  std::vector<GroupPass> passes;
};

// nccl-tests' size of a call, alike on every rank: the all-reduce, broadcast and reduce buffer,
// the all-gather output, the reduce-scatter input, a send's or receive's message.
size_t callSizeBytes(const CollArgs& call, int nranks);

GroupPlan planGroup(std::span<const CollArgs> calls, int nranks, const GroupFuseLimits& limits);

// One copy between a fused pass's staging buffer and a call's own buffer: `bytes` at `staged` in
// the staging buffer and at `own` in member `member`'s sendbuff (an input) or recvbuff (an output).
struct StagedCopy {
  size_t member = 0;
  size_t own = 0;
  size_t staged = 0;
  size_t bytes = 0;
};

// A fused pass as rank `rank` runs it: one call of the members' collective over the staging
// buffer (its buffers null: they are the staging buffer at sendOffset and recvOffset), the
// buffer's size, what is copied in before the call and out after it. Every member's block of
// rank r lies inside the fused call's block of rank r, and the call runs in place.
struct FusedPass {
  CollArgs call;
  size_t sendOffset = 0, recvOffset = 0;
  size_t stagingBytes = 0;
  std::vector<StagedCopy> inputs, outputs;
};
FusedPass fusedPass(std::span<const CollArgs> members, int nranks, int rank);

// A pair (earlier, later) of members where the later one reads what the earlier one writes, as
// this rank's `pass` (fusedPass of `members`) copies them: a fused pass reads every input before
// it writes any output, so the later call sees the value from before the group where calls run
// one by one would show it the earlier call's result. Nothing where no member does.
std::optional<std::pair<size_t, size_t>> laterReadsEarlierOutput(std::span<const CollArgs> members,
                                                                 const FusedPass& pass);

}  // namespace braid
