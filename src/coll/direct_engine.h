// Direct (all-pairs) all-reduce, reduce-scatter and all-gather, for ranks that reach each other's
// buffers: ranks sharing one GPU, GPUs behind an NVSwitch. Every rank reads every peer's input
// itself and writes results straight into the outputs: one step where a ring takes 2(n-1) steps,
// and no FIFO in between. Two barriers bracket the call: before it, every rank's input is ready
// and its output free (the peers' streams reached the call); after it, no rank goes on while
// others still read its input or write its output. The same thread-group policy as the ring
// engine (coll/ring_engine.h), so it runs as a CUDA block per channel or as CPU threads in tests.
#pragma once

#include <cstddef>
#include <cstdint>

#include "coll/ring_engine.h"

namespace braid {

// One rank's arrivals at a channel's barrier, on a line of its own (one writer, n readers), the
// signature of the call it arrived for (stored before the count it publishes), and whether one of
// its calls stopped short: its count then no longer matches its peers', and its later calls
// (queued before the host saw the failure) must keep out.
struct alignas(64) DirectArrival {
  uint32_t count = 0;
  uint32_t broken = 0;
  uint64_t call = 0;
};

// A channel's barrier as one rank sees it. Every thread of the group keeps its own copy and
// counts along; the leader stores and waits.
struct DirectBarrier {
  DirectArrival* arrivals = nullptr;  // one per rank, shared by the ranks of the channel
  const uint32_t* abort = nullptr;    // the host sets it to stop every wait (may be null)
  // What this rank's call is, as every rank's host computes it alike (collective, datatype,
  // operator, count and, for ranks launched apart, where in their windows the buffers lie): the
  // call's first arrival compares it with every peer's before anything is read or written, since
  // a peer making another call would have its buffers read at the wrong place.
  uint64_t signature = 0;
  uint32_t arrived = 0;  // this rank's arrivals so far (resume() reads them)
  bool differs = false;  // a peer's signature was other than this rank's

  // The barrier words outlive the calls: the rank takes up its count where the previous call left
  // it (its own last stores, earlier on its stream); every thread reads before the leader stores
  // again. false: an earlier call of this rank stopped short, so this one must not arrive.
  template <class G>
  BRAID_HD bool resume(G& group, int rank) {
    arrived = loadRelaxed(arrivals[rank].count);
    const bool broken = loadRelaxed(arrivals[rank].broken) != 0;
    group.sync();
    return !broken;
  }

  // This rank's call stopped short: its later calls keep out (resume).
  template <class G>
  BRAID_HD void breakOff(G& group, int rank) {
    if (group.index() == 0) storeRelaxed(arrivals[rank].broken, 1u);
  }

  // Every thread's stores are ordered before the leader's release (the group's barrier), and
  // every peer's stores before this group's loads (the leader's acquire, then the barrier). With
  // `compare` (the call's first arrival) the leader also compares signatures: a peer cannot store
  // its next call's before this rank arrives again, so the one it reads is this call's.
  // false: the wait gave up (abort or the group's deadline) or a signature differed, for every
  // thread of the group.
  template <class G>
  BRAID_HD bool arriveAndWait(G& group, int rank, int nranks, bool compare) {
    ++arrived;
    group.sync();
    bool ok = true;
    if (group.index() == 0) {
      if (compare) storeRelaxed(arrivals[rank].call, signature);
      storeRelease(arrivals[rank].count, arrived);
      for (int peer = 0; peer < nranks && ok; ++peer) {
        ok = waitFor(group,
                     [&] {
                       return static_cast<int32_t>(loadAcquire(arrivals[peer].count) - arrived) >=
                                  0 ||
                              (abort != nullptr && loadAcquire(*const_cast<uint32_t*>(abort)) != 0);
                     }) &&
             (abort == nullptr || loadAcquire(*const_cast<uint32_t*>(abort)) == 0);
        if (ok && compare && loadRelaxed(arrivals[peer].call) != signature) {
          differs = true;
          ok = false;
        }
      }
    }
    const bool failed = group.any(!ok);
    if (failed && compare) differs = group.any(differs);  // every thread of the group knows
    return !failed;
  }
};

// Where one rank stands in a direct collective.
template <class T>
struct DirectCall {
  Collective collective;  // AllReduce, ReduceScatter or AllGather
  int nranks;
  int rank;
  const T* const* inputs;  // every rank's input (nccl.h's sendbuff), by rank
  T* const* outputs;       // every rank's output (recvbuff), by rank
  const T* scales;         // PreMulSum: every rank's scalar, by rank; else null
  size_t count;            // nccl.h's count (recvcount, sendcount)
  int divisor;             // Avg: nranks; else 1
};

// Element `i` of rank `peer`'s input as the reduction sees it (times that rank's scalar for a
// PreMulSum operator).
template <class R, bool kPrescaled, class T>
BRAID_HD T directInput(const DirectCall<T>& call, int peer, size_t i) {
  return prescaled<R, kPrescaled>(call.inputs[peer][i], kPrescaled ? call.scales[peer] : T{});
}

// Combines the packs x of rank p's input into acc; kFirst (rank 0): acc becomes them.
template <class R, bool kPrescaled, bool kFirst, int kPacks, class T>
BRAID_HD void directCombine(const DirectCall<T>& call, int p, const Pack16 (&x)[kPacks],
                            T (&acc)[kPacks][sizeof(Pack16) / sizeof(T)]) {
  constexpr size_t kPerPack = sizeof(Pack16) / sizeof(T);
  const T scale = kPrescaled ? call.scales[p] : T{};
  const int divisor = p == call.nranks - 1 ? call.divisor : 1;
  BRAID_UNROLL
  for (int u = 0; u < kPacks; ++u) {
    T next[kPerPack];
    memcpy(next, &x[u], sizeof x[u]);
    BRAID_UNROLL
    for (size_t k = 0; k < kPerPack; ++k) {
      const T v = prescaled<R, kPrescaled>(next[k], scale);
      acc[u][k] = kFirst ? v : R::apply(acc[u][k], v, divisor);
    }
  }
}

// Rank p's packs of the reduction below, and rank p + 1's where `pair`: every load issued before
// the first is used (2 x kPacks in flight per thread), then combined into acc in rank order.
template <class R, bool kPrescaled, int kPacks, class T>
BRAID_HD void directPair(const DirectCall<T>& call, size_t inAt, size_t pk, size_t stride, int p,
                         bool pair, T (&acc)[kPacks][sizeof(Pack16) / sizeof(T)]) {
  constexpr size_t kPerPack = sizeof(Pack16) / sizeof(T);
  Pack16 x[kPacks], y[kPacks];
  BRAID_UNROLL
  for (int u = 0; u < kPacks; ++u) {
    x[u] = load16(call.inputs[p] + inAt + (pk + u * stride) * kPerPack);
    if (pair) y[u] = load16(call.inputs[p + 1] + inAt + (pk + u * stride) * kPerPack);
  }
  if (p == 0)
    directCombine<R, kPrescaled, true>(call, p, x, acc);
  else
    directCombine<R, kPrescaled, false>(call, p, x, acc);
  if (pair) directCombine<R, kPrescaled, false>(call, p + 1, y, acc);
}

// kPacks whole packs of the reduction below, `stride` packs apart from pack pk: the ranks' inputs
// two at a time, combined in rank order, then stored.
template <class R, bool kPrescaled, int kPacks, class T>
BRAID_HD void directPacks(const DirectCall<T>& call, size_t inAt, size_t outAt, size_t pk,
                          size_t stride, int firstOut, int lastOut) {
  constexpr size_t kPerPack = sizeof(Pack16) / sizeof(T);
  const int n = call.nranks;
  T acc[kPacks][kPerPack];
  for (int p = 0; p < n; p += 2)
    directPair<R, kPrescaled, kPacks>(call, inAt, pk, stride, p, p + 1 < n, acc);
  BRAID_UNROLL
  for (int u = 0; u < kPacks; ++u) {
    Pack16 result;
    memcpy(&result, acc[u], sizeof result);
    for (int q = firstOut; q < lastOut; ++q)
      store16(call.outputs[q] + outAt + (pk + u * stride) * kPerPack, result);
  }
}

// outputs[q][outAt + i] for every q in [firstOut, lastOut) = the reduction over every rank's
// input at inAt + i, for i in [0, count): this thread's share, 16 bytes at a time where every
// pointer allows it (kPacksInFlight packs per round trip), the ranks' inputs combined in rank
// order.
template <class R, bool kPrescaled, class G, class T>
BRAID_HD void directReduce(G& group, const DirectCall<T>& call, size_t inAt, size_t outAt,
                           size_t count, int firstOut, int lastOut) {
  constexpr size_t kPerPack = sizeof(Pack16) / sizeof(T);
  const int n = call.nranks;
  bool packed = true;
  for (int p = 0; p < n; ++p) packed = packed && aligned16(call.inputs[p] + inAt);
  for (int q = firstOut; q < lastOut; ++q) packed = packed && aligned16(call.outputs[q] + outAt);
  const size_t first = static_cast<size_t>(group.index()), stride = group.size();
  const size_t packs = packed ? count / kPerPack : 0;
  size_t pk = first;
  for (; pk + (kPacksInFlight - 1) * stride < packs; pk += kPacksInFlight * stride)
    directPacks<R, kPrescaled, kPacksInFlight>(call, inAt, outAt, pk, stride, firstOut, lastOut);
  for (; pk < packs; pk += stride)
    directPacks<R, kPrescaled, 1>(call, inAt, outAt, pk, stride, firstOut, lastOut);
  for (size_t i = packs * kPerPack + first; i < count; i += stride) {
    T acc = directInput<R, kPrescaled>(call, 0, inAt + i);
    for (int p = 1; p < n; ++p)
      acc = R::apply(acc, directInput<R, kPrescaled>(call, p, inAt + i),
                     p == n - 1 ? call.divisor : 1);
    for (int q = firstOut; q < lastOut; ++q) call.outputs[q][outAt + i] = acc;
  }
}

// This rank's share of the call, elements [begin, begin + count) of its block (all-reduce) or of
// every rank's (reduce-scatter, all-gather), read from the inputs and written to the outputs.
template <class R, bool kPrescaled, class G, class T>
BRAID_HD void directMove(G& group, const DirectCall<T>& call, size_t begin, size_t count) {
  const int n = call.nranks;
  switch (call.collective) {
    case Collective::AllReduce:  // this rank's block, reduced once, into every rank's output
      directReduce<R, kPrescaled>(group, call, begin, begin, count, 0, n);
      break;
    case Collective::ReduceScatter:  // block `rank` of every input, into this rank's output
      directReduce<R, kPrescaled>(group, call, call.rank * call.count + begin, begin, count,
                                  call.rank, call.rank + 1);
      break;
    default:  // AllGather: every rank's input, into this rank's output
      for (int p = 0; p < n; ++p) {
        // In place this rank's own block is there already, and peers read it: no write.
        if (call.inputs[p] == call.outputs[call.rank] + p * call.count) continue;
        const DirectCall<T> one{call.collective,          1,       0,          call.inputs + p,
                                call.outputs + call.rank, nullptr, call.count, 1};
        directReduce<R, false>(group, one, begin, p * call.count + begin, count, 0, 1);
      }
  }
}

// Channel `channel` of `nChannels` runs its share of the call (a contiguous part of each block,
// cut on 16-byte boundaries), between the two barriers. false: a barrier gave up, an earlier call
// of this rank stopped short, or (then barrier.differs, and nothing was read or written) a peer
// arrived for another call; the rank's later calls then keep out.
template <class R, bool kPrescaled = false, class G, class T>
BRAID_HD bool runDirect(G& group, const DirectCall<T>& call, int channel, int nChannels,
                        DirectBarrier& barrier) {
  if (!barrier.resume(group, call.rank)) return false;
  const int n = call.nranks;
  constexpr size_t kPerPack = sizeof(Pack16) / sizeof(T);
  auto cut = [](size_t total, size_t part, size_t parts) {
    return part == parts ? total : total * part / parts / kPerPack * kPerPack;
  };
  const size_t total = call.collective == Collective::AllReduce
                           ? cut(call.count, call.rank + 1, n) - cut(call.count, call.rank, n)
                           : call.count;
  const size_t base =
      call.collective == Collective::AllReduce ? cut(call.count, call.rank, n) : size_t{0};
  const size_t begin = base + cut(total, channel, nChannels);
  const size_t count = base + cut(total, channel + 1, nChannels) - begin;
  const bool agreed = barrier.arriveAndWait(group, call.rank, n, /*compare=*/true);
  if (!agreed && !barrier.differs) {
    barrier.breakOff(group, call.rank);
    return false;
  }
  if (agreed) directMove<R, kPrescaled>(group, call, begin, count);
  // Ranks whose calls differ meet at the second barrier too, moving nothing: none may store its
  // next call's signature before every rank has compared this one's.
  const bool done = barrier.arriveAndWait(group, call.rank, n, /*compare=*/false) && agreed;
  if (!done) barrier.breakOff(group, call.rank);
  return done;
}

}  // namespace braid
