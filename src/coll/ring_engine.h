// The ring collectives once, for whatever runs them: a CUDA thread block (one per channel), CPU
// threads standing in for one (tests), or one host thread (the host executor). Header-only and
// __host__ __device__, templated on three policies:
//  - a thread group G: int index() const, int size() const, void sync() (every thread of the
//    group reaches it before any leaves: __syncthreads, or a std::barrier), bool any(bool) (a
//    sync that also tells every thread whether any passed true: __syncthreads_or), and
//    bool keepWaiting() (pauses once; false when the wait must give up: abort flag or timeout);
//    the segmented protocol also cuts it into warps of lanes() threads: warp(), warps(), lane(),
//    syncWarp() (__syncwarp) and anyInWarp(bool) (__any_sync);
//  - a data mover M: `Storage` (the element's bits) and
//    operator()(G&, recv, input, toOutput, toSlot, count, divisor): recv OP input, or a copy of
//    whichever is not null, into toOutput and toSlot (either may be null), this thread's share of
//    `count` elements; divisor > 1 divides (Avg's finishing step). ElementMover below is the
//    generic one a device uses (and the only one with the low-latency protocol's move); the host
//    executor's moves bytes with its SIMD kernels;
//  - ports P, the rank's two FIFO ends on the ring: kArrival (how a receiver learns its data is
//    there: tail, or flags the data carries), slotBytes() (payload bytes of a slot), waitSend(G&)
//    (false: the wait gave up), post(G&, bytes) and release(G&) (called by every thread after the
//    group's barrier); Simple ports add waitRecv(G&, bytes), recvSlot() and sendSlot(),
//    low-latency ones readLines and writeLines, segmented ones waitSegment and publishSegment.
//    FifoViewPorts (Simple), LlPorts (low latency) and SegmentPorts (segmented) below wait on the
//    FIFO views as a device does; the host executor's ports block under the watchdog and tag each
//    slot with the call.
// The same engine runs point-to-point calls (Collective::Send, Recv: one FIFO end used).
// Every thread of the group runs the same sequence of primitives over the same schedule
// (coll/schedule.h); an ElementMover's threads split each chunk's bytes among them, 16 bytes at a
// time where every pointer involved allows it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "coll/schedule.h"
#include "kernels/element_reduce.h"
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

// The elements at p..p+n (n <= a pack) as a pack, 16 bytes at once where aligned, else element
// by element (unrolled over a whole pack, so the pack stays in registers: a copy of n elements
// went through local memory).
template <class T>
BRAID_HD inline Pack16 loadElements(const T* p, size_t n) {
  constexpr size_t kPerPack = sizeof(Pack16) / sizeof(T);
  if (n == kPerPack && aligned16(p)) return load16(p);
  T e[kPerPack] = {};
  BRAID_UNROLL
  for (size_t k = 0; k < kPerPack; ++k)
    if (k < n) e[k] = p[k];
  Pack16 v;
  memcpy(&v, e, sizeof v);
  return v;
}
template <class T>
BRAID_HD inline void storeElements(T* p, size_t n, const Pack16& v) {
  constexpr size_t kPerPack = sizeof(Pack16) / sizeof(T);
  if (n == kPerPack && aligned16(p)) return store16(p, v);
  T e[kPerPack];
  memcpy(e, &v, sizeof v);
  BRAID_UNROLL
  for (size_t k = 0; k < kPerPack; ++k)
    if (k < n) p[k] = e[k];
}

// Packs a thread has in flight at once in the bulk moves: its loads of them are issued together,
// so each round trip to memory brings kPacksInFlight packs rather than one (a 256-thread block
// moving one pack per round trip reached 4-5 GB/s on an H100: bench/results/gpu-check).
constexpr int kPacksInFlight = 4;

// A device's segment of the segmented protocol (SegmentPorts): what a warp of 32 lanes moves with
// its packs in flight.
constexpr size_t kWarpSegmentBytes = 32 * kPacksInFlight * sizeof(Pack16);

// x as a reduction with PreMulSum's operator sees it: times the rank's scalar, rounded once as a
// Prod (kPrescaled; R is then Sum), else x itself.
template <class R, bool kPrescaled>
BRAID_HD typename R::Storage prescaled(typename R::Storage x, typename R::Storage scale) {
  if constexpr (kPrescaled)
    return kernels::ElementReduce<R::kType, braidProd>::apply(x, scale, 1);
  else
    return x;
}

// How a receiver learns that a slot's data is there: the sender's tail (Simple), a flag in every
// 8-byte line (low latency), a flag per warp segment (segmented).
enum class Arrival { Tail, LineFlags, SegmentFlags };

// A warp's lanes as the bulk move's thread group (it asks only which thread and how many).
struct LaneGroup {
  int laneIndex, laneCount;
  BRAID_HD int index() const { return laneIndex; }
  BRAID_HD int size() const { return laneCount; }
};

// The generic data mover: R's element reduction (kernels/element_reduce.h), this thread's share
// of the elements, 16 bytes at a time where every pointer involved allows it. A move computes
// recv OP pre(input), or a copy of whichever of the two is given, into toOutput and, when not
// null, toSlot; `divisor` > 1 divides (Avg's finishing step). With kPrescaled (a PreMulSum
// operator; R is then Sum) pre() multiplies every element of the rank's input by `scale` where it
// is first read, rounded once as a Prod, so no scaled copy is ever allocated.
template <class R, bool kPrescaled = false>
struct ElementMover {
  using Storage = typename R::Storage;
  static constexpr size_t kPerPack = sizeof(Pack16) / sizeof(Storage);
  Storage scale{};

  BRAID_HD Storage pre(Storage x) const { return prescaled<R, kPrescaled>(x, scale); }
  // One pack of n elements: r (when receiving) OP pre(x) (when hasInput), as above. By value, so
  // that nvcc keeps the packs in registers.
  BRAID_HD Pack16 combinePack(bool receives, Pack16 r, bool hasInput, Pack16 x, size_t n,
                              int divisor) const {
    if (!hasInput) return r;
    if (!receives && !kPrescaled) return x;
    Storage xs[kPerPack], ys[kPerPack];
    memcpy(ys, &x, sizeof x);
    memcpy(xs, &r, sizeof r);
    // Unrolled over the whole pack, so that xs and ys stay in registers (a loop to n indexed
    // them in local memory where the element work is long: PreMulSum on fp8).
    BRAID_UNROLL
    for (size_t k = 0; k < kPerPack; ++k)
      if (k < n) xs[k] = receives ? R::apply(xs[k], pre(ys[k]), divisor) : pre(ys[k]);
    memcpy(&x, xs, sizeof x);
    return x;
  }

  // kPacks whole packs, `stride` packs apart from pack p: every load first, then the stores.
  template <int kPacks>
  BRAID_HD void movePacks(size_t p, size_t stride, const Storage* recv, const Storage* input,
                          Storage* out, Storage* out2, int divisor) const {
    Pack16 r[kPacks] = {}, x[kPacks] = {};
    BRAID_UNROLL
    for (int u = 0; u < kPacks; ++u) {
      const size_t at = (p + u * stride) * kPerPack;
      if (recv != nullptr) r[u] = load16(recv + at);
      if (input != nullptr) x[u] = load16(input + at);
    }
    BRAID_UNROLL
    for (int u = 0; u < kPacks; ++u) {
      const size_t at = (p + u * stride) * kPerPack;
      const Pack16 y =
          combinePack(recv != nullptr, r[u], input != nullptr, x[u], kPerPack, divisor);
      store16(out + at, y);
      if (out2 != nullptr) store16(out2 + at, y);
    }
  }

  template <class G>
  BRAID_HD void operator()(G& group, const Storage* recv, const Storage* input, Storage* toOutput,
                           Storage* toSlot, size_t count, int divisor) const {
    Storage* out = toOutput != nullptr ? toOutput : toSlot;
    Storage* out2 = out == toOutput ? toSlot : nullptr;
    const size_t first = static_cast<size_t>(group.index());
    const size_t stride = static_cast<size_t>(group.size());
    size_t done = 0;
    if (aligned16(recv) && aligned16(input) && aligned16(out) && aligned16(out2)) {
      const size_t packs = count / kPerPack;
      size_t p = first;
      for (; p + (kPacksInFlight - 1) * stride < packs; p += kPacksInFlight * stride)
        movePacks<kPacksInFlight>(p, stride, recv, input, out, out2, divisor);
      for (; p < packs; p += stride) movePacks<1>(p, stride, recv, input, out, out2, divisor);
      done = packs * kPerPack;
    }
    for (size_t i = done + first; i < count; i += stride) {
      const Storage v = recv == nullptr    ? pre(input[i])
                        : input == nullptr ? recv[i]
                                           : R::apply(recv[i], pre(input[i]), divisor);
      out[i] = v;
      if (out2 != nullptr) out2[i] = v;
    }
  }

  // The same move through a low-latency slot (LlPorts): this thread's packs of the received
  // lines (waited for line by line) OP pre(input) into toOutput and the next slot's lines.
  // false: a wait gave up.
  template <class G, class P>
  BRAID_HD bool lowLatency(G& group, P& ports, bool receives, const Storage* input,
                           Storage* toOutput, bool sends, size_t count, int divisor) const {
    const size_t packs = ceilDiv(count, kPerPack);
    for (size_t p = static_cast<size_t>(group.index()); p < packs;
         p += static_cast<size_t>(group.size())) {
      const size_t at = p * kPerPack;
      const size_t n = count - at < kPerPack ? count - at : kPerPack;
      Pack16 r{};
      if (receives && !ports.readLines(group, p, n * sizeof(Storage), r)) return false;
      const Pack16 x =
          combinePack(receives, r, input != nullptr,
                      input != nullptr ? loadElements(input + at, n) : Pack16{}, n, divisor);
      if (toOutput != nullptr) storeElements(toOutput + at, n, x);
      if (sends) ports.writeLines(p, n * sizeof(Storage), x);
    }
    return true;
  }

  // The same move through a segmented slot (SegmentPorts): each warp takes whole segments in
  // turn; its lanes wait for the segment's flag, move it as the bulk move does (packs in flight,
  // the warp's lanes as the group) and, once the warp has met, its first lane publishes the next
  // slot's segment. false: a wait gave up (the warp's lanes give up together).
  template <class G, class P>
  BRAID_HD bool segmented(G& group, P& ports, bool receives, const Storage* input,
                          Storage* toOutput, bool sends, size_t count, int divisor) const {
    const size_t perSegment = ports.segmentBytes / sizeof(Storage);
    const size_t segments = ceilDiv(count, perSegment);
    LaneGroup lanes{group.lane(), group.lanes()};
    for (size_t s = static_cast<size_t>(group.warp()); s < segments;
         s += static_cast<size_t>(group.warps())) {
      const size_t at = s * perSegment;
      const size_t n = count - at < perSegment ? count - at : perSegment;
      const bool ready = !receives || ports.waitSegment(group, s);
      if (group.anyInWarp(!ready)) return false;
      (*this)(lanes, receives ? static_cast<const Storage*>(ports.recvData()) + at : nullptr,
              input != nullptr ? input + at : nullptr,
              toOutput != nullptr ? toOutput + at : nullptr,
              sends ? static_cast<Storage*>(ports.sendData()) + at : nullptr, n, divisor);
      if (sends) {
        group.syncWarp();  // every lane's stores before the first lane's release
        ports.publishSegment(group, s);
      }
    }
    return true;
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

// A rank's two FIFO ends as a device waits on them: every thread polls its own copy of the views
// until the slot is there, the FIFO is aborted or the group gives up; the leader alone publishes.
// What both protocols share: credit for a send slot, and returning a received one.
struct FifoEnds {
  FifoRecvView in;
  FifoSendView out;

  // A communicator's FIFOs outlive its calls: each end takes up its counters where the previous
  // call on it left them, the receiver its head, the sender its tail, each the only writer of
  // that word (so what it reads is its own last store, ordered before this call by the stream).
  // The barrier: every thread reads before the leader stores anything new, so all start alike.
  // An end a point-to-point block does not use has no words.
  template <class G>
  BRAID_HD void resume(G& group) {
    if (in.words != nullptr) in.head = in.tailSeen = loadRelaxed(in.words->head);
    if (out.words != nullptr) {
      out.tail = loadRelaxed(out.words->tail);
      out.headSeen = loadAcquire(out.words->head);
    }
    group.sync();
  }

  template <class G>
  BRAID_HD bool waitSend(G& group) {
    return waitFor(group, [&] { return out.tryAcquire() || out.aborted(); }) && !out.aborted();
  }
  template <class G>
  BRAID_HD void release(G& group) {
    in.release(group.index() == 0);
  }
  // Slot bytes of the end in use (a point-to-point block has one end).
  BRAID_HD size_t fifoSlotBytes() const {
    return out.words != nullptr ? out.slotBytes : in.slotBytes;
  }
};

// The Simple protocol: a slot's bytes, then its tail (a release store after the group's barrier).
struct FifoViewPorts : FifoEnds {
  static constexpr Arrival kArrival = Arrival::Tail;

  BRAID_HD size_t slotBytes() const { return fifoSlotBytes(); }
  template <class G>
  BRAID_HD bool waitRecv(G& group, size_t) {
    return waitFor(group, [&] { return in.tryWait() || in.aborted(); }) && !in.aborted();
  }
  BRAID_HD const void* recvSlot() const { return in.slot(); }
  BRAID_HD void* sendSlot() const { return out.slot(); }
  template <class G>
  BRAID_HD void post(G& group, size_t bytes) {
    out.post(group.index() == 0, bytes);
  }
};

// The low-latency protocol (NCCL's LL) over the same FIFO views, for small messages: a slot is
// 8-byte lines, each 4 bytes of data and a 4-byte flag (the slot's use number, tail + 1, never 0)
// stored as one word, so the receiver polls the lines themselves and no fence, tail store or
// round trip stands between the sender's stores and the receiver's loads. Half of a slot's bytes
// carry data. Slots are still returned through head (credit), as in Simple. A rank takes its send
// slot before it reads the slot it receives, so a ring needs two slots or more: with one, every
// FIFO can be full while every rank waits for credit.
struct LlPorts : FifoEnds {
  static constexpr Arrival kArrival = Arrival::LineFlags;
  static constexpr size_t kLinesPerPack = sizeof(Pack16) / sizeof(uint32_t);

  BRAID_HD size_t slotBytes() const { return fifoSlotBytes() / 2; }
  // The data of pack `pack` of the slot being received (`bytes` of it, at most 16), once every
  // line holds this slot use's flag.
  template <class G>
  BRAID_HD bool readLines(G& group, size_t pack, size_t bytes, Pack16& data) {
    auto* line =
        reinterpret_cast<uint64_t*>(const_cast<uint8_t*>(in.slot())) + pack * kLinesPerPack;
    const uint32_t flag = in.head + 1;
    const size_t lines = ceilDiv(bytes, sizeof(uint32_t));
    for (;;) {
      bool all = true;
      // Over the whole pack, unrolled: data stays in registers.
      BRAID_UNROLL
      for (size_t l = 0; l < kLinesPerPack; ++l) {
        if (l >= lines) continue;
        const uint64_t word = loadRelaxed(line[l]);
        all = all && static_cast<uint32_t>(word >> 32) == flag;
        data.word[l] = static_cast<uint32_t>(word);
      }
      if (all) return true;
      if (in.aborted() || !group.keepWaiting()) return false;
    }
  }
  BRAID_HD void writeLines(size_t pack, size_t bytes, const Pack16& data) {
    auto* line = reinterpret_cast<uint64_t*>(out.slot()) + pack * kLinesPerPack;
    const uint64_t flag = static_cast<uint64_t>(out.tail + 1) << 32;
    const size_t lines = ceilDiv(bytes, sizeof(uint32_t));
    // Over the whole pack, unrolled: data stays in registers.
    BRAID_UNROLL
    for (size_t l = 0; l < kLinesPerPack; ++l)
      if (l < lines) storeRelaxed(line[l], flag | data.word[l]);
  }
  // A network proxy that drains this FIFO (`used` set) sends what tail publishes: the leader
  // publishes the lines of the packs in use and tail as the Simple protocol does, and the lines
  // cross the network with their flags (net::LinkFormat).
  template <class G>
  BRAID_HD void post(G& group, size_t bytes) {
    if (out.used != nullptr)
      out.post(group.index() == 0,
               ceilDiv(bytes, sizeof(Pack16)) * kLinesPerPack * sizeof(uint64_t));
    else
      out.postFlagged(group.index() == 0);
  }
};

// The segmented protocol, for mid sizes: a slot is cut into segments of segmentBytes (on a device
// a warp's packs in flight: 32 lanes x kPacksInFlight x 16 bytes = 2 KiB), its data first, then a
// 4-byte flag per segment (segmentedSlotBytes). The warp that filled a segment meets at its warp
// barrier and its first lane stores the segment's flag (the slot's use number, tail + 1, never 0)
// with a release, as Simple's leader stores tail after the block's barrier; every lane of the
// receiving warp acquires the flag before it reads. So a segment moves on as soon as its warp has
// written it, with no block barrier, fence of the whole slot or tail round trip in between: the
// pipeline's grain is a warp's 2 KiB, not a slot, and 99.8% of the bytes are data. NCCL's LL128
// gets that grain from 128-byte lines that carry their flag, which relies on NVLink delivering a
// warp's 128-byte store whole; the release and acquire here rely on the memory model alone, so
// it also runs where that does not hold. Slots are returned through head, as in LL, and a ring
// needs two slots or more for the same reason.
struct SegmentPorts : FifoEnds {
  static constexpr Arrival kArrival = Arrival::SegmentFlags;
  size_t segmentBytes = 0;  // a multiple of 16

  BRAID_HD size_t segments() const { return fifoSlotBytes() / (segmentBytes + sizeof(uint32_t)); }
  BRAID_HD size_t slotBytes() const { return segments() * segmentBytes; }
  BRAID_HD const void* recvData() const { return in.slot(); }
  BRAID_HD void* sendData() const { return out.slot(); }
  // Every lane acquires segment s's flag itself (no lane's read then depends on another's).
  template <class G>
  BRAID_HD bool waitSegment(G& group, size_t s) {
    auto* flags = reinterpret_cast<uint32_t*>(const_cast<uint8_t*>(in.slot()) + slotBytes());
    const uint32_t flag = in.head + 1;
    return waitFor(group, [&] { return loadAcquire(flags[s]) == flag || in.aborted(); }) &&
           !in.aborted();
  }
  // After the warp's barrier: the warp's stores into segment s, then its flag.
  template <class G>
  BRAID_HD void publishSegment(G& group, size_t s) {
    auto* flags = reinterpret_cast<uint32_t*>(out.slot() + slotBytes());
    if (group.lane() == 0) storeRelease(flags[s], out.tail + 1);
  }
  template <class G>
  BRAID_HD void post(G& group, size_t) {
    out.postFlagged(group.index() == 0);
  }
};

// One primitive of the schedule over `op.count` elements. false: a wait gave up.
template <class M, class G, class P>
BRAID_HD bool runPrim(G& group, const M& move, P& ports, const RingOp& op,
                      const typename M::Storage* input, typename M::Storage* output, int divisor) {
  using T = typename M::Storage;
  // A flagged receiver waits for flags, not for tail: with none to wait for it would return the
  // slot before the sender filled it. Both ends see the same empty block (the schedule is the
  // same function on both), so neither counts a slot for it.
  if (P::kArrival != Arrival::Tail && op.count == 0) return true;
  const bool receives = primReceives(op.prim), sends = primSends(op.prim);
  const size_t bytes = op.count * sizeof(T);
  const T* src = primReadsInput(op.prim) ? input + op.inOffset : nullptr;
  T* dst = primWritesOutput(op.prim) ? output + op.outOffset : nullptr;
  if (op.prim == Prim::CopySend && src == dst) dst = nullptr;  // in place: already there
  const int finish = primFinishesReduction(op.prim) ? divisor : 1;
  bool ready;
  if constexpr (P::kArrival == Arrival::LineFlags) {
    ready = (!sends || ports.waitSend(group)) &&
            move.lowLatency(group, ports, receives, src, dst, sends, op.count, finish);
  } else if constexpr (P::kArrival == Arrival::SegmentFlags) {
    ready = (!sends || ports.waitSend(group)) &&
            move.segmented(group, ports, receives, src, dst, sends, op.count, finish);
  } else {
    ready = (!receives || ports.waitRecv(group, bytes)) && (!sends || ports.waitSend(group));
    if (ready)
      move(group, receives ? static_cast<const T*>(ports.recvSlot()) : nullptr, src, dst,
           sends ? static_cast<T*>(ports.sendSlot()) : nullptr, op.count, finish);
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
  // Chunks are whole 16-byte packs, so every block of a slot stays 16-byte aligned.
  const size_t packElems = sizeof(Pack16) / sizeof(T);
  const size_t chunk = ports.slotBytes() / sizeof(Pack16) * packElems;
  if (call.collective == Collective::Send || call.collective == Collective::Recv) {
    const Prim prim = call.collective == Collective::Send ? Prim::Send : Prim::Recv;
    for (size_t at = 0; at < call.count; at += chunk) {
      const RingOp op{prim, at, at, call.count - at < chunk ? call.count - at : chunk};
      if (!runPrim(group, move, ports, op, call.input, call.output, 1)) return false;
    }
    return true;
  }
  if (n == 1) {  // no peer: the result is this rank's input
    if (call.collective != Collective::Broadcast || call.rank == call.root)
      move(group, nullptr, call.input, call.output, nullptr, call.count, 1);
    group.sync();
    return true;
  }
  const int me = ringPosition(call.ringOrder, n, call.rank);
  int pos = me;
  if (call.collective == Collective::Broadcast)
    pos = modRanks(me - ringPosition(call.ringOrder, n, call.root), n);
  if (call.collective == Collective::Reduce)
    pos = modRanks(me - ringPosition(call.ringOrder, n, call.root) - 1, n);
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

// Where share `part` of `parts` of `count` elements begins (count at parts): on a 16-byte
// boundary. The ring's channels and the trees cut their shares so.
template <class T>
BRAID_HD size_t shareBegin(size_t count, int part, int parts) {
  const size_t packElems = sizeof(Pack16) / sizeof(T);
  if (part >= parts) return count;
  return count * static_cast<size_t>(part) / static_cast<size_t>(parts) / packElems * packElems;
}

// Channel `channel` of `nChannels` runs its share of the call: a contiguous part of every block,
// starting on a 16-byte boundary.
template <class M, class G, class P>
BRAID_HD bool runChannel(G& group, const M& move, const RingCall<typename M::Storage>& call,
                         int channel, int nChannels, P& ports) {
  using T = typename M::Storage;
  const size_t start = shareBegin<T>(call.count, channel, nChannels);
  const size_t end = shareBegin<T>(call.count, channel + 1, nChannels);
  RingCall<T> part = call;
  part.count = end - start;
  part.input = call.input + start;
  part.output = call.output + start;
  return runRing(group, move, part, ports);
}

// Whether a work list of reduction R (a ring's or a tree's) holds one call: Avg's division leaves
// no room for the loop over a list within the 128 registers a thread of a 512-thread block has
// (ptxas spilled 9 of its ring kernels, every protocol's of some datatypes), so its calls keep a
// launch each (coll/device_launch.h's runsInKernelOf).
template <class R>
constexpr bool kOneWorkPerList = R::kOperator == braidAvg;

// One call of a block's work list: the call (its ring order the block's channel's) and, for
// PreMulSum, the rank's scalar where the block reads it, or its value when `scale` is null.
template <class T>
struct RingWork {
  RingCall<T> call;
  const T* scale = nullptr;
  T scaleValue{};
};

// The device form: a block's work list, the calls of one rank run one after another on one channel
// (NCCL's work list: a group's collectives in one launch), each with element reduction R (with
// kPrescaled, PreMulSum's: each input element times its work's scalar, then Sum) over the FIFO
// views, with the Simple protocol (FifoViewPorts), the low-latency one (LlPorts) or the segmented
// one (SegmentPorts). The counters are taken up from the FIFO words once; from one call to the
// next every thread carries its own copy on, as from one step of a call to the next (each thread
// keeps the counters the leader stores), so no barrier stands between the calls. Calls that
// reduce and calls that only move (all-gather, broadcast) share a list: moving ignores R's
// operator. Avg's lists hold one call (kOneWorkPerList).
template <class R, bool kPrescaled = false, class G, class Ports>
BRAID_HD bool runWorksOnViews(G& group, const RingWork<typename R::Storage>* works, int nWorks,
                              const int* ringOrder, int channel, int nChannels, Ports ports) {
  // Avg: no loop at all, as before lists; no launch holds a longer list of it (checkLaunch in
  // coll/device_executor.cc refuses one; checking here too cost Avg's kernels 2 registers, which
  // some did not have).
  const int calls = kOneWorkPerList<R> ? 1 : nWorks;
  ports.resume(group);
  for (int w = 0; w < calls; ++w) {
    const RingWork<typename R::Storage>& work = works[w];
    RingCall<typename R::Storage> call = work.call;
    call.ringOrder = ringOrder;
    ElementMover<R, kPrescaled> move{};
    if constexpr (kPrescaled) move.scale = work.scale != nullptr ? *work.scale : work.scaleValue;
    if (!runChannel(group, move, call, channel, nChannels, ports)) return false;
  }
  return true;
}

// One call on the views: a work list of one.
template <class R, bool kPrescaled = false, class G, class Ports>
BRAID_HD bool runChannelOnViews(G& group, const RingCall<typename R::Storage>& call, int channel,
                                int nChannels, Ports ports, typename R::Storage scale = {}) {
  const RingWork<typename R::Storage> work{call, nullptr, scale};
  return runWorksOnViews<R, kPrescaled>(group, &work, 1, call.ringOrder, channel, nChannels, ports);
}

}  // namespace braid
