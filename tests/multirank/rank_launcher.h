// Runs one program on N ranks, as threads of this process or as forked processes, and collects
// what went wrong. Nothing here hangs: communicators get a timeout, and a rank that stops making
// progress is reported with the step it was in (and killed, where it is a process).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "braid/braid.h"

namespace braid_test {

using Failures = std::vector<std::string>;

// Every communicator the tests create waits at most this long for a peer.
inline constexpr int kOpTimeoutMs = 60000;

// Where one rank is; lives in memory shared across fork so the launcher can read it.
struct alignas(64) ProgressSlot {
  std::atomic<int64_t> step{-1};
};

struct RankEnv {
  int rank;
  int nranks;
  braidUniqueId id;
  ProgressSlot* progress;

  // Publishes the step this rank has started, for the hang report.
  void at(int64_t step) const { progress->step.store(step, std::memory_order_relaxed); }
};

struct RankProgram {
  std::function<Failures(const RankEnv&)> run;
  // Names a step published with RankEnv::at.
  std::function<std::string(int64_t step)> describeStep;
};

// Threads and Processes share one braidGetUniqueId; OneWorker runs the program once, on one
// thread, with no id (it makes its own communicators, e.g. with braidCommInitAll).
enum class Launch { Threads, Processes, OneWorker };

// Runs program.run for ranks 0..nranks-1 as threads, or as children forked after
// braidGetUniqueId. Returns every failure, each prefixed with its rank. When no rank advances for
// stallLimit, reports where each unfinished rank is and gives up: children are killed; threads
// cannot be, so the whole process exits with the report on stderr.
Failures launchRanks(Launch how, int nranks, const RankProgram& program,
                     std::chrono::seconds stallLimit);

// braidCommInitRankConfig on the CPU device with the given per-operation timeout.
braidResult_t initRank(braidComm_t* comm, const RankEnv& env, int timeoutMs = kOpTimeoutMs);

// A parameterized test's launch: how and how many ranks; named "threads_2ranks",
// "processes_4ranks".
struct RanksParam {
  Launch how;
  int nranks;
};
std::string ranksParamName(const RanksParam& param);

// "braidRemoteError (<error string>): <braidGetLastError(comm)>".
std::string describeResult(braidResult_t result, braidComm_t comm);

}  // namespace braid_test
