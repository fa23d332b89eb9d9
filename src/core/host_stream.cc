#include "core/host_stream.h"

#include <set>

#include "base/error.h"
#include "base/wait.h"

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
  workQueued_.notify_all();
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

namespace {

// Whether `ahead` is another rank's part of a collective of `mine`.
bool otherRanksPart(const RankCollectives& ahead, const RankCollectives& mine) {
  return ahead.comm == mine.comm && ahead.rank != mine.rank && ahead.first <= mine.last &&
         mine.first <= ahead.last;
}

}  // namespace

std::optional<RankCollectives> HostStream::partAhead(
    const std::vector<RankCollectives>& collectives) const {
  auto among = [&](const std::vector<RankCollectives>& queued) -> std::optional<RankCollectives> {
    for (const RankCollectives& ahead : queued)
      for (const RankCollectives& mine : collectives)
        if (otherRanksPart(ahead, mine)) return ahead;
    return std::nullopt;
  };
  if (running_)
    if (auto part = among(runningCollectives_)) return part;
  for (const Task& task : queue_)
    if (auto part = among(task.collectives)) return part;
  return std::nullopt;
}

std::optional<RankCollectives> HostStream::otherRanksPartAhead(
    const std::vector<RankCollectives>& collectives) {
  std::lock_guard<std::mutex> lock(mutex_);
  return partAhead(collectives);
}

std::optional<RankCollectives> HostStream::enqueue(std::function<void()> task,
                                                   std::vector<RankCollectives> collectives) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto part = partAhead(collectives)) return part;
    queue_.push_back({std::move(task), std::move(collectives)});
    outstanding_.fetch_add(1, std::memory_order_release);
  }
  workQueued_.notify_one();
  return std::nullopt;
}

// Back-to-back operations hand over faster when the waiting side polls a little before it
// sleeps: waking a sleeping thread costs microseconds.
template <typename Done>
void HostStream::pollBriefly(Done done) {
  for (int i = 0; i < kPollIterations && !done(); ++i) cpuRelax();
}

braidResult_t HostStream::synchronize(std::string* message) {
  pollBriefly([&] { return outstanding_.load(std::memory_order_acquire) == 0; });
  std::unique_lock<std::mutex> lock(mutex_);
  // Every queued task is bounded by its communicator's timeout, so this wait ends.
  drained_.wait(lock, [&] { return queue_.empty() && !running_; });
  braidResult_t result = error_;
  if (message != nullptr) *message = errorMessage_;
  error_ = braidSuccess;
  errorMessage_.clear();
  return result;
}

void HostStream::work() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    if (queue_.empty() && !stopping_) {
      lock.unlock();
      pollBriefly([&] { return outstanding_.load(std::memory_order_acquire) != 0; });
      lock.lock();
    }
    workQueued_.wait(lock, [&] { return !queue_.empty() || stopping_; });
    if (queue_.empty()) return;  // stopping, and drained
    Task task = std::move(queue_.front());
    queue_.pop_front();
    running_ = true;
    runningCollectives_ = std::move(task.collectives);
    lock.unlock();
    braidResult_t code = braidSuccess;
    std::string message;
    try {
      task.run();
    } catch (...) {
      code = braidSystemError;  // when not even the sentence can be made: out of memory
      try {
        const Error e = currentError();
        code = e.code();
        message = e.what();
      } catch (...) {
      }
    }
    lock.lock();
    running_ = false;
    runningCollectives_.clear();
    outstanding_.fetch_sub(1, std::memory_order_release);
    if (code != braidSuccess && error_ == braidSuccess) {
      error_ = code;
      errorMessage_ = message;
    }
    if (queue_.empty()) drained_.notify_all();
  }
}

}  // namespace braid
