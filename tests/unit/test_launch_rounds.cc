// Rounds of ranks that share a GPU from threads of one process (core/launch_rounds.h): a rank's
// collective k is queued only after every rank of the GPU queued collective k - 1, and one thread
// that drives several of them issues their launches round by round. The rounds are host code;
// here real threads stand in for the ranks' threads and a log for CUDA's queue.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <atomic>
#include <map>
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

constexpr std::chrono::milliseconds kLongWait{20'000};  // never reached where the rounds are right

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

std::optional<Error> turnError(const LaunchRounds& seat, std::chrono::milliseconds timeout) {
  return failureOf([&] { seat.awaitTurn(timeout, "braidAllReduce"); });
}

void expectFailure(const std::optional<Error>& e, braidResult_t code, const std::string& says) {
  ASSERT_TRUE(e.has_value());
  EXPECT_EQ(e->code(), code);
  EXPECT_NE(std::string(e->what()).find(says), std::string::npos) << e->what();
}

TEST(LaunchRounds, ARankAheadWaitsUntilEveryRankOfItsGpuQueuedTheRoundBefore) {
  auto seats = joinAll({0, 2, 5});  // any ranks of the communicator, in rank order
  for (const auto& seat : seats) EXPECT_TRUE(seat->turnHasCome());
  seats[0]->markQueued();
  EXPECT_FALSE(seats[0]->turnHasCome());
  EXPECT_TRUE(seats[1]->turnHasCome());
  seats[1]->markQueued();
  EXPECT_FALSE(seats[0]->turnHasCome());
  EXPECT_FALSE(seats[1]->turnHasCome());
  EXPECT_TRUE(seats[2]->turnHasCome());
  expectFailure(turnError(*seats[0], std::chrono::milliseconds(0)), braidTimeout,
                "rank 0: braidAllReduce waited 0 ms in vain for rank(s) 5 on the same GPU to "
                "queue collective 1 (sends and receives not counted)");
  seats[2]->markQueued();
  for (const auto& seat : seats) {
    EXPECT_TRUE(seat->turnHasCome());
    EXPECT_EQ(seat->queued(), 1u);
  }
}

TEST(LaunchRounds, AWaitingRankGoesOnOnceTheLastPeerQueues) {
  auto seats = joinAll({0, 1, 2});
  seats[0]->markQueued();
  std::atomic<uint64_t> peersQueuedWhenLetGo{0};
  std::thread ahead([&] {
    seats[0]->awaitTurn(kLongWait, "braidAllReduce");
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
  std::thread ahead([&] { waiting = turnError(*seats[0], kLongWait); });
  seats[1]->release("rank 1 called braidCommAbort");
  ahead.join();
  for (const std::optional<Error>& e : {waiting, turnError(*seats[1], kLongWait)})
    expectFailure(e, braidRemoteError,
                  "braidAllReduce was not queued: rank 1 called braidCommAbort");
}

TEST(LaunchRounds, APeerDestroyedBehindARankEndsItsWaitButNotThoseOfRanksBehind) {
  auto seats = joinAll({0, 1, 2});
  seats[0]->markQueued();
  seats[0]->markQueued();
  seats[2]->markQueued();
  std::optional<Error> waiting;
  std::thread ahead([&] { waiting = turnError(*seats[0], kLongWait); });
  seats[1].reset();  // destroyed after no collective
  ahead.join();
  expectFailure(waiting, braidInvalidUsage,
                "rank 0: braidAllReduce was not queued: rank 1, on the same GPU, was destroyed "
                "after queuing 0 collectives, and this rank has queued 2");
  auto gone = joinAll({0, 1});
  gone[0].reset();  // ahead of nobody: the rank left behind is not stopped
  EXPECT_TRUE(gone[1]->turnHasCome());
  EXPECT_FALSE(turnError(*gone[1], std::chrono::milliseconds(0)).has_value());
}

TEST(LaunchRounds, CommunicatorsAreKeptApartAndAKeyIsFreshOnceEveryMemberLeft) {
  const uint64_t key = freshKey();
  auto a0 = LaunchRounds::join(key, 0, {0, 1});
  auto other = joinAll({0, 1});
  a0->markQueued();
  EXPECT_TRUE(other[0]->turnHasCome());
  auto a1 = LaunchRounds::join(key, 1, {0, 1});
  EXPECT_FALSE(a0->turnHasCome());  // a1 shares a0's rounds
  a1->markQueued();
  EXPECT_TRUE(a0->turnHasCome());
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
  std::map<int, std::vector<size_t>> order;  // per rank: the launches made, in order
};

// A rank's launches as braidComm::launchOne makes them: each waits for its turn, and 'c' (a
// collective) then counts one, a digit d (a work list of d collectives) d, 'p' (sends and
// receives) nothing. Each launch checks, as it is
// queued, that no member of its rounds (`members`, itself among them) has queued fewer
// collectives than it has. Without rounds, nothing is checked. A driver that made a launch of one
// of its ranks wait for another of its ranks would end in braidTimeout.
RankLaunches launchesOf(const std::string& kinds, int rank, LaunchRounds* own,
                        std::vector<LaunchRounds*> members, QueueLog& log,
                        std::chrono::milliseconds wait) {
  RankLaunches r;
  r.rounds = own;
  r.count = kinds.size();
  r.launch = [=, &log](size_t i) {
    if (own != nullptr) own->awaitTurn(wait, "braidAllReduce");
    const std::lock_guard<std::mutex> lock(log.mutex);
    for (const LaunchRounds* peer : members)
      if (peer->queued() < own->queued())
        log.breaches.push_back(
            fmt::format("rank {} made launch {} before rank {} queued its "
                        "collective {}",
                        rank, i, peer->rank(), own->queued()));
    if (own != nullptr && kinds[i] == 'c') own->markQueued();
    if (own != nullptr && kinds[i] >= '2' && kinds[i] <= '9') own->markQueued(kinds[i] - '0');
    log.order[rank].push_back(i);
  };
  return r;
}

std::vector<LaunchRounds*> pointers(const std::vector<std::unique_ptr<LaunchRounds>>& seats) {
  std::vector<LaunchRounds*> all;
  for (const auto& seat : seats) all.push_back(seat.get());
  return all;
}

// `group` launched in rounds by this thread, `alone` by another at once; neither fails.
void launchFromTwoThreads(std::vector<RankLaunches>& group, std::vector<RankLaunches>& alone) {
  std::optional<Error> otherError;
  std::thread other([&] { otherError = failureOf([&] { braid::launchInRounds(alone); }); });
  const std::optional<Error> groupError = failureOf([&] { braid::launchInRounds(group); });
  other.join();
  for (const std::optional<Error>& e : {groupError, otherError})
    EXPECT_FALSE(e.has_value()) << e->what();
}

// Every rank made every launch, in its order.
void expectEveryLaunchInOrder(const QueueLog& log, const std::map<int, std::string>& kinds) {
  EXPECT_TRUE(log.breaches.empty()) << log.breaches.front();
  for (const auto& [rank, launches] : kinds) {
    std::vector<size_t> inOrder(launches.size());
    for (size_t i = 0; i < inOrder.size(); ++i) inOrder[i] = i;
    EXPECT_EQ(log.order.at(rank), inOrder) << "rank " << rank;
  }
}

// Ranks 0 and 1 of a GPU launched in rounds by this thread, rank 2 by another, each making the
// launches `kinds` gives it: every launch is made in its order, none before its turn, and each
// rank has queued `collectives` once all are made.
void expectThreeRanksLaunchInRounds(const std::map<int, std::string>& kinds, uint64_t collectives) {
  auto seats = joinAll({0, 1, 2});
  const std::vector<LaunchRounds*> members = pointers(seats);
  QueueLog log;
  std::vector<RankLaunches> group, alone;
  for (int rank : {0, 1})
    group.push_back(launchesOf(kinds.at(rank), rank, seats[rank].get(), members, log, kLongWait));
  alone.push_back(launchesOf(kinds.at(2), 2, seats[2].get(), members, log, kLongWait));
  launchFromTwoThreads(group, alone);
  expectEveryLaunchInOrder(log, kinds);
  for (const auto& seat : seats) EXPECT_EQ(seat->queued(), collectives);
}

TEST(LaunchRounds, OneThreadDrivesSeveralRanksRoundByRoundBesideAnotherThreadsRank) {
  expectThreeRanksLaunchInRounds({{0, "cpcc"}, {1, "pccpc"}, {2, "ccc"}}, 3);
}

// Ranks make the same four collectives but cut them into launches differently (a group's work
// list, sends between collectives on some ranks, calls outside a group on others): counted by
// collective, every launch still waits for its turn and none hangs.
TEST(LaunchRounds, LaunchesOfSeveralCollectivesCountEachOfThem) {
  expectThreeRanksLaunchInRounds({{0, "3c"}, {1, "c2pc"}, {2, "cpccc"}}, 4);
}

TEST(LaunchRounds, OneThreadDrivesRanksOfTwoGpusAndOneWithoutRounds) {
  // Ranks 0-1 on one GPU, 2-3 on another (rank 3 on a thread of its own), rank 4 alone on a third.
  auto first = joinAll({0, 1});
  auto second = joinAll({2, 3});
  QueueLog log;
  const std::map<int, std::string> kinds = {
      {0, "ccpc"}, {1, "pccc"}, {2, "cpcpc"}, {3, "ccc"}, {4, "cpc"}};
  std::vector<RankLaunches> group, alone;
  for (int rank : {0, 1})
    group.push_back(
        launchesOf(kinds.at(rank), rank, first[rank].get(), pointers(first), log, kLongWait));
  group.push_back(launchesOf(kinds.at(2), 2, second[0].get(), pointers(second), log, kLongWait));
  group.push_back(launchesOf(kinds.at(4), 4, nullptr, {}, log, kLongWait));
  alone.push_back(launchesOf(kinds.at(3), 3, second[1].get(), pointers(second), log, kLongWait));
  launchFromTwoThreads(group, alone);
  expectEveryLaunchInOrder(log, kinds);
}

TEST(LaunchRounds, IssuingOneRankAfterAnotherFromOneThreadWaitsForItself) {
  // Why groups launch in rounds: the same three ranks' calls, issued rank after rank by one
  // thread, stop at rank 0's second collective (the wait here is short: it must pass).
  auto seats = joinAll({0, 1, 2});
  QueueLog log;
  for (int rank = 0; rank < 3; ++rank) {
    RankLaunches r = launchesOf("cc", rank, seats[rank].get(), pointers(seats), log,
                                std::chrono::milliseconds(200));
    try {
      for (size_t i = 0; i < r.count; ++i) r.launch(i);
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), braidTimeout);
      EXPECT_EQ(rank, 0);
      EXPECT_EQ(log.order[0].size(), 1u);
      return;
    }
  }
  ADD_FAILURE() << "rank 0 queued its second collective before ranks 1 and 2 queued their first";
}

}  // namespace
