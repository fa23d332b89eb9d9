// A FIFO as plain data, for code that runs on a host thread or a GPU thread alike: the control
// words are read and written through cuda::atomic_ref (libcu++ from the CUDA toolkit's CCCL,
// which g++ compiles too) or std::atomic_ref where no toolkit is installed. The operations never
// block and never throw: they say whether they could go ahead, and callers (a thread group's wait
// loop on a device, the host's watchdog waits) decide how long to try.
#pragma once

#include <cstddef>
#include <cstdint>

#include "base/host_device.h"

#if __has_include(<cuda/atomic>)
#include <cuda/atomic>
#define BRAID_FIFO_LIBCUXX 1
#else
#include <atomic>
#endif

namespace braid {

// System scope for every control word: the other side of a FIFO may be a thread of another
// process (shm), the host's network proxy thread reading a GPU's slots, or another GPU (p2p), so
// a device-scope release would not order the slot's bytes for it. (CPU tests cannot tell a scope
// that is too narrow: this choice is made here, once, on purpose.)
#ifdef BRAID_FIFO_LIBCUXX
template <class T>
using SystemAtomicRef = cuda::atomic_ref<T, cuda::thread_scope_system>;
namespace atomics = cuda::std;
#else
template <class T>
using SystemAtomicRef = std::atomic_ref<T>;
namespace atomics = std;
#endif

template <class T>
BRAID_HD inline T loadAcquire(T& word) {
  return SystemAtomicRef<T>(word).load(atomics::memory_order_acquire);
}
template <class T>
BRAID_HD inline void storeRelease(T& word, T value) {
  SystemAtomicRef<T>(word).store(value, atomics::memory_order_release);
}
// The low-latency protocol's lines (a 4-byte flag and 4 bytes of data in one 64-bit word: what
// is seen together was stored together, so no ordering is needed) and the tail it stores only so
// that the next call starts from it.
template <class T>
BRAID_HD inline T loadRelaxed(T& word) {
  return SystemAtomicRef<T>(word).load(atomics::memory_order_relaxed);
}
template <class T>
BRAID_HD inline void storeRelaxed(T& word, T value) {
  SystemAtomicRef<T>(word).store(value, atomics::memory_order_relaxed);
}

// A slot of the segmented protocol (coll/ring_engine.h's SegmentPorts): `segments` segments of
// `segmentBytes` of data, then a 4-byte flag for each.
BRAID_HD constexpr size_t segmentedSlotBytes(size_t segmentBytes, size_t segments) {
  return segments * (segmentBytes + sizeof(uint32_t));
}

// The control words of one FIFO, each on its own cache line: the sender writes tail, the
// receiver head; either side, or the host, sets abort to stop every wait on it. Beside tail and
// head, the count of host threads asleep on them (a futex; core/wait.h's WakeableWord): a host
// side that advances a word wakes them; device code never sleeps and never reads them.
struct FifoWords {
  alignas(64) uint32_t tail = 0;  // slots published
  uint32_t tailSleepers = 0;
  alignas(64) uint32_t head = 0;  // slots released
  uint32_t headSleepers = 0;
  alignas(64) uint32_t abort = 0;
};

// One side's view. Every thread of a group keeps its own copy and advances its counters through
// the same calls; only the group's leader stores a counter (after the group's barrier, so the
// slot's bytes written by every thread are ordered before it).
struct FifoSendView {
  FifoWords* words = nullptr;
  uint8_t* slots = nullptr;  // nSlots * slotBytes, 64-byte aligned each
  size_t slotBytes = 0;
  uint32_t nSlots = 0;
  uint32_t tail = 0;      // slots this side posted
  uint32_t headSeen = 0;  // the receiver's head, as last read
  // Where a network proxy drains the FIFO (FifoControl::bytes): the bytes of each slot in use,
  // stored before tail, so that only those go on the wire. Null where the receiver reads the
  // slots itself.
  uint64_t* used = nullptr;

  // Whether a slot is free to fill (reads head only when the last value shows none). Signed: with
  // the low-latency protocol the receiver reads a slot's lines, and may return it, before the
  // leader has posted it, so a thread still waiting for that slot can see head one past its tail.
  BRAID_HD bool tryAcquire() {
    if (freeSlots()) return true;
    headSeen = loadAcquire(words->head);
    return freeSlots();
  }
  BRAID_HD bool freeSlots() const {
    return static_cast<int32_t>(tail - headSeen) < static_cast<int32_t>(nSlots);
  }
  BRAID_HD uint8_t* slot() const { return slots + (tail % nSlots) * slotBytes; }
  // Publishes the acquired slot, `bytes` of it in use: the leader stores tail (after the bytes in
  // use, for a proxy), the others count along.
  BRAID_HD void post(bool leader, uint64_t bytes) {
    if (leader && used != nullptr) storeRelaxed(used[tail % nSlots], bytes);
    ++tail;
    if (leader) storeRelease(words->tail, tail);
  }
  // Counts a slot whose lines carry their own flags (the low-latency protocol): the receiver never
  // reads tail, which is stored without ordering only so that the next call starts from it.
  BRAID_HD void postFlagged(bool leader) {
    ++tail;
    if (leader) storeRelaxed(words->tail, tail);
  }
  BRAID_HD bool aborted() const { return loadAcquire(words->abort) != 0; }
};

struct FifoRecvView {
  FifoWords* words = nullptr;
  const uint8_t* slots = nullptr;
  size_t slotBytes = 0;
  uint32_t nSlots = 0;
  uint32_t head = 0;      // slots this side released
  uint32_t tailSeen = 0;  // the sender's tail, as last read

  // Whether a published slot waits (reads tail only when the last value shows none).
  BRAID_HD bool tryWait() {
    if (tailSeen != head) return true;
    tailSeen = loadAcquire(words->tail);
    return tailSeen != head;
  }
  BRAID_HD const uint8_t* slot() const { return slots + (head % nSlots) * slotBytes; }
  // Returns the slot to the sender: the leader stores head, the others count along.
  BRAID_HD void release(bool leader) {
    ++head;
    if (leader) storeRelease(words->head, head);
  }
  BRAID_HD bool aborted() const { return loadAcquire(words->abort) != 0; }
};

}  // namespace braid
