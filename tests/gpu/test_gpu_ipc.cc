// Two processes on one GPU, each reaching the other's FIFOs through a CUDA IPC handle: the CUDA
// communicator's cases (gpu/comm_cases.h) in fp32 and bf16. In an executable of its own: the
// ranks are forked before this process touches CUDA (a forked child cannot use a context its
// parent made), which no other test in the process may have done. Skipped, saying so, where no
// CUDA device is present.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "gpu/comm_cases.h"

namespace braid_test {
namespace {

// Two processes on one GPU: each reaches the other's FIFOs through a CUDA IPC handle. The
// children are forked before this process touches CUDA (a forked child cannot use a CUDA context
// its parent made), and report through their exit status and stderr.
TEST(CudaCommProcesses, TwoProcessesMeetThroughIpc) {
  // Asked of a child too, for the same reason.
  const pid_t probe = fork();
  if (probe == 0) _exit(noCudaDevice().empty() ? 0 : 1);
  int status = 0;
  waitpid(probe, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    GTEST_SKIP() << "no CUDA device here: CUDA IPC needs a GPU";
  braidUniqueId id;
  ASSERT_EQ(braidGetUniqueId(&id), braidSuccess);
  constexpr int kRanks = 2;
  std::vector<pid_t> children;
  for (int rank = 0; rank < kRanks; ++rank) {
    const pid_t pid = fork();
    if (pid == 0) {
      std::vector<std::string> failures;
      CudaRank me;
      if (const std::string failed = openCudaRank(kRanks, id, rank, me); !failed.empty()) {
        failures.push_back(failed);
      } else {
        for (const Case& c : commCases(kRanks)) {
          if (c.type != braidFloat32 && c.type != braidBfloat16) continue;
          runCase(c, rank, kRanks, me.comm, me.stream, failures);
          if (!failures.empty()) break;
        }
      }
      closeCudaRank(me);
      for (const std::string& f : failures) fprintf(stderr, "rank %d: %s\n", rank, f.c_str());
      _exit(failures.empty() ? 0 : 1);
    }
    children.push_back(pid);
  }
  for (int rank = 0; rank < kRanks; ++rank) {
    waitpid(children[rank], &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "rank " << rank << " failed (its stderr says how)";
  }
}

}  // namespace
}  // namespace braid_test
