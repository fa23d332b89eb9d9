// A connector is a FIFO of slots in memory the receiver reads: the sender fills a slot and
// publishes `tail`; the receiver consumes it and returns credit through `head`. Transports only
// decide where the FIFO lives (heap, shared memory, GPU memory) and who moves the bytes; the
// collectives above see nothing but SendConnector and RecvConnector.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "base/error.h"
#include "base/wait.h"
#include "transport/fifo_view.h"

namespace braid {

constexpr int kMaxFifoSlots = 32;

// The FIFO's control block. It lives next to the slots; both sides map it. Its words are the
// ones the engine's FIFO views use (transport/fifo_view.h), so host and device code read one
// layout.
struct FifoControl {
  FifoWords words;
  // Bytes in use of each slot (header and payload), set before tail moves: how much a network
  // proxy sends, and what it received.
  alignas(64) uint64_t bytes[kMaxFifoSlots];

  WakeableWord tail() { return {&words.tail, &words.tailSleepers}; }  // the receiver sleeps on it
  WakeableWord head() { return {&words.head, &words.headSleepers}; }  // the sender sleeps on it
};

// What the sender says of the call a slot belongs to. Transports move it with the payload and
// never read it; the collectives compare it with their own call, so that ranks that made
// different calls get an error instead of a wrong result (coll/call_tag.h).
struct CallTag {
  uint64_t sequence = 0;  // the communicator's collective number; 0 for send/recv
  uint64_t count = 0;     // the call's count argument (a fused pass: its calls' digest)
  int32_t root = 0;
  uint8_t collective = 0;
  uint8_t datatype = 0;
  uint8_t op = 0;
  uint8_t flags = 0;  // kTagFusedCalls: a group's fused pass, `count` a digest of its calls
  uint64_t comm = 0;  // the communicator's identity (its rank 0's init nonce)
  bool operator==(const CallTag&) const = default;
};

inline constexpr uint8_t kTagFusedCalls = 1;

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
  // Where the reader takes a slot's payload from when the sender names it instead of copying it
  // in (SendConnector::postFrom), one entry per slot; nullptr where the reader cannot (it is not
  // in the sender's process). A network proxy sends a named payload straight from the caller's
  // buffer.
  const void** payloadAt = nullptr;

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

// Waits until a FIFO counter reaches `target` (in wrapping arithmetic); returns its value.
inline uint32_t waitReached(WakeableWord counter, uint32_t target, Watchdog& dog, int peer,
                            const char* waitingFor) {
  return waitUntil(
      counter, [target](uint32_t v) { return static_cast<int32_t>(v - target) >= 0; }, dog, peer,
      waitingFor);
}

// The host's ends of a FIFO: the engine's views (their non-blocking steps), and around them what
// only a host does: slot headers with the call's tag, blocking waits under the watchdog, futex
// wake-ups, error sentences.
class SendConnector {
 public:
  SendConnector() = default;
  SendConnector(FifoDesc fifo, int self, int peer)
      : control_(fifo.control),
        view_{&fifo.control->words, fifo.slots, fifo.slotBytes, static_cast<uint32_t>(fifo.nSlots)},
        payloadAt_(fifo.payloadAt),
        self_(self),
        peer_(peer) {}

  int peer() const { return peer_; }
  // Payload bytes one slot carries.
  size_t slotBytes() const { return view_.slotBytes - sizeof(SlotHeader); }
  // Whether postFrom() may name a payload where it lies.
  bool postsFromPlace() const { return payloadAt_ != nullptr; }

  // A slot's payload to fill, once the receiver has freed one.
  void* acquire(Watchdog& dog) {
    if (!view_.tryAcquire())
      view_.headSeen =
          waitReached(control_->head(), view_.tail - view_.nSlots + 1, dog, peer_, "FIFO credit");
    return payload();
  }
  // Non-blocking acquire: nullptr when the FIFO is full.
  void* tryAcquire() { return view_.tryAcquire() ? payload() : nullptr; }
  // Publishes the slot returned by acquire() with `bytes` of payload, tagged with the call.
  void post(size_t bytes, const CallTag& tag) {
    *reinterpret_cast<SlotHeader*>(view_.slot()) = {tag, bytes};
    control_->bytes[view_.tail % view_.nSlots] = sizeof(SlotHeader) + bytes;
    control_->tail().publish(++view_.tail);  // the view's post, with a wake for a sleeper
  }
  // Publishes the next slot (once the receiver has freed one) with the `bytes` at `data` as its
  // payload, read by the FIFO's reader where they lie; they must stay unchanged until
  // awaitTaken(posted()) returns. Only where postsFromPlace().
  void postFrom(const void* data, size_t bytes, const CallTag& tag, Watchdog& dog) {
    acquire(dog);
    payloadAt_[view_.tail % view_.nSlots] = data;
    post(bytes, tag);
  }
  // Slots published so far, a count for awaitTaken().
  uint32_t posted() const { return view_.tail; }
  // Waits until the reader has taken the first `count` slots posted: a network proxy, until they
  // are sent (the sender's own memory is then free), not until the peer has read them.
  void awaitTaken(uint32_t count, Watchdog& dog) {
    if (static_cast<int32_t>(view_.headSeen - count) < 0)
      view_.headSeen =
          waitReached(control_->head(), count, dog, -1, "the network to send this rank's data");
  }

 private:
  void* payload() const { return view_.slot() + sizeof(SlotHeader); }

  FifoControl* control_ = nullptr;
  FifoSendView view_;
  const void** payloadAt_ = nullptr;
  int self_ = -1;
  int peer_ = -1;
};

class RecvConnector {
 public:
  RecvConnector() = default;
  RecvConnector(FifoDesc fifo, int self, int peer)
      : control_(fifo.control),
        view_{&fifo.control->words, fifo.slots, fifo.slotBytes, static_cast<uint32_t>(fifo.nSlots)},
        self_(self),
        peer_(peer) {}

  int self() const { return self_; }
  int peer() const { return peer_; }
  // Payload bytes one slot carries.
  size_t slotBytes() const { return view_.slotBytes - sizeof(SlotHeader); }

  // The header of the next published slot, once there is one; its payload follows it.
  const SlotHeader& wait(Watchdog& dog) {
    if (!view_.tryWait())
      view_.tailSeen = waitReached(control_->tail(), view_.head + 1, dog, peer_, "data");
    return checkedHeader();
  }
  // Non-blocking wait: nullptr when nothing has arrived.
  const SlotHeader* tryWait() { return view_.tryWait() ? &checkedHeader() : nullptr; }
  // Returns the slot from wait() to the sender.
  void release() {
    control_->head().publish(++view_.head);  // the view's release, with a wake for a sleeper
  }

 private:
  // A slot whose size disagrees with its header was not written by a braid peer's post.
  const SlotHeader& checkedHeader() const {
    const auto& header = *reinterpret_cast<const SlotHeader*>(view_.slot());
    const uint64_t used = control_->bytes[view_.head % view_.nSlots];
    if (used < sizeof(SlotHeader) || used > view_.slotBytes ||
        header.payloadBytes != used - sizeof(SlotHeader))
      fail(braidRemoteError,
           "rank {} received a malformed message from rank {}: {} bytes, of which the header "
           "claims {} bytes of payload",
           self_, peer_, used, header.payloadBytes);
    return header;
  }

  FifoControl* control_ = nullptr;
  FifoRecvView view_;
  int self_ = -1;
  int peer_ = -1;
};

}  // namespace braid
