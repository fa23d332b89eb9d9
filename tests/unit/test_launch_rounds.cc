// Rounds of ranks that share a GPU from threads of one process (core/launch_rounds.h): a rank's
// collective k is queued only after every rank of the GPU queued collective k - 1, and one thread
// that drives several of them issues their launches round by round. The rounds are host code;
// here real threads stand in for the ranks' threads and a log for CUDA's queue.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "core/launch_rounds.h"

namespace {

using braid::Clock;
using braid::Error;
using braid::LaunchRounds;
using braid::RankLaunches;

constexpr auto kLongWait = std::chrono::seconds(20);  // never reached where the rounds are right

// A fresh key per test: members of one communicator share it, no other communicator does.
uint64_t freshKey() {
  static std::atomic<uint64_t> next{0x5eed0000};
  return next++;
}

std::vector<std::unique_ptr<LaunchRounds>> joinAll(const std::vector<int>& members) {
  const uint64_t key = freshKey();
  std::vector<std::unique_ptr<LaunchRounds>> seats;
  for (int rank : members) seats.push_back(LaunchRounds::join(key, rank, members));
  return seats;
}

// The error `body` fails with, or nothing.
template <typename Body>
std::optional<Error> failureOf(Body&& body) {
  try {
    body();
  } catch (const Error& e) {
    return e;
  }
  return std::nullopt;
}

std::optional<Error> turnError(const LaunchRounds& seat, Clock::time_point deadline) {
  return failureOf([&] { seat.awaitTurn(deadline); });
}

TEST(LaunchRounds, ARankAheadWaitsUntilEveryRankOfItsGpuQueuedTheRoundBefore) {
  auto seats = joinAll({0, 2, 5});  // any ranks of the communicator, in rank order
  for (const auto& seat : seats) EXPECT_TRUE(seat->turnCome());
  seats[0]->markQueued();
  EXPECT_FALSE(seats[0]->turnCome());
  EXPECT_TRUE(seats[1]->turnCome());
  seats[1]->markQueued();
  EXPECT_FALSE(seats[0]->turnCome());
  EXPECT_FALSE(seats[1]->turnCome());
  EXPECT_TRUE(seats[2]->turnCome());
  const std::optional<Error> early = turnError(*seats[0], Clock::now());
  ASSERT_TRUE(early.has_value());
  EXPECT_EQ(early->code(), braidTimeout);
  EXPECT_NE(std::string(early->what())
                .find("rank 0: its collective 2 waited in vain for "
                      "rank(s) 5 on the same GPU to queue collective 1"),
            std::string::npos)
      << early->what();
  seats[2]->markQueued();
  for (const auto& seat : seats) {
    EXPECT_TRUE(seat->turnCome());
    EXPECT_EQ(seat->queued(), 1u);
  }
}

TEST(LaunchRounds, AWaitingRankGoesOnOnceTheLastPeerQueues) {
  auto seats = joinAll({0, 1, 2});
  seats[0]->markQueued();
  std::atomic<uint64_t> peersQueuedWhenLetGo{0};
  std::thread ahead([&] {
    seats[0]->awaitTurn(Clock::now() + kLongWait);
    peersQueuedWhenLetGo = seats[1]->queued() + seats[2]->queued();
  });
  seats[1]->markQueued();
  seats[2]->markQueued();
  ahead.join();
  EXPECT_EQ(peersQueuedWhenLetGo.load(), 2u);
}

TEST(LaunchRounds, AnAbortedPeerEndsEveryWaitNowAndLater) {
  auto seats = joinAll({0, 1});
  seats[0]->markQueued();
  std::optional<Error> waiting;
  std::thread ahead([&] { waiting = turnError(*seats[0], Clock::now() + kLongWait); });
  seats[1]->release("rank 1 called braidCommAbort");
  ahead.join();
  for (const std::optional<Error>& e : {waiting, turnError(*seats[1], Clock::now() + kLongWait)}) {
    ASSERT_TRUE(e.has_value());
    EXPECT_EQ(e->code(), braidRemoteError);
    EXPECT_NE(std::string(e->what()).find("was not queued: rank 1 called braidCommAbort"),
              std::string::npos)
        << e->what();
  }
}

TEST(LaunchRounds, APeerDestroyedBehindARankEndsItsWaitButNotThoseOfRanksBehind) {
  auto seats = joinAll({0, 1, 2});
  seats[0]->markQueued();
  seats[0]->markQueued();
  seats[2]->markQueued();
  std::optional<Error> waiting;
  std::thread ahead([&] { waiting = turnError(*seats[0], Clock::now() + kLongWait); });
  seats[1].reset();  // destroyed after no collective
  ahead.join();
  ASSERT_TRUE(waiting.has_value());
  EXPECT_EQ(waiting->code(), braidInvalidUsage);
  EXPECT_NE(std::string(waiting->what())
                .find("rank 0: its collective 3 was not queued: rank 1, on the same GPU, was "
                      "destroyed after queuing 0 collectives"),
            std::string::npos)
      << waiting->what();
  auto gone = joinAll({0, 1});
  gone[0].reset();  // ahead of nobody: the rank left behind is not stopped
  EXPECT_TRUE(gone[1]->turnCome());
  EXPECT_FALSE(turnError(*gone[1], Clock::now()).has_value());
}

TEST(LaunchRounds, CommunicatorsAreKeptApartAndAKeyIsFreshOnceEveryMemberLeft) {
  const uint64_t key = freshKey();
  auto a0 = LaunchRounds::join(key, 0, {0, 1});
  auto other = joinAll({0, 1});
  a0->markQueued();
  EXPECT_TRUE(other[0]->turnCome());
  auto a1 = LaunchRounds::join(key, 1, {0, 1});
  EXPECT_FALSE(a0->turnCome());  // a1 shares a0's rounds
  a1->markQueued();
  EXPECT_TRUE(a0->turnCome());
  EXPECT_THROW(LaunchRounds::join(key, 1, {1, 2}), Error);         // other members: refused
  EXPECT_THROW(LaunchRounds::join(freshKey(), 3, {0, 1}), Error);  // not among its members
  a0.reset();
  a1.reset();
  auto again = LaunchRounds::join(key, 0, {0, 1});
  EXPECT_EQ(again->queued(), 0u);
}

// What a launch of the driver did, as CUDA's queue would see it.
struct QueueLog {
  std::mutex mutex;
  std::vector<std::string> breaches;
  std::vector<std::vector<size_t>> order;  // per seat: the launches made, in order
};

// A rank's launches: 'c' a collective (waits for its turn, then counts), 'p' sends and receives.
// Each collective checks, as it is queued, that no rank of the GPU has queued fewer than it has.
RankLaunches launchesOf(const std::string& kinds, size_t seat,
                        std::vector<std::unique_ptr<LaunchRounds>>& seats, QueueLog& log,
                        Clock::duration wait) {
  RankLaunches r;
  r.rounds = seats[seat].get();
  r.launches = kinds.size();
  r.isCollective = [kinds](size_t i) { return kinds[i] == 'c'; };
  r.launch = [kinds, seat, &seats, &log, wait](size_t i) {
    LaunchRounds& own = *seats[seat];
    if (kinds[i] == 'c') {
      own.awaitTurn(Clock::now() + wait);
      const std::lock_guard<std::mutex> lock(log.mutex);
      for (const auto& peer : seats)
        if (peer->queued() < own.queued())
          log.breaches.push_back(
              fmt::format("rank {} queued collective {} before rank {} queued "
                          "{}",
                          own.rank(), own.queued() + 1, peer->rank(), own.queued()));
      own.markQueued();
    }
    const std::lock_guard<std::mutex> lock(log.mutex);
    log.order[seat].push_back(i);
  };
  return r;
}

TEST(LaunchRounds, OneThreadDrivesSeveralRanksRoundByRoundBesideAnotherThreadsRank) {
  auto seats = joinAll({0, 1, 2});
  QueueLog log;
  log.order.resize(3);
  const std::vector<std::string> kinds = {"cpcc", "pccpc", "ccc"};
  std::vector<RankLaunches> group = {launchesOf(kinds[0], 0, seats, log, kLongWait),
                                     launchesOf(kinds[1], 1, seats, log, kLongWait)};
  std::vector<RankLaunches> alone = {launchesOf(kinds[2], 2, seats, log, kLongWait)};
  std::optional<Error> otherError;
  std::thread other([&] { otherError = failureOf([&] { braid::launchInRounds(alone); }); });
  const std::optional<Error> groupError = failureOf([&] { braid::launchInRounds(group); });
  other.join();
  for (const std::optional<Error>& e : {groupError, otherError})
    EXPECT_FALSE(e.has_value()) << e->what();
  EXPECT_TRUE(log.breaches.empty()) << log.breaches.front();
  for (size_t s = 0; s < 3; ++s) {
    std::vector<size_t> inOrder(kinds[s].size());
    for (size_t i = 0; i < inOrder.size(); ++i) inOrder[i] = i;
    EXPECT_EQ(log.order[s], inOrder) << "rank " << s;
    EXPECT_EQ(seats[s]->queued(), 3u);
  }
}

TEST(LaunchRounds, IssuingOneRankAfterAnotherFromOneThreadWaitsForItself) {
  // Why groups launch in rounds: the same three ranks' calls, issued rank after rank by one
  // thread, stop at rank 0's second collective (the deadline here is short: it must pass).
  auto seats = joinAll({0, 1, 2});
  QueueLog log;
  log.order.resize(3);
  for (size_t s = 0; s < 3; ++s) {
    RankLaunches r = launchesOf("cc", s, seats, log, std::chrono::milliseconds(200));
    try {
      for (size_t i = 0; i < r.launches; ++i) r.launch(i);
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), braidTimeout);
      EXPECT_EQ(s, 0u);
      EXPECT_EQ(log.order[0].size(), 1u);
      return;
    }
  }
  ADD_FAILURE() << "rank 0 queued its second collective before ranks 1 and 2 queued their first";
}

}  // namespace
