// Issue order among ranks that share a GPU on threads of one process. CUDA feeds streams to the
// device through a few hardware queues (CUDA_DEVICE_MAX_CONNECTIONS, 8 by default), which
// several ranks' streams may share. In a shared queue a kernel that must wait for the previous
// call of its own stream holds back everything queued behind it; if that is a peer's kernel of
// the previous call, which the waiting rank's previous kernel spins for, neither ever finishes.
// So a rank queues its call k only after every rank of its group has queued call k - 1: then in
// any queue every call k - 1 comes before every call k, and what holds a queue back is only ever
// waiting for what is ahead of it.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "base/wait.h"

namespace braid {

class IssueGate {
 public:
  // The gate of the group named `key` (the same for every member, unique while any member holds
  // it) of `members` members, made by the first to join; shared with the others.
  static std::shared_ptr<IssueGate> join(uintptr_t key, int members);

  explicit IssueGate(int members) : issued_(members, 0) {}

  // Waits until every member has queued as many calls as `member` has, so that its next call may
  // go. Fails (braidTimeout) at `deadline`, naming the member that lags; `rank` is the caller's,
  // for the sentence.
  void awaitTurn(int member, int rank, Clock::time_point deadline);
  // `member` queued a call.
  void issued(int member);
  int members() const { return static_cast<int>(issued_.size()); }

 private:
  std::mutex mutex_;
  std::condition_variable changed_;
  std::vector<uint64_t> issued_;
};

}  // namespace braid
