#include "core/launch_rounds.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>

#include "base/error.h"

namespace braid {

struct LaunchRounds::Shared {
  uint64_t key = 0;
  std::vector<int> members;
  mutable std::mutex mutex;
  mutable std::condition_variable changed;
  std::vector<uint64_t> queued;  // per seat
  std::vector<bool> left;        // per seat
  std::string failure;           // why, once a member failed or was aborted

  // Members (by rank) behind `seat`; under the mutex.
  std::vector<int> behind(size_t seat) const {
    std::vector<int> ranks;
    for (size_t s = 0; s < members.size(); ++s)
      if (queued[s] < queued[seat]) ranks.push_back(members[s]);
    return ranks;
  }
  // The first member behind `seat` that left, if any; under the mutex.
  std::optional<size_t> leftBehind(size_t seat) const {
    for (size_t s = 0; s < members.size(); ++s)
      if (left[s] && queued[s] < queued[seat]) return s;
    return std::nullopt;
  }
};

namespace {

std::mutex registryMutex;
// Never destroyed: a communicator may be destroyed during the program's static destruction.
std::map<uint64_t, std::weak_ptr<LaunchRounds::Shared>>& registry() {
  static auto* rounds = new std::map<uint64_t, std::weak_ptr<LaunchRounds::Shared>>;
  return *rounds;
}

}  // namespace

std::unique_ptr<LaunchRounds> LaunchRounds::join(uint64_t key, int rank, std::vector<int> members) {
  const auto seat = std::find(members.begin(), members.end(), rank);
  if (seat == members.end())
    fail(braidInternalError, "rank {}: not among the ranks of its GPU ({})", rank,
         fmt::join(members, ", "));
  const std::lock_guard<std::mutex> lock(registryMutex);
  std::shared_ptr<Shared> shared = registry()[key].lock();
  if (shared == nullptr) {
    shared = std::make_shared<Shared>();
    shared->key = key;
    shared->members = members;
    shared->queued.assign(members.size(), 0);
    shared->left.assign(members.size(), false);
    registry()[key] = shared;
  } else if (shared->members != members) {
    fail(braidInternalError, "rank {}: its GPU's ranks are {}, but a peer joined with {}", rank,
         fmt::join(members, ", "), fmt::join(shared->members, ", "));
  }
  return std::unique_ptr<LaunchRounds>(
      new LaunchRounds(std::move(shared), rank, static_cast<size_t>(seat - members.begin())));
}

LaunchRounds::LaunchRounds(std::shared_ptr<Shared> shared, int rank, size_t seat)
    : shared_(std::move(shared)), rank_(rank), seat_(seat) {}

LaunchRounds::~LaunchRounds() {
  {
    const std::lock_guard<std::mutex> lock(shared_->mutex);
    shared_->left[seat_] = true;
  }
  shared_->changed.notify_all();
  // Every member lets go under the registry's lock, so the last one out sees the entry expired.
  const std::lock_guard<std::mutex> lock(registryMutex);
  const uint64_t key = shared_->key;
  shared_.reset();
  if (auto it = registry().find(key); it != registry().end() && it->second.expired())
    registry().erase(it);
}

uint64_t LaunchRounds::queued() const {
  const std::lock_guard<std::mutex> lock(shared_->mutex);
  return shared_->queued[seat_];
}

bool LaunchRounds::turnHasCome() const {
  const std::lock_guard<std::mutex> lock(shared_->mutex);
  return shared_->behind(seat_).empty();
}

void LaunchRounds::awaitTurn(std::chrono::milliseconds timeout, std::string_view operation) const {
  const Clock::time_point deadline = Clock::now() + timeout;
  Shared& s = *shared_;
  std::unique_lock<std::mutex> lock(s.mutex);
  while (true) {
    if (!s.failure.empty())
      fail(braidRemoteError, "rank {}: {} was not queued: {}", rank_, operation, s.failure);
    if (std::optional<size_t> gone = s.leftBehind(seat_))
      fail(braidInvalidUsage,
           "rank {}: {} was not queued: rank {}, on the same GPU, was destroyed after queuing {} "
           "collectives, and this rank has queued {} (expected every rank to make the same "
           "collectives)",
           rank_, operation, s.members[*gone], s.queued[*gone], s.queued[seat_]);
    if (s.behind(seat_).empty()) return;
    if (Clock::now() >= deadline)
      fail(braidTimeout,
           "rank {}: {} waited {} ms in vain for rank(s) {} on the same GPU to queue collective "
           "{} (sends and receives not counted): ranks that share a GPU from threads of one "
           "process queue their collectives in rounds (docs/cuda.md, \"Shared hardware "
           "queues\"); a thread that drives several of them must issue their calls in a group "
           "(braidGroupStart/braidGroupEnd) or one round at a time",
           rank_, operation, timeout.count(), fmt::join(s.behind(seat_), ", "), s.queued[seat_]);
    s.changed.wait_until(lock, deadline);
  }
}

void LaunchRounds::markQueued(uint64_t collectives) {
  {
    const std::lock_guard<std::mutex> lock(shared_->mutex);
    shared_->queued[seat_] += collectives;
  }
  shared_->changed.notify_all();
}

void LaunchRounds::release(const std::string& why) {
  {
    const std::lock_guard<std::mutex> lock(shared_->mutex);
    if (shared_->failure.empty()) shared_->failure = why;
  }
  shared_->changed.notify_all();
}

namespace {

// Of the ranks with launches left (none of whose turn has come), the one that has queued the
// fewest collectives: nothing of the others' can go before it does. It is also the one furthest
// behind in its own rounds, where the ranks belong to several communicators or GPUs.
RankLaunches* furthestBehind(std::span<RankLaunches> ranks, std::span<const size_t> next) {
  RankLaunches* slowest = nullptr;
  for (size_t r = 0; r < ranks.size(); ++r) {
    if (next[r] == ranks[r].count) continue;
    if (slowest == nullptr || ranks[r].rounds->queued() < slowest->rounds->queued())
      slowest = &ranks[r];
  }
  return slowest;
}

}  // namespace

void launchInRounds(std::span<RankLaunches> ranks) {
  std::vector<size_t> next(ranks.size(), 0);
  // A rank without rounds always may: it has made every launch before anyone waits.
  auto mayGo = [&](size_t r) {
    return next[r] < ranks[r].count &&
           (ranks[r].rounds == nullptr || ranks[r].rounds->turnHasCome());
  };
  while (true) {
    bool moved = false;
    for (size_t r = 0; r < ranks.size(); ++r)
      for (; mayGo(r); moved = true) ranks[r].launch(next[r]++);
    if (moved) continue;
    RankLaunches* slowest = furthestBehind(ranks, next);
    if (slowest == nullptr) return;  // every launch made
    const size_t r = static_cast<size_t>(slowest - ranks.data());
    slowest->launch(next[r]++);  // waits for its turn
  }
}

}  // namespace braid
