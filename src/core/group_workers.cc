#include "core/group_workers.h"

#include <pthread.h>
#include <unistd.h>

#include <utility>

namespace braid {
namespace {

// The wait for the next task has no deadline: an idle worker waits as long as its owner lives,
// asleep until woken (no slices: it has nothing to ask). The owner's wait for a task is bounded by
// the task itself (operations end at their timeout).
struct Unbounded final : Watchdog {
  Unbounded() { sliceNs = 0; }
  void poll(int, const char*) override {}
};

struct Workers {
  pid_t pid = 0;
  std::vector<std::unique_ptr<GroupWorker>> list;
};
thread_local Workers tWorkers;

}  // namespace

GroupWorker::GroupWorker() : thread_([this] { work(); }) {
  pthread_setname_np(thread_.native_handle(), "braid-group");
}

GroupWorker::~GroupWorker() {
  stopping_ = true;
  posted_.publish(posted_.load() + 1);
  thread_.join();
}

void GroupWorker::start(const std::function<void()>& task) {
  task_ = &task;
  posted_.publish(posted_.load() + 1);
}

void GroupWorker::finish() {
  Unbounded dog;
  const uint32_t target = posted_.load();
  waitUntil(
      finished_, [target](uint32_t v) { return v == target; }, dog, -1, "a group worker");
  if (thrown_) std::rethrow_exception(std::exchange(thrown_, nullptr));
}

void GroupWorker::work() {
  Unbounded dog;
  for (uint32_t done = 0;;) {
    waitUntil(
        posted_, [done](uint32_t v) { return v != done; }, dog, -1, "the next group");
    if (stopping_) return;
    try {
      (*task_)();
    } catch (...) {
      thrown_ = std::current_exception();
    }
    finished_.publish(++done);
  }
}

void runTogether(size_t n, const std::function<void(size_t)>& body) {
  if (n == 0) return;
  if (n == 1) return body(0);  // no worker, so no question (a system call) whether they are ours
  if (tWorkers.pid != getpid()) {
    for (auto& inherited : tWorkers.list) (void)inherited.release();  // their threads are gone
    tWorkers = Workers{getpid(), {}};
  }
  while (tWorkers.list.size() + 1 < n) tWorkers.list.push_back(std::make_unique<GroupWorker>());
  std::vector<std::function<void()>> tasks;
  tasks.reserve(n);
  for (size_t i = 1; i < n; ++i) tasks.emplace_back([&body, i] { body(i); });
  for (size_t i = 1; i < n; ++i) tWorkers.list[i - 1]->start(tasks[i - 1]);
  std::exception_ptr first;
  try {
    body(0);
  } catch (...) {
    first = std::current_exception();
  }
  for (size_t i = 1; i < n; ++i) {
    try {
      tWorkers.list[i - 1]->finish();
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

}  // namespace braid
