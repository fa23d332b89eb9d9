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
  // Bytes in use of each slot (header and payload), set before tail moves: how much a network
  // proxy sends, and what it received.
  alignas(64) uint64_t bytes[kMaxFifoSlots];
};

// What the sender says of the call a slot belongs to. Transports move it with the payload and
// never read it; the collectives compare it with their own call, so that ranks that made
// different calls get an error instead of a wrong result (coll/call_tag.h).
struct CallTag {
  uint64_t sequence = 0;  // the communicator's collective number; 0 for send/recv
  uint64_t count = 0;     // the call's count argument
  int32_t root = 0;
  uint8_t collective = 0;
  uint8_t datatype = 0;
  uint8_t op = 0;
  uint8_t flags = 0;
  bool operator==(const CallTag&) const = default;
};

// The head of every slot; the payload follows it, 64-byte aligned.
struct alignas(64) SlotHeader {
  CallTag tag;
  uint64_t payloadBytes = 0;
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
  // Payload bytes one slot carries.
  size_t slotBytes() const { return fifo_.slotBytes - sizeof(SlotHeader); }

  // A slot's payload to fill, once the receiver has freed one.
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
  // Publishes the slot returned by acquire() with `bytes` of payload, tagged with the call.
  void post(size_t bytes, const CallTag& tag) {
    const uint32_t index = tail_ % fifo_.nSlots;
    *reinterpret_cast<SlotHeader*>(fifo_.slots + index * fifo_.slotBytes) = {tag, bytes};
    fifo_.control->bytes[index] = sizeof(SlotHeader) + bytes;
    fifo_.control->tail.publish(++tail_);
  }

 private:
  bool hasCredit() const { return tail_ - headSeen_ < static_cast<uint32_t>(fifo_.nSlots); }
  void* slot() const {
    return fifo_.slots + (tail_ % fifo_.nSlots) * fifo_.slotBytes + sizeof(SlotHeader);
  }

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

  int self() const { return self_; }
  int peer() const { return peer_; }
  // Payload bytes one slot carries.
  size_t slotBytes() const { return fifo_.slotBytes - sizeof(SlotHeader); }

  // The header of the next published slot, once there is one; its payload follows it.
  const SlotHeader& wait(Watchdog& dog) {
    if (!hasData()) {
      const uint32_t need = head_ + 1;
      tailSeen_ = waitUntil(
          fifo_.control->tail, [need](uint32_t t) { return counterReached(t, need); }, dog, peer_,
          "data");
    }
    return checkedHeader();
  }
  // Non-blocking wait: nullptr when nothing has arrived.
  const SlotHeader* tryWait() {
    if (!hasData()) {
      tailSeen_ = fifo_.control->tail.value.load(std::memory_order_acquire);
      if (!hasData()) return nullptr;
    }
    return &checkedHeader();
  }
  // Returns the slot from wait() to the sender.
  void release() { fifo_.control->head.publish(++head_); }

 private:
  bool hasData() const { return tailSeen_ != head_; }
  // A slot whose size disagrees with its header was not written by a braid peer's post.
  const SlotHeader& checkedHeader() const {
    const uint32_t index = head_ % fifo_.nSlots;
    const auto& header =
        *reinterpret_cast<const SlotHeader*>(fifo_.slots + index * fifo_.slotBytes);
    const uint64_t used = fifo_.control->bytes[index];
    if (used < sizeof(SlotHeader) || used > fifo_.slotBytes ||
        header.payloadBytes != used - sizeof(SlotHeader))
      fail(braidRemoteError,
           "rank {} received a malformed message from rank {}: {} bytes, of which the header "
           "claims {} bytes of payload",
           self_, peer_, used, header.payloadBytes);
    return header;
  }

  FifoDesc fifo_;
  int self_ = -1;
  int peer_ = -1;
  uint32_t head_ = 0;
  uint32_t tailSeen_ = 0;
};

}  // namespace braid
