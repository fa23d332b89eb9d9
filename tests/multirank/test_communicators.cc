// Several communicators of one job, made at the same time from one launcher environment
// (BRAID_COMM_ID is set for this whole binary, as a job started with it would have): over
// disjoint and overlapping sets of workers, as threads and as processes, and several world
// communicators from braidCommInitFromEnv. Each must be its own communicator with its own ranks
// and results: none may fail, and none may meet the ranks of another.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "braid/braid.h"
#include "fault/child_processes.h"

namespace braid_test {
namespace {

constexpr int kTimeoutMs = 60000;
constexpr int kMaxWorkers = 4;
constexpr int kMaxComms = 4;
constexpr size_t kCount = 1031;

// A free port below the ephemeral range (32768 and up on Linux), so that no connection another
// test makes meanwhile can take it as its local port.
uint16_t freeFixedPort() {
  for (uint16_t port = 20000 + static_cast<uint16_t>(getpid() % 12000);;
       port = port >= 31999 ? 20000 : port + 1) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(port);
    const bool free = bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0;
    close(fd);
    if (free) return port;
  }
}

// Before any braid call: braid reads its parameters once.
[[maybe_unused]] const bool kEnvironmentSet = [] {
  setenv("BRAID_COMM_ID", ("127.0.0.1:" + std::to_string(freeFixedPort())).c_str(), 1);
  setenv("BRAID_DEVICE", "cpu", 1);
  setenv("BRAID_TIMEOUT", std::to_string(kTimeoutMs).c_str(), 1);
  return true;
}();

// Communicator c's ranks, as worker indices in rank order.
using Layout = std::vector<std::vector<int>>;

struct Board {
  std::array<braidUniqueId, kMaxComms> ids{};
  std::array<std::atomic<int>, kMaxComms> idReady{};
  std::atomic<int> finished{0};  // workers done: each waits for all, so every root outlives use
  char failure[kMaxWorkers][512] = {};
};

int rankIn(const std::vector<int>& members, int worker) {
  for (size_t r = 0; r < members.size(); ++r)
    if (members[r] == worker) return static_cast<int>(r);
  return -1;
}

// What rank `rank` of communicator `c` contributes, and the sum over the communicator's ranks.
int32_t contribution(int c, int rank, size_t i) {
  return 1000 * (c + 1) + 10 * rank + static_cast<int32_t>(i % 7);
}
int32_t expectedSum(int c, int nranks, size_t i) {
  int32_t sum = 0;
  for (int r = 0; r < nranks; ++r) sum += contribution(c, r, i);
  return sum;
}

template <typename Clock = std::chrono::steady_clock>
bool waitFor(const std::atomic<int>& flag, int value) {
  const auto deadline = Clock::now() + std::chrono::milliseconds(kTimeoutMs);
  while (flag.load() < value) {
    if (Clock::now() > deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return true;
}

std::string resultText(braidResult_t r, braidComm_t comm) {
  return std::string(braidGetErrorString(r)) + ": " + braidGetLastError(comm);
}

// Checks one all-reduce on each communicator; returns what went wrong.
std::string allReduceOnEach(const std::vector<int>& commIndex, const std::vector<int>& sizes,
                            const std::vector<int>& ranks, const std::vector<braidComm_t>& comms) {
  for (size_t k = 0; k < comms.size(); ++k) {
    const int c = commIndex[k];
    int count = 0, rank = -1;
    braidCommCount(comms[k], &count);
    braidCommUserRank(comms[k], &rank);
    if (count != sizes[k] || rank != ranks[k])
      return "communicator " + std::to_string(c) + ": size " + std::to_string(count) + ", rank " +
             std::to_string(rank) + "; expected " + std::to_string(sizes[k]) + ", " +
             std::to_string(ranks[k]);
    std::vector<int32_t> send(kCount), recv(kCount, -1);
    for (size_t i = 0; i < kCount; ++i) send[i] = contribution(c, ranks[k], i);
    const braidResult_t r =
        braidAllReduce(send.data(), recv.data(), kCount, braidInt32, braidSum, comms[k], nullptr);
    if (r != braidSuccess)
      return "communicator " + std::to_string(c) + ": " + resultText(r, comms[k]);
    for (size_t i = 0; i < kCount; ++i)
      if (recv[i] != expectedSum(c, sizes[k], i))
        return "communicator " + std::to_string(c) + ": element " + std::to_string(i) + " is " +
               std::to_string(recv[i]) + ", expected " +
               std::to_string(expectedSum(c, sizes[k], i));
  }
  return "";
}

// One worker of a layout: makes the ids of the communicators it is rank 0 of, initializes all of
// its communicators at once (one group), then all-reduces on each.
std::string runWorker(Board& board, const Layout& layout, int worker) {
  std::vector<int> mine, sizes, ranks;
  for (int c = 0; c < static_cast<int>(layout.size()); ++c) {
    const int rank = rankIn(layout[c], worker);
    if (rank < 0) continue;
    mine.push_back(c);
    sizes.push_back(static_cast<int>(layout[c].size()));
    ranks.push_back(rank);
    if (rank == 0) {
      const braidResult_t r = braidGetUniqueId(&board.ids[c]);
      if (r != braidSuccess) return "braidGetUniqueId: " + resultText(r, nullptr);
      board.idReady[c].store(1);
    }
  }
  for (int c : mine)
    if (!waitFor(board.idReady[c], 1)) return "no id for communicator " + std::to_string(c);
  std::vector<braidComm_t> comms(mine.size());
  braidConfig_t config = BRAID_CONFIG_INITIALIZER;
  config.timeoutMs = kTimeoutMs;
  braidGroupStart();
  for (size_t k = 0; k < mine.size(); ++k)
    braidCommInitRankConfig(&comms[k], sizes[k], board.ids[mine[k]], ranks[k], &config);
  braidResult_t r = braidGroupEnd();
  if (r != braidSuccess) return "init: " + resultText(r, nullptr);
  std::string failure = allReduceOnEach(mine, sizes, ranks, comms);
  for (braidComm_t comm : comms) braidCommDestroy(comm);
  return failure;
}

// The k-th braidCommInitFromEnv of every process forms the k-th world communicator.
std::string runWorldWorker(int worker, int nworkers, int worldComms) {
  setenv("RANK", std::to_string(worker).c_str(), 1);
  setenv("WORLD_SIZE", std::to_string(nworkers).c_str(), 1);
  std::vector<braidComm_t> comms(worldComms);
  braidConfig_t config = BRAID_CONFIG_INITIALIZER;
  config.timeoutMs = kTimeoutMs;
  braidGroupStart();
  for (braidComm_t& comm : comms) braidCommInitFromEnv(&comm, &config);
  const braidResult_t r = braidGroupEnd();
  if (r != braidSuccess) return "init: " + resultText(r, nullptr);
  std::vector<int> index, sizes(worldComms, nworkers), ranks(worldComms, worker);
  for (int c = 0; c < worldComms; ++c) index.push_back(c);
  std::string failure = allReduceOnEach(index, sizes, ranks, comms);
  for (braidComm_t comm : comms) braidCommDestroy(comm);
  return failure;
}

enum class Launch { Threads, Processes };

void record(Board& board, int worker, const std::string& failure) {
  std::snprintf(board.failure[worker], sizeof board.failure[worker], "%s", failure.c_str());
  board.finished.fetch_add(1);
}

// Runs `body(worker)` on every worker and expects none to fail.
template <typename Body>
void runWorkers(Launch how, int nworkers, SharedBlock<Board>& board, Body body) {
  auto run = [&](int w) {
    record(*board, w, body(w));
    // Every worker stays until all are done: the job's rendezvous service lives in one of them.
    waitFor(board->finished, nworkers);
  };
  if (how == Launch::Threads) {
    std::vector<std::thread> threads;
    for (int w = 0; w < nworkers; ++w) threads.emplace_back(run, w);
    for (std::thread& t : threads) t.join();
  } else {
    std::vector<pid_t> pids;
    for (int w = 0; w < nworkers; ++w)
      pids.push_back(forkChild([&, w] {
        run(w);
        return 0;
      }));
    for (const ChildStatus& child :
         waitChildren(pids, Clock::now() + std::chrono::milliseconds(3 * kTimeoutMs)))
      EXPECT_TRUE(WIFEXITED(child.status) && WEXITSTATUS(child.status) == 0) << describe(child);
  }
  for (int w = 0; w < nworkers; ++w) EXPECT_STREQ(board->failure[w], "") << "worker " << w;
}

void runLayout(Launch how, int nworkers, const Layout& layout) {
  SharedBlock<Board> board;
  runWorkers(how, nworkers, board, [&](int w) { return runWorker(*board, layout, w); });
}

TEST(Communicators, TwoDisjointThreads) {
  runLayout(Launch::Threads, 4, {{0, 1}, {2, 3}});
}
TEST(Communicators, TwoDisjointProcesses) {
  runLayout(Launch::Processes, 4, {{0, 1}, {2, 3}});
}
// Rank orders that differ from the workers' order, and one worker in three communicators.
TEST(Communicators, ThreeOverlappingThreads) {
  runLayout(Launch::Threads, 3, {{0, 1, 2}, {1, 0}, {2, 1}});
}
TEST(Communicators, ThreeOverlappingProcesses) {
  runLayout(Launch::Processes, 3, {{0, 1, 2}, {1, 0}, {2, 1}});
}
TEST(Communicators, ThreeDisjointProcesses) {
  runLayout(Launch::Processes, 4, {{0, 1}, {2}, {3}});
}
TEST(Communicators, TwoWorldCommunicatorsFromTheEnvironmentProcesses) {
  SharedBlock<Board> board;
  runWorkers(Launch::Processes, 3, board, [](int w) { return runWorldWorker(w, 3, 2); });
}

}  // namespace
}  // namespace braid_test
