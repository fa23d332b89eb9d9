// A rank dies (SIGKILL) after the rendezvous, as it connects to the next rank of the bootstrap
// ring: that next rank waits for a connection that never comes. Every survivor must fail its init
// with braidRemoteError, the death passed back round the ring (a refused connection, a connection
// closed while a rank waited), and none may wait out the init timeout (braidTimeout): each did,
// before. The victim dies at that point by way of connect(): this test defines it, so the
// library's calls reach this definition first, which kills the victim's process at its first
// connection to anything but the rendezvous port (fixed through BRAID_COMM_ID).
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "braid/braid.h"
#include "fault/child_processes.h"

namespace {

using braid_test::Clock;

constexpr int kMaxRanks = 4;
constexpr int kTimeoutMs = 20000;

// Child exit codes.
enum Exit { kFailedAsExpected = 0, kInitSucceeded = 10, kOtherResult = 11 };

struct RankReport {
  int result = braidSuccess;
  char lastError[1024] = {};
};

struct Shared {
  RankReport ranks[kMaxRanks];
};

// Set in the victim's process only, before its init.
bool dieAtRingConnect = false;
uint16_t rendezvousPort = 0;

uint16_t portOf(const sockaddr* address) {
  if (address->sa_family == AF_INET)
    return ntohs(reinterpret_cast<const sockaddr_in*>(address)->sin_port);
  return ntohs(reinterpret_cast<const sockaddr_in6*>(address)->sin6_port);
}

}  // namespace

extern "C" int connect(int fd, const sockaddr* address, socklen_t length) {
  using Connect = int (*)(int, const sockaddr*, socklen_t);
  static const auto real = reinterpret_cast<Connect>(dlsym(RTLD_NEXT, "connect"));
  const bool tcp =
      address != nullptr && (address->sa_family == AF_INET || address->sa_family == AF_INET6);
  if (dieAtRingConnect && tcp && portOf(address) != rendezvousPort) raise(SIGKILL);
  return real(fd, address, length);
}

namespace {

int runRank(RankReport& me, int rank, int nranks, int victim, uint16_t port) {
  // Before any braid call: braid reads its parameters on first use.
  setenv("BRAID_COMM_ID", ("127.0.0.1:" + std::to_string(port)).c_str(), 1);
  setenv("BRAID_SECRET", "kill-in-bootstrap-test", 1);
  setenv("RANK", std::to_string(rank).c_str(), 1);
  setenv("WORLD_SIZE", std::to_string(nranks).c_str(), 1);
  if (rank == victim) {
    rendezvousPort = port;
    dieAtRingConnect = true;
  }
  braidConfig_t config = BRAID_CONFIG_INITIALIZER;
  config.timeoutMs = kTimeoutMs;
  config.device = "cpu";
  braidComm_t comm = nullptr;
  const braidResult_t r = braidCommInitFromEnv(&comm, &config);
  if (r == braidSuccess) {
    braidCommAbort(comm);
    return kInitSucceeded;
  }
  me.result = r;
  std::snprintf(me.lastError, sizeof me.lastError, "%s", braidGetLastError(nullptr));
  return r == braidRemoteError ? kFailedAsExpected : kOtherResult;
}

// (ranks, victim)
class KillInBootstrap : public testing::TestWithParam<std::pair<int, int>> {};

TEST_P(KillInBootstrap, EverySurvivorFailsItsInitWithoutWaitingOutTheTimeout) {
  const auto [nranks, victim] = GetParam();
  const uint16_t port = braid_test::pickFreePort();
  braid_test::SharedBlock<Shared> shared;
  std::vector<pid_t> pids;
  for (int rank = 0; rank < nranks; ++rank)
    pids.push_back(braid_test::forkChild(
        [&, rank] { return runRank(shared->ranks[rank], rank, nranks, victim, port); }));
  auto children = braid_test::waitChildren(pids, Clock::now() + std::chrono::seconds(90));

  EXPECT_TRUE(WIFSIGNALED(children[victim].status) && WTERMSIG(children[victim].status) == SIGKILL)
      << "rank " << victim << " " << describe(children[victim]);
  for (int rank = 0; rank < nranks; ++rank) {
    if (rank == victim) continue;
    const RankReport& report = shared->ranks[rank];
    EXPECT_TRUE(WIFEXITED(children[rank].status) &&
                WEXITSTATUS(children[rank].status) == kFailedAsExpected)
        << "rank " << rank << " " << describe(children[rank]) << ", result "
        << braidGetErrorString(braidResult_t(report.result))
        << ", last error: " << report.lastError;
  }
}

// Rank 0 hosts the rendezvous's root too, which has sent every table by then.
INSTANTIATE_TEST_SUITE_P(RanksAndVictim, KillInBootstrap,
                         testing::Values(std::pair{2, 0}, std::pair{2, 1}, std::pair{3, 1},
                                         std::pair{4, 0}, std::pair{4, 2}, std::pair{4, 3}),
                         [](const testing::TestParamInfo<std::pair<int, int>>& info) {
                           return std::to_string(info.param.first) + "ranks_victim" +
                                  std::to_string(info.param.second);
                         });

}  // namespace
