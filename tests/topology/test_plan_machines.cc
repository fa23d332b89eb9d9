// The ring planner on every real machine in ../shared/topologies/xml, and against NCCL's own ring
// search for the three machines whose NCCL graph files are there. What a machine should get is
// worked out here from its topology (NVLink wiring, PCIe tree, NICs), not from the planner.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>

#include "plan/from_topology.h"
#include "topology/hwloc_import.h"
#include "topology/load.h"
#include "topology/nccl_xml.h"
#include "unit/plan_checks.h"

namespace braid::plan {
namespace {

namespace fs = std::filesystem;
const fs::path kXml = fs::path(BRAID_SHARED_TOPOLOGIES) / "xml";

#define SKIP_WITHOUT_SHARED()  \
  if (!fs::is_directory(kXml)) \
  GTEST_SKIP() << "no " << kXml << " (../shared/topologies is not here)"

// Topology files (not NCCL graph files); hwloc ones only where braid reads them.
std::vector<fs::path> machineFiles() {
  std::vector<fs::path> files;
  for (const auto& entry : fs::directory_iterator(kXml)) {
    std::string name = entry.path().filename();
    if (entry.path().extension() != ".xml" || name.find("_graph.xml") != std::string::npos)
      continue;
    if (name.rfind("hwloc_", 0) == 0 && !topo::haveHwloc()) continue;
    files.push_back(entry.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

// NVLinks between two GPUs: direct, or both reach NVSwitches.
bool nvlinked(const topo::Node& a, const topo::Node& b) {
  auto links = [](const topo::Node& from, const topo::Node& to) {
    int direct = 0, fabric = 0;
    for (const topo::GpuLink& link : from.gpu.links) {
      direct += link.peer == topo::PeerKind::Gpu && link.target == to.busId ? link.count : 0;
      fabric += link.peer == topo::PeerKind::NvSwitch ? link.count : 0;
    }
    return std::pair{direct, fabric};
  };
  auto [ab, fabricA] = links(a, b);
  auto [ba, fabricB] = links(b, a);
  return ab > 0 || ba > 0 || (fabricA > 0 && fabricB > 0);
}

// Whether the GPUs' NVLinks alone form a ring through all of them (subset dynamic programming).
bool nvlinkRing(const topo::Topology& t) {
  std::vector<int> gpus = topo::gpuNodes(t);
  int n = static_cast<int>(gpus.size());
  if (n < 2) return false;
  std::vector<std::vector<char>> reach(1 << n, std::vector<char>(n, 0));
  reach[1][0] = 1;
  for (int mask = 1; mask < (1 << n); ++mask)
    for (int last = 0; last < n; ++last) {
      if (!reach[mask][last]) continue;
      for (int next = 0; next < n; ++next)
        if (!(mask >> next & 1) && nvlinked(t.nodes[gpus[last]], t.nodes[gpus[next]]))
          reach[mask | 1 << next][next] = 1;
    }
  for (int last = 1; last < n; ++last)
    if (reach[(1 << n) - 1][last] && nvlinked(t.nodes[gpus[last]], t.nodes[gpus[0]])) return true;
  return false;
}

// The narrowest GPU's NVLink bandwidth into NVSwitches (links x per-link rate); 0 without any.
double nvswitchGBs(const topo::Topology& t) {
  double narrowest = 0;
  for (int gpu : topo::gpuNodes(t)) {
    int links = 0;
    for (const topo::GpuLink& link : t.nodes[gpu].gpu.links)
      links += link.peer == topo::PeerKind::NvSwitch ? link.count : 0;
    bool guessed = false;
    double gbs = links * topo::linkRateGBs(t.nodes[gpu].gpu, &guessed);
    if (gbs == 0) return 0;
    narrowest = narrowest == 0 ? gbs : std::min(narrowest, gbs);
  }
  return narrowest;
}

TEST(PlanMachines, EveryMachinePlansWithinItsLinks) {
  SKIP_WITHOUT_SHARED();
  for (const fs::path& file : machineFiles()) {
    SCOPED_TRACE(file.filename().string());
    topo::Topology t = topo::loadTopology(file);
    LinkGraph g = fromTopology(t, 0, 1);
    Plan plan = search(g);
    EXPECT_FALSE(plan.fallback) << describe(g, plan);
    for (const std::map<int, int>& uses : expectSound(g, plan)) {
      for (auto [edge, count] : uses) {
        if (g.edges[edge].kind != LinkKind::InterSocket) continue;
        EXPECT_EQ(count, 1) << "a ring crosses " << g.vertices[g.edges[edge].from].label << " -> "
                            << g.vertices[g.edges[edge].to].label << " twice";
      }
    }
    if (nvlinkRing(t)) {
      for (const Channel& channel : plan.channels)
        for (const Hop& hop : channel.hops) EXPECT_EQ(hop.kind, HopKind::NvLink);
    }
    // Each ring moves a GPU's bytes out over its NVLinks once: the planned total must reach what
    // one GPU's NVLinks into the switches carry.
    if (double fabric = nvswitchGBs(t); fabric > 0) {
      EXPECT_GE(plan.totalBandwidthGBs(), fabric - 1e-9) << describe(g, plan);
    }
  }
}

// NICs sharing a PCIe switch with a GPU, by the names the graph gives their ports.
std::set<std::string> nicsNearGpus(const topo::Topology& t) {
  std::set<int> gpuBridges;
  for (int gpu : topo::gpuNodes(t))
    for (int up : t.ancestors(gpu))
      if (t.nodes[up].kind == topo::NodeKind::Bridge) gpuBridges.insert(up);
  std::set<std::string> names;
  for (int n = 0; n < static_cast<int>(t.nodes.size()); ++n) {
    const topo::Node& node = t.nodes[n];
    if (node.kind != topo::NodeKind::Nic || node.busId.empty()) continue;
    std::vector<int> up = t.ancestors(n);
    if (std::none_of(up.begin(), up.end(), [&](int a) { return gpuBridges.count(a) > 0; }))
      continue;
    if (node.ports.empty()) names.insert("NIC " + node.busId);
    for (const topo::NetPort& port : node.ports)
      if (port.inMatrix) names.insert(port.name);
  }
  return names;
}

// Files that name GPUs by PCI class alone (NCCL reads NVLink from NVML at run time) are never
// planned as PCIe in silence: a PCI device id of an NVSwitch-only part (p4d's A100-SXM4-40GB)
// brings that part's NVLinks, anything else (NDv5's file has no ids) is said to lack them.
TEST(PlanMachines, FilesWithoutNvlinkDetailSaySoAndInferFromDeviceIds) {
  SKIP_WITHOUT_SHARED();
  auto noted = [](const topo::Topology& t, const std::string& words) {
    return std::any_of(t.notes.begin(), t.notes.end(), [&](const std::string& note) {
      return note.find(words) != std::string::npos;
    });
  };
  const topo::Topology p4d = topo::loadTopology(kXml / "aws_p4d_24xl_nccl_topo.xml");
  EXPECT_TRUE(noted(p4d, "8 GPU(s) had no NVLink detail"));
  EXPECT_TRUE(noted(p4d, "A100-SXM4-40GB (0x20b0, 12 NVLinks)"));
  for (int gpu : topo::gpuNodes(p4d)) {
    ASSERT_EQ(p4d.nodes[gpu].gpu.links.size(), 1u);
    EXPECT_EQ(p4d.nodes[gpu].gpu.links[0].peer, topo::PeerKind::NvSwitch);
    EXPECT_EQ(p4d.nodes[gpu].gpu.links[0].count, 12);
  }
  // 12 NVLink3 links of 25 GB/s each way: one NVSwitch ring of 300 GB/s.
  const LinkGraph graph = fromTopology(p4d, 0, 1);
  EXPECT_NEAR(search(graph).totalBandwidthGBs(), 300.0, 1e-9);

  // No ids at all, but the HGX H100 board's layout (Gen5 x16, a NIC beside each GPU): H100 SXM5,
  // 18 NVLink4 links of 25 GB/s each way, a 450 GB/s NVSwitch ring, said to be inferred.
  const topo::Topology ndv5 = topo::loadTopology(kXml / "azure_ndv5_h100_nccl_topo.xml");
  EXPECT_TRUE(noted(ndv5, "the HGX H100/H200 board's layout: inferred as H100-SXM5-80GB"));
  for (int gpu : topo::gpuNodes(ndv5)) {
    ASSERT_EQ(ndv5.nodes[gpu].gpu.links.size(), 1u);
    EXPECT_EQ(ndv5.nodes[gpu].gpu.links[0].count, 18);
  }
  EXPECT_NEAR(search(fromTopology(ndv5, 0, 1)).totalBandwidthGBs(), 450.0, 1e-9);
  // Every other file whose GPUs go without NVLink detail says so; none but NDv5 has the layout.
  for (const fs::path& file : machineFiles()) {
    const topo::Topology t = topo::loadTopology(file);
    for (int gpu : topo::gpuNodes(t))
      if (!t.nodes[gpu].gpu.described && t.nodes[gpu].gpu.links.empty())
        EXPECT_TRUE(noted(t, "planned over PCIe alone")) << file.filename();
    if (file.filename() != "azure_ndv5_h100_nccl_topo.xml")
      EXPECT_FALSE(noted(t, "board's layout")) << file.filename();
  }
}

TEST(PlanMachines, SeveralHostsUseEveryNicNearTheGpus) {
  SKIP_WITHOUT_SHARED();
  int checked = 0;
  for (const fs::path& file : machineFiles()) {
    topo::Topology t = topo::loadTopology(file);
    std::set<std::string> near = nicsNearGpus(t);
    if (topo::gpuNodes(t).empty() || near.empty()) continue;
    ++checked;
    for (int hosts = 2; hosts <= 4; ++hosts) {
      SCOPED_TRACE(file.filename().string() + " x " + std::to_string(hosts) + " hosts");
      LinkGraph g = fromTopology(t, 0, hosts);
      Plan plan = search(g);
      expectSound(g, plan);
      std::vector<int> hostOfRank;
      for (int r = 0; r < g.nranks(); ++r) hostOfRank.push_back(g.hostOfRank(r));
      std::set<std::string> used;
      for (const Channel& channel : plan.channels) {
        EXPECT_EQ(groupChanges(channel.order, hostOfRank), hosts);
        for (const Hop& hop : channel.hops)
          if (hop.nicOut >= 0) used.insert(g.vertices[hop.nicOut].label);
      }
      for (int h = 0; h < hosts; ++h)
        for (const std::string& nic : near)
          EXPECT_TRUE(used.count("h" + std::to_string(h) + ":" + nic))
              << nic << " of host " << h << " carries no channel\n"
              << describe(g, plan);
    }
  }
  EXPECT_GE(checked, 5);
}

// NCCL's ring graph (graph id 0) of a machine.
topo::NcclGraph ncclRing(const std::string& name) {
  fs::path file = kXml / name;
  for (const topo::NcclGraph& graph : topo::readNcclGraphXml(topo::readFile(file), file))
    if (graph.id == 0) return graph;
  ADD_FAILURE() << name << " has no ring graph";
  return {};
}

// What is compared: NCCL's planned intra-node ring bandwidth, nchannels x speedintra (GB/s per
// direction), against braid's, the sum of its channels' bandwidths. The units match: braid counts
// PCIe at 75% of the raw rate as NCCL does (Gen3 x16 = 12, Gen4 x16 = 24) and takes NCCL's
// inter-socket figures (Intel Skylake 10, AMD 16).
TEST(PlanVsNccl, AzureNcV4A100Pcie) {
  SKIP_WITHOUT_SHARED();
  topo::NcclGraph nccl = ncclRing("azure_ncv4_a100pcie_nccl_graph.xml");
  EXPECT_EQ(nccl.nchannels * nccl.speedIntra, 24);  // 2 x 12 GB/s
  LinkGraph g = fromTopology(topo::loadTopology(kXml / "azure_ncv4_a100pcie_nccl_topo.xml"), 0, 1);
  Plan plan = search(g);
  // 4 NUMA nodes, one A100 (Gen4 x16: 24 GB/s) on each, 16 GB/s between AMD sockets: a ring at
  // 16 and its reverse on what the GPUs' links have left, 8.
  EXPECT_GE(plan.totalBandwidthGBs(), nccl.nchannels * nccl.speedIntra) << describe(g, plan);
}

TEST(PlanVsNccl, DellFourRtxA6000) {
  SKIP_WITHOUT_SHARED();
  topo::NcclGraph nccl = ncclRing("yccl_dell_4x_rtxa6000_nccl_graph.xml");
  EXPECT_EQ(nccl.nchannels * nccl.speedIntra, 10);  // 1 x 10 GB/s
  LinkGraph g =
      fromTopology(topo::loadTopology(kXml / "yccl_dell_4x_rtxa6000_nccl_topo.xml"), 0, 1);
  Plan plan = search(g);
  // Two GPUs per Skylake socket: every ring crosses the 10 GB/s socket link both ways.
  EXPECT_GE(plan.totalBandwidthGBs(), nccl.nchannels * nccl.speedIntra) << describe(g, plan);
}

// A 4-host job, 8 RTX 3090 per host and one 56 Gb/s NIC. Besides the intra-node figure, NCCL's
// inter-node one, nchannels x speedinter, is compared with braid's network bandwidth per host: the
// bandwidth of the channels that leave host 0 through one of its NICs.
TEST(PlanVsNccl, Panlichen4Hosts8Rtx3090) {
  SKIP_WITHOUT_SHARED();
  topo::NcclGraph nccl = ncclRing("panlichen_8x_rtx3090_nccl_graph.xml");
  EXPECT_EQ(nccl.nchannels * nccl.speedInter, 4);  // 1 x 4 GB/s
  topo::Topology t = topo::loadTopology(kXml / "panlichen_8x_rtx3090_switchtec_1nic_nccl_topo.xml");
  LinkGraph g = fromTopology(t, 8, 4);
  Plan plan = search(g);
  expectSound(g, plan);
  EXPECT_GE(plan.totalBandwidthGBs(), nccl.nchannels * nccl.speedIntra) << describe(g, plan);
  double network = 0;
  for (const Channel& channel : plan.channels)
    for (const Hop& hop : channel.hops)
      if (hop.nicOut >= 0 && g.vertices[hop.nicOut].host == 0) network += channel.bandwidthGBs;
  EXPECT_GE(network, nccl.nchannels * nccl.speedInter) << describe(g, plan);
}

}  // namespace
}  // namespace braid::plan
