// A connector is a FIFO of slots in memory the receiver reads: the sender fills a slot and
// publishes `tail`; the receiver consumes it and returns credit through `head`. Transports only
// decide where the FIFO lives (heap, shared memory, GPU memory) and who moves the bytes; the
// collectives above see nothing but SendConnector and RecvConnector.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "core/error.h"
#include "core/wait.h"

namespace braid {

constexpr int kMaxFifoSlots = 32;

// The FIFO's control block. It lives next to the slots; both sides map it.
struct FifoControl {
  WakeableCounter tail;  // slots published by the sender; the receiver sleeps on it
  WakeableCounter head;  // slots released by the receiver; the sender sleeps on it
  alignas(64) uint64_t bytes[kMaxFifoSlots];  // payload size of each slot, set before tail moves
};

struct FifoDesc {
  FifoControl* control = nullptr;
  uint8_t* slots = nullptr;  // nSlots * slotBytes, each slot 64-byte aligned
  size_t slotBytes = 0;
  int nSlots = 0;

  // Bytes a FIFO of this geometry occupies (control block, then the slots).
  static size_t footprint(size_t slotBytes, int nSlots) {
    return sizeof(FifoControl) + slotBytes * static_cast<size_t>(nSlots);
  }
  // Lays a FIFO over `memory`, which must be zeroed and hold footprint() bytes.
  static FifoDesc over(void* memory, size_t slotBytes, int nSlots) {
    FifoDesc d;
    d.control = static_cast<FifoControl*>(memory);
    d.slots = static_cast<uint8_t*>(memory) + sizeof(FifoControl);
    d.slotBytes = slotBytes;
    d.nSlots = nSlots;
    return d;
  }
};

inline bool counterReached(uint32_t value, uint32_t target) {
  return static_cast<int32_t>(value - target) >= 0;
}

class SendConnector {
 public:
  SendConnector() = default;
  SendConnector(FifoDesc fifo, int self, int peer) : fifo_(fifo), self_(self), peer_(peer) {}

  int peer() const { return peer_; }
  size_t slotBytes() const { return fifo_.slotBytes; }

  // A slot to fill, once the receiver has freed one.
  void* acquire(Watchdog& dog) {
    if (!hasCredit()) {
      const uint32_t need = tail_ - static_cast<uint32_t>(fifo_.nSlots) + 1;
      headSeen_ = waitUntil(
          fifo_.control->head, [need](uint32_t h) { return counterReached(h, need); }, dog, peer_,
          "FIFO credit");
    }
    return slot();
  }
  // Non-blocking acquire: nullptr when the FIFO is full.
  void* tryAcquire() {
    if (!hasCredit()) {
      headSeen_ = fifo_.control->head.value.load(std::memory_order_acquire);
      if (!hasCredit()) return nullptr;
    }
    return slot();
  }
  // Publishes the slot returned by acquire() with `bytes` of payload.
  void post(size_t bytes) {
    fifo_.control->bytes[tail_ % fifo_.nSlots] = bytes;
    fifo_.control->tail.publish(++tail_);
  }

 private:
  bool hasCredit() const { return tail_ - headSeen_ < static_cast<uint32_t>(fifo_.nSlots); }
  void* slot() const { return fifo_.slots + (tail_ % fifo_.nSlots) * fifo_.slotBytes; }

  FifoDesc fifo_;
  int self_ = -1;
  int peer_ = -1;
  uint32_t tail_ = 0;      // only this side writes tail, so it keeps the value
  uint32_t headSeen_ = 0;  // last head read from the receiver
};

class RecvConnector {
 public:
  RecvConnector() = default;
  RecvConnector(FifoDesc fifo, int self, int peer) : fifo_(fifo), self_(self), peer_(peer) {}

  int peer() const { return peer_; }
  size_t slotBytes() const { return fifo_.slotBytes; }

  // The next published slot, which must carry exactly `expectedBytes`.
  const void* wait(size_t expectedBytes, Watchdog& dog) {
    if (!hasData()) {
      const uint32_t need = head_ + 1;
      tailSeen_ = waitUntil(
          fifo_.control->tail, [need](uint32_t t) { return counterReached(t, need); }, dog, peer_,
          "data");
    }
    return checkedSlot(expectedBytes);
  }
  // Non-blocking wait: nullptr when nothing has arrived.
  const void* tryWait(size_t expectedBytes) {
    if (!hasData()) {
      tailSeen_ = fifo_.control->tail.value.load(std::memory_order_acquire);
      if (!hasData()) return nullptr;
    }
    return checkedSlot(expectedBytes);
  }
  // Returns the slot from wait() to the sender.
  void release() { fifo_.control->head.publish(++head_); }

 private:
  bool hasData() const { return tailSeen_ != head_; }
  const void* checkedSlot(size_t expectedBytes) const {
    const uint64_t got = fifo_.control->bytes[head_ % fifo_.nSlots];
    if (got != expectedBytes)
      fail(braidInvalidUsage,
           "rank {} received a {}-byte chunk from rank {} where it expected {} bytes: the ranks "
           "called the operation with different counts, datatypes or peers",
           self_, got, peer_, expectedBytes);
    return fifo_.slots + (head_ % fifo_.nSlots) * fifo_.slotBytes;
  }

  FifoDesc fifo_;
  int self_ = -1;
  int peer_ = -1;
  uint32_t head_ = 0;
  uint32_t tailSeen_ = 0;
};

}  // namespace braid
