// The threads that run the other communicators' parts of a group driven from one thread (ranks of
// one process inside braidGroupStart/End must progress together). They are kept for the life of
// the thread that owns them: starting a thread per group call cost 75-200 us a call.
#pragma once

#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <thread>
#include <vector>

#include "base/wait.h"

namespace braid {

// One worker: runs one task at a time for its owner. Both hand-offs poll briefly before they
// sleep on a futex, so back-to-back groups make no system call.
class GroupWorker {
 public:
  GroupWorker();
  ~GroupWorker();  // stops and joins the thread
  GroupWorker(const GroupWorker&) = delete;
  GroupWorker& operator=(const GroupWorker&) = delete;

  // Runs `task` on the worker; it must live until finish() returns.
  void start(const std::function<void()>& task);
  // Waits until the task given to start() has returned, and rethrows what it threw.
  void finish();

 private:
  void work();

  WakeableCounter posted_;    // tasks handed over; the worker sleeps on it
  WakeableCounter finished_;  // tasks done; the owner sleeps on it
  const std::function<void()>* task_ = nullptr;
  std::exception_ptr thrown_;  // by the last task; carried to the owner
  bool stopping_ = false;      // written before posted_ moves, read after
  std::thread thread_;
};

// Runs body(0) on the calling thread and body(1) .. body(n - 1) on the calling thread's workers,
// all at once, and returns when every one has returned; then rethrows the first exception a body
// threw, so none ends the process from a worker thread. Workers are made on
// first need and kept per thread (a shared pool could queue one group's part behind another's);
// a forked child starts its own, since it inherits the objects but not their threads.
void runTogether(size_t n, const std::function<void(size_t)>& body);

}  // namespace braid
