// The tree collectives once, for whatever runs them, as coll/ring_engine.h is for rings: one
// rank's part of an all-reduce (reduced up the tree, the result broadcast down), a broadcast (down
// from the top) or a reduce (up to the top) on one binary tree of base/binary_trees.h, a FIFO
// slot of elements at a time. A double binary tree gives each tree a share of the elements.
// Header-only and __host__ __device__, on the ring engine's thread group G and data mover M, and
// on ports P per neighbour, each with the FIFO from that neighbour and the FIFO to it: the ring
// engine's Simple ports (slots published by tail) or its low-latency ports (LlPorts: every 8-byte
// line carries its flag, so a small call's hop costs no fence and no tail round trip). An
// all-reduce sends every slot up, then every result down, each pass pipelined (NCCL's tree runs
// so too): a rank waits up the tree only on its children's slots and its parent's credits, which
// its parent frees while still going up, and it turns down only once its children's slots are
// all taken, so no wait can close a cycle, whatever the FIFOs' depth. A call then costs the
// tree's depth twice plus a slot's move per slot at each pass.
#pragma once

#include <cstddef>

#include "coll/ring_engine.h"

namespace braid {

// Where one rank stands on one tree, for one share of a call.
template <class T>
struct TreeCall {
  Collective collective;  // AllReduce, Broadcast or Reduce
  const T* input;         // nccl.h's sendbuff (Broadcast: read at the top only)
  T* output;              // nccl.h's recvbuff (Reduce: written at the top only)
  size_t count;           // elements of this share
  int divisor;            // Avg: nranks; else 1
  bool hasParent;         // false: the top (a broadcast's or reduce's root)
  int nChildren;          // 0, 1 or 2
};

// A rank's ports to its neighbours on one tree.
template <class P>
struct TreePorts {
  P parent;  // unused at the top
  P children[2];
};

// Calls f on each child's port in order. The bound is fixed so the compiler unrolls the loop and
// every port stays in registers: an index it cannot resolve would put the ports in local memory
// (tests/device/check_sass.sh fails on any).
template <class P, class F>
BRAID_HD void forEachChild(TreePorts<P>& ports, int nChildren, F&& f) {
  BRAID_UNROLL
  for (int c = 0; c < 2; ++c)
    if (c < nChildren) f(ports.children[c]);
}

// The mover without PreMulSum's scaling: the second child's slot is combined with a partial
// result that holds this rank's scaled input already. The host's movers never scale.
template <class R, bool kPrescaled>
BRAID_HD ElementMover<R, false> unscaled(const ElementMover<R, kPrescaled>&) {
  return {};
}
template <class M>
BRAID_HD const M& unscaled(const M& move) {
  return move;
}

// Up one slot: the children's partial results and this rank's input, combined (children in order,
// then this rank), go to the parent's slot, or at the top into the output (Avg divided there).
template <class M, class G, class P>
BRAID_HD bool reduceUp(G& group, const M& move, const TreeCall<typename M::Storage>& call,
                       TreePorts<P>& ports, size_t at, size_t n) {
  using T = typename M::Storage;
  const size_t bytes = n * sizeof(T);
  bool ready = true;
  forEachChild(ports, call.nChildren,
               [&](P& child) { ready = ready && child.waitRecv(group, bytes); });
  if (ready && call.hasParent) ready = ports.parent.waitSend(group);
  if (ready) {
    T* out = call.hasParent ? nullptr : call.output + at;
    T* slot = call.hasParent ? static_cast<T*>(ports.parent.sendSlot()) : nullptr;
    const int divisor = call.hasParent ? 1 : call.divisor;
    const T* in = call.input + at;
    auto received = [&](int c) { return static_cast<const T*>(ports.children[c].recvSlot()); };
    if (call.nChildren < 2) {
      move(group, call.nChildren == 1 ? received(0) : nullptr, in, out, slot, n, divisor);
    } else {
      T* partial = out != nullptr ? out : slot;
      move(group, received(0), in, partial, nullptr, n, 1);
      group.sync();  // a thread may combine elements another wrote
      unscaled(move)(group, received(1), partial, out, slot, n, divisor);
    }
  }
  if (group.any(!ready)) return false;
  if (call.hasParent) ports.parent.post(group, bytes);
  forEachChild(ports, call.nChildren, [&](P& child) { child.release(group); });
  return true;
}

// Down one slot: the result, from the parent's slot (or at the top from the output, or for a
// broadcast the input), into the output and every child's slot.
template <class M, class G, class P>
BRAID_HD bool broadcastDown(G& group, const M& move, const TreeCall<typename M::Storage>& call,
                            TreePorts<P>& ports, size_t at, size_t n) {
  using T = typename M::Storage;
  const auto copy = unscaled(move);
  const size_t bytes = n * sizeof(T);
  bool ready = !call.hasParent || ports.parent.waitRecv(group, bytes);
  forEachChild(ports, call.nChildren, [&](P& child) { ready = ready && child.waitSend(group); });
  if (ready) {
    const bool fromInput = !call.hasParent && call.collective == Collective::Broadcast;
    const T* from = call.hasParent ? static_cast<const T*>(ports.parent.recvSlot())
                    : fromInput    ? call.input + at
                                   : call.output + at;
    T* out = call.output + at;
    auto slot = [&](int c) { return static_cast<T*>(ports.children[c].sendSlot()); };
    // At the top of an all-reduce the output holds the result already; in place, the input is it.
    T* toOutput = from == out ? nullptr : out;
    T* first = call.nChildren > 0 ? slot(0) : nullptr;
    if (toOutput != nullptr || first != nullptr) copy(group, from, nullptr, toOutput, first, n, 1);
    if (call.nChildren > 1) copy(group, from, nullptr, nullptr, slot(1), n, 1);
  }
  if (group.any(!ready)) return false;
  forEachChild(ports, call.nChildren, [&](P& child) { child.post(group, bytes); });
  if (call.hasParent) ports.parent.release(group);
  return true;
}

// The low-latency protocol's steps: each thread takes whole packs, the same packs in both steps,
// and reads the neighbours' lines, waiting for each line's flag, straight into registers; no
// slot is read whole, so no partial result is stored between the children. A rank takes its send
// credit before it reads, as on the ring.
template <class M, class G, class P>
BRAID_HD bool reduceUpLines(G& group, const M& move, const TreeCall<typename M::Storage>& call,
                            TreePorts<P>& ports, size_t at, size_t n) {
  using T = typename M::Storage;
  constexpr size_t kPerPack = M::kPerPack;
  bool ready = !call.hasParent || ports.parent.waitSend(group);
  const size_t packs = ceilDiv(n, kPerPack);
  for (size_t p = static_cast<size_t>(group.index()); ready && p < packs;
       p += static_cast<size_t>(group.size())) {
    const size_t k = n - p * kPerPack < kPerPack ? n - p * kPerPack : kPerPack;
    const size_t bytes = k * sizeof(T);
    Pack16 received[2] = {};
    if (call.nChildren > 0) ready = ports.children[0].readLines(group, p, bytes, received[0]);
    if (call.nChildren > 1)
      ready = ready && ports.children[1].readLines(group, p, bytes, received[1]);
    if (!ready) break;
    // Combined as the Simple steps combine: the first child with this rank's input, then the
    // second child with that, Avg's division at the top's last combination.
    const int divisor = call.hasParent ? 1 : call.divisor;
    const Pack16 input = loadElements(call.input + at + p * kPerPack, k);
    Pack16 result = move.combinePack(call.nChildren > 0, received[0], true, input, k,
                                     call.nChildren < 2 ? divisor : 1);
    if (call.nChildren > 1)
      result = unscaled(move).combinePack(true, received[1], true, result, k, divisor);
    if (call.hasParent)
      ports.parent.writeLines(p, bytes, result);
    else
      storeElements(call.output + at + p * kPerPack, k, result);
  }
  if (group.any(!ready)) return false;
  if (call.hasParent) ports.parent.post(group, n * sizeof(T));
  forEachChild(ports, call.nChildren, [&](P& child) { child.release(group); });
  return true;
}

template <class M, class G, class P>
BRAID_HD bool broadcastDownLines(G& group, const TreeCall<typename M::Storage>& call,
                                 TreePorts<P>& ports, size_t at, size_t n) {
  using T = typename M::Storage;
  constexpr size_t kPerPack = M::kPerPack;
  bool ready = true;
  forEachChild(ports, call.nChildren, [&](P& child) { ready = ready && child.waitSend(group); });
  // At the top of an all-reduce the output holds the result: the group stored it before the vote
  // that ended the step up (each thread its own packs, the same ones it reads here).
  const T* from = call.collective == Collective::Broadcast ? call.input : call.output;
  const bool toOutput = call.hasParent || from != call.output;
  const size_t packs = ceilDiv(n, kPerPack);
  for (size_t p = static_cast<size_t>(group.index()); ready && p < packs;
       p += static_cast<size_t>(group.size())) {
    const size_t k = n - p * kPerPack < kPerPack ? n - p * kPerPack : kPerPack;
    const size_t bytes = k * sizeof(T);
    Pack16 value{};
    if (call.hasParent)
      ready = ports.parent.readLines(group, p, bytes, value);
    else
      value = loadElements(from + at + p * kPerPack, k);
    if (!ready) break;
    if (toOutput) storeElements(call.output + at + p * kPerPack, k, value);
    forEachChild(ports, call.nChildren, [&](P& child) { child.writeLines(p, bytes, value); });
  }
  if (group.any(!ready)) return false;
  forEachChild(ports, call.nChildren, [&](P& child) { child.post(group, n * sizeof(T)); });
  if (call.hasParent) ports.parent.release(group);
  return true;
}

// One slot's step up or down, in the ports' protocol.
template <class M, class G, class P>
BRAID_HD bool upOneSlot(G& group, const M& move, const TreeCall<typename M::Storage>& call,
                        TreePorts<P>& ports, size_t at, size_t n) {
  if constexpr (P::kArrival == Arrival::LineFlags)
    return reduceUpLines(group, move, call, ports, at, n);
  else
    return reduceUp(group, move, call, ports, at, n);
}
template <class M, class G, class P>
BRAID_HD bool downOneSlot(G& group, const M& move, const TreeCall<typename M::Storage>& call,
                          TreePorts<P>& ports, size_t at, size_t n) {
  if constexpr (P::kArrival == Arrival::LineFlags)
    return broadcastDownLines<M>(group, call, ports, at, n);
  else
    return broadcastDown(group, move, call, ports, at, n);
}

// This rank's part of the call on one tree. false: a wait gave up (every thread alike).
template <class M, class G, class P>
BRAID_HD bool runTree(G& group, const M& move, const TreeCall<typename M::Storage>& call,
                      TreePorts<P>& ports) {
  using T = typename M::Storage;
  // Slots of whole 16-byte packs; a rank alone moves its share at once.
  const bool alone = !call.hasParent && call.nChildren == 0;
  const size_t slotBytes =
      call.hasParent ? ports.parent.slotBytes() : ports.children[0].slotBytes();
  const size_t chunk =
      alone ? call.count : slotBytes / sizeof(Pack16) * (sizeof(Pack16) / sizeof(T));
  if (chunk == 0 && call.count > 0) return false;  // a slot smaller than a pack: nothing fits
  // Every slot up, then every slot down: each pass is a pipeline, the slots following each other
  // through the levels.
  auto slotAt = [&](size_t at) { return call.count - at < chunk ? call.count - at : chunk; };
  if (call.collective != Collective::Broadcast)
    for (size_t at = 0; at < call.count; at += chunk)
      if (!upOneSlot(group, move, call, ports, at, slotAt(at))) return false;
  if (call.collective != Collective::Reduce)
    for (size_t at = 0; at < call.count; at += chunk)
      if (!downOneSlot(group, move, call, ports, at, slotAt(at))) return false;
  group.sync();
  return true;
}

// One call of a tree block's work list, whole (each block takes its tree channel's share) and,
// for PreMulSum, the rank's scalar where the block reads it, or its value when `scale` is null.
template <class T>
struct TreeWork {
  Collective collective;
  const T* input;
  T* output;
  size_t count;
  int divisor;
  const T* scale = nullptr;
  T scaleValue{};
};

// Where a block stands: its place on its tree (the same for every call of its list: the device
// runs unrooted calls, all-reduces, whose trees do not move) and its channel's share.
struct TreePlace {
  bool hasParent;
  int nChildren;
  int channel, nChannels;
};

// The device form: a block's work list on one tree (a group's tree all-reduces in one launch, as
// the ring's lists: coll/ring_engine.h's runWorksOnViews), element reduction R over the FIFO views
// (Simple or low-latency ports). The counters are taken up from the FIFO words once and each
// thread carries its own copy from call to call. Avg's lists hold one call (kOneWorkPerList).
template <class R, bool kPrescaled = false, class G, class Ports>
BRAID_HD bool runTreeWorksOnViews(G& group, const TreeWork<typename R::Storage>* works, int nWorks,
                                  const TreePlace& place, TreePorts<Ports> ports) {
  using T = typename R::Storage;
  if (place.hasParent) ports.parent.resume(group);
  forEachChild(ports, place.nChildren, [&](Ports& child) { child.resume(group); });
  const int calls = kOneWorkPerList<R> ? 1 : nWorks;
  for (int w = 0; w < calls; ++w) {
    const TreeWork<T>& work = works[w];
    const size_t begin = shareBegin<T>(work.count, place.channel, place.nChannels);
    const size_t end = shareBegin<T>(work.count, place.channel + 1, place.nChannels);
    const TreeCall<T> call{work.collective, work.input + begin, work.output + begin, end - begin,
                           work.divisor,    place.hasParent,    place.nChildren};
    ElementMover<R, kPrescaled> move{};
    if constexpr (kPrescaled) move.scale = work.scale != nullptr ? *work.scale : work.scaleValue;
    if (!runTree(group, move, call, ports)) return false;
  }
  return true;
}

}  // namespace braid
