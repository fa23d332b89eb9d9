// The engine's policies on the host (coll/ring_engine.h's thread group, data mover and ports),
// shared by the host executor's rings (host_executor.cc) and trees (host_tree.cc).
#pragma once

#include <cstddef>

#include "base/wait.h"
#include "coll/call_tag.h"
#include "coll/ring_engine.h"
#include "kernels/host_reduce.h"
#include "transport/connector.h"

namespace braid {

// The host executor's thread as the engine's thread group: one thread, so nothing to meet.
struct OneThread {
  int index() const { return 0; }
  int size() const { return 1; }
  void sync() {}
  bool any(bool mine) { return mine; }
  bool keepWaiting() { return true; }  // the connectors' own waits never hand back
};

// The engine's data mover on the host: the SIMD kernels, on the element's bits T (their size is
// all the engine needs). A move that writes both the output and a FIFO slot streams at most one
// of them (the kernels stream their first destination only): the slot when slots stream.
template <class T>
struct SimdMover {
  using Storage = T;
  kernels::ReduceFn reduceToSlot;    // streams its first destination when slots stream
  kernels::ReduceFn reduceToOutput;  // streams its first destination when the output streams
  bool streamSlots;
  bool streamOutput;

  // recv OP input, or a copy of whichever is given (the engine's data mover).
  void operator()(OneThread&, const T* recv, const T* input, T* toOutput, T* toSlot, size_t count,
                  int divisor) const {
    const bool slotFirst = toSlot != nullptr && (streamSlots || toOutput == nullptr);
    T* first = slotFirst ? toSlot : toOutput;
    T* second = slotFirst ? toOutput : toSlot;
    if (recv == nullptr || input == nullptr) {
      const T* from = recv != nullptr ? recv : input;
      if (from == first && second == nullptr) return;  // in place: already there
      kernels::copy2(first, second, from, count * sizeof(T),
                     slotFirst ? streamSlots : streamOutput);
    } else {
      (slotFirst ? reduceToSlot : reduceToOutput)(first, second, recv, input, count, divisor);
    }
  }
};

// The engine's ports on the host: the connectors' blocking waits under the watchdog, every slot
// tagged with the call and checked against it.
struct ConnectorPorts {
  static constexpr Arrival kArrival = Arrival::Tail;
  RecvConnector* prev = nullptr;
  SendConnector* next = nullptr;
  const CallTag* tag = nullptr;
  Watchdog* dog = nullptr;
  bool fenceBeforePost = false;  // slots are written with streaming stores: order them first
  const void* received = nullptr;
  void* slot = nullptr;

  size_t slotBytes() const { return next->slotBytes(); }
  bool waitRecv(OneThread&, size_t bytes) {
    received = receive(*prev, *tag, bytes, *dog);
    return true;
  }
  bool waitSend(OneThread&) {
    slot = next->acquire(*dog);
    return true;
  }
  const void* recvSlot() const { return received; }
  void* sendSlot() const { return slot; }
  void post(OneThread&, size_t bytes) {
    if (fenceBeforePost) kernels::streamFence();
    next->post(bytes, *tag);
  }
  void release(OneThread&) { prev->release(); }
};

}  // namespace braid
