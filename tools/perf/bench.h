// One rank's part of a braid-perf run: the sweeps of nccl-tests' TimeTest/BenchTime over an
// initialized communicator. Every rank calls runBenchmark; rank 0 prints.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "braid/braid.h"
#include "perf/options.h"

namespace braid_perf {

struct LaunchInfo {
  std::string mode;          // shown in the header: "fork", "threads", "environment (<variable>)"
  int processes;             // 0: one per rank (an external launcher's)
  std::string binding = "";  // how ranks were placed on cores, for the header; empty: not at all
};

// Runs every datatype x op sweep the options ask for on this thread's ranks (-g communicators,
// consecutive ranks of one clique). Returns the number of wrong elements over all rows, the same
// on every rank. Throws RunError when a braid call fails and UsageError when the options do not
// fit the communicator (a root outside it).
int64_t runBenchmark(const Options& options, const std::vector<braidComm_t>& comms,
                     const LaunchInfo& launch);

}  // namespace braid_perf
