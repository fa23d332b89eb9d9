// Ring schedules as pure functions: (collective, nranks, ring position, loop, step) ->
// (primitive, input offset, output offset, element count). The host executor and the CUDA
// kernels run the same schedule, so it is header-only and callable from device code.
#pragma once

#include <cstddef>
#include <cstdint>

#include "base/host_device.h"

namespace braid {

enum class Collective : uint8_t {
  AllReduce,
  ReduceScatter,
  AllGather,
  Broadcast,
  Reduce,
  Send,
  Recv,
  // Gather and Scatter run as sends and receives; these name the call in the tag the ranks pass
  // round the ring first, so that ranks that disagree on the root fail instead of waiting.
  Gather,
  Scatter
};

// NCCL's vocabulary. "Copy" writes the user's output, "Send" fills the next rank's FIFO slot,
// "Recv" consumes the previous rank's slot, "Reduce" combines a received slot with local input.
enum class Prim : uint8_t {
  Send,                // slot <- input
  CopySend,            // slot <- input, output <- input (unless in place)
  RecvReduceSend,      // slot <- recv OP input
  RecvReduceCopySend,  // output <- recv OP input, slot <- same
  RecvCopySend,        // output <- recv, slot <- recv
  Recv,                // output <- recv
  RecvReduceCopy,      // output <- recv OP input
};

BRAID_HD inline bool primReceives(Prim p) {
  return p >= Prim::RecvReduceSend;
}
BRAID_HD inline bool primSends(Prim p) {
  return p <= Prim::RecvCopySend;
}
// The primitives that read the rank's input, and those that write its output.
BRAID_HD inline bool primReadsInput(Prim p) {
  return p == Prim::Send || p == Prim::CopySend || p == Prim::RecvReduceSend ||
         p == Prim::RecvReduceCopySend || p == Prim::RecvReduceCopy;
}
BRAID_HD inline bool primWritesOutput(Prim p) {
  return p != Prim::Send && p != Prim::RecvReduceSend;
}
// The primitives that complete a reduction: where Avg divides.
BRAID_HD inline bool primFinishesReduction(Prim p) {
  return p == Prim::RecvReduceCopySend || p == Prim::RecvReduceCopy;
}

struct RingOp {
  Prim prim;
  size_t inOffset;   // elements into the input buffer
  size_t outOffset;  // elements into the output buffer
  size_t count;      // elements moved (may be 0 at the tail of a message)
};

BRAID_HD inline size_t ceilDiv(size_t a, size_t b) {
  return (a + b - 1) / b;
}
BRAID_HD inline int modRanks(int v, int n) {
  return ((v % n) + n) % n;
}

// Steps one rank runs per loop. Broadcast and Reduce are chains: one primitive per rank.
BRAID_HD inline int ringSteps(Collective c, int nranks) {
  switch (c) {
    case Collective::AllReduce: return 2 * nranks - 1;
    case Collective::ReduceScatter:
    case Collective::AllGather: return nranks;
    default: return 1;
  }
}

// Loops needed for `count` elements (the user's count argument) with chunks of `chunk` elements
// (one FIFO slot).
BRAID_HD inline size_t ringLoops(Collective c, int nranks, size_t count, size_t chunk) {
  if (c == Collective::AllReduce) return ceilDiv(count, chunk * static_cast<size_t>(nranks));
  return ceilDiv(count, chunk);
}

// Which block position `pos` works on at `step`, and with which primitive.
// AllReduce: reduce-scatter (steps 0..n-1) then all-gather (n..2n-2); after step n-1 position p
// holds the fully reduced block p. Broadcast and Reduce take `pos` relative to the root's chain.
struct RingRole {
  Prim prim;
  int block;
};
BRAID_HD inline RingRole ringRole(Collective c, int n, int pos, int step) {
  switch (c) {
    case Collective::AllReduce:
      if (step == 0) return {Prim::Send, modRanks(pos - 1, n)};
      if (step < n - 1) return {Prim::RecvReduceSend, modRanks(pos - 1 - step, n)};
      if (step == n - 1) return {Prim::RecvReduceCopySend, pos};
      if (step < 2 * n - 2) return {Prim::RecvCopySend, modRanks(pos - (step - n + 1), n)};
      return {Prim::Recv, modRanks(pos + 1, n)};
    case Collective::ReduceScatter:
      if (step == 0) return {Prim::Send, modRanks(pos - 1, n)};
      if (step < n - 1) return {Prim::RecvReduceSend, modRanks(pos - 1 - step, n)};
      return {Prim::RecvReduceCopy, pos};
    case Collective::AllGather:
      if (step == 0) return {Prim::CopySend, pos};
      if (step < n - 1) return {Prim::RecvCopySend, modRanks(pos - step, n)};
      return {Prim::Recv, modRanks(pos + 1, n)};
    case Collective::Broadcast:  // chain root -> root+1 -> ... -> root-1
      if (pos == 0) return {Prim::CopySend, 0};
      if (pos < n - 1) return {Prim::RecvCopySend, 0};
      return {Prim::Recv, 0};
    case Collective::Reduce:  // chain root+1 -> ... -> root; the root is the last position
    default:
      if (pos == 0) return {Prim::Send, 0};
      if (pos < n - 1) return {Prim::RecvReduceSend, 0};
      return {Prim::RecvReduceCopy, 0};
  }
}

// The full schedule entry. `alignElems` keeps all-reduce blocks on cache-line boundaries.
// `ringOrder` lists the ranks in ring order (nullptr: rank = position): blocks are numbered by
// ring position, but a reduce-scatter's input block and an all-gather's output block belong to
// the rank at that position.
BRAID_HD inline RingOp ringOp(Collective c, int n, int pos, size_t count, size_t chunk,
                              size_t alignElems, size_t loop, int step,
                              const int* ringOrder = nullptr) {
  const RingRole role = ringRole(c, n, pos, step);
  const size_t block = static_cast<size_t>(role.block);
  const size_t owner = ringOrder != nullptr ? static_cast<size_t>(ringOrder[role.block]) : block;
  if (c == Collective::AllReduce) {
    const size_t loopElems = chunk * static_cast<size_t>(n);
    const size_t base = loop * loopElems;
    const size_t remain = count - base < loopElems ? count - base : loopElems;
    size_t blockElems = ceilDiv(ceilDiv(remain, static_cast<size_t>(n)), alignElems) * alignElems;
    if (blockElems > chunk) blockElems = chunk;
    const size_t start = block * blockElems;
    const size_t elems =
        start >= remain ? 0 : (remain - start < blockElems ? remain - start : blockElems);
    return {role.prim, base + start, base + start, elems};
  }
  const size_t offset = loop * chunk;
  const size_t elems = count - offset < chunk ? count - offset : chunk;
  switch (c) {
    case Collective::ReduceScatter: return {role.prim, owner * count + offset, offset, elems};
    case Collective::AllGather: return {role.prim, offset, owner * count + offset, elems};
    default: return {role.prim, offset, offset, elems};
  }
}

}  // namespace braid
