// The ring collectives once, for whatever runs them: a CUDA thread block (one per channel), CPU
// threads standing in for one (tests), or one host thread (the host executor). Header-only and
// __host__ __device__, templated on three policies:
//  - a thread group G: int index() const, int size() const, void sync() (every thread of the
//    group reaches it before any leaves: __syncthreads, or a std::barrier), bool any(bool) (a
//    sync that also tells every thread whether any passed true: __syncthreads_or), and
//    bool keepWaiting() (pauses once; false when the wait must give up: abort flag or timeout);
//  - a data mover M: `Storage` (the element's bits) and
//    operator()(G&, a, b, toOutput, toSlot, count, divisor): a OP b, or a copy of a when b is
//    null, into toOutput and toSlot (either may be null), this thread's share of `count`
//    elements; divisor > 1 divides (Avg's finishing step). ElementMover below is the generic one a
//    device uses; the host executor's moves bytes with its SIMD kernels;
//  - ports P, the rank's two FIFO ends on the ring: slotBytes() (payload bytes of a slot),
//    waitRecv(G&, bytes) and waitSend(G&) (false: the wait gave up), recvSlot() and sendSlot(),
//    post(G&, bytes) and release(G&) (called by every thread after the group's barrier).
//    FifoViewPorts below waits on the FIFO views as a device does; the host executor's ports
//    block under the watchdog and tag each slot with the call.
// Every thread of the group runs the same sequence of primitives over the same schedule
// (coll/schedule.h); an ElementMover's threads split each chunk's bytes among them, 16 bytes at a
// time where every pointer involved allows it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "coll/schedule.h"
#include "transport/fifo_view.h"

namespace braid {

// 16 bytes moved by one load and one store. On a device they are global-memory vector accesses
// (user buffers and FIFO slots are global memory); the only __CUDA_ARCH__ split of the engine.
struct alignas(16) Pack16 {
  uint32_t word[4];
};

BRAID_HD inline Pack16 load16(const void* p) {
  Pack16 v;
#if defined(__CUDA_ARCH__)
  asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.word[0]), "=r"(v.word[1]), "=r"(v.word[2]), "=r"(v.word[3])
               : "l"(p)
               : "memory");
#else
  memcpy(&v, p, sizeof v);
#endif
  return v;
}

BRAID_HD inline void store16(void* p, const Pack16& v) {
#if defined(__CUDA_ARCH__)
  asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(v.word[0]), "r"(v.word[1]),
               "r"(v.word[2]), "r"(v.word[3])
               : "memory");
#else
  memcpy(p, &v, sizeof v);
#endif
}

BRAID_HD inline bool aligned16(const void* p) {
  return p == nullptr || reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// out = a OP b (or a copy of a when b is null), written to out and, when not null, out2; this
// thread's share of `count` elements. divisor > 1 divides (Avg's finishing step).
template <class R, class G>
BRAID_HD void combine(const G& group, const typename R::Storage* a, const typename R::Storage* b,
                      typename R::Storage* out, typename R::Storage* out2, size_t count,
                      int divisor) {
  using T = typename R::Storage;
  constexpr size_t kPerPack = sizeof(Pack16) / sizeof(T);
  const size_t first = static_cast<size_t>(group.index());
  const size_t stride = static_cast<size_t>(group.size());
  size_t done = 0;
  if (aligned16(a) && aligned16(b) && aligned16(out) && aligned16(out2)) {
    const size_t packs = count / kPerPack;
    for (size_t p = first; p < packs; p += stride) {
      Pack16 x = load16(a + p * kPerPack);
      if (b != nullptr) {
        const Pack16 y = load16(b + p * kPerPack);
        T xs[kPerPack], ys[kPerPack];
        memcpy(xs, &x, sizeof x);
        memcpy(ys, &y, sizeof y);
        for (size_t k = 0; k < kPerPack; ++k) xs[k] = R::apply(xs[k], ys[k], divisor);
        memcpy(&x, xs, sizeof x);
      }
      store16(out + p * kPerPack, x);
      if (out2 != nullptr) store16(out2 + p * kPerPack, x);
    }
    done = packs * kPerPack;
  }
  for (size_t i = done + first; i < count; i += stride) {
    const T v = b != nullptr ? R::apply(a[i], b[i], divisor) : a[i];
    out[i] = v;
    if (out2 != nullptr) out2[i] = v;
  }
}

// The generic data mover: R's element reduction (kernels/element_reduce.h) over `combine`.
template <class R>
struct ElementMover {
  using Storage = typename R::Storage;
  template <class G>
  BRAID_HD void operator()(G& group, const Storage* a, const Storage* b, Storage* toOutput,
                           Storage* toSlot, size_t count, int divisor) const {
    Storage* first = toOutput != nullptr ? toOutput : toSlot;
    combine<R>(group, a, b, first, first == toOutput ? toSlot : nullptr, count, divisor);
  }
};

// Waits, as the group decides, until `ready` holds or the FIFO is aborted; every thread waits on
// its own copy of the view.
template <class G, class Ready>
BRAID_HD bool waitFor(G& group, Ready ready) {
  while (!ready()) {
    if (!group.keepWaiting()) return false;
  }
  return true;
}

// Ports over the FIFO views, as a device waits: every thread polls its own copy of the views
// until the slot is there, the FIFO is aborted or the group gives up; the leader alone publishes.
struct FifoViewPorts {
  FifoRecvView in;
  FifoSendView out;

  BRAID_HD size_t slotBytes() const { return out.slotBytes; }
  template <class G>
  BRAID_HD bool waitRecv(G& group, size_t) {
    return waitFor(group, [&] { return in.tryWait() || in.aborted(); }) && !in.aborted();
  }
  template <class G>
  BRAID_HD bool waitSend(G& group) {
    return waitFor(group, [&] { return out.tryAcquire() || out.aborted(); }) && !out.aborted();
  }
  BRAID_HD const void* recvSlot() const { return in.slot(); }
  BRAID_HD void* sendSlot() const { return out.slot(); }
  template <class G>
  BRAID_HD void post(G& group, size_t) {
    out.post(group.index() == 0);
  }
  template <class G>
  BRAID_HD void release(G& group) {
    in.release(group.index() == 0);
  }
};

// One primitive of the schedule over `op.count` elements. false: a wait gave up.
template <class M, class G, class P>
BRAID_HD bool runPrim(G& group, const M& move, P& ports, const RingOp& op,
                      const typename M::Storage* input, typename M::Storage* output, int divisor) {
  using T = typename M::Storage;
  const bool receives = primReceives(op.prim), sends = primSends(op.prim);
  const size_t bytes = op.count * sizeof(T);
  const bool ready =
      (!receives || ports.waitRecv(group, bytes)) && (!sends || ports.waitSend(group));
  if (ready) {
    const T* recvSlot = receives ? static_cast<const T*>(ports.recvSlot()) : nullptr;
    T* sendSlot = sends ? static_cast<T*>(ports.sendSlot()) : nullptr;
    const T* src = input + op.inOffset;
    T* dst = output + op.outOffset;
    const int finish = primFinishesReduction(op.prim) ? divisor : 1;
    switch (op.prim) {
      case Prim::Send: move(group, src, nullptr, nullptr, sendSlot, op.count, 1); break;
      case Prim::CopySend:
        move(group, src, nullptr, src == dst ? nullptr : dst, sendSlot, op.count, 1);
        break;
      case Prim::RecvReduceSend: move(group, recvSlot, src, nullptr, sendSlot, op.count, 1); break;
      case Prim::RecvReduceCopySend:
        move(group, recvSlot, src, dst, sendSlot, op.count, finish);
        break;
      case Prim::RecvCopySend: move(group, recvSlot, nullptr, dst, sendSlot, op.count, 1); break;
      case Prim::Recv: move(group, recvSlot, nullptr, dst, nullptr, op.count, 1); break;
      case Prim::RecvReduceCopy: move(group, recvSlot, src, dst, nullptr, op.count, finish); break;
    }
  }
  // One barrier: every thread's bytes are in place before the leader publishes, and the group
  // gives up together (a thread left alone at a later barrier would wait forever); a slot some
  // threads filled is then never published.
  if (group.any(!ready)) return false;
  if (sends) ports.post(group, bytes);
  if (receives) ports.release(group);
  return true;
}

// Where one rank stands in a collective on one channel.
template <class T>
struct RingCall {
  Collective collective;
  int nranks;
  int rank;
  int root;        // Broadcast and Reduce
  const T* input;  // as nccl.h's sendbuff (Broadcast: read on the root only)
  T* output;       // as nccl.h's recvbuff
  size_t count;    // nccl.h's count (recvcount, sendcount)
  size_t stride;   // elements between ranks' blocks of a reduce-scatter's input or an
                   // all-gather's output (the whole call's count when a channel runs a part)
  int divisor;     // Avg: nranks; else 1
  const int* ringOrder = nullptr;  // the ranks in ring order; null: rank r sends to r + 1
};

// Where `rank` stands on the ring.
BRAID_HD inline int ringPosition(const int* ringOrder, int nranks, int rank) {
  if (ringOrder == nullptr) return rank;
  for (int pos = 0; pos < nranks; ++pos)
    if (ringOrder[pos] == rank) return pos;
  return -1;
}

// Maps a ring position's block offset of a reduce-scatter input or all-gather output onto the
// call's layout, whose blocks are `stride` apart.
BRAID_HD inline size_t restride(size_t offset, size_t count, size_t stride) {
  return count == 0 || count == stride ? offset : offset / count * stride + offset % count;
}

// All-reduce blocks start on cache-line boundaries.
constexpr size_t kBlockAlignBytes = 64;

// Runs the whole collective on one channel.
template <class M, class G, class P>
BRAID_HD bool runRing(G& group, const M& move, const RingCall<typename M::Storage>& call,
                      P& ports) {
  using T = typename M::Storage;
  const int n = call.nranks;
  if (n == 1) {  // no peer: the result is this rank's input
    if (call.collective != Collective::Broadcast || call.rank == call.root)
      move(group, call.input, nullptr, call.output, nullptr, call.count, 1);
    group.sync();
    return true;
  }
  const int me = ringPosition(call.ringOrder, n, call.rank);
  int pos = me;
  if (call.collective == Collective::Broadcast)
    pos = modRanks(me - ringPosition(call.ringOrder, n, call.root), n);
  if (call.collective == Collective::Reduce)
    pos = modRanks(me - ringPosition(call.ringOrder, n, call.root) - 1, n);
  // Chunks are whole 16-byte packs, so every block of a slot stays 16-byte aligned.
  const size_t packElems = sizeof(Pack16) / sizeof(T);
  const size_t chunk = ports.slotBytes() / sizeof(Pack16) * packElems;
  const size_t loops = ringLoops(call.collective, n, call.count, chunk);
  const int steps = ringSteps(call.collective, n);
  for (size_t loop = 0; loop < loops; ++loop) {
    for (int step = 0; step < steps; ++step) {
      RingOp op = ringOp(call.collective, n, pos, call.count, chunk, kBlockAlignBytes / sizeof(T),
                         loop, step, call.ringOrder);
      if (call.collective == Collective::ReduceScatter)
        op.inOffset = restride(op.inOffset, call.count, call.stride);
      if (call.collective == Collective::AllGather)
        op.outOffset = restride(op.outOffset, call.count, call.stride);
      if (!runPrim(group, move, ports, op, call.input, call.output, call.divisor)) return false;
    }
  }
  return true;
}

// Channel `channel` of `nChannels` runs its share of the call: a contiguous part of every block,
// starting on a 16-byte boundary.
template <class M, class G, class P>
BRAID_HD bool runChannel(G& group, const M& move, const RingCall<typename M::Storage>& call,
                         int channel, int nChannels, P& ports) {
  using T = typename M::Storage;
  const size_t packElems = sizeof(Pack16) / sizeof(T);
  auto boundary = [&](int c) {
    const size_t at = call.count * static_cast<size_t>(c) / static_cast<size_t>(nChannels);
    return c == nChannels ? call.count : at / packElems * packElems;
  };
  const size_t start = boundary(channel), end = boundary(channel + 1);
  RingCall<T> part = call;
  part.count = end - start;
  part.input = call.input + start;
  part.output = call.output + start;
  return runRing(group, move, part, ports);
}

// The device form: element reduction R over the FIFO views.
template <class R, class G>
BRAID_HD bool runChannelOnViews(G& group, const RingCall<typename R::Storage>& call, int channel,
                                int nChannels, FifoRecvView in, FifoSendView out) {
  FifoViewPorts ports{in, out};
  return runChannel(group, ElementMover<R>{}, call, channel, nChannels, ports);
}

}  // namespace braid
