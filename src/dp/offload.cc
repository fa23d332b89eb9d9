#include "dp/offload.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>

#include "dp/error.h"

namespace braid::dp {
namespace {

class ResidentStore final : public StateStore {
 public:
  ResidentStore(Backend& backend, const StateLayout& layout) : backend_(backend) {
    const size_t bytes = layout.ownedCount * sizeof(float);
    if (layout.master) master_ = Buffer(backend, bytes);
    if (layout.moment1) moment1_ = Buffer(backend, bytes);
    if (layout.moment2) moment2_ = Buffer(backend, bytes);
    for (const StateLayout::Range& r : layout.segments) offsets_.push_back(r.offset);
  }
  void prefetch(size_t) override {}
  SegmentState acquire(size_t segment) override {
    const size_t at = offsets_[segment];
    auto in = [&](const Buffer& b) { return b.empty() ? nullptr : b.floats() + at; };
    return {in(master_), in(moment1_), in(moment2_)};
  }
  void release(size_t) override {}
  void flush() override {}
  void setMaster(size_t offset, const float* values, size_t count) override {
    backend_.copyFromHost(master_.floats() + offset, values, count * sizeof(float));
  }
  size_t residentBytes() const override {
    return master_.size() + moment1_.size() + moment2_.size();
  }
  size_t offloadedBytes() const override { return 0; }

 private:
  Backend& backend_;
  Buffer master_, moment1_, moment2_;
  std::vector<size_t> offsets_;
};

// The file holds each array whole, one after another; segment i of array a is `count` floats at
// element `offset` of it. Two slots in memory: segment i uses slot i % 2, so the next segment's
// read and the previous one's write-back run while segment i is updated. One I/O thread serves
// the jobs in order, which keeps a slot's write-back ahead of the read that reuses it.
class FileStore final : public StateStore {
 public:
  FileStore(const StateLayout& layout, const std::string& directory, int rank)
      : layout_(layout), rank_(rank) {
    path_ = directory + "/braid-dp-state-rank" + std::to_string(rank) + "-XXXXXX";
    std::vector<char> name(path_.begin(), path_.end());
    name.push_back('\0');
    fd_ = mkstemp(name.data());
    if (fd_ < 0)
      fail(braidSystemError,
           "DataParallel on rank {}: cannot create the optimizer state file {} (OffloadOptions::"
           "directory): {}",
           rank, path_, std::strerror(errno));
    path_ = name.data();
    unlink(path_.c_str());  // the file goes with the descriptor, however the process ends
    const off_t bytes = static_cast<off_t>(layout.arrays() * layout.ownedCount * sizeof(float));
    // Allocated now, not sparse: a full disk shows here rather than in the middle of a step
    // (where the other ranks would wait for this one until their timeout).
    if (const int err = posix_fallocate(fd_, 0, bytes); err != 0) {
      close(fd_);
      fail(braidSystemError, "DataParallel on rank {}: cannot allocate {} bytes for {}: {}", rank,
           bytes, path_, std::strerror(err));
    }
    size_t largest = 0;
    for (const StateLayout::Range& r : layout.segments) largest = std::max(largest, r.count);
    slotFloats_ = largest;
    for (std::vector<float>& slot : slots_) slot.assign(layout.arrays() * largest, 0.0f);
    readJob_.assign(layout.segments.size(), 0);
    thread_ = std::thread([this] { serve(); });
  }
  ~FileStore() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    thread_.join();
    close(fd_);
  }

  void prefetch(size_t segment) override { readJob_[segment] = enqueue(false, segment); }
  SegmentState acquire(size_t segment) override {
    if (readJob_[segment] == 0) prefetch(segment);
    waitFor(readJob_[segment]);
    readJob_[segment] = 0;
    float* slot = slots_[segment % 2].data();
    SegmentState state;
    int a = 0;
    if (layout_.master) state.master = slot + slotFloats_ * a++;
    if (layout_.moment1) state.moment1 = slot + slotFloats_ * a++;
    if (layout_.moment2) state.moment2 = slot + slotFloats_ * a++;
    return state;
  }
  void release(size_t segment) override { enqueue(true, segment); }
  void flush() override { waitFor(queued_); }
  void setMaster(size_t offset, const float* values, size_t count) override {
    flush();
    transfer(true, const_cast<float*>(values), offset, count);  // array 0: the master
  }
  size_t residentBytes() const override { return 2 * slots_[0].size() * sizeof(float); }
  size_t offloadedBytes() const override {
    return layout_.arrays() * layout_.ownedCount * sizeof(float);
  }

 private:
  struct Job {
    bool write;
    size_t segment;
  };

  uint64_t enqueue(bool write, size_t segment) {
    std::lock_guard<std::mutex> lock(mutex_);
    jobs_.push_back({write, segment});
    wake_.notify_all();
    return ++queued_;
  }
  // Waits until job `sequence` (and every one before it) is done; fails with the first I/O error.
  void waitFor(uint64_t sequence) {
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [&] { return completed_ >= sequence || !error_.empty(); });
    if (!error_.empty()) fail(braidSystemError, "{}", error_);
  }

  void serve() {
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      wake_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stop_, nothing left
      const Job job = jobs_.front();
      jobs_.pop_front();
      lock.unlock();
      std::string failed;
      try {
        const StateLayout::Range& r = layout_.segments[job.segment];
        float* slot = slots_[job.segment % 2].data();
        for (size_t a = 0; a < layout_.arrays(); ++a)
          transfer(job.write, slot + slotFloats_ * a, a * layout_.ownedCount + r.offset, r.count);
      } catch (const Error& e) {
        failed = e.what();
      }
      lock.lock();
      if (!failed.empty() && error_.empty()) error_ = failed;
      ++completed_;
      done_.notify_all();
    }
  }

  // `count` floats at element `element` of the file, whole (pread and pwrite may move less).
  void transfer(bool write, float* data, size_t element, size_t count) const {
    auto* bytes = reinterpret_cast<char*>(data);
    size_t left = count * sizeof(float);
    off_t at = static_cast<off_t>(element * sizeof(float));
    while (left > 0) {
      const ssize_t n = write ? pwrite(fd_, bytes, left, at) : pread(fd_, bytes, left, at);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0)
        fail(braidSystemError, "DataParallel on rank {}: {} of the optimizer state file {}: {}",
             rank_, write ? "pwrite" : "pread", path_,
             n < 0 ? std::strerror(errno) : "unexpected end of file");
      bytes += n;
      left -= static_cast<size_t>(n);
      at += n;
    }
  }

  const StateLayout layout_;
  const int rank_;
  std::string path_;
  int fd_ = -1;
  size_t slotFloats_ = 0;  // per array, in each slot
  std::vector<float> slots_[2];
  std::vector<uint64_t> readJob_;  // by segment: its read's job number, 0 when none is queued

  std::mutex mutex_;
  std::condition_variable wake_, done_;
  std::deque<Job> jobs_;
  uint64_t queued_ = 0, completed_ = 0;
  std::string error_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace

std::unique_ptr<StateStore> makeResidentStore(Backend& backend, const StateLayout& layout) {
  return std::make_unique<ResidentStore>(backend, layout);
}

std::unique_ptr<StateStore> makeFileStore(const StateLayout& layout, const std::string& directory,
                                          int rank) {
  return std::make_unique<FileStore>(layout, directory, rank);
}

}  // namespace braid::dp
