// CUDA communicators across hosts: ranks forked into the network namespaces netns_hosts.sh makes
// (rank r on host r % hosts), so a hop between hosts goes through FIFOs in pinned host memory that
// the network proxies move over TCP, and a hop within a host through CUDA IPC. The CUDA
// communicator's cases (gpu/comm_cases.h) in fp32 and bf16, at 2 ranks on 2 hosts and at 4 ranks
// (2 per host). Each child enters its host before it touches CUDA (the runtime's threads could not
// follow it), and the ranks are forked before this process touches CUDA (gpu/test_gpu_ipc.cc says
// why). Skipped, saying so, where no CUDA device is present or not run by netns_hosts.sh.
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "gpu/comm_cases.h"
#include "multihost/netns_ranks.h"

namespace braid_test {
namespace {

class CudaCommHosts : public testing::TestWithParam<int> {};

TEST_P(CudaCommHosts, EveryCaseMatchesTheReference) {
  if (testHosts().size() < 2) GTEST_SKIP() << "not run by netns_hosts.sh with 2 hosts or more";
  const pid_t probe = fork();
  if (probe == 0) _exit(noCudaDevice().empty() ? 0 : 1);
  int status = 0;
  waitpid(probe, &status, 0);
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    GTEST_SKIP() << "no CUDA device here: CUDA communicators across hosts need a GPU";
  const int n = GetParam();
  braidUniqueId id;
  ASSERT_EQ(braidGetUniqueId(&id), braidSuccess);
  std::vector<pid_t> children;
  for (int rank = 0; rank < n; ++rank) {
    const pid_t pid = fork();
    if (pid == 0) {
      std::vector<std::string> failures;
      CudaRank me;
      if (const std::string moved = enterHost(hostOfRank(rank)); !moved.empty()) {
        failures.push_back("cannot enter its host: " + moved);
      } else if (const std::string failed = openCudaRank(n, id, rank, me); !failed.empty()) {
        failures.push_back(failed);
      } else {
        for (const Case& c : commCases(n)) {
          if (c.type != braidFloat32 && c.type != braidBfloat16) continue;
          runCase(c, rank, n, me.comm, me.stream, failures);
          if (!failures.empty()) break;
        }
      }
      closeCudaRank(me);
      for (const std::string& f : failures) fprintf(stderr, "rank %d: %s\n", rank, f.c_str());
      _exit(failures.empty() ? 0 : 1);
    }
    children.push_back(pid);
  }
  for (int rank = 0; rank < n; ++rank) {
    waitpid(children[rank], &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "rank " << rank << " failed (its stderr says how)";
  }
}

INSTANTIATE_TEST_SUITE_P(Gpu, CudaCommHosts, testing::Values(2, 4),
                         [](const testing::TestParamInfo<int>& info) {
                           return std::to_string(info.param) + "ranks";
                         });

}  // namespace
}  // namespace braid_test
