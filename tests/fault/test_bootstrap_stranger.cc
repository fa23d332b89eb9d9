// Strangers at the bootstrap port: while a job rendezvouses, one connection sends garbage and
// another sends nothing. The root must drop them with a WARN and the job must still produce a
// correct all-reduce. The port is fixed through BRAID_COMM_ID so the test knows where to knock.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <fstream>
#include <random>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "braid/braid.h"
#include "fault/child_processes.h"

namespace {

using braid_test::Clock;

constexpr int kTimeoutMs = 30000;
constexpr size_t kCount = (size_t{1} << 20) + 3;  // past any small-message path, not a round size

// Child exit codes.
enum Exit { kCorrect = 0, kSetupFailed = 10, kOpFailed = 11, kWrongResult = 12 };

struct RankReport {
  int result = braidSuccess;
  char lastError[1024] = {};
};

struct Shared {
  RankReport ranks[4];
};

// Connects to 127.0.0.1:port, retrying while nobody listens yet; -1 if the deadline passes.
int connectWhenListening(uint16_t port, Clock::time_point deadline) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  while (Clock::now() < deadline) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd >= 0 && connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) return fd;
    if (fd >= 0) close(fd);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return -1;
}

// What a confused client might send: an all-ones header (a huge length, if read as one), an
// HTTP request, then random bytes.
std::string garbage() {
  std::string bytes(64, '\xff');
  bytes += "GET / HTTP/1.1\r\nHost: braid\r\n\r\n";
  std::mt19937 random(12345);
  for (int i = 0; i < 4096; ++i) bytes += char(random());
  return bytes;
}

int runRank(RankReport& me, int rank, int nranks, uint16_t port, const std::string& rootLog) {
  // Before any braid call: braid reads its parameters on first use.
  setenv("BRAID_COMM_ID", ("127.0.0.1:" + std::to_string(port)).c_str(), 1);
  setenv("BRAID_SECRET", "stranger-test", 1);
  setenv("BRAID_DEBUG", "WARN", 1);
  if (rank == 0) setenv("BRAID_DEBUG_FILE", rootLog.c_str(), 1);

  auto fail = [&](braidResult_t result, braidComm_t comm, int exitCode) {
    me.result = result;
    std::snprintf(me.lastError, sizeof me.lastError, "%s", braidGetLastError(comm));
    return exitCode;
  };
  setenv("RANK", std::to_string(rank).c_str(), 1);
  setenv("WORLD_SIZE", std::to_string(nranks).c_str(), 1);
  braidConfig_t config = BRAID_CONFIG_INITIALIZER;
  config.timeoutMs = kTimeoutMs;
  config.device = "cpu";
  braidComm_t comm = nullptr;
  braidResult_t r = braidCommInitFromEnv(&comm, &config);
  if (r != braidSuccess) return fail(r, nullptr, kSetupFailed);

  std::vector<double> send(kCount), recv(kCount, -1.0);
  for (size_t i = 0; i < kCount; ++i) send[i] = double(i % 1000) * (rank + 1);
  r = braidAllReduce(send.data(), recv.data(), kCount, braidFloat64, braidSum, comm, nullptr);
  if (r != braidSuccess) return fail(r, comm, kOpFailed);
  const double rankFactor = nranks * (nranks + 1) / 2;
  for (size_t i = 0; i < kCount; ++i)
    if (recv[i] != double(i % 1000) * rankFactor) return kWrongResult;
  r = braidCommDestroy(comm);
  return r == braidSuccess ? kCorrect : fail(r, nullptr, kOpFailed);
}

class BootstrapStranger : public testing::TestWithParam<int> {};

TEST_P(BootstrapStranger, JobCompletesAndRootWarnsAboutDroppedConnections) {
  const int nranks = GetParam();
  const uint16_t port = braid_test::pickFreePort();
  const std::string rootLog =
      testing::TempDir() + "stranger_root_" + std::to_string(getpid()) + ".log";
  std::remove(rootLog.c_str());
  braid_test::SharedBlock<Shared> shared;
  auto spawn = [&](int rank) {
    return braid_test::forkChild(
        [&, rank] { return runRank(shared->ranks[rank], rank, nranks, port, rootLog); });
  };

  // Rank 0 opens the rendezvous; the strangers get in before any other rank arrives.
  std::vector<pid_t> pids{spawn(0)};
  const auto deadline = Clock::now() + std::chrono::seconds(90);
  int talker = connectWhenListening(port, Clock::now() + std::chrono::seconds(20));
  const std::string junk = garbage();
  if (talker >= 0) send(talker, junk.data(), junk.size(), MSG_NOSIGNAL);
  int silent = connectWhenListening(port, Clock::now() + std::chrono::seconds(20));
  for (int rank = 1; rank < nranks; ++rank) pids.push_back(spawn(rank));
  auto children = braid_test::waitChildren(pids, deadline);
  if (talker >= 0) close(talker);
  if (silent >= 0) close(silent);

  EXPECT_GE(talker, 0) << "nothing listened on the rendezvous port " << port;
  EXPECT_GE(silent, 0) << "the second stranger could not connect to port " << port;
  for (int rank = 0; rank < nranks; ++rank) {
    EXPECT_TRUE(WIFEXITED(children[rank].status) && WEXITSTATUS(children[rank].status) == kCorrect)
        << "rank " << rank << " " << describe(children[rank]) << ", result "
        << braidGetErrorString(braidResult_t(shared->ranks[rank].result))
        << ", last error: " << shared->ranks[rank].lastError;
  }

  std::ifstream log(rootLog);
  std::string text, line;
  bool warned = false;
  const std::regex dropped("drop|reject|refus|ignor|clos", std::regex::icase);
  while (std::getline(log, line)) {
    text += line + "\n";
    warned = warned ||
             (line.find("BRAID WARN") != std::string::npos && std::regex_search(line, dropped));
  }
  EXPECT_TRUE(warned) << "no WARN line about a dropped connection in the root's log:\n" << text;
  std::remove(rootLog.c_str());
}

INSTANTIATE_TEST_SUITE_P(Ranks, BootstrapStranger, testing::Values(2, 4),
                         testing::PrintToStringParamName());

}  // namespace
