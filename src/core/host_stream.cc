#include "core/host_stream.h"

#include <set>

#include "core/error.h"

namespace braid {
namespace {
std::mutex gLiveMutex;
std::set<const void*> gLive;
}  // namespace

HostStream::HostStream() : worker_([this] { work(); }) {}

HostStream::~HostStream() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  worker_.join();
}

HostStream* HostStream::create() {
  auto* stream = new HostStream();
  std::lock_guard<std::mutex> lock(gLiveMutex);
  gLive.insert(stream);
  return stream;
}

void HostStream::destroy(HostStream* stream) {
  {
    std::lock_guard<std::mutex> lock(gLiveMutex);
    gLive.erase(stream);
  }
  delete stream;
}

bool HostStream::isLive(braidStream_t handle) {
  std::lock_guard<std::mutex> lock(gLiveMutex);
  return gLive.count(handle) != 0;
}

void HostStream::enqueue(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queue_.push_back(std::move(task));
  }
  changed_.notify_all();
}

braidResult_t HostStream::synchronize(std::string* message) {
  std::unique_lock<std::mutex> lock(mutex_);
  // Every queued task is bounded by its communicator's timeout, so this wait ends.
  changed_.wait(lock, [&] { return queue_.empty() && !running_; });
  braidResult_t result = error_;
  if (message != nullptr) *message = errorMessage_;
  error_ = braidSuccess;
  errorMessage_.clear();
  return result;
}

void HostStream::work() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    changed_.wait(lock, [&] { return !queue_.empty() || stopping_; });
    if (queue_.empty()) return;  // stopping, and drained
    std::function<void()> task = std::move(queue_.front());
    queue_.pop_front();
    running_ = true;
    lock.unlock();
    braidResult_t code = braidSuccess;
    std::string message;
    try {
      task();
    } catch (const Error& e) {
      code = e.code();
      message = e.what();
    } catch (const std::exception& e) {
      code = braidInternalError;
      message = e.what();
    }
    lock.lock();
    running_ = false;
    if (code != braidSuccess && error_ == braidSuccess) {
      error_ = code;
      errorMessage_ = message;
    }
    changed_.notify_all();
  }
}

}  // namespace braid
