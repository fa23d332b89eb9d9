// Path classes of real machines, pinned. Every expected matrix below was written by hand from the
// file's content (read in ../shared/topologies/xml) and nvidia-smi's definitions, never produced by
// the code under test: X self; NV# a bonded set of # NVLinks; PIX at most one PCIe switch (or one
// bridge) between the two; PXB several switches, no host bridge; PHB through a host bridge; NODE
// across host bridges of one NUMA node; SYS across NUMA nodes. An NCCL file records no host
// bridges, so its same-CPU pairs with no common switch are PHB (NODE cannot be told apart).
#include <gtest/gtest.h>

#include <filesystem>
#include <sstream>

#include "topology/hwloc_import.h"
#include "topology/load.h"
#include "topology/paths.h"
#include "topology/report.h"

namespace braid::topo {
namespace {

const std::string kXml = std::string(BRAID_SHARED_TOPOLOGIES) + "/xml/";

// Loads ../shared/topologies/xml/<name>; skips where the folder is absent, or for hwloc files
// where braid was built without hwloc.
#define LOAD_SHARED(topology, name)                                                 \
  if (!std::filesystem::exists(kXml + name))                                        \
    GTEST_SKIP() << "no " << kXml << name << " (../shared/topologies is not here)"; \
  if (std::string(name).rfind("hwloc_", 0) == 0 && !haveHwloc())                    \
    GTEST_SKIP() << "built without hwloc";                                          \
  Topology topology = loadTopology(kXml + name)

// Each row as "LABEL class class ...".
std::vector<std::string> classRows(const Topology& topology) {
  Matrix matrix = computeMatrix(topology);
  std::vector<std::string> rows;
  for (size_t r = 0; r < matrix.endpoints.size(); ++r) {
    std::string row = matrix.endpoints[r].label;
    for (const Path& path : matrix.paths[r]) row += " " + classLabel(path);
    rows.push_back(row);
  }
  return rows;
}

void expectRows(const Topology& topology, const std::vector<std::string>& expected) {
  std::vector<std::string> actual = classRows(topology);
  ASSERT_EQ(actual.size(), expected.size()) << topology.origin;
  for (size_t i = 0; i < expected.size(); ++i) EXPECT_EQ(actual[i], expected[i]) << topology.origin;
}

Path pathOf(const Topology& topology, const std::string& a, const std::string& b) {
  Matrix matrix = computeMatrix(topology);
  auto find = [&](const std::string& label) {
    for (size_t i = 0; i < matrix.endpoints.size(); ++i)
      if (matrix.endpoints[i].label == label) return i;
    ADD_FAILURE() << "no " << label;
    return size_t{0};
  };
  return matrix.paths[find(a)][find(b)];
}

// The printed line of `label` in printMatrix's output (nvidia-smi's tab-separated layout).
std::string printedRow(const Topology& topology, const std::string& label) {
  std::ostringstream out;
  printMatrix(out, topology, computeMatrix(topology));
  std::istringstream lines(out.str());
  for (std::string line; std::getline(lines, line);)
    if (line.rfind(label + "\t", 0) == 0) return line;
  return "";
}

// hwloc_nvidia_dgx2h.xml, a DGX-2H: 16 V100 (nvml0..15). Its NVLinkBandwidth matrix gives every
// GPU 25000 MB/s to each of six NVSwitches: 25 GB/s is one NVLink 2 link, so six links per GPU,
// and any two GPUs meet through the NVSwitch fabric: NV6 for every pair, as nvidia-smi prints on a
// DGX-2 (nvidia-smi/ncclt78_dgx2_16gpu_10nic_EXCERPT.txt). The export holds no NIC.
TEST(Machines, Dgx2NvSwitchBox) {
  LOAD_SHARED(dgx2, "hwloc_nvidia_dgx2h.xml");
  expectRows(dgx2, {
                       "GPU0 X NV6 NV6 NV6 NV6 NV6 NV6 NV6 NV6 NV6 NV6 NV6 NV6 NV6 NV6 NV6",
                       "GPU1 NV6 X NV6 NV6 NV6 NV6 NV6 NV6 NV6 NV6 NV6 NV6 NV6 NV6 NV6 NV6",
                       "GPU2 NV6 NV6 X NV6 NV6 NV6 NV6 NV6 NV6 NV6 NV6 NV6 NV6 NV6 NV6 NV6",
                       "GPU3 NV6 NV6 NV6 X NV6 NV6 NV6 NV6 NV6 NV6 NV6 NV6 NV6 NV6 NV6 NV6",
                       "GPU4 NV6 NV6 NV6 NV6 X NV6 NV6 NV6 NV6 NV6 NV6 NV6 NV6 NV6 NV6 NV6",
                       "GPU5 NV6 NV6 NV6 NV6 NV6 X NV6 NV6 NV6 NV6 NV6 NV6 NV6 NV6 NV6 NV6",
                       "GPU6 NV6 NV6 NV6 NV6 NV6 NV6 X NV6 NV6 NV6 NV6 NV6 NV6 NV6 NV6 NV6",
                       "GPU7 NV6 NV6 NV6 NV6 NV6 NV6 NV6 X NV6 NV6 NV6 NV6 NV6 NV6 NV6 NV6",
                       "GPU8 NV6 NV6 NV6 NV6 NV6 NV6 NV6 NV6 X NV6 NV6 NV6 NV6 NV6 NV6 NV6",
                       "GPU9 NV6 NV6 NV6 NV6 NV6 NV6 NV6 NV6 NV6 X NV6 NV6 NV6 NV6 NV6 NV6",
                       "GPU10 NV6 NV6 NV6 NV6 NV6 NV6 NV6 NV6 NV6 NV6 X NV6 NV6 NV6 NV6 NV6",
                       "GPU11 NV6 NV6 NV6 NV6 NV6 NV6 NV6 NV6 NV6 NV6 NV6 X NV6 NV6 NV6 NV6",
                       "GPU12 NV6 NV6 NV6 NV6 NV6 NV6 NV6 NV6 NV6 NV6 NV6 NV6 X NV6 NV6 NV6",
                       "GPU13 NV6 NV6 NV6 NV6 NV6 NV6 NV6 NV6 NV6 NV6 NV6 NV6 NV6 X NV6 NV6",
                       "GPU14 NV6 NV6 NV6 NV6 NV6 NV6 NV6 NV6 NV6 NV6 NV6 NV6 NV6 NV6 X NV6",
                       "GPU15 NV6 NV6 NV6 NV6 NV6 NV6 NV6 NV6 NV6 NV6 NV6 NV6 NV6 NV6 NV6 X",
                   });
  // Six links at NVLink 2's 25 GB/s.
  EXPECT_DOUBLE_EQ(pathOf(dgx2, "GPU0", "GPU15").bandwidthGBs, 150.0);
  // nvml0..7 sit under package 0 (cpuset 0x3: CPUs 0-1), nvml8..15 under package 1 (CPUs 24-25).
  EXPECT_EQ(printedRow(dgx2, "GPU0").substr(printedRow(dgx2, "GPU0").rfind("NV6\t") + 4),
            "0-1\t0\t\tN/A");
  EXPECT_EQ(printedRow(dgx2, "GPU8").substr(printedRow(dgx2, "GPU8").rfind("NV6\t") + 4),
            "24-25\t1\t\tN/A");
}

// The same DGX-2 with its NVLinks taken away shows the PCIe tree's own classes. From the file:
// host bridge [2b-3b] (package 0): root port 2b:00.0 > PLX switch 2c:00.0 > two second-level
// switches 32:00.0 (GPU0 34:00.0, GPU1 36:00.0) and 37:00.0 (GPU2, GPU3); host bridge [4e-67]
// (package 0) likewise holds GPU4-5 and GPU6-7; host bridges [ae-c7] and [d7-e7] (package 1) hold
// GPU8-11 and GPU12-15. A pair under one second-level switch crosses one switch: PIX. Pairs under
// different second-level switches cross three (both second-level ones and the first-level one) but
// no host bridge: PXB. Different host bridges of one package: NODE. Different packages: SYS.
TEST(Machines, Dgx2PcieTreeWithoutNvLink) {
  LOAD_SHARED(dgx2, "hwloc_nvidia_dgx2h.xml");
  for (Node& node : dgx2.nodes) node.gpu.links.clear();
  expectRows(dgx2, {
                       "GPU0 X PIX PXB PXB NODE NODE NODE NODE SYS SYS SYS SYS SYS SYS SYS SYS",
                       "GPU1 PIX X PXB PXB NODE NODE NODE NODE SYS SYS SYS SYS SYS SYS SYS SYS",
                       "GPU2 PXB PXB X PIX NODE NODE NODE NODE SYS SYS SYS SYS SYS SYS SYS SYS",
                       "GPU3 PXB PXB PIX X NODE NODE NODE NODE SYS SYS SYS SYS SYS SYS SYS SYS",
                       "GPU4 NODE NODE NODE NODE X PIX PXB PXB SYS SYS SYS SYS SYS SYS SYS SYS",
                       "GPU5 NODE NODE NODE NODE PIX X PXB PXB SYS SYS SYS SYS SYS SYS SYS SYS",
                       "GPU6 NODE NODE NODE NODE PXB PXB X PIX SYS SYS SYS SYS SYS SYS SYS SYS",
                       "GPU7 NODE NODE NODE NODE PXB PXB PIX X SYS SYS SYS SYS SYS SYS SYS SYS",
                       "GPU8 SYS SYS SYS SYS SYS SYS SYS SYS X PIX PXB PXB NODE NODE NODE NODE",
                       "GPU9 SYS SYS SYS SYS SYS SYS SYS SYS PIX X PXB PXB NODE NODE NODE NODE",
                       "GPU10 SYS SYS SYS SYS SYS SYS SYS SYS PXB PXB X PIX NODE NODE NODE NODE",
                       "GPU11 SYS SYS SYS SYS SYS SYS SYS SYS PXB PXB PIX X NODE NODE NODE NODE",
                       "GPU12 SYS SYS SYS SYS SYS SYS SYS SYS NODE NODE NODE NODE X PIX PXB PXB",
                       "GPU13 SYS SYS SYS SYS SYS SYS SYS SYS NODE NODE NODE NODE PIX X PXB PXB",
                       "GPU14 SYS SYS SYS SYS SYS SYS SYS SYS NODE NODE NODE NODE PXB PXB X PIX",
                       "GPU15 SYS SYS SYS SYS SYS SYS SYS SYS NODE NODE NODE NODE PXB PXB PIX X",
                   });
  // Every GPU's own link is 15.75 GB/s (Gen3 x16 in the file); packages are Skylake (model 85),
  // 10 GB/s between them by NCCL's table.
  EXPECT_NEAR(pathOf(dgx2, "GPU0", "GPU1").bandwidthGBs, 15.75, 0.01);
  EXPECT_DOUBLE_EQ(pathOf(dgx2, "GPU0", "GPU8").bandwidthGBs, 10.0);
}

// panlichen_8x_rtx3090_switchtec_1nic_nccl_topo.xml: <cpu numaid=0> holds one Switchtec switch
// 0c:00.0 with GPUs dev 0-3; <cpu numaid=1> holds switch 98:00.0 with GPUs dev 4-7 and the
// ConnectX mlx5_0 (9a:00.0). One switch between any two devices of a socket: PIX; across sockets:
// SYS. (NCCL itself says PHB here because GeForce cards cannot do P2P; nvidia-smi shows topology.)
TEST(Machines, PcieSwitchServer) {
  LOAD_SHARED(server, "panlichen_8x_rtx3090_switchtec_1nic_nccl_topo.xml");
  expectRows(server, {
                         "GPU0 X PIX PIX PIX SYS SYS SYS SYS SYS",
                         "GPU1 PIX X PIX PIX SYS SYS SYS SYS SYS",
                         "GPU2 PIX PIX X PIX SYS SYS SYS SYS SYS",
                         "GPU3 PIX PIX PIX X SYS SYS SYS SYS SYS",
                         "GPU4 SYS SYS SYS SYS X PIX PIX PIX PIX",
                         "GPU5 SYS SYS SYS SYS PIX X PIX PIX PIX",
                         "GPU6 SYS SYS SYS SYS PIX PIX X PIX PIX",
                         "GPU7 SYS SYS SYS SYS PIX PIX PIX X PIX",
                         "NIC0 SYS SYS SYS SYS PIX PIX PIX PIX X",
                     });
  // affinity "0000ffff,0000ffff": CPUs 0-15 and 32-47. The whole row in nvidia-smi's layout.
  EXPECT_EQ(printedRow(server, "GPU0"),
            "GPU0\t X \tPIX\tPIX\tPIX\tSYS\tSYS\tSYS\tSYS\tSYS\t0-15,32-47\t0\t\tN/A");
  EXPECT_EQ(printedRow(server, "NIC0"), "NIC0\tSYS\tSYS\tSYS\tSYS\tPIX\tPIX\tPIX\tPIX\t X ");
  // "16.0 GT/s PCIe" x16 everywhere: 16 lanes x 16 GT/s x 128/130 / 8 = 31.5 GB/s. Across sockets
  // the Ice Lake (modelid 106) link, 10 GB/s in NCCL's table, is narrower.
  EXPECT_NEAR(pathOf(server, "GPU0", "GPU1").bandwidthGBs, 31.51, 0.01);
  EXPECT_DOUBLE_EQ(pathOf(server, "GPU0", "GPU4").bandwidthGBs, 10.0);
}

// yccl_16x_l20_2level_switch_nccl_topo.xml: two levels of Broadcom switches. Per <cpu>, two
// top-level <pci> switches each hold two second-level switches, each of those two L20s and one
// NIC. Reading dev numbers and NIC names from the file: numa 0: 0f:02.0 > {0e:00.0: dev 0, 1,
// mlx5_1; 4b:00.0: dev 4, 5, mlx5_3}, 8c:02.0 > {8b:00.0: dev 8, 9, mlx5_5; c8:00.0: dev 12, 13,
// mlx5_7}; numa 1: 41:02.0 > {40:00.0: dev 2, 3, mlx5_2; 55:00.0: dev 6, 7, mlx5_4}, be:02.0 >
// {bd:00.0: dev 10, 11, mlx5_6; d2:00.0: dev 14, 15, mlx5_8}. NICs in name order: NIC0 mlx5_1 ...
// NIC7 mlx5_8. Same second-level switch: PIX; same top-level switch: PXB; same CPU: PHB; else SYS.
TEST(Machines, TwoLevelSwitchServer) {
  LOAD_SHARED(server, "yccl_16x_l20_2level_switch_nccl_topo.xml");
  expectRows(server, {
                         "GPU0 X PIX SYS SYS PXB PXB SYS SYS PHB PHB SYS SYS PHB PHB SYS SYS PIX "
                         "SYS PXB SYS PHB SYS PHB SYS",
                         "GPU1 PIX X SYS SYS PXB PXB SYS SYS PHB PHB SYS SYS PHB PHB SYS SYS PIX "
                         "SYS PXB SYS PHB SYS PHB SYS",
                         "GPU2 SYS SYS X PIX SYS SYS PXB PXB SYS SYS PHB PHB SYS SYS PHB PHB SYS "
                         "PIX SYS PXB SYS PHB SYS PHB",
                         "GPU3 SYS SYS PIX X SYS SYS PXB PXB SYS SYS PHB PHB SYS SYS PHB PHB SYS "
                         "PIX SYS PXB SYS PHB SYS PHB",
                         "GPU4 PXB PXB SYS SYS X PIX SYS SYS PHB PHB SYS SYS PHB PHB SYS SYS PXB "
                         "SYS PIX SYS PHB SYS PHB SYS",
                         "GPU5 PXB PXB SYS SYS PIX X SYS SYS PHB PHB SYS SYS PHB PHB SYS SYS PXB "
                         "SYS PIX SYS PHB SYS PHB SYS",
                         "GPU6 SYS SYS PXB PXB SYS SYS X PIX SYS SYS PHB PHB SYS SYS PHB PHB SYS "
                         "PXB SYS PIX SYS PHB SYS PHB",
                         "GPU7 SYS SYS PXB PXB SYS SYS PIX X SYS SYS PHB PHB SYS SYS PHB PHB SYS "
                         "PXB SYS PIX SYS PHB SYS PHB",
                         "GPU8 PHB PHB SYS SYS PHB PHB SYS SYS X PIX SYS SYS PXB PXB SYS SYS PHB "
                         "SYS PHB SYS PIX SYS PXB SYS",
                         "GPU9 PHB PHB SYS SYS PHB PHB SYS SYS PIX X SYS SYS PXB PXB SYS SYS PHB "
                         "SYS PHB SYS PIX SYS PXB SYS",
                         "GPU10 SYS SYS PHB PHB SYS SYS PHB PHB SYS SYS X PIX SYS SYS PXB PXB SYS "
                         "PHB SYS PHB SYS PIX SYS PXB",
                         "GPU11 SYS SYS PHB PHB SYS SYS PHB PHB SYS SYS PIX X SYS SYS PXB PXB SYS "
                         "PHB SYS PHB SYS PIX SYS PXB",
                         "GPU12 PHB PHB SYS SYS PHB PHB SYS SYS PXB PXB SYS SYS X PIX SYS SYS PHB "
                         "SYS PHB SYS PXB SYS PIX SYS",
                         "GPU13 PHB PHB SYS SYS PHB PHB SYS SYS PXB PXB SYS SYS PIX X SYS SYS PHB "
                         "SYS PHB SYS PXB SYS PIX SYS",
                         "GPU14 SYS SYS PHB PHB SYS SYS PHB PHB SYS SYS PXB PXB SYS SYS X PIX SYS "
                         "PHB SYS PHB SYS PXB SYS PIX",
                         "GPU15 SYS SYS PHB PHB SYS SYS PHB PHB SYS SYS PXB PXB SYS SYS PIX X SYS "
                         "PHB SYS PHB SYS PXB SYS PIX",
                         "NIC0 PIX PIX SYS SYS PXB PXB SYS SYS PHB PHB SYS SYS PHB PHB SYS SYS X "
                         "SYS PXB SYS PHB SYS PHB SYS",
                         "NIC1 SYS SYS PIX PIX SYS SYS PXB PXB SYS SYS PHB PHB SYS SYS PHB PHB SYS "
                         "X SYS PXB SYS PHB SYS PHB",
                         "NIC2 PXB PXB SYS SYS PIX PIX SYS SYS PHB PHB SYS SYS PHB PHB SYS SYS PXB "
                         "SYS X SYS PHB SYS PHB SYS",
                         "NIC3 SYS SYS PXB PXB SYS SYS PIX PIX SYS SYS PHB PHB SYS SYS PHB PHB SYS "
                         "PXB SYS X SYS PHB SYS PHB",
                         "NIC4 PHB PHB SYS SYS PHB PHB SYS SYS PIX PIX SYS SYS PXB PXB SYS SYS PHB "
                         "SYS PHB SYS X SYS PXB SYS",
                         "NIC5 SYS SYS PHB PHB SYS SYS PHB PHB SYS SYS PIX PIX SYS SYS PXB PXB SYS "
                         "PHB SYS PHB SYS X SYS PXB",
                         "NIC6 PHB PHB SYS SYS PHB PHB SYS SYS PXB PXB SYS SYS PIX PIX SYS SYS PHB "
                         "SYS PHB SYS PXB SYS X SYS",
                         "NIC7 SYS SYS PHB PHB SYS SYS PHB PHB SYS SYS PXB PXB SYS SYS PIX PIX SYS "
                         "PHB SYS PHB SYS PXB SYS X",
                     });
  // The L20s are "16.0 GT/s PCIe" x16 (31.5 GB/s), narrower than the Gen5 switches (63 GB/s).
  EXPECT_NEAR(pathOf(server, "GPU0", "GPU4").bandwidthGBs, 31.51, 0.01);
}

// ibm_h100_gx3d_nccl.xml, an IBM Cloud VM with 8 H100 and 8 ConnectX-7 on two sockets. Each
// virtual bridge holds one GPU and one NIC: <cpu numaid=0>: a1:00.0 {mlx5_7, dev 0}, ab:00.0
// {mlx5_6, dev 1}, b5:00.0 {mlx5_5, dev 2}, bf:00.0 {mlx5_4, dev 3}; <cpu numaid=1>: c9:00.0
// {mlx5_3, dev 4}, d3:00.0 {mlx5_2, dev 5}, dd:00.0 {mlx5_1, dev 6}, e7:00.0 {mlx5_0, dev 7}.
// Every GPU lists NVLinks to four NVSwitches, 5+5+4+4 = 18: NV18 between all GPUs. NICs in name
// order: NIC0 = mlx5_0 (GPU7's bridge) ... NIC7 = mlx5_7 (GPU0's). A GPU and the NIC on its bridge:
// PIX; other devices of the same CPU: PHB; the other CPU: SYS.
TEST(Machines, DualSocketWithNics) {
  LOAD_SHARED(vm, "ibm_h100_gx3d_nccl.xml");
  expectRows(vm, {
                     "GPU0 X NV18 NV18 NV18 NV18 NV18 NV18 NV18 SYS SYS SYS SYS PHB PHB PHB PIX",
                     "GPU1 NV18 X NV18 NV18 NV18 NV18 NV18 NV18 SYS SYS SYS SYS PHB PHB PIX PHB",
                     "GPU2 NV18 NV18 X NV18 NV18 NV18 NV18 NV18 SYS SYS SYS SYS PHB PIX PHB PHB",
                     "GPU3 NV18 NV18 NV18 X NV18 NV18 NV18 NV18 SYS SYS SYS SYS PIX PHB PHB PHB",
                     "GPU4 NV18 NV18 NV18 NV18 X NV18 NV18 NV18 PHB PHB PHB PIX SYS SYS SYS SYS",
                     "GPU5 NV18 NV18 NV18 NV18 NV18 X NV18 NV18 PHB PHB PIX PHB SYS SYS SYS SYS",
                     "GPU6 NV18 NV18 NV18 NV18 NV18 NV18 X NV18 PHB PIX PHB PHB SYS SYS SYS SYS",
                     "GPU7 NV18 NV18 NV18 NV18 NV18 NV18 NV18 X PIX PHB PHB PHB SYS SYS SYS SYS",
                     "NIC0 SYS SYS SYS SYS PHB PHB PHB PIX X PHB PHB PHB SYS SYS SYS SYS",
                     "NIC1 SYS SYS SYS SYS PHB PHB PIX PHB PHB X PHB PHB SYS SYS SYS SYS",
                     "NIC2 SYS SYS SYS SYS PHB PIX PHB PHB PHB PHB X PHB SYS SYS SYS SYS",
                     "NIC3 SYS SYS SYS SYS PIX PHB PHB PHB PHB PHB PHB X SYS SYS SYS SYS",
                     "NIC4 PHB PHB PHB PIX SYS SYS SYS SYS SYS SYS SYS SYS X PHB PHB PHB",
                     "NIC5 PHB PHB PIX PHB SYS SYS SYS SYS SYS SYS SYS SYS PHB X PHB PHB",
                     "NIC6 PHB PIX PHB PHB SYS SYS SYS SYS SYS SYS SYS SYS PHB PHB X PHB",
                     "NIC7 PIX PHB PHB PHB SYS SYS SYS SYS SYS SYS SYS SYS PHB PHB PHB X",
                 });
  // 18 links x 25 GB/s (NVLink 4, sm90).
  EXPECT_DOUBLE_EQ(pathOf(vm, "GPU0", "GPU7").bandwidthGBs, 450.0);
  // GPU and NIC are "32.0 GT/s PCIe" with link_width="0": taken as x16 (63.0 GB/s), flagged.
  Path pix = pathOf(vm, "GPU0", "NIC7");
  EXPECT_NEAR(pix.bandwidthGBs, 63.02, 0.01);
  EXPECT_TRUE(pix.estimated);
  // Through two virtual bridges that report "2.5 GT/s PCIe" x1: 0.25 GB/s.
  EXPECT_DOUBLE_EQ(pathOf(vm, "GPU0", "NIC6").bandwidthGBs, 0.25);
  std::ostringstream out;
  printMatrix(out, vm, computeMatrix(vm));
  EXPECT_NE(out.str().find("PHB and NODE cannot be told apart"), std::string::npos);
  EXPECT_NE(out.str().find("NIC Legend:\n\n  NIC0: mlx5_0\n"), std::string::npos);
}

// azure_ndv4_a100_nccl_topo.xml, a Hyper-V VM dump: four <cpu> (numaid 0-3), each with one
// placeholder switch ffff:ff:0N.0 holding two GPUs and two InfiniBand NICs known by class alone.
// GPUs are numbered in bus id order (0001 -> GPU0, 0002, 0003, 0004, 000b, 000c, 000d, 000e ->
// GPU7), NICs likewise (0101 -> NIC0 ... 0108 -> NIC7). numaid 1 holds GPU0, GPU1, NIC0, NIC1;
// numaid 0 GPU2, GPU3, NIC2, NIC3; numaid 3 GPU4, GPU5, NIC4, NIC5; numaid 2 GPU6, GPU7, NIC6,
// NIC7. One switch inside a group: PIX; between groups (NUMA nodes): SYS. The file has no NVLinks
// (NCCL adds them from NVML at run time), so none are shown.
TEST(Machines, VirtualMachineDump) {
  LOAD_SHARED(vm, "azure_ndv4_a100_nccl_topo.xml");
  expectRows(vm, {
                     "GPU0 X PIX SYS SYS SYS SYS SYS SYS PIX PIX SYS SYS SYS SYS SYS SYS",
                     "GPU1 PIX X SYS SYS SYS SYS SYS SYS PIX PIX SYS SYS SYS SYS SYS SYS",
                     "GPU2 SYS SYS X PIX SYS SYS SYS SYS SYS SYS PIX PIX SYS SYS SYS SYS",
                     "GPU3 SYS SYS PIX X SYS SYS SYS SYS SYS SYS PIX PIX SYS SYS SYS SYS",
                     "GPU4 SYS SYS SYS SYS X PIX SYS SYS SYS SYS SYS SYS PIX PIX SYS SYS",
                     "GPU5 SYS SYS SYS SYS PIX X SYS SYS SYS SYS SYS SYS PIX PIX SYS SYS",
                     "GPU6 SYS SYS SYS SYS SYS SYS X PIX SYS SYS SYS SYS SYS SYS PIX PIX",
                     "GPU7 SYS SYS SYS SYS SYS SYS PIX X SYS SYS SYS SYS SYS SYS PIX PIX",
                     "NIC0 PIX PIX SYS SYS SYS SYS SYS SYS X PIX SYS SYS SYS SYS SYS SYS",
                     "NIC1 PIX PIX SYS SYS SYS SYS SYS SYS PIX X SYS SYS SYS SYS SYS SYS",
                     "NIC2 SYS SYS PIX PIX SYS SYS SYS SYS SYS SYS X PIX SYS SYS SYS SYS",
                     "NIC3 SYS SYS PIX PIX SYS SYS SYS SYS SYS SYS PIX X SYS SYS SYS SYS",
                     "NIC4 SYS SYS SYS SYS PIX PIX SYS SYS SYS SYS SYS SYS X PIX SYS SYS",
                     "NIC5 SYS SYS SYS SYS PIX PIX SYS SYS SYS SYS SYS SYS PIX X SYS SYS",
                     "NIC6 SYS SYS SYS SYS SYS SYS PIX PIX SYS SYS SYS SYS SYS SYS X PIX",
                     "NIC7 SYS SYS SYS SYS SYS SYS PIX PIX SYS SYS SYS SYS SYS SYS PIX X",
                 });
  // numaid 1's affinity "00000000,0000ffff,ff000000" is CPUs 24-47; numaid 2's
  // "000000ff,ffff0000,00000000" is CPUs 48-71.
  EXPECT_EQ(printedRow(vm, "GPU0").substr(printedRow(vm, "GPU0").rfind("SYS\t") + 4),
            "24-47\t1\t\tN/A");
  EXPECT_EQ(printedRow(vm, "GPU6").substr(printedRow(vm, "GPU6").rfind("PIX\t") + 4),
            "48-71\t2\t\tN/A");
  // AMD EPYC between NUMA nodes: 16 GB/s in NCCL's table; "16 GT/s" x16 links: 31.5 GB/s.
  EXPECT_DOUBLE_EQ(pathOf(vm, "GPU0", "GPU2").bandwidthGBs, 16.0);
  EXPECT_NEAR(pathOf(vm, "GPU0", "NIC1").bandwidthGBs, 31.51, 0.01);
}

// cuiboyuan_2x_rtxa6000_nvlink_bridge_nccl_topo.xml: two RTX A6000 (sm86) whose <nvlink> elements
// point at each other with count 4: NV4. numaid="-1" and no affinity: N/A in both columns. eno1
// has no PCI device in the dump, so it is no NIC column.
TEST(Machines, WorkstationPairWithNvLinkBridge) {
  LOAD_SHARED(pair, "cuiboyuan_2x_rtxa6000_nvlink_bridge_nccl_topo.xml");
  expectRows(pair, {
                       "GPU0 X NV4",
                       "GPU1 NV4 X",
                   });
  EXPECT_EQ(printedRow(pair, "GPU1"), "GPU1\tNV4\t X \tN/A\tN/A\t\tN/A");
  // An A6000 NVLink bridge: 4 links x 14.0625 GB/s (112.5 GB/s both ways).
  EXPECT_DOUBLE_EQ(pathOf(pair, "GPU0", "GPU1").bandwidthGBs, 56.25);
}

// hwloc_hp_sl390s_g7_3gpu_ib.xml, hwloc XML of an HP SL390s: package 0 (NUMA 0, cpuset 0x00555555:
// even CPUs 0-22) has host bridge [00-0f] with root ports 00:05.0 (Mellanox 05:00.0, RDMA device
// mlx4_0) and 00:07.0 (NVIDIA 06:00.0); package 1 (NUMA 1, odd CPUs) has host bridge [10-1f] with
// root ports 10:03.0 (NVIDIA 14:00.0) and 10:07.0 (NVIDIA 11:00.0). No NVML devices, so GPUs in bus
// order: GPU0 06:00.0, GPU1 11:00.0, GPU2 14:00.0. The onboard ATI VGA is no NVIDIA GPU, and the
// 82576 Ethernet ports are no RDMA devices: nvidia-smi lists neither. Different root ports of one
// host bridge: PHB; different packages: SYS.
TEST(Machines, HwlocFileWithInfiniBand) {
  LOAD_SHARED(server, "hwloc_hp_sl390s_g7_3gpu_ib.xml");
  expectRows(server, {
                         "GPU0 X SYS SYS PHB",
                         "GPU1 SYS X PHB SYS",
                         "GPU2 SYS PHB X SYS",
                         "NIC0 PHB SYS SYS X",
                     });
  EXPECT_EQ(printedRow(server, "GPU1"),
            "GPU1\tSYS\t X \tPHB\tSYS\t1,3,5,7,9,11,13,15,17,19,21,23\t1\t\tN/A");
  // hwloc gives link bandwidths: 4.0 GB/s for the GPUs, 2.0 GB/s for the InfiniBand card.
  EXPECT_DOUBLE_EQ(pathOf(server, "GPU1", "GPU2").bandwidthGBs, 4.0);
  EXPECT_DOUBLE_EQ(pathOf(server, "GPU0", "NIC0").bandwidthGBs, 2.0);
  std::ostringstream out;
  printMatrix(out, server, computeMatrix(server));
  EXPECT_NE(out.str().find("  NIC0: mlx4_0\n"), std::string::npos);
  EXPECT_EQ(out.str().find("cannot be told apart"), std::string::npos);  // hwloc has host bridges
}

// hwloc_ibm_power8_minsky_p100.xml: its NVLinkBandwidth matrix gives 40000 MB/s between nvml0 and
// nvml1 and between nvml2 and nvml3: two NVLink 1 links of 20 GB/s (P100), NV2. The pairs sit on
// different sockets: SYS, as on a real Minsky.
TEST(Machines, PowerMinskyNvLinkPairs) {
  LOAD_SHARED(minsky, "hwloc_ibm_power8_minsky_p100.xml");
  expectRows(minsky, {
                         "GPU0 X NV2 SYS SYS",
                         "GPU1 NV2 X SYS SYS",
                         "GPU2 SYS SYS X NV2",
                         "GPU3 SYS SYS NV2 X",
                     });
  EXPECT_DOUBLE_EQ(pathOf(minsky, "GPU0", "GPU1").bandwidthGBs, 40.0);
}

// modal_b200_vm_8gpu_13nic_nccl_topo.xml: NVSwitches are invisible in this VM and every B200 lists
// NCCL's placeholder target fffffff:ff:ff.0 with count 18: still NV18, at NVLink 5's 50 GB/s.
TEST(Machines, PlaceholderNvSwitchTarget) {
  LOAD_SHARED(vm, "modal_b200_vm_8gpu_13nic_nccl_topo.xml");
  Path path = pathOf(vm, "GPU0", "GPU7");
  EXPECT_EQ(classLabel(path), "NV18");
  EXPECT_DOUBLE_EQ(path.bandwidthGBs, 900.0);
}

}  // namespace
}  // namespace braid::topo
