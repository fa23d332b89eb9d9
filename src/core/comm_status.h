// A communicator's state as its callers see it: whether init has finished and how, the error that
// ended it (braidCommGetAsyncError, braidGetLastError), and the operations queued on host streams
// or being launched that finalize, abort and destroy wait for. Thread-safe: init may run on a
// thread of its own (non-blocking init) while others ask.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <optional>
#include <string>

#include "base/error.h"
#include "braid/braid.h"

namespace braid {

// Operations queued on host streams but not finished, or being launched on a device; or the
// C API's calls inside a communicator (CommStatus::callsInside).
class PendingOperations {
 public:
  void begin() { count_.fetch_add(1); }
  void end();
  // Blocks until none is pending (each is bounded by its own deadline).
  void waitDrained();

 private:
  std::atomic<int> count_{0};
  std::mutex mutex_;
  std::condition_variable drained_;
};

// Numbers the collective calls the C API's callers make on a communicator (1, 2, ...; a group's at
// its end), alike on every rank, since every rank makes the same collectives in the same order; a
// call refused before it runs takes none. Host streams compare them (core/host_stream.h). Used by
// the thread that calls on the communicator (one at a time, as NCCL requires).
class CollectiveNumbers {
 public:
  // The number the k-th next call will take.
  uint64_t next(uint64_t k = 1) const { return taken_.load(std::memory_order_relaxed) + k; }
  // The next `n` calls have been made.
  void take(uint64_t n) { taken_.fetch_add(n, std::memory_order_relaxed); }

 private:
  std::atomic<uint64_t> taken_{0};
};

class CommStatus {
 public:
  // Init has finished: successfully where `initError` is empty. Wakes waitReady().
  void markReady(const std::optional<Error>& initError);
  bool ready() const { return ready_.load(std::memory_order_acquire); }
  // Blocks until markReady(), then throws init's error if it had one.
  void waitReady();

  // braidInProgress until init has finished, then braidSuccess until something fails.
  braidResult_t code() const { return code_.load(); }
  // The communicator failed with `code` (the first failure's sentence: record()).
  void fail(braidResult_t code) { code_ = code; }
  // A non-blocking finalize runs: braidInProgress from braidSuccess until it ends (a failure
  // meanwhile stays).
  void beginFinalize() { exchange(braidSuccess, braidInProgress); }
  void endFinalize() { exchange(braidInProgress, braidSuccess); }
  // The sentence braidGetLastError gives for this communicator.
  void record(const Error& e);
  std::string lastError() const;

  PendingOperations& pending() { return pending_; }
  CollectiveNumbers& collectiveNumbers() { return collectiveNumbers_; }
  // The C API's calls on this communicator that have not returned (api::guarded): abort and
  // destroy wait for them to leave, since a call failing as the communicator is aborted still
  // records its error in it on its way out.
  PendingOperations& callsInside() { return callsInside_; }

 private:
  mutable std::mutex mutex_;
  std::condition_variable readyCv_;
  std::atomic<bool> ready_{false};  // read without the mutex on every operation
  std::optional<Error> initError_;
  std::atomic<braidResult_t> code_{braidInProgress};
  std::string lastError_;
  PendingOperations pending_;
  PendingOperations callsInside_;
  CollectiveNumbers collectiveNumbers_;
  void exchange(braidResult_t from, braidResult_t to) { code_.compare_exchange_strong(from, to); }
};

}  // namespace braid
