// Planning time: the link graph from a machine's topology, then the ring search, for the sizes the
// planner promises (issue #5): 16 GPUs on one host under 50 ms, 8 GPUs x 64 hosts under 1 s.
// Topologies come from ../shared/topologies/xml; a missing file (or an hwloc one without hwloc)
// is reported as skipped.
#include <benchmark/benchmark.h>

#include <filesystem>

#include "plan/from_topology.h"
#include "topology/hwloc_import.h"
#include "topology/load.h"

namespace {

void planMachine(benchmark::State& state, const char* file, int ranksPerHost, int hosts) {
  std::string path = std::string(BRAID_SHARED_TOPOLOGIES) + "/xml/" + file;
  if (!std::filesystem::exists(path) ||
      (std::string(file).rfind("hwloc_", 0) == 0 && !braid::topo::haveHwloc())) {
    state.SkipWithError(("cannot read " + path).c_str());
    return;
  }
  braid::topo::Topology topology = braid::topo::loadTopology(path);
  size_t channels = 0;
  double total = 0;
  for (auto _ : state) {
    braid::plan::LinkGraph graph = braid::plan::fromTopology(topology, ranksPerHost, hosts);
    braid::plan::Plan plan = braid::plan::search(graph);
    channels = plan.channels.size();
    total = plan.totalBandwidthGBs();
    benchmark::DoNotOptimize(plan);
  }
  state.counters["ranks"] = ranksPerHost * hosts;
  state.counters["channels"] = static_cast<double>(channels);
  state.counters["GB/s"] = total;
}

BENCHMARK_CAPTURE(planMachine, l20_16gpu, "yccl_16x_l20_2level_switch_nccl_topo.xml", 16, 1)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(planMachine, dgx2h_16gpu, "hwloc_nvidia_dgx2h.xml", 16, 1)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(planMachine, p4d_8gpu_x64, "aws_p4d_24xl_nccl_topo.xml", 8, 64)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(planMachine, h800_8gpu_x64, "yccl_8x_h800_8nic_nccl_topo.xml", 8, 64)
    ->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(planMachine, b200_8gpu_x64, "modal_b200_vm_8gpu_13nic_nccl_topo.xml", 8, 64)
    ->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
