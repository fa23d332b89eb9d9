#include "coll/host_executor.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>

#include "coll/call_tag.h"
#include "core/error.h"
#include "kernels/host_reduce.h"

namespace braid {
namespace {

constexpr size_t kInPlaceStreamingFactor = 4;

struct Buffers {
  const uint8_t* in;
  uint8_t* out;
  size_t elemBytes;
  bool streamOut;    // the output is written with streaming stores
  bool streamSlots;  // FIFO slots are written with streaming stores (coll/slot_stores.h)
  const uint8_t* inAt(size_t elems) const { return in + elems * elemBytes; }
  uint8_t* outAt(size_t elems) const { return out + elems * elemBytes; }
};

// One primitive of the ring on one chunk. `toSlot` writes FIFO slots, `toOut` the output, each
// with the stores Buffers asks for. A prim that writes both streams at most one of them (the
// kernels stream their first destination only): the slot when slots stream.
void runPrim(const RingOp& op, const Buffers& buf, SendConnector& next, RecvConnector& prev,
             kernels::ReduceFn toSlot, kernels::ReduceFn toOut, int divisor, const CallTag& tag,
             Watchdog& dog) {
  const size_t bytes = op.count * buf.elemBytes;
  const void* received = primReceives(op.prim) ? receive(prev, tag, bytes, dog) : nullptr;
  void* slot = primSends(op.prim) ? next.acquire(dog) : nullptr;
  const int div = primFinishesReduction(op.prim) ? divisor : 1;
  uint8_t* out = buf.outAt(op.outOffset);
  const uint8_t* in = buf.inAt(op.inOffset);
  switch (op.prim) {
    case Prim::Send: kernels::copy2(slot, nullptr, in, bytes, buf.streamSlots); break;
    case Prim::CopySend:
      if (out != in) kernels::copy2(out, nullptr, in, bytes, buf.streamOut);
      kernels::copy2(slot, nullptr, in, bytes, buf.streamSlots);
      break;
    case Prim::RecvReduceSend: toSlot(slot, nullptr, received, in, op.count, 1); break;
    case Prim::RecvReduceCopySend:
      if (buf.streamSlots)
        toSlot(slot, out, received, in, op.count, div);
      else
        toOut(out, slot, received, in, op.count, div);
      break;
    case Prim::RecvCopySend:
      if (buf.streamSlots)
        kernels::copy2(slot, out, received, bytes, true);
      else
        kernels::copy2(out, slot, received, bytes, buf.streamOut);
      break;
    case Prim::Recv: kernels::copy2(out, nullptr, received, bytes, buf.streamOut); break;
    case Prim::RecvReduceCopy: toOut(out, nullptr, received, in, op.count, div); break;
  }
  if (slot != nullptr) {
    if (buf.streamSlots) kernels::streamFence();  // the data before the post that publishes it
    next.post(bytes, tag);
  }
  if (received != nullptr) prev.release();
}

void sendTagOnly(SendConnector& to, const CallTag& tag, Watchdog& dog) {
  to.acquire(dog);
  to.post(0, tag);
}

void receiveTagOnly(RecvConnector& from, const CallTag& tag, Watchdog& dog) {
  receive(from, tag, 0, dog);
  from.release();
}

int ringPosition(const CollContext& ctx, int rank) {
  return static_cast<int>(std::find(ctx.ringOrder.begin(), ctx.ringOrder.end(), rank) -
                          ctx.ringOrder.begin());
}

void runRing(CollContext& ctx, const CollArgs& a, const CallTag& tag) {
  const int n = ctx.nranks;
  const size_t elemBytes = kernels::typeSize(a.type);
  const int myPos = ringPosition(ctx, ctx.rank);
  int pos = myPos;
  // Broadcast and Reduce run along the chain that starts at (Bcast) or after (Reduce) the root.
  if (a.coll == Collective::Broadcast) pos = modRanks(myPos - ringPosition(ctx, a.root), n);
  if (a.coll == Collective::Reduce) pos = modRanks(myPos - ringPosition(ctx, a.root) - 1, n);
  SendConnector& next = ctx.sendTo[ctx.ringOrder[modRanks(myPos + 1, n)]];
  RecvConnector& prev = ctx.recvFrom[ctx.ringOrder[modRanks(myPos - 1, n)]];

  const size_t chunk = next.slotBytes() / elemBytes;
  const size_t alignElems = std::max<size_t>(1, 64 / elemBytes);
  const size_t outBytes = a.count * elemBytes * (a.coll == Collective::AllGather ? n : 1);
  // In place, the output is the input: streaming stores would evict the buffer its next reader
  // (the caller's next step, an optimizer) finds cached while it is small enough. Measured with 2
  // ranks here: in place streaming loses up to 16 MiB (8 vs 16 GB/s at 8 MiB), out of place it
  // wins from 8 MiB (13 vs 8).
  const auto* out = static_cast<const uint8_t*>(a.recvbuff);
  const auto* in = static_cast<const uint8_t*>(a.sendbuff);
  const bool inPlace = in >= out && in < out + outBytes;
  const bool streamOut =
      outBytes >= ctx.streamingMinBytes * (inPlace ? kInPlaceStreamingFactor : 1);
  const SlotStores slotStores =
      ctx.slotStores != nullptr ? ctx.slotStores->choose(outBytes) : SlotStores::kCached;
  const bool streamSlots = slotStores == SlotStores::kStreaming;
  const Buffers buf{static_cast<const uint8_t*>(a.sendbuff), static_cast<uint8_t*>(a.recvbuff),
                    elemBytes, streamOut, streamSlots};
  const kernels::ReduceFn toSlot = kernels::reduceFn(a.type, a.op, streamSlots);
  const kernels::ReduceFn toOut = kernels::reduceFn(a.type, a.op, streamOut);
  const int divisor = a.op == braidAvg ? n : 1;
  const size_t loops = ringLoops(a.coll, n, a.count, chunk);
  const int steps = ringSteps(a.coll, n);
  const auto start = std::chrono::steady_clock::now();
  for (size_t loop = 0; loop < loops; ++loop)
    for (int step = 0; step < steps; ++step)
      runPrim(ringOp(a.coll, n, pos, a.count, chunk, alignElems, loop, step, ctx.ringOrder.data()),
              buf, next, prev, toSlot, toOut, divisor, tag, *ctx.dog);
  if (streamOut) kernels::streamFence();
  if (ctx.slotStores != nullptr)
    ctx.slotStores->record(
        outBytes, slotStores,
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
}

// Small all-reduce in one exchange: every rank sends its input to every peer, then reduces all
// inputs in rank order, so every rank computes the identical result.
void runDirectAllReduce(CollContext& ctx, const CollArgs& a, const CallTag& tag) {
  const kernels::ReduceFn reduce = kernels::reduceFn(a.type, a.op);
  const int n = ctx.nranks;
  const size_t bytes = a.count * kernels::typeSize(a.type);
  const void* own = a.sendbuff;
  // In place, the output is written before this rank's own input is consumed when rank >= 2.
  if (a.sendbuff == a.recvbuff && ctx.rank >= 2) {
    std::memcpy(ctx.scratch, a.sendbuff, bytes);
    own = ctx.scratch;
  }
  for (int i = 1; i < n; ++i) {
    SendConnector& to = ctx.sendTo[(ctx.rank + i) % n];
    std::memcpy(to.acquire(*ctx.dog), a.sendbuff, bytes);
    to.post(bytes, tag);
  }
  auto input = [&](int r) {
    return r == ctx.rank ? own : receive(ctx.recvFrom[r], tag, bytes, *ctx.dog);
  };
  const int divisor = a.op == braidAvg ? n : 1;
  const void* first = input(0);
  reduce(a.recvbuff, nullptr, first, input(1), a.count, n == 2 ? divisor : 1);
  for (int r = 2; r < n; ++r)
    reduce(a.recvbuff, nullptr, a.recvbuff, input(r), a.count, r == n - 1 ? divisor : 1);
  for (int r = 0; r < n; ++r)
    if (r != ctx.rank) ctx.recvFrom[r].release();
}

void runSingleRank(const CollArgs& a) {
  const size_t bytes = a.count * kernels::typeSize(a.type);
  const bool movesData = a.coll != Collective::Send && a.coll != Collective::Recv &&
                         a.coll != Collective::Gather && a.coll != Collective::Scatter;
  if (!movesData || bytes == 0) return;
  if (a.sendbuff != a.recvbuff) std::memmove(a.recvbuff, a.sendbuff, bytes);
}

}  // namespace

void runCollective(CollContext& ctx, const CollArgs& a) {
  if (ctx.nranks == 1) return runSingleRank(a);
  const CallTag tag = callTag(a, ctx.sequence);
  // Each rank checks its ring predecessor's call from the first slot it receives. Where that slot
  // may never come, the ranks first pass their tags round the ring: with nothing to move, and in
  // a chain (Broadcast, Reduce), whose first rank receives nothing and whose ranks could each
  // believe themselves its first (a root mismatch), every one then waiting for credit. Gather
  // and Scatter are nothing but that pass here (their data moves as sends and receives after it):
  // ranks that disagree on the root would otherwise wait for messages that never come.
  const bool chain = a.coll == Collective::Broadcast || a.coll == Collective::Reduce;
  const bool agreementOnly = a.coll == Collective::Gather || a.coll == Collective::Scatter;
  if (a.count == 0 || chain || agreementOnly) {
    const int pos = ringPosition(ctx, ctx.rank);
    sendTagOnly(ctx.sendTo[ctx.ringOrder[modRanks(pos + 1, ctx.nranks)]], tag, *ctx.dog);
    receiveTagOnly(ctx.recvFrom[ctx.ringOrder[modRanks(pos - 1, ctx.nranks)]], tag, *ctx.dog);
  }
  if (a.count == 0 || agreementOnly) return;
  const size_t bytes = a.count * kernels::typeSize(a.type);
  if (a.coll == Collective::AllReduce && bytes <= ctx.directMaxBytes)
    return runDirectAllReduce(ctx, a, tag);
  runRing(ctx, a, tag);
}

namespace {

struct Transfer {
  bool isSend;
  int peer;
  uint8_t* buffer;  // const for sends; the executor never writes through it then
  size_t bytes;
  CallTag tag;
  size_t done = 0;
  bool finished() const { return done == bytes; }
};

// Moves as many chunks as the FIFO allows without waiting; returns whether anything moved.
bool progress(CollContext& ctx, Transfer& t) {
  bool moved = false;
  while (!t.finished()) {
    if (t.isSend) {
      SendConnector& to = ctx.sendTo[t.peer];
      void* slot = to.tryAcquire();
      if (slot == nullptr) break;
      const size_t n = std::min(to.slotBytes(), t.bytes - t.done);
      std::memcpy(slot, t.buffer + t.done, n);
      to.post(n, t.tag);
      t.done += n;
    } else {
      RecvConnector& from = ctx.recvFrom[t.peer];
      const size_t n = std::min(from.slotBytes(), t.bytes - t.done);
      const void* slot = tryReceive(from, t.tag, n);
      if (slot == nullptr) break;
      std::memcpy(t.buffer + t.done, slot, n);
      from.release();
      t.done += n;
    }
    moved = true;
  }
  return moved;
}

// Sends to self are matched with receives from self in issue order.
void runSelfTransfers(CollContext& ctx, std::vector<Transfer>& sends,
                      std::vector<Transfer>& recvs) {
  if (sends.size() != recvs.size())
    fail(braidInvalidUsage, "rank {}: a group has {} sends to self but {} receives from self",
         ctx.rank, sends.size(), recvs.size());
  for (size_t i = 0; i < sends.size(); ++i) {
    if (sends[i].bytes != recvs[i].bytes)
      fail(braidInvalidUsage,
           "rank {}: send to self #{} carries {} bytes but the matching receive expects {}",
           ctx.rank, i, sends[i].bytes, recvs[i].bytes);
    std::memmove(recvs[i].buffer, sends[i].buffer, sends[i].bytes);
  }
}

}  // namespace

void runSendRecv(CollContext& ctx, std::span<const CollArgs> ops) {
  std::vector<Transfer> transfers, selfSends, selfRecvs;
  for (const CollArgs& op : ops) {
    const size_t bytes = op.count * kernels::typeSize(op.type);
    const bool isSend = op.coll == Collective::Send;
    auto* buffer = static_cast<uint8_t*>(isSend ? const_cast<void*>(op.sendbuff) : op.recvbuff);
    Transfer t{isSend, op.root, buffer, bytes, callTag(op, 0)};
    if (bytes == 0) continue;
    if (op.root == ctx.rank)
      (isSend ? selfSends : selfRecvs).push_back(t);
    else
      transfers.push_back(t);
  }
  runSelfTransfers(ctx, selfSends, selfRecvs);

  int idleRounds = 0;
  for (;;) {
    bool moved = false, pending = false;
    int waitingOn = -1;
    for (size_t i = 0; i < transfers.size(); ++i) {
      Transfer& t = transfers[i];
      if (t.finished()) continue;
      pending = true;
      waitingOn = t.peer;
      // Only the oldest unfinished transfer per (peer, direction) may move: FIFO order.
      bool blocked = false;
      for (size_t j = 0; j < i && !blocked; ++j)
        blocked = !transfers[j].finished() && transfers[j].peer == t.peer &&
                  transfers[j].isSend == t.isSend;
      if (!blocked) moved |= progress(ctx, t);
    }
    if (!pending) return;
    if (moved) {
      idleRounds = 0;
      continue;
    }
    // Nothing moved: back off (spin, yield, then short sleeps), asking the watchdog regularly.
    ++idleRounds;
    if (idleRounds < 2000) {
      cpuRelax();
    } else if (idleRounds < 2200) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(50));
      if (idleRounds % 64 == 0) ctx.dog->poll(waitingOn, "send/recv");
    }
  }
}

}  // namespace braid
