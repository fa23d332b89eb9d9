// A host stream: operations of CPU communicators queued in order and run by one worker thread,
// so a trainer can overlap communication with compute.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

#include "braid/braid.h"

namespace braid {

class HostStream {
 public:
  HostStream();
  ~HostStream();  // drains the queue, then stops the worker

  // `task` runs on the worker; what it throws is kept for synchronize() as braid's error.
  void enqueue(std::function<void()> task);
  // Waits until everything queued so far has run; returns (and clears) the first error.
  braidResult_t synchronize(std::string* message);

  // Whether `handle` is a live host stream (validates user-supplied stream arguments).
  static bool isLive(braidStream_t handle);
  static HostStream* create();
  static void destroy(HostStream* stream);

 private:
  void work();
  template <typename Done>
  static void pollBriefly(Done done);
  static constexpr int kPollIterations = 2000;

  std::mutex mutex_;
  // Two conditions, so that neither side is woken for what only the other waits for: the worker
  // for work (or stopping), synchronize() for the queue drained. One shared condition woke a
  // synchronizing caller after every task, a context switch per operation on a small machine.
  std::condition_variable workQueued_;
  std::condition_variable drained_;
  std::deque<std::function<void()>> queue_;
  bool running_ = false;  // a task is executing
  bool stopping_ = false;
  std::atomic<size_t> outstanding_{0};  // queued or running: polled without the mutex
  braidResult_t error_ = braidSuccess;
  std::string errorMessage_;
  std::thread worker_;
};

}  // namespace braid
