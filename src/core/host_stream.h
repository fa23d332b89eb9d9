// A host stream: operations of CPU communicators queued in order and run by one worker thread,
// so a trainer can overlap communication with compute.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "braid/braid.h"

namespace braid {

// Of the collectives a task runs, those of one rank of one communicator: numbered `first` to
// `last` among the collectives its callers issued (CommStatus::issueCollective, alike on every
// rank), of the communicator whose identity is `comm`.
struct RankCollectives {
  uint64_t comm = 0;
  int rank = 0;
  uint64_t first = 0;
  uint64_t last = 0;
};

class HostStream {
 public:
  HostStream();
  ~HostStream();  // drains the queue, then stops the worker

  // Queues `task` to run on the worker; what it throws is kept for synchronize() as braid's error.
  // Unless a task queued or running runs another rank's part of one of the collectives `task`
  // runs (`collectives`): that task waits for this one, which would wait behind it for ever. Then
  // nothing is queued, and that other rank's part is returned.
  [[nodiscard]] std::optional<RankCollectives> enqueue(
      std::function<void()> task, std::vector<RankCollectives> collectives = {});
  // What enqueue would return now for `collectives` (a group checks each of its streams before it
  // queues on any).
  std::optional<RankCollectives> otherRanksPartAhead(
      const std::vector<RankCollectives>& collectives);
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
  struct Task {
    std::function<void()> run;
    std::vector<RankCollectives> collectives;
  };
  // otherRanksPartAhead, with the mutex held.
  std::optional<RankCollectives> partAhead(const std::vector<RankCollectives>& collectives) const;

  std::deque<Task> queue_;
  bool running_ = false;  // a task is executing
  std::vector<RankCollectives> runningCollectives_;
  bool stopping_ = false;
  std::atomic<size_t> outstanding_{0};  // queued or running: polled without the mutex
  braidResult_t error_ = braidSuccess;
  std::string errorMessage_;
  std::thread worker_;
};

}  // namespace braid
