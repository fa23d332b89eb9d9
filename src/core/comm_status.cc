#include "core/comm_status.h"

namespace braid {

void CommStatus::markReady(const std::optional<Error>& initError) {
  if (initError) {
    record(*initError);
    code_ = initError->code();
  } else {
    code_ = braidSuccess;
  }
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    initError_ = initError;
    ready_.store(true, std::memory_order_release);
  }
  readyCv_.notify_all();
}

void CommStatus::waitReady() {
  if (!ready()) {
    std::unique_lock<std::mutex> lock(mutex_);
    readyCv_.wait(lock, [&] { return ready_.load(); });
  }
  if (initError_) throw *initError_;  // written before ready_, never after
}

void CommStatus::record(const Error& e) {
  const std::lock_guard<std::mutex> lock(mutex_);
  lastError_ = e.what();
}

std::string CommStatus::lastError() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return lastError_;
}

// Under the mutex: a waiter sees none pending only once this has let go of the mutex, and may then
// free the communicator that holds it.
void PendingOperations::end() {
  const std::lock_guard<std::mutex> lock(mutex_);
  if (count_.fetch_sub(1) == 1) drained_.notify_all();
}

void PendingOperations::waitDrained() {
  std::unique_lock<std::mutex> lock(mutex_);
  drained_.wait(lock, [&] { return count_.load() == 0; });
}

}  // namespace braid
