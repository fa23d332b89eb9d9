// A thread block's stand-in for the engines' device form on CPU threads (the grid harness and the
// tests of calls built on it).
#pragma once

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

namespace braid_test {

// Where a block's (or a warp's) threads meet: a barrier, and a vote for any()/anyInWarp() in three
// flags used in turn.
struct Meeting {
  explicit Meeting(int threads) : barrier(threads) {}
  std::barrier<> barrier;
  std::atomic<bool> flag[3] = {false, false, false};

  // Once every thread has reached this vote's barrier, all have read the previous vote's flag, and
  // none can set it again (as the vote after next) before the leader reaches the next barrier: so
  // the leader clears it here. (Clearing the next vote's flag instead would race with a thread
  // already voting in it.) `phase`: the calling thread's count of votes here.
  bool any(bool mine, bool leader, unsigned& phase) {
    std::atomic<bool>& current = flag[phase % 3];
    if (mine) current.store(true);
    barrier.arrive_and_wait();
    const bool result = current.load();
    if (leader) flag[(phase + 2) % 3].store(false);
    ++phase;
    return result;
  }
};

// A thread block's stand-in: its threads meet at one barrier, the lanes of each of its warps
// (consecutive threads, `lanes` of them, the last warp what is left) at another; waits yield
// (two cores run every thread of the grid) and give up at the deadline.
class CpuGroup {
 public:
  using Clock = std::chrono::steady_clock;
  CpuGroup(int index, int size, int lanes, Meeting* block, Meeting* warp,
           Clock::time_point deadline)
      : index_(index),
        size_(size),
        lanes_(lanes),
        block_(block),
        warp_(warp),
        deadline_(deadline) {}
  int index() const { return index_; }
  int size() const { return size_; }
  void sync() { block_->barrier.arrive_and_wait(); }
  bool any(bool mine) { return block_->any(mine, index_ == 0, blockPhase_); }
  int lane() const { return index_ % lanes_; }
  int lanes() const { return std::min(lanes_, size_ - warp() * lanes_); }
  int warp() const { return index_ / lanes_; }
  int warps() const { return (size_ + lanes_ - 1) / lanes_; }
  void syncWarp() { warp_->barrier.arrive_and_wait(); }
  bool anyInWarp(bool mine) { return warp_->any(mine, lane() == 0, warpPhase_); }
  bool keepWaiting() {
    std::this_thread::yield();
    return Clock::now() < deadline_;
  }

 private:
  int index_, size_, lanes_;
  Meeting *block_, *warp_;
  Clock::time_point deadline_;
  unsigned blockPhase_ = 0, warpPhase_ = 0;
};

// The meeting places of `blocks` stand-in blocks of `threads` threads each, in warps of `lanes`
// (2 by default: several warps in a block of 4 and more, as a GPU block has); group(b, t,
// deadline) is thread t of block b.
class CpuBlocks {
 public:
  CpuBlocks(int blocks, int threads, int lanes = 2)
      : threads_(threads),
        lanes_(std::max(1, std::min(lanes, threads))),
        warpsPerBlock_((threads + lanes_ - 1) / lanes_) {
    for (int b = 0; b < blocks; ++b) {
      blocks_.push_back(std::make_unique<Meeting>(threads));
      for (int w = 0; w < warpsPerBlock_; ++w)
        warps_.push_back(std::make_unique<Meeting>(std::min(lanes_, threads - w * lanes_)));
    }
  }
  CpuGroup group(int block, int thread, CpuGroup::Clock::time_point deadline) {
    return CpuGroup(thread, threads_, lanes_, blocks_[block].get(),
                    warps_[block * warpsPerBlock_ + thread / lanes_].get(), deadline);
  }

 private:
  int threads_, lanes_, warpsPerBlock_;
  std::vector<std::unique_ptr<Meeting>> blocks_, warps_;
};

}  // namespace braid_test
