// braid-perf: nccl-tests for braid. One binary, the collective as a subcommand:
//   braid-perf allreduce -b 8 -e 256M -f 2 --np 2 -c 1
// prints nccl-tests' table (size, count, type, redop, root, then time, algbw, busbw and #wrong
// out-of-place and in-place) and exits 0 passed, 1 wrong values, 2 bad flags, 3 the run failed.
// It uses only braid's public API.
#include <fmt/format.h>

#include <cstdio>

#include "perf/launch.h"
#include "perf/options.h"

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);  // rows appear as they are measured
  try {
    const std::optional<braid_perf::Options> options = braid_perf::parseOptions(argc, argv);
    if (!options) return braid_perf::kExitPassed;
    return braid_perf::launchAndRun(*options);
  } catch (const braid_perf::UsageError& e) {
    fmt::print(stderr, "braid-perf: {}\n", e.what());
    return braid_perf::kExitUsage;
  }
}
