#include "coll/host_executor.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstring>
#include <thread>

#include "base/error.h"
#include "coll/call_tag.h"
#include "coll/host_bruck.h"
#include "coll/host_channels.h"
#include "coll/host_engine_policies.h"
#include "coll/host_recursive.h"
#include "coll/host_tree.h"
#include "coll/ring_call.h"
#include "coll/ring_engine.h"
#include "kernels/host_reduce.h"

namespace braid {
namespace {

constexpr size_t kInPlaceStreamingFactor = 4;

void sendTagOnly(SendConnector& to, const CallTag& tag, Watchdog& dog) {
  to.acquire(dog);
  to.post(0, tag);
}

void receiveTagOnly(RecvConnector& from, const CallTag& tag, Watchdog& dog) {
  receive(from, tag, 0, dog);
  from.release();
}

// The ring channel `channel` of `nChannels` (its share of every block) over `sendTo`/`recvFrom`.
template <class T>
void runRingChannel(const CollContext& ctx, const SimdMover<T>& move, const RingCall<T>& call,
                    const CallTag& tag, const HostChannel& links, int channel, int nChannels) {
  const int n = ctx.nranks;
  const int myPos = ringPosition(ctx.ringOrder.data(), n, ctx.rank);
  SendConnector& next = *links.sendTo[ctx.ringOrder[modRanks(myPos + 1, n)]];
  RecvConnector& prev = *links.recvFrom[ctx.ringOrder[modRanks(myPos - 1, n)]];
  ConnectorPorts ports{&prev, &next, &tag, links.dog, move.streamSlots};
  OneThread thread;
  runChannel(thread, move, call, channel, nChannels, ports);
  if (move.streamOutput) kernels::streamFence();  // this thread's streaming stores
}

template <class T>
void runRingAs(CollContext& ctx, const CollArgs& a, const CallTag& tag) {
  const int n = ctx.nranks;
  const size_t outBytes = a.count * sizeof(T) * (a.coll == Collective::AllGather ? n : 1);
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
  const SimdMover<T> move{kernels::reduceFn(a.type, a.op, streamSlots),
                          kernels::reduceFn(a.type, a.op, streamOut), streamSlots, streamOut};
  const RingCall<T> call = ringCallOf<T>(a, n, ctx.rank, ctx.ringOrder.data());
  const auto start = std::chrono::steady_clock::now();
  const HostChannel first{ctx.sendTo, ctx.recvFrom, ctx.dog};
  if (ctx.moreChannels.empty() || outBytes < ctx.channelMinBytes) {
    runRingChannel(ctx, move, call, tag, first, 0, 1);
  } else {
    std::vector<Watchdog*> dogs{ctx.dog};
    for (const HostChannel& c : ctx.moreChannels) dogs.push_back(c.dog);
    runOnChannels(dogs, [&](int channel, Watchdog& dog) {
      HostChannel links = channel == 0 ? first : ctx.moreChannels[channel - 1];
      links.dog = &dog;
      runRingChannel(ctx, move, call, tag, links, channel, static_cast<int>(dogs.size()));
    });
  }
  if (ctx.slotStores != nullptr)
    ctx.slotStores->record(
        outBytes, slotStores,
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
}

// The ring engine (coll/ring_engine.h) on this thread, instantiated per element size.
void runRing(CollContext& ctx, const CollArgs& a, const CallTag& tag) {
  switch (kernels::typeSize(a.type)) {
    case 1: return runRingAs<uint8_t>(ctx, a, tag);
    case 2: return runRingAs<uint16_t>(ctx, a, tag);
    case 4: return runRingAs<uint32_t>(ctx, a, tag);
    case 8: return runRingAs<uint64_t>(ctx, a, tag);
    default:
      fail(braidInternalError, "rank {}: no ring for elements of {} bytes", ctx.rank,
           kernels::typeSize(a.type));
  }
}

// Small all-reduce in one exchange: every rank sends its input to every peer, then reduces all
// inputs in rank order, so every rank computes the identical result. An input larger than a slot
// goes as slot-sized pieces, all posted before any is received (the caller's directMaxBytes keeps
// them within a FIFO, so posting never waits for a peer), and each piece is reduced as it arrives
// while the next ones are still on the way. A link whose reader can send from this rank's memory
// (a network proxy) takes the pieces where they lie, not copied into its slots: one pass less
// over the data, which on few cores is time (2 hosts, 512 KiB over sockets: 152-156 -> 142-148 us).
// The pieces are then this rank's until sent: it waits for that before it overwrites one (in
// place) or returns.
void runDirectAllReduce(CollContext& ctx, const CollArgs& a, const CallTag& tag) {
  const kernels::ReduceFn reduce = kernels::reduceFn(a.type, a.op);
  const int n = ctx.nranks;
  const size_t elemBytes = kernels::typeSize(a.type);
  const size_t bytes = a.count * elemBytes;
  const size_t pieceBytes = ctx.sendTo[(ctx.rank + 1) % n]->slotBytes() / elemBytes * elemBytes;
  const auto* own = static_cast<const uint8_t*>(a.sendbuff);
  auto* out = static_cast<uint8_t*>(a.recvbuff);
  // In place, the output is written before this rank's own input is consumed when rank >= 2.
  if (a.sendbuff == a.recvbuff && ctx.rank >= 2) {
    std::memcpy(ctx.scratch, a.sendbuff, bytes);
    own = static_cast<const uint8_t*>(ctx.scratch);
  }
  for (size_t at = 0; at < bytes; at += pieceBytes)
    for (int i = 1; i < n; ++i) {
      SendConnector& to = *ctx.sendTo[(ctx.rank + i) % n];
      const size_t piece = std::min(pieceBytes, bytes - at);
      if (to.postsFromPlace()) {
        to.postFrom(own + at, piece, tag, *ctx.dog);
      } else {
        std::memcpy(to.acquire(*ctx.dog), own + at, piece);
        to.post(piece, tag);
      }
    }
  // Waits until the first `sent` pieces have gone on every link that took them where they lie.
  // Each link's last `pieces` slots are this call's.
  const size_t pieces = (bytes + pieceBytes - 1) / pieceBytes;
  auto awaitSent = [&](size_t sent) {
    for (int r = 0; r < n; ++r)
      if (r != ctx.rank && ctx.sendTo[r]->postsFromPlace())
        ctx.sendTo[r]->awaitTaken(ctx.sendTo[r]->posted() - static_cast<uint32_t>(pieces - sent),
                                  *ctx.dog);
  };
  const int divisor = a.op == braidAvg ? n : 1;
  for (size_t at = 0, k = 0; at < bytes; at += pieceBytes, ++k) {
    const size_t piece = std::min(pieceBytes, bytes - at);
    const size_t count = piece / elemBytes;
    auto input = [&](int r) {
      return r == ctx.rank ? own + at : receive(*ctx.recvFrom[r], tag, piece, *ctx.dog);
    };
    const void* first = input(0);
    const void* second = input(1);
    if (own == out) awaitSent(k + 1);
    reduce(out + at, nullptr, first, second, count, n == 2 ? divisor : 1);
    for (int r = 2; r < n; ++r)
      reduce(out + at, nullptr, out + at, input(r), count, r == n - 1 ? divisor : 1);
    for (int r = 0; r < n; ++r)
      if (r != ctx.rank) ctx.recvFrom[r]->release();
  }
  awaitSent(pieces);
}

void runSingleRank(const CollArgs& a) {
  const size_t bytes = a.count * kernels::typeSize(a.type);
  const bool movesData = a.coll != Collective::Send && a.coll != Collective::Recv &&
                         a.coll != Collective::Gather && a.coll != Collective::Scatter;
  if (!movesData || bytes == 0) return;
  if (a.sendbuff != a.recvbuff) std::memmove(a.recvbuff, a.sendbuff, bytes);
}

// Whether a broadcast or reduce of `bytes` runs on the trees (the communicator's model chose them).
bool rootedOnTree(const CollContext& ctx, const CollArgs& a, size_t bytes) {
  if (a.coll == Collective::Broadcast) return ctx.broadcastOnTree[sizeClass(bytes)];
  if (a.coll == Collective::Reduce) return ctx.reduceOnTree[sizeClass(bytes)];
  return false;
}

// `bytes` is a rank's block; the tables count the gathered output (the scattered input).
bool onBruck(const CollContext& ctx, const CollArgs& a, size_t bytes) {
  const size_t all = bytes * static_cast<size_t>(ctx.nranks);
  if (a.coll == Collective::AllGather) return ctx.allGatherBruck[sizeClass(all)];
  if (a.coll == Collective::ReduceScatter) return ctx.reduceScatterBruck[sizeClass(all)];
  return false;
}

}  // namespace

void runCollective(CollContext& ctx, const CollArgs& a) {
  if (ctx.nranks == 1) return runSingleRank(a);
  const CallTag tag = callTag(a, ctx.sequence, ctx.commIdentity);
  if (ctx.self != nullptr) publishCall(*ctx.self, tag);
  const size_t bytes = a.count * kernels::typeSize(a.type);
  // Each rank checks its ring predecessor's call from the first slot it receives. Where that slot
  // may never come, the ranks first pass their tags round the ring: with nothing to move, and in
  // a chain (Broadcast, Reduce), whose first rank receives nothing and whose ranks could each
  // believe themselves its first (a root mismatch), every one then waiting for credit; on the
  // trees, which different roots would draw apart. The pass costs one handoff: every rank sends
  // before it waits. Gather and Scatter are nothing but that pass here (their data moves as sends
  // and receives after it): ranks that disagree on the root would otherwise wait for messages that
  // never come.
  const bool chain = a.coll == Collective::Broadcast || a.coll == Collective::Reduce;
  const bool agreementOnly = a.coll == Collective::Gather || a.coll == Collective::Scatter;
  if (a.count == 0 || chain || agreementOnly) {
    const int pos = ringPosition(ctx.ringOrder.data(), ctx.nranks, ctx.rank);
    sendTagOnly(*ctx.sendTo[ctx.ringOrder[modRanks(pos + 1, ctx.nranks)]], tag, *ctx.dog);
    receiveTagOnly(*ctx.recvFrom[ctx.ringOrder[modRanks(pos - 1, ctx.nranks)]], tag, *ctx.dog);
  }
  if (a.count == 0 || agreementOnly) return;
  if (rootedOnTree(ctx, a, bytes)) return runTreeCollective(ctx, a, tag);
  if (onBruck(ctx, a, bytes))
    return a.coll == Collective::AllGather ? runBruckAllGather(ctx, a, tag)
                                           : runBruckReduceScatter(ctx, a, tag);
  if (a.coll == Collective::AllReduce) {
    const HostAllReduceChoice choice = ctx.allReduce[sizeClass(bytes)];
    switch (choice.algorithm) {
      case HostAllReduce::OneShot:
        if (bytes <= ctx.directMaxBytes) return runDirectAllReduce(ctx, a, tag);
        break;
      case HostAllReduce::Doubling: return runRecursiveAllReduce(ctx, a, tag, 0);
      case HostAllReduce::Halving: return runRecursiveAllReduce(ctx, a, tag, choice.halvingLevels);
      case HostAllReduce::Tree: return runTreeCollective(ctx, a, tag);
      case HostAllReduce::HierDoubling: return runHierarchicalAllReduce(ctx, a, tag, 0);
      case HostAllReduce::HierHalving:
        return runHierarchicalAllReduce(ctx, a, tag, choice.halvingLevels);
      case HostAllReduce::Ring: break;
    }
  }
  runRing(ctx, a, tag);
}

size_t sizeClass(size_t bytes) {
  return bytes <= 1 ? 0
                    : std::min<size_t>(std::bit_width(bytes - 1), HostAllReduceTable{}.size() - 1);
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
      SendConnector& to = *ctx.sendTo[t.peer];
      void* slot = to.tryAcquire();
      if (slot == nullptr) break;
      const size_t n = std::min(to.slotBytes(), t.bytes - t.done);
      std::memcpy(slot, t.buffer + t.done, n);
      to.post(n, t.tag);
      t.done += n;
    } else {
      RecvConnector& from = *ctx.recvFrom[t.peer];
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
    Transfer t{isSend, op.root, buffer, bytes, callTag(op, 0, ctx.commIdentity)};
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
