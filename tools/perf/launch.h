// Starting the ranks: --np forks local processes; under an external launcher (mpirun, srun,
// torchrun) this process is one rank; otherwise this process runs -t ranks as threads.
#pragma once

#include "perf/options.h"

namespace braid_perf {

enum ExitStatus {
  kExitPassed = 0,
  kExitWrongValues = 1,
  kExitUsage = 2,
  kExitFailed = 3,  // a braid call failed, a rank died or the run timed out
};

// -T bounds the whole run of this process, whatever it is waiting for: when `seconds` have passed
// it says so on stderr under `tool`'s name and exits with kExitFailed.
void armTimeout(const char* tool, int seconds);

// Runs the benchmark as the options say; returns the exit status. Throws UsageError when the
// options do not fit the launch (a root outside the ranks, -t under an external launcher).
int launchAndRun(const Options& options);

}  // namespace braid_perf
