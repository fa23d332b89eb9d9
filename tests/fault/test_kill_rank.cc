// A rank dies (SIGKILL) in the middle of a large all-reduce over shared memory (each rank maps
// every rank's segment): the survivors must return braidRemoteError naming the dead rank and its
// pid within the timeout, and shut down cleanly. A timeout is a failure here: it would mean that
// the death went unnoticed and the survivors only gave up waiting. (Segments are memory files
// with no name to leave behind: test_shm_without_dev_shm.)
#include <gtest/gtest.h>
#include <signal.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "braid/braid.h"
#include "fault/child_processes.h"

namespace {

using braid_test::Clock;
using braid_test::monotonicNs;

constexpr int kRanks = 4;
constexpr int kVictim = 2;
constexpr int kTimeoutMs = 10000;
constexpr size_t kCount = size_t{16} << 20;  // 64 MiB of float32
constexpr int kVerifiedOps = 2;              // complete, checked all-reduces before the kill
constexpr int kMaxOpsAfterKill = 20;         // survivors give up looking for the error after these
constexpr auto kVictimDelay = std::chrono::milliseconds(20);  // into its first op after the sync

// Child exit codes.
enum Exit {
  kGotExpectedError = 0,
  kNoUniqueId = 10,
  kSetupFailed = 11,
  kWrongResult = 12,
  kUnexpectedError = 13,
  kNoError = 14,
  kAbortFailed = 15,
};

constexpr int kMaxSegments = 16;

struct RankReport {
  int verifiedOps = 0;
  int result = braidSuccess;
  int64_t errorNs = 0;
  char lastError[1024] = {};
  // The labels of the segments this rank had mapped once its communicator ran: this job's, not
  // those of tests running beside it (ctest -j), which the leftover check must not count.
  char segments[kMaxSegments][64] = {};
};

struct Shared {
  std::atomic<int> idReady{0};
  braidUniqueId id{};
  std::atomic<int64_t> killNs{0};
  RankReport ranks[kRanks];
};

// Notes a failed call in the rank's report; returns `exitCode` for the child to exit with.
int record(RankReport& me, braidResult_t result, braidComm_t comm, int exitCode) {
  me.errorNs = monotonicNs();
  me.result = result;
  std::snprintf(me.lastError, sizeof me.lastError, "%s", braidGetLastError(comm));
  return exitCode;
}

float input(size_t i, int rank) {
  return float((i & 15) + 1) * float(rank + 1);
}

bool sumCorrect(const std::vector<float>& recv) {
  const float rankFactor = kRanks * (kRanks + 1) / 2;
  for (size_t i = 0; i < recv.size(); ++i)
    if (recv[i] != float((i & 15) + 1) * rankFactor) return false;
  return true;
}

// Records the labels of the braid segments this process maps (its communicator's, the peers'
// too): memory files, "/memfd:braid-<nonce>-<rank> (deleted)" in the maps.
void recordMappedSegments(RankReport& me) {
  std::ifstream maps("/proc/self/maps");
  std::set<std::string> names;
  for (std::string line; std::getline(maps, line);)
    if (const size_t at = line.find("/memfd:braid-"); at != std::string::npos) {
      const std::string label = line.substr(at + std::strlen("/memfd:"));
      names.insert(label.substr(0, label.find(' ')));
    }
  int k = 0;
  for (const std::string& name : names)
    if (k < kMaxSegments)
      std::snprintf(me.segments[k++], sizeof me.segments[0], "%s", name.c_str());
}

int runRank(Shared& shared, int rank) {
  RankReport& me = shared.ranks[rank];
  if (rank == 0) {
    braidResult_t r = braidGetUniqueId(&shared.id);
    if (r != braidSuccess) return record(me, r, nullptr, kSetupFailed);
    shared.idReady.store(1);
  } else {
    auto deadline = Clock::now() + std::chrono::milliseconds(kTimeoutMs);
    while (shared.idReady.load() == 0) {
      if (Clock::now() > deadline) return kNoUniqueId;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }

  braidConfig_t config = BRAID_CONFIG_INITIALIZER;
  config.timeoutMs = kTimeoutMs;
  config.device = "cpu";
  config.commName = "kill-rank";
  braidComm_t comm = nullptr;
  braidResult_t r = braidCommInitRankConfig(&comm, kRanks, shared.id, rank, &config);
  if (r != braidSuccess) return record(me, r, nullptr, kSetupFailed);

  std::vector<float> send(kCount), recv(kCount);
  for (size_t i = 0; i < kCount; ++i) send[i] = input(i, rank);
  for (int op = 0; op < kVerifiedOps; ++op) {
    std::fill(recv.begin(), recv.end(), -1.0f);
    r = braidAllReduce(send.data(), recv.data(), kCount, braidFloat32, braidSum, comm, nullptr);
    if (r != braidSuccess) return record(me, r, comm, kSetupFailed);
    if (!sumCorrect(recv)) return kWrongResult;
    ++me.verifiedOps;
  }
  recordMappedSegments(me);
  // A one-element all-reduce lines the ranks up, so the kill lands inside the large op below.
  float one = 1, total = 0;
  r = braidAllReduce(&one, &total, 1, braidFloat32, braidSum, comm, nullptr);
  if (r != braidSuccess) return record(me, r, comm, kSetupFailed);

  if (rank == kVictim) {
    std::thread([&shared] {
      std::this_thread::sleep_for(kVictimDelay);
      shared.killNs.store(monotonicNs());
      raise(SIGKILL);
    }).detach();
  }
  for (int op = 0; op < kMaxOpsAfterKill; ++op) {
    r = braidAllReduce(send.data(), recv.data(), kCount, braidFloat32, braidSum, comm, nullptr);
    if (r == braidSuccess) continue;
    const int exitCode = r == braidRemoteError ? kGotExpectedError : kUnexpectedError;
    record(me, r, comm, exitCode);
    return braidCommAbort(comm) == braidSuccess ? exitCode : kAbortFailed;
  }
  return kNoError;
}

TEST(KillRank, SurvivorsReportTheDeadRankWithinTheTimeout) {
  braid_test::SharedBlock<Shared> shared;
  std::vector<pid_t> pids;
  for (int rank = 0; rank < kRanks; ++rank)
    pids.push_back(braid_test::forkChild([&shared, rank] { return runRank(*shared, rank); }));
  auto children = braid_test::waitChildren(pids, Clock::now() + std::chrono::seconds(90));

  const auto& victim = children[kVictim];
  EXPECT_TRUE(WIFSIGNALED(victim.status) && WTERMSIG(victim.status) == SIGKILL)
      << "rank " << kVictim << " " << describe(victim);
  const int64_t killNs = shared->killNs.load();
  ASSERT_NE(killNs, 0) << "rank " << kVictim << " never reached its kill";

  for (int rank = 0; rank < kRanks; ++rank) {
    if (rank == kVictim) continue;
    const RankReport& report = shared->ranks[rank];
    SCOPED_TRACE("rank " + std::to_string(rank) + ": " + describe(children[rank]) + ", result " +
                 braidGetErrorString(braidResult_t(report.result)) +
                 ", last error: " + report.lastError);
    EXPECT_EQ(report.verifiedOps, kVerifiedOps);
    EXPECT_TRUE(WIFEXITED(children[rank].status) &&
                WEXITSTATUS(children[rank].status) == kGotExpectedError);
    EXPECT_EQ(report.result, braidRemoteError);
    const std::string deadRank =
        "rank " + std::to_string(kVictim) + " (pid " + std::to_string(pids[kVictim]) + ")";
    EXPECT_NE(std::string(report.lastError).find(deadRank), std::string::npos)
        << "the error should name " << deadRank;
    const double secondsAfterKill = (report.errorNs - killNs) / 1e9;
    EXPECT_LE(secondsAfterKill, kTimeoutMs / 1000.0 + 2.0) << "error came too late";
  }

  // The segments the ranks mapped (every rank's: each maps its peers'): the run was over shared
  // memory.
  std::set<std::string> mapped;
  for (const RankReport& report : shared->ranks)
    for (const auto& name : report.segments)
      if (name[0] != '\0') mapped.insert(name);
  EXPECT_GE(mapped.size(), size_t{kRanks}) << "the ranks mapped no segment of each rank";
}

}  // namespace
