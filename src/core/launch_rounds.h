// Ranks of one CUDA communicator that share a GPU from threads of one process queue their
// collectives in rounds: a rank's launch whose first collective is k goes to CUDA only after every
// one of them has queued collective k - 1 (a launch may carry several: a group's work list). CUDA
// feeds the streams of a device through a few hardware queues
// (CUDA_DEVICE_MAX_CONNECTIONS), and a kernel at the head of a queue holds back whatever is behind
// it: a rank's call k waits in its stream for its own call k - 1, which spins for the peers' call
// k - 1; if one of those sits behind call k in a shared queue, neither ever runs. In rounds, no
// launch starting at call k is queued before any peer's call k - 1, so what is ahead of a launch
// in a queue never waits for what is behind it. Sends and receives (and the collectives made of
// them: all-to-all, gather, scatter) are not counted, since ranks need not make the same number,
// but wait for their rank's turn all the same. Host code only (no CUDA type): docs/cuda.md, "Shared
// hardware queues".
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/wait.h"

namespace braid {

class LaunchRounds {
 public:
  // This rank's seat in the rounds of `members` (sorted ranks of the communicator, in this process
  // on one GPU, `rank` among them): every member joins with the same `key` (one per communicator
  // and GPU, never reused by another communicator) and the same members.
  static std::unique_ptr<LaunchRounds> join(uint64_t key, int rank, std::vector<int> members);
  // Leaving (the communicator destroyed) stops the waits of members that are ahead of this rank:
  // the collectives they wait for will never come.
  ~LaunchRounds();
  LaunchRounds(const LaunchRounds&) = delete;
  LaunchRounds& operator=(const LaunchRounds&) = delete;

  int rank() const { return rank_; }
  // Collectives this rank has queued (or that failed after their turn came).
  uint64_t queued() const;
  // Whether this rank may queue a launch now: no member has queued fewer collectives.
  bool turnHasCome() const;
  // Blocks until turnHasCome() for the launch of `operation` (named in errors). Fails with
  // braidTimeout after `timeout` naming the members behind, with braidRemoteError and the reason
  // once a member failed or was aborted (release), with braidInvalidUsage where a member behind
  // this rank left.
  void awaitTurn(std::chrono::milliseconds timeout, std::string_view operation) const;
  // This rank's next `collectives` collectives are queued (a launch may carry several: a work
  // list): the members waiting for them may go on. Called whatever became of the launch once its
  // turn came, so a failure cannot hold the others back. A launch of several is as safe as a
  // launch of one waiting its turn for the first: what it waits for in its stream (the rank's
  // earlier collectives) waits for peers' collectives queued before it, and counting each of its
  // collectives keeps every rank's count the same however ranks cut their collectives into
  // launches (their groups and sends differ from rank to rank).
  void markQueued(uint64_t collectives = 1);
  // Every wait of every member, now and later, fails with braidRemoteError and `why` (one of
  // them failed or called braidCommAbort: the collectives the others wait for may never come).
  void release(const std::string& why);

  struct Shared;

 private:
  LaunchRounds(std::shared_ptr<Shared> shared, int rank, size_t seat);

  std::shared_ptr<Shared> shared_;
  int rank_;
  size_t seat_;  // this rank's index in the members
};

// One rank's part of a group on a CUDA device, as a series of launches in the rank's order:
// collectives (one, or a work list), or a run of sends and receives.
struct RankLaunches {
  const LaunchRounds* rounds = nullptr;  // nullptr: the rank launches without waiting
  size_t count = 0;
  // Launch i: waits for the rank's turn (awaitTurn), and counts it where it is a collective.
  std::function<void(size_t)> launch;
};

// Launches every rank's part, each in its own order, round by round: a rank's next launch is made
// once its turn has come; where no rank's has, the launch of the one furthest behind waits (the
// others' turns cannot come before it moves). One thread can so drive several ranks of a GPU,
// whatever number and kind of calls each makes. The first failure ends it, leaving the other
// ranks' launches unmade (their communicators are then to be aborted).
void launchInRounds(std::span<RankLaunches> ranks);

}  // namespace braid
