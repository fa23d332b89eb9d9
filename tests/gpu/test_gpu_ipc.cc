// Two processes on one GPU, each reaching the other's FIFOs through a CUDA IPC handle: the CUDA
// communicator's cases (gpu/comm_cases.h) in fp32 and bf16. In an executable of its own: the
// ranks are forked before this process touches CUDA (a forked child cannot use a context its
// parent made), which no other test in the process may have done. Skipped, saying so, where no
// CUDA device is present.
#include <string>

#include "gpu/comm_cases.h"

namespace braid_test {
namespace {

// Two processes on one GPU: each reaches the other's FIFOs through a CUDA IPC handle.
TEST(CudaCommProcesses, TwoProcessesMeetThroughIpc) {
  if (!childSeesCudaDevice()) GTEST_SKIP() << "no CUDA device here: CUDA IPC needs a GPU";
  for (const std::string& f : runForkedRanks(2, [](int) { return std::string(); }))
    ADD_FAILURE() << f;
}

}  // namespace
}  // namespace braid_test
