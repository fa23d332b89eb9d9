// CUDA communicators across hosts: ranks forked into the network namespaces netns_hosts.sh makes
// (rank r on host r % hosts), so a hop between hosts goes through FIFOs in pinned host memory that
// the network proxies move over TCP, and a hop within a host through CUDA IPC. The CUDA
// communicator's cases (gpu/comm_cases.h) in fp32 and bf16, at 2 ranks on 2 hosts and at 4 ranks
// (2 per host). Each child enters its host before it touches CUDA (the runtime's threads could not
// follow it), and the ranks are forked before this process touches CUDA (gpu/test_gpu_ipc.cc says
// why). Skipped, saying so, where no CUDA device is present or not run by netns_hosts.sh.
#include <string>

#include "gpu/comm_cases.h"
#include "multihost/netns_ranks.h"

namespace braid_test {
namespace {

class CudaCommHosts : public testing::TestWithParam<int> {};

TEST_P(CudaCommHosts, EveryCaseMatchesTheReference) {
  if (testHosts().size() < 2) GTEST_SKIP() << "not run by netns_hosts.sh with 2 hosts or more";
  if (!childSeesCudaDevice())
    GTEST_SKIP() << "no CUDA device here: CUDA communicators across hosts need a GPU";
  const auto enter = [](int rank) {
    const std::string why = enterHost(hostOfRank(rank));
    return why.empty() ? why : "cannot enter its host: " + why;
  };
  for (const std::string& f : runForkedRanks(GetParam(), enter)) ADD_FAILURE() << f;
}

INSTANTIATE_TEST_SUITE_P(Gpu, CudaCommHosts, testing::Values(2, 4),
                         [](const testing::TestParamInfo<int>& info) {
                           return std::to_string(info.param) + "ranks";
                         });

}  // namespace
}  // namespace braid_test
