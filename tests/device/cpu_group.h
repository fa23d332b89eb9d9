// A thread block's stand-in for the engines' device form on CPU threads (the grid harness and the
// tests of calls built on it).
#pragma once

#include <atomic>
#include <barrier>
#include <chrono>
#include <memory>
#include <thread>
#include <vector>

namespace braid_test {

// A block's vote for CpuGroup::any: two flags used in turn, so one can be cleared while the
// other is in use.
struct Vote {
  std::atomic<bool> flag[2] = {false, false};
};

// A thread block's stand-in: its threads meet at one barrier; waits yield (two cores run every
// thread of the grid) and give up at the deadline.
class CpuGroup {
 public:
  using Clock = std::chrono::steady_clock;
  CpuGroup(int index, int size, std::barrier<>* barrier, Vote* vote, Clock::time_point deadline)
      : index_(index), size_(size), barrier_(barrier), vote_(vote), deadline_(deadline) {}
  int index() const { return index_; }
  int size() const { return size_; }
  void sync() { barrier_->arrive_and_wait(); }
  // Every thread has left the previous vote once all reach this barrier, so the leader may clear
  // that vote's flag for the next one.
  bool any(bool mine) {
    std::atomic<bool>& flag = vote_->flag[phase_ % 2];
    if (mine) flag.store(true);
    barrier_->arrive_and_wait();
    const bool result = flag.load();
    if (index_ == 0) vote_->flag[(phase_ + 1) % 2].store(false);
    ++phase_;
    return result;
  }
  bool keepWaiting() {
    std::this_thread::yield();
    return Clock::now() < deadline_;
  }

 private:
  int index_, size_;
  std::barrier<>* barrier_;
  Vote* vote_;
  Clock::time_point deadline_;
  unsigned phase_ = 0;
};

// The meeting places of `blocks` stand-in blocks of `threads` threads each; group(b, t, deadline)
// is thread t of block b.
class CpuBlocks {
 public:
  CpuBlocks(int blocks, int threads) : threads_(threads) {
    for (int b = 0; b < blocks; ++b) {
      barriers_.push_back(std::make_unique<std::barrier<>>(threads));
      votes_.push_back(std::make_unique<Vote>());
    }
  }
  CpuGroup group(int block, int thread, CpuGroup::Clock::time_point deadline) {
    return CpuGroup(thread, threads_, barriers_[block].get(), votes_[block].get(), deadline);
  }

 private:
  int threads_;
  std::vector<std::unique_ptr<std::barrier<>>> barriers_;
  std::vector<std::unique_ptr<Vote>> votes_;
};

}  // namespace braid_test
