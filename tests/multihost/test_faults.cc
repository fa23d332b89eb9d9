// Failures across hosts, run by netns_hosts.sh (see multihost.cmake): ranks loop over large
// all-reduces on several hosts while one host's link goes down, a rank on another host is killed,
// or a rank stops reading. Every surviving rank must return an error, within its timeout, that
// names a peer it lost; nothing hangs (the launcher kills what stops advancing).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "multihost/netns_ranks.h"
#include "multirank/rank_launcher.h"

namespace braid_test {
namespace {

using namespace std::chrono_literals;

// Peers on a broken link are declared unreachable after about 2 s instead of 20.
[[maybe_unused]] const bool kKeepaliveSet = [] {
  setenv("BRAID_SOCKET_KEEPALIVE_MS", "2000", /*overwrite=*/0);
  return true;
}();

constexpr int kMaxRanks = 8;
constexpr size_t kElements = size_t{8} << 20;  // 32 MiB of floats per all-reduce

// What the ranks and the test share across fork.
struct Board {
  std::atomic<int> looping{0};  // ranks that finished their first all-reduce
  std::atomic<int> failed{0};   // ranks whose all-reduce returned an error
  std::atomic<pid_t> pid[kMaxRanks];
  std::atomic<int64_t> waitedMs[kMaxRanks];  // how long a rank's failed operation took
};

Board* sharedBoard() {
  void* memory =
      mmap(nullptr, sizeof(Board), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (memory == MAP_FAILED) std::abort();
  return new (memory) Board();
}

bool waitFor(const std::atomic<int>& counter, int value, std::chrono::seconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (counter.load() < value) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(10ms);
  }
  return true;
}

// Runs all-reduces until one fails; returns "<code name>: <last error>" as its one failure line,
// or a line saying it never failed. A failed rank keeps its communicator (and so its connections)
// until `failing` ranks have failed: a rank that closed its connections early would make the
// others report that instead of what they found themselves. `killSelf` raises SIGKILL once every
// rank is looping.
RankProgram allReduceUntilFailure(Board* board, int timeoutMs, int failing, int killSelf = -1) {
  RankProgram program;
  program.describeStep = [](int64_t step) { return "all-reduce #" + std::to_string(step); };
  program.run = [=](const RankEnv& env) -> Failures {
    board->pid[env.rank] = getpid();
    braidComm_t comm = nullptr;
    if (braidResult_t r = initRank(&comm, env, timeoutMs); r != braidSuccess)
      return {"init: " + describeResult(r, nullptr)};
    std::vector<float> data(kElements, 1.0f);
    const auto start = std::chrono::steady_clock::now();
    for (int64_t i = 0; std::chrono::steady_clock::now() - start < 120s; ++i) {
      env.at(i);
      if (env.rank == killSelf && board->looping.load() == env.nranks) raise(SIGKILL);
      const braidResult_t r = braidAllReduce(data.data(), data.data(), kElements, braidFloat32,
                                             braidSum, comm, nullptr);
      if (r != braidSuccess) {
        const std::string error = describeResult(r, comm);
        board->failed.fetch_add(1);
        waitFor(board->failed, failing, 60s);
        braidCommDestroy(comm);
        return {error};
      }
      if (i == 0) board->looping.fetch_add(1);
    }
    braidCommDestroy(comm);
    return {"never failed"};
  };
  return program;
}

// Every rank's line, by rank ("rank 3: braidRemoteError (...): ..." -> [3] = "braidRemote...").
std::vector<std::string> byRank(const Failures& failures, int nranks) {
  std::vector<std::string> lines(nranks);
  const std::regex line("^rank ([0-9]+): (.*)$");
  for (const std::string& f : failures) {
    std::smatch m;
    if (std::regex_match(f, m, line) && std::stoi(m[1]) < nranks)
      lines[std::stoi(m[1])] += m[2].str();
    else
      ADD_FAILURE() << "unexpected report: " << f;
  }
  return lines;
}

void run(const std::string& command) {
  EXPECT_EQ(std::system(command.c_str()), 0) << command;
}

class Faults : public testing::Test {
 protected:
  void requireHosts(size_t hosts) {
    if (testHosts().size() != hosts)
      GTEST_SKIP() << "needs " << hosts << " hosts: run it through netns_hosts.sh --hosts " << hosts
                   << " (see multihost.cmake)";
  }
};

// Host 1's port on the bridge goes down while 6 ranks on 3 hosts (2 each) all-reduce. Ranks on
// host 1 lose every peer elsewhere; ranks elsewhere lose host 1's ranks. Each must say so: a rank
// may first hear of it from a peer that failed (its reason quoted), so the connection named last
// before "unreachable" is the one lost.
TEST_F(Faults, LinkDownMidAllReduceEveryRankNamesAPeerItLost) {
  requireHosts(3);
  const int nranks = 6;
  Board* board = sharedBoard();
  std::thread saboteur([&] {
    if (!waitFor(board->looping, nranks, 60s)) return;
    std::this_thread::sleep_for(300ms);
    run("ip -n " + switchNamespace() + " link set port1 down");
  });
  const Failures failures =
      launchRanks(Launch::Processes, nranks, allReduceUntilFailure(board, 60000, nranks), 100s);
  saboteur.join();
  run("ip -n " + switchNamespace() + " link set port1 up");

  const std::vector<std::string> lines = byRank(failures, nranks);
  const std::regex lost(
      "connection with rank ([0-9]+) failed: (?:(?!connection with rank).)*unreachable");
  for (int rank = 0; rank < nranks; ++rank) {
    SCOPED_TRACE("rank " + std::to_string(rank) + " on host " + std::to_string(hostOfRank(rank)));
    std::smatch m;
    ASSERT_TRUE(std::regex_search(lines[rank], m, lost)) << lines[rank];
    const int peer = std::stoi(m[1]);
    EXPECT_NE(hostOfRank(peer) == 1, hostOfRank(rank) == 1)
        << "rank " << peer << " is on host " << hostOfRank(peer) << ": " << lines[rank];
    EXPECT_EQ(lines[rank].rfind("braidRemoteError", 0), 0u) << lines[rank];
  }
}

// Rank 3 (host 1 of 2) is killed between all-reduces: its host-mate sees its pidfd, the ranks on
// host 0 see its connections close. Every survivor names rank 3.
TEST_F(Faults, KilledRankIsNamedByPeersOnEveryHost) {
  requireHosts(2);
  const int nranks = 4;
  Board* board = sharedBoard();
  const Failures failures =
      launchRanks(Launch::Processes, nranks, allReduceUntilFailure(board, 60000, 3, 3), 100s);
  const std::vector<std::string> lines = byRank(failures, nranks);
  EXPECT_NE(lines[3].find("killed by signal 9"), std::string::npos) << lines[3];
  for (int rank : {0, 1, 2}) {
    EXPECT_EQ(lines[rank].rfind("braidRemoteError", 0), 0u) << lines[rank];
    EXPECT_NE(lines[rank].find("rank 3"), std::string::npos) << lines[rank];
  }
}

// Rank 1 (host 1 of 2) times out waiting for a message rank 0 never sends, while the others wait
// for rank 1 with a long timeout. Rank 3, on its host, reads the reason from its control block;
// ranks 0 and 2 must learn it across the network (SendComm::abort) and fail at once quoting it,
// not with a closed connection or at their own timeout.
TEST_F(Faults, FailedRanksReasonReachesPeersOnOtherHosts) {
  requireHosts(2);
  const int nranks = 4, failing = 1, shortMs = 4000, longMs = 60000;
  Board* board = sharedBoard();
  RankProgram program;
  program.describeStep = [](int64_t step) {
    return step == 0 ? std::string("the first all-reduce") : std::string("the receive");
  };
  program.run = [=](const RankEnv& env) -> Failures {
    braidComm_t comm = nullptr;
    if (braidResult_t r = initRank(&comm, env, env.rank == failing ? shortMs : longMs);
        r != braidSuccess)
      return {"init: " + describeResult(r, nullptr)};
    float value = 1;
    env.at(0);
    // Every rank has joined before rank 1's short timeout counts. A ring all-reduce (4 MiB: no
    // one-shot exchange) connects ring neighbours only: ranks 0 and 2 have no connection from
    // rank 1 (ring 0 2 1 3), which must make one on first use to tell them why it failed.
    std::vector<float> warmUp(size_t{1} << 20, 1.0f);
    if (braidResult_t r = braidAllReduce(warmUp.data(), warmUp.data(), warmUp.size(), braidFloat32,
                                         braidSum, comm, nullptr);
        r != braidSuccess)
      return {"all-reduce: " + describeResult(r, comm)};
    env.at(1);
    const auto start = std::chrono::steady_clock::now();
    const braidResult_t r =
        braidRecv(&value, 1, braidFloat32, env.rank == failing ? 0 : failing, comm, nullptr);
    board->waitedMs[env.rank] = std::chrono::duration_cast<std::chrono::milliseconds>(
                                    std::chrono::steady_clock::now() - start)
                                    .count();
    const std::string error = describeResult(r, comm);
    // Rank 1 keeps its connections until every rank has failed: their close would say less.
    board->failed.fetch_add(1);
    waitFor(board->failed, nranks, 60s);
    braidCommDestroy(comm);
    return {error};
  };
  const Failures failures = launchRanks(Launch::Processes, nranks, program, 100s);
  const std::vector<std::string> lines = byRank(failures, nranks);
  EXPECT_EQ(lines[failing].rfind("braidTimeout", 0), 0u) << lines[failing];
  const std::regex reason("rank 1: [a-z/-]+ #[0-9]+ timed out after " + std::to_string(shortMs) +
                          " ms waiting for [a-z/-]+ from rank 0");
  for (int rank : {0, 2, 3}) {
    SCOPED_TRACE("rank " + std::to_string(rank) + " on host " + std::to_string(hostOfRank(rank)));
    EXPECT_EQ(lines[rank].rfind("braidRemoteError", 0), 0u) << lines[rank];
    EXPECT_TRUE(std::regex_search(lines[rank], reason)) << lines[rank];
    // Rank 1's timeout and a little: nowhere near its own.
    EXPECT_LT(board->waitedMs[rank].load(), shortMs + 5000) << lines[rank];
  }
}

// Whether process `pid` has ended (a zombie its parent has not reaped yet, or gone).
bool processEnded(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string pidField, name, state;
  return !(stat >> pidField >> name >> state) || state == "Z";
}

// Rank 1 (host 1 of 2) is killed after init, before any message to it: connections are made on
// first use, so rank 0's all-reduce dials a listener that is gone. The refusal is its answer at
// once (it was tried again until the keepalive's 2 s, then said "could not connect before the
// deadline", and met the failures its peers sent only after that).
TEST_F(Faults, APeerGoneBeforeItsFirstConnectionIsRefusedAtOnce) {
  requireHosts(2);
  Board* board = sharedBoard();
  RankProgram program;
  program.describeStep = [](int64_t) { return std::string("the all-reduce"); };
  program.run = [=](const RankEnv& env) -> Failures {
    board->pid[env.rank] = getpid();
    braidComm_t comm = nullptr;
    if (braidResult_t r = initRank(&comm, env, 60000); r != braidSuccess)
      return {"init: " + describeResult(r, nullptr)};
    env.at(0);
    if (env.rank == 1) raise(SIGKILL);
    while (board->pid[1].load() == 0 || !processEnded(board->pid[1].load()))
      std::this_thread::sleep_for(5ms);
    std::vector<float> data(1024, 1.0f);
    const braidResult_t r = braidAllReduce(data.data(), data.data(), data.size(), braidFloat32,
                                           braidSum, comm, nullptr);
    const std::string error = describeResult(r, comm);
    braidCommAbort(comm);
    return {error};
  };
  const std::vector<std::string> lines =
      byRank(launchRanks(Launch::Processes, 2, program, 100s), 2);
  EXPECT_NE(lines[1].find("killed by signal 9"), std::string::npos) << lines[1];
  EXPECT_EQ(lines[0].rfind("braidRemoteError", 0), 0u) << lines[0];
  EXPECT_NE(lines[0].find("refused the connection"), std::string::npos) << lines[0];
}

// Rank 1 stops (SIGSTOP) in the middle of the loop: its kernel still answers, so its link looks
// alive, but nothing it should send or read moves. Rank 0 times out naming it.
TEST_F(Faults, PeerThatStopsReadingEndsInATimeoutNamingIt) {
  requireHosts(2);
  const int nranks = 2;
  Board* board = sharedBoard();
  std::thread saboteur([&] {
    if (!waitFor(board->looping, nranks, 60s)) return;
    std::this_thread::sleep_for(300ms);
    kill(board->pid[1], SIGSTOP);
    waitFor(board->failed, 1, 60s);
    kill(board->pid[1], SIGKILL);
  });
  const Failures failures =
      launchRanks(Launch::Processes, nranks, allReduceUntilFailure(board, 4000, 1), 100s);
  saboteur.join();
  const std::vector<std::string> lines = byRank(failures, nranks);
  EXPECT_EQ(lines[0].rfind("braidTimeout", 0), 0u) << lines[0];
  EXPECT_NE(lines[0].find("from rank 1"), std::string::npos) << lines[0];
  EXPECT_NE(lines[1].find("killed by signal 9"), std::string::npos) << lines[1];
}

// A rank may destroy its communicator right after a send: what it sent still arrives, and its
// closed connections are no failure for the ranks that go on (rank 0 leaves; ranks 1 and 2, each
// on a host of its own, keep talking).
TEST(Departure, SendThenDestroyDeliversEverythingAndIsNoFailure) {
  if (testHosts().size() != 3) GTEST_SKIP() << "needs 3 hosts: run it through netns_hosts.sh";
  constexpr size_t kCount = size_t{4} << 20;
  RankProgram program;
  program.describeStep = [](int64_t step) { return "step " + std::to_string(step); };
  program.run = [](const RankEnv& env) -> Failures {
    braidComm_t comm = nullptr;
    if (braidResult_t r = initRank(&comm, env, 30000); r != braidSuccess)
      return {"init: " + describeResult(r, nullptr)};
    std::vector<uint32_t> data(kCount);
    Failures failures;
    auto check = [&](const char* what, braidResult_t r) {
      if (r != braidSuccess) failures.push_back(std::string(what) + ": " + describeResult(r, comm));
      return r == braidSuccess;
    };
    auto verify = [&](uint32_t salt) {
      for (size_t i = 0; i < kCount; ++i)
        if (data[i] != i * 3 + salt) {
          failures.push_back("element " + std::to_string(i) + " is " + std::to_string(data[i]));
          return;
        }
    };
    if (env.rank == 0) {
      for (size_t i = 0; i < kCount; ++i) data[i] = static_cast<uint32_t>(i * 3 + 1);
      check("send to 1", braidSend(data.data(), kCount, braidUint32, 1, comm, nullptr));
    } else if (env.rank == 1 && check("recv from 0", braidRecv(data.data(), kCount, braidUint32, 0,
                                                               comm, nullptr))) {
      verify(1);
      for (size_t i = 0; i < kCount; ++i) data[i] = static_cast<uint32_t>(i * 3 + 2);
      std::this_thread::sleep_for(300ms);  // rank 0 is gone by now
      check("send to 2", braidSend(data.data(), kCount, braidUint32, 2, comm, nullptr));
    } else if (env.rank == 2) {
      std::this_thread::sleep_for(800ms);  // rank 1's send waits for room meanwhile
      if (check("recv from 1", braidRecv(data.data(), kCount, braidUint32, 1, comm, nullptr)))
        verify(2);
    }
    check("destroy", braidCommDestroy(comm));
    return failures;
  };
  for (const std::string& failure : launchRanks(Launch::Processes, 3, program, 100s))
    ADD_FAILURE() << failure;
}

// A rank aborts right after its all-reduce returned: its last messages may still be on their way
// (a send returns once its data is in the FIFO) when the abort's reason follows them, on every
// socket of the connection. The peers' same all-reduce must end whole and right: the abort
// delivers what finished operations left unsent first, and a receiver takes every message sent
// before a reason (it may read the reason on one socket before the last parts on another). Rank 1
// aborts a fresh communicator split off each round, 3 ranks on 3 hosts; before, the peers failed
// in about half of the rounds.
TEST(Departure, AnAbortRightAfterASuccessfulCallLeavesThePeersCallWhole) {
  if (testHosts().size() != 3) GTEST_SKIP() << "needs 3 hosts: run it through netns_hosts.sh";
  constexpr int kRounds = 12;
  constexpr size_t kCount = 1024;
  RankProgram program;
  program.describeStep = [](int64_t step) { return "round " + std::to_string(step); };
  program.run = [](const RankEnv& env) -> Failures {
    braidComm_t parent = nullptr;
    if (braidResult_t r = initRank(&parent, env, 30000); r != braidSuccess)
      return {"init: " + describeResult(r, nullptr)};
    Failures failures;
    for (int round = 0; round < kRounds && failures.empty(); ++round) {
      env.at(round);
      braidComm_t comm = nullptr;
      if (braidResult_t r = braidCommSplit(parent, 0, env.rank, &comm, nullptr); r != braidSuccess)
        return {"split: " + describeResult(r, parent)};
      std::vector<float> data(kCount);
      for (size_t i = 0; i < kCount; ++i) data[i] = static_cast<float>(env.rank * 1000 + i);
      const braidResult_t r =
          braidAllReduce(data.data(), data.data(), kCount, braidFloat32, braidSum, comm, nullptr);
      if (r != braidSuccess)
        failures.push_back("round " + std::to_string(round) + ": " + describeResult(r, comm));
      for (size_t i = 0; r == braidSuccess && i < kCount; ++i)
        if (data[i] != static_cast<float>(3000 + 3 * i)) {
          failures.push_back("round " + std::to_string(round) + ": element " + std::to_string(i) +
                             " is " + std::to_string(data[i]));
          break;
        }
      const braidResult_t ended = env.rank == 1 ? braidCommAbort(comm) : braidCommDestroy(comm);
      if (ended != braidSuccess) failures.push_back("ending the round's communicator failed");
    }
    braidCommDestroy(parent);
    return failures;
  };
  for (const std::string& failure : launchRanks(Launch::Processes, 3, program, 200s))
    ADD_FAILURE() << failure;
}

}  // namespace
}  // namespace braid_test
