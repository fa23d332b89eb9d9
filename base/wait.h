// How every blocking wait in braid waits: spin, then yield, then sleep on a futex in short slices,
// asking the watchdog between slices whether to give up (deadline passed, a peer died, abort).
#pragma once

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <ctime>
#include <string>

#include "base/params.h"

namespace braid {

using Clock = std::chrono::steady_clock;

// Decides when a wait must be abandoned. The communicator implements it: it knows the deadline,
// the peers' liveness and the abort flags. Both functions throw braid::Error to end the wait.
class Watchdog {
 public:
  virtual ~Watchdog() = default;
  // Called between sleep slices; `peer` is the rank being waited for (-1 if several).
  virtual void poll(int peer, const char* waitingFor) = 0;
  // Moves what the waiting thread can move itself, such as the sockets of its connection with
  // `peer` on another host, instead of waiting for a progress thread to do it; true if anything
  // moved. Called on every spin and before every yield.
  virtual bool drive(int peer) { return false; }
  // The wait stops calling drive(): it is about to sleep until woken.
  virtual void stopDriving() {}
  // Waits under this watchdog pace themselves as `other`'s do (a watchdog standing in for it).
  void pacedAs(const Watchdog& other) {
    spins = other.spins;
    yields = other.yields;
    sliceNs = other.sliceNs;
  }

  // How long a wait busy-polls, then yields, before it sleeps. Fewer spins when ranks outnumber
  // cores: a spinning rank would hold the core its producer needs.
  int64_t spins = param::SpinCount();
  int64_t yields = param::YieldCount();
  // How often a sleeping wait wakes to ask poll(); 0: only when woken (a wait with nothing to ask,
  // such as an idle group worker's, then costs nothing while it sleeps).
  long sliceNs = 20 * 1000 * 1000;
};

inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// Futex on a 32-bit word that may live in memory shared between processes.
// A timeout of 0 waits until woken.
inline void futexWait(uint32_t* word, uint32_t seen, long timeoutNs) {
  timespec ts{timeoutNs / 1000000000L, timeoutNs % 1000000000L};
  syscall(SYS_futex, word, FUTEX_WAIT, seen, timeoutNs > 0 ? &ts : nullptr, nullptr, 0);
}
inline void futexWakeAll(uint32_t* word) {
  syscall(SYS_futex, word, FUTEX_WAKE, INT32_MAX, nullptr, nullptr, 0);
}

// A word another party advances, and beside it a count of threads asleep on it. Both are plain
// data used through atomic_ref: they may live in shared memory, or in a FIFO's control block that
// device code reads through the same words (transport/fifo_view.h). The advancing side stores the
// value, then wakes the sleepers; the waiting side calls waitUntil().
struct WakeableWord {
  uint32_t* value;
  uint32_t* sleepers;

  uint32_t load() const {
    return std::atomic_ref<uint32_t>(*value).load(std::memory_order_acquire);
  }
  // Stores the value, then wakes whoever sleeps on it. Both sequentially consistent: a sleeper
  // counts itself before it reads the value (Dekker's pattern), so either it sees the new value or
  // this side sees it counted; the futex rechecks the value, so a wake is never lost.
  void publish(uint32_t v) const {
    std::atomic_ref<uint32_t>(*value).store(v, std::memory_order_seq_cst);
    if (std::atomic_ref<uint32_t>(*sleepers).load(std::memory_order_seq_cst) != 0)
      futexWakeAll(value);
  }
};

// A wakeable word and its sleepers' count on one cache line of their own.
struct alignas(64) WakeableCounter {
  uint32_t value = 0;
  uint32_t sleepers = 0;
  WakeableWord word() { return {&value, &sleepers}; }
  uint32_t load() { return word().load(); }
  void publish(uint32_t v) { word().publish(v); }
};

// Waits until `ready(the word's value)` is true. Fast path: one load.
template <typename Ready>
inline uint32_t waitUntil(WakeableWord w, Ready ready, Watchdog& dog, int peer,
                          const char* waitingFor) {
  uint32_t v = w.load();
  if (ready(v)) return v;
  // Drives on every spin: a network link moves only when driven, and the pauses between drives
  // are lag (2 namespace hosts, 8 B - 512 B all-reduces over UCX: 0.97-0.99 of MPI's time against
  // 0.98-1.01 with a drive every 16 spins, 3 interleaved runs).
  for (int64_t i = 0; i < dog.spins; ++i) {
    dog.drive(peer);
    cpuRelax();
    v = w.load();
    if (ready(v)) return v;
  }
  for (int64_t i = 0; i < dog.yields; ++i) {
    if (!dog.drive(peer)) sched_yield();
    v = w.load();
    if (ready(v)) return v;
  }
  dog.stopDriving();
  std::atomic_ref<uint32_t> sleepers(*w.sleepers), value(*w.value);
  for (;;) {
    sleepers.fetch_add(1, std::memory_order_seq_cst);
    v = value.load(std::memory_order_seq_cst);
    if (!ready(v)) futexWait(w.value, v, dog.sliceNs);
    sleepers.fetch_sub(1, std::memory_order_seq_cst);
    v = w.load();
    if (ready(v)) return v;
    dog.poll(peer, waitingFor);
  }
}

template <typename Ready>
inline uint32_t waitUntil(WakeableCounter& c, Ready ready, Watchdog& dog, int peer,
                          const char* waitingFor) {
  return waitUntil(c.word(), ready, dog, peer, waitingFor);
}

}  // namespace braid
