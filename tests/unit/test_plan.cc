// The ring planner on graphs built by hand: the validator's refusals, NVLink meshes, NVSwitch, CPU
// ranks over NUMA nodes, several hosts with NICs, plan files, the fallback. Expected values come
// from the graphs' wiring (worked out in the comments), and every plan is also checked by this
// file's own walk over its routes, not only by plan::validate.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "base/error.h"
#include "plan/plan.h"
#include "plan/plan_file.h"
#include "unit/plan_checks.h"

namespace braid::plan {
namespace {

// Two NUMA nodes, each with two PCIe switches (12 GB/s uplinks) of two GPUs (12 GB/s); with
// `nics`, one NIC per switch (16 GB/s of PCIe, 12.5 GB/s to the network); the CPUs joined by
// 10 GB/s.
struct Host {
  std::vector<int> cpus, switches, gpus, nics;
};
Host addPcieHost(LinkGraph& g, int host, bool nics) {
  Host h;
  for (int c = 0; c < 2; ++c) h.cpus.push_back(g.addVertex(VertexKind::Cpu, host, "NUMA"));
  g.addLink(h.cpus[0], h.cpus[1], 10, LinkKind::InterSocket);
  for (int s = 0; s < 4; ++s) {
    int sw = g.addVertex(VertexKind::Switch, host, "switch");
    g.addLink(sw, h.cpus[s / 2], 12, LinkKind::Pcie);
    h.switches.push_back(sw);
    for (int k = 0; k < 2; ++k) h.gpus.push_back(g.addRank(host, "GPU", sw, 12, LinkKind::Pcie));
    if (nics) {
      int nic = g.addVertex(VertexKind::Nic, host, "nic" + std::to_string(s));
      g.addLink(nic, sw, 16, LinkKind::Pcie);
      h.nics.push_back(nic);
    }
  }
  return h;
}

// DGX-1 (V100) hybrid cube mesh, NVLinks per pair as nvidia-smi shows them (NV1 / NV2).
LinkGraph dgx1() {
  LinkGraph g;
  Host h = addPcieHost(g, 0, false);
  const int links[8][8] = {{0, 1, 1, 2, 2, 0, 0, 0}, {1, 0, 2, 1, 0, 2, 0, 0},
                           {1, 2, 0, 2, 0, 0, 1, 0}, {2, 1, 2, 0, 0, 0, 0, 1},
                           {2, 0, 0, 0, 0, 1, 1, 2}, {0, 2, 0, 0, 1, 0, 2, 1},
                           {0, 0, 1, 0, 1, 2, 0, 2}, {0, 0, 0, 1, 2, 1, 2, 0}};
  for (int a = 0; a < 8; ++a)
    for (int b = a + 1; b < 8; ++b)
      if (links[a][b]) g.addLink(h.gpus[a], h.gpus[b], 25.0 * links[a][b], LinkKind::NvLink);
  return g;
}

TEST(Plan, Dgx1MeshGetsNvLinkOnlyRingsWorthEveryLink) {
  LinkGraph g = dgx1();
  Plan plan = search(g);
  expectSound(g, plan);
  for (const Channel& channel : plan.channels)
    for (const Hop& hop : channel.hops) EXPECT_EQ(hop.kind, HopKind::NvLink);
  EXPECT_GT(plan.channels.size(), 1u);
  // Every ring leaves each GPU by one NVLink, so no plan beats a GPU's 6 links x 25 = 150 GB/s;
  // the NV2 links form a Hamiltonian cycle (0-3-2-1-5-6-7-4), as do the NV1 links, and each can
  // be run both ways: 50 + 50 + 25 + 25.
  EXPECT_DOUBLE_EQ(plan.totalBandwidthGBs(), 150);
  EXPECT_FALSE(plan.fallback);
}

TEST(Plan, NvSwitchSaturatesEachGpusNvLinks) {
  LinkGraph g;
  Host h = addPcieHost(g, 0, false);
  int fabric = g.addVertex(VertexKind::NvSwitch, 0, "NVSwitch");
  for (int gpu : h.gpus) g.addLink(gpu, fabric, 12 * 25.0, LinkKind::NvLink);
  Plan plan = search(g);
  expectSound(g, plan);
  EXPECT_DOUBLE_EQ(plan.totalBandwidthGBs(), 300);  // 12 links x 25 GB/s per GPU
  for (const Hop& hop : plan.channels[0].hops) EXPECT_EQ(hop.kind, HopKind::NvLink);

  SearchOptions split;
  split.minChannels = 4;
  Plan four = search(g, split);
  expectSound(g, four);
  ASSERT_EQ(four.channels.size(), 4u);
  EXPECT_DOUBLE_EQ(four.totalBandwidthGBs(), 300);
}

TEST(Plan, PcieTreeCrossesEachUplinkAndTheSocketLinkOncePerDirection) {
  LinkGraph g;
  addPcieHost(g, 0, false);
  Plan plan = search(g);
  for (const std::map<int, int>& uses : expectSound(g, plan))
    for (auto [edge, count] : uses)
      EXPECT_EQ(count, 1) << g.vertices[g.edges[edge].from].label << " -> "
                          << g.vertices[g.edges[edge].to].label;
  // Any ring crosses the 10 GB/s socket link both ways, so 10 GB/s is all there is.
  EXPECT_DOUBLE_EQ(plan.totalBandwidthGBs(), 10);
}

// CPU ranks 0, 2, 4, 6 on NUMA0 and 1, 3, 5, 7 on NUMA1, shared memory within a node.
LinkGraph interleavedCpuRanks() {
  LinkGraph g;
  int numa[2] = {g.addVertex(VertexKind::Cpu, 0, "NUMA0"),
                 g.addVertex(VertexKind::Cpu, 0, "NUMA1")};
  g.addLink(numa[0], numa[1], 10, LinkKind::InterSocket);
  for (int r = 0; r < 8; ++r) g.addRank(0, "rank", numa[r % 2], 1000, LinkKind::Memory);
  return g;
}

TEST(Plan, CpuRanksKeepEachNumaNodeTogether) {
  LinkGraph g = interleavedCpuRanks();
  Plan plan = search(g);
  expectSound(g, plan);
  ASSERT_EQ(plan.channels.size(), 1u);
  EXPECT_EQ(groupChanges(plan.channels[0].order, {0, 1, 0, 1, 0, 1, 0, 1}), 2);
  EXPECT_DOUBLE_EQ(plan.totalBandwidthGBs(), 10);
}

TEST(Plan, CpuRanksOnOneNodeGetOneChannel) {
  LinkGraph g;
  int numa = g.addVertex(VertexKind::Cpu, 0, "NUMA0");
  for (int r = 0; r < 6; ++r) g.addRank(0, "rank", numa, 1000, LinkKind::Memory);
  Plan plan = search(g);
  expectSound(g, plan);
  EXPECT_EQ(plan.channels.size(), 1u);
  SearchOptions three;
  three.minChannels = 3;
  EXPECT_EQ(search(g, three).channels.size(), 3u);
}

TEST(Plan, OneRankIsARingOfOne) {
  LinkGraph g;
  g.addRank(0, "rank0", g.addVertex(VertexKind::Cpu, 0, "NUMA0"), 1000, LinkKind::Memory);
  Plan plan = search(g);
  ASSERT_EQ(plan.channels.size(), 1u);
  EXPECT_EQ(plan.channels[0].order, std::vector<int>{0});
  EXPECT_EQ(fromJson(toJson(g, plan), g, "one.json").channels.size(), 1u);
}

TEST(Plan, FallbackWithoutBudgetKeepsTheStructuralOrder) {
  LinkGraph g = interleavedCpuRanks();
  SearchOptions none;
  none.budget = std::chrono::milliseconds(0);
  Plan plan = search(g, none);
  expectSound(g, plan);
  EXPECT_TRUE(plan.fallback);
  ASSERT_FALSE(plan.notes.empty());
  EXPECT_NE(describe(g, plan).find("budget"), std::string::npos) << describe(g, plan);
  // The structural order (a walk down from each CPU) is NUMA-contiguous by itself.
  EXPECT_EQ(groupChanges(plan.channels[0].order, {0, 1, 0, 1, 0, 1, 0, 1}), 2);
}

TEST(Plan, SeveralHostsUseEveryNicRailAlignedAndKeepHostsTogether) {
  LinkGraph g;
  std::vector<Host> hosts;
  for (int host = 0; host < 4; ++host) {
    hosts.push_back(addPcieHost(g, host, true));
    int fabric = g.addVertex(VertexKind::NvSwitch, host, "NVSwitch");
    for (int gpu : hosts.back().gpus) g.addLink(gpu, fabric, 300, LinkKind::NvLink);
  }
  int network = g.addVertex(VertexKind::Network, -1, "network");
  for (const Host& h : hosts)
    for (int nic : h.nics) g.addLink(nic, network, 12.5, LinkKind::Network);
  g.hostClass.assign(4, 0);
  Plan plan = search(g);
  expectSound(g, plan);
  std::vector<int> hostOfRank;
  for (int r = 0; r < g.nranks(); ++r) hostOfRank.push_back(g.hostOfRank(r));
  std::set<int> nicsUsed;
  std::map<int, int> nicIndex;  // Nic vertex -> its index within its host
  for (const Host& h : hosts)
    for (size_t i = 0; i < h.nics.size(); ++i) nicIndex[h.nics[i]] = static_cast<int>(i);
  for (const Channel& channel : plan.channels) {
    EXPECT_EQ(groupChanges(channel.order, hostOfRank), 4);
    std::set<int> rails;
    for (const Hop& hop : channel.hops) {
      if (hop.nicOut < 0) continue;
      nicsUsed.insert(hop.nicOut);
      rails.insert(nicIndex[hop.nicOut]);
      EXPECT_EQ(nicIndex[hop.nicOut], nicIndex[hop.nicIn]);
      // The ring leaves from a GPU on the NIC's own switch: out of the GPU, into the NIC.
      EXPECT_EQ(hop.route.size(), 2u + 2u + 2u);
    }
    EXPECT_EQ(rails.size(), 1u);
  }
  EXPECT_EQ(nicsUsed.size(), 16u);
  Plan loaded = fromJson(toJson(g, plan), g, "hosts.json");  // the rails survive a plan file
  ASSERT_EQ(loaded.channels.size(), plan.channels.size());
  for (size_t c = 0; c < plan.channels.size(); ++c)
    for (size_t h = 0; h < plan.channels[c].hops.size(); ++h)
      EXPECT_EQ(loaded.channels[c].hops[h].nicOut, plan.channels[c].hops[h].nicOut);
  // Four NICs per host, each channel entering a host through a GPU's 12 GB/s PCIe link (the NIC's
  // 12.5 GB/s to the network is wider).
  EXPECT_DOUBLE_EQ(plan.totalBandwidthGBs(), 4 * 12);
}

TEST(Plan, SearchIsDeterministic) {
  LinkGraph g = dgx1();
  Plan a = search(g), b = search(g);
  ASSERT_EQ(a.channels.size(), b.channels.size());
  for (size_t c = 0; c < a.channels.size(); ++c) {
    EXPECT_EQ(a.channels[c].order, b.channels[c].order);
    EXPECT_EQ(a.channels[c].bandwidthGBs, b.channels[c].bandwidthGBs);
  }
}

template <typename F>
std::string errorOf(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Plan, ValidatorRefusesBrokenPlans) {
  LinkGraph g = dgx1();
  const Plan good = search(g);
  ASSERT_NO_THROW(validate(g, good));

  Plan repeated = good;
  repeated.channels[0].order[1] = repeated.channels[0].order[0];
  EXPECT_NE(errorOf([&] { validate(g, repeated); }).find("appears twice"), std::string::npos);

  Plan heavy = good;
  heavy.channels[0].bandwidthGBs *= 2;
  EXPECT_NE(errorOf([&] { validate(g, heavy); }).find("reserve"), std::string::npos);

  // Hop 0 -> 2 of the ring 0 1 2 3 4 5 6 7 routed over rank 1's NVLinks (0-1, then 1-2).
  Plan through = good;
  Channel& ring = through.channels[0];
  ring.order = {0, 2, 1, 3, 4, 5, 6, 7};
  for (size_t i = 0; i < ring.hops.size(); ++i) {
    ring.hops[i].from = ring.order[i];
    ring.hops[i].to = ring.order[(i + 1) % 8];
    ring.hops[i].route.clear();
  }
  for (int e = 0; e < static_cast<int>(g.edges.size()); ++e) {
    const Edge& edge = g.edges[e];
    if (edge.from == g.rankVertex[0] && edge.to == g.rankVertex[1]) ring.hops[0].route.push_back(e);
  }
  for (int e = 0; e < static_cast<int>(g.edges.size()); ++e) {
    const Edge& edge = g.edges[e];
    if (edge.from == g.rankVertex[1] && edge.to == g.rankVertex[2]) ring.hops[0].route.push_back(e);
  }
  std::string message = errorOf([&] { validate(g, through); });
  EXPECT_NE(message.find("channel 0 hop 0"), std::string::npos) << message;
  EXPECT_NE(message.find("another rank"), std::string::npos) << message;
}

TEST(PlanFile, RoundTrip) {
  LinkGraph g = dgx1();
  Plan plan = search(g);
  Plan loaded = fromJson(toJson(g, plan), g, "plan.json");
  ASSERT_EQ(loaded.channels.size(), plan.channels.size());
  for (size_t c = 0; c < plan.channels.size(); ++c) {
    EXPECT_EQ(loaded.channels[c].order, plan.channels[c].order);
    EXPECT_EQ(loaded.channels[c].bandwidthGBs, plan.channels[c].bandwidthGBs);
    for (size_t h = 0; h < plan.channels[c].hops.size(); ++h)
      EXPECT_EQ(loaded.channels[c].hops[h].route, plan.channels[c].hops[h].route);
  }
  // Without bandwidths each channel takes what the ones before it leave.
  Plan bare = fromJson(R"({"channels": [{"order": [0, 3, 2, 1, 5, 6, 7, 4]},
                                        {"order": [0, 4, 7, 6, 5, 1, 2, 3]}]})",
                       g, "bare.json");
  EXPECT_DOUBLE_EQ(bare.channels[0].bandwidthGBs, 50);  // the NV2 ring
  EXPECT_DOUBLE_EQ(bare.channels[1].bandwidthGBs, 50);  // and back
  expectSound(g, bare);
}

TEST(PlanFile, MalformedFilesAreNamed) {
  LinkGraph g = dgx1();
  struct Case {
    const char* text;
    const char* expected;
  } cases[] = {
      {"{", "not a plan file"},
      {"[]", "expected a JSON object"},
      {R"({"chanels": []})", "unknown field \"chanels\""},
      {R"({"channels": []})", "non-empty array"},
      {R"({"nranks": 4, "channels": [{"order": [0, 1, 2, 3]}]})", "this job has 8 ranks"},
      {R"({"channels": [{"order": [0, 1, 2]}]})",
       "channel 0: expected \"order\": an array of the 8"},
      {R"({"channels": [{"order": [0, 1, 2, 3, 4, 5, 6, 6]}]})", "channel 0: rank 6 appears twice"},
      {R"({"channels": [{"order": [0, 1, 2, 3, 4, 5, 6, "7"]}]})", "holds \"7\""},
      {R"({"channels": [{"order": [0, 1, 2, 3, 4, 5, 6, 7], "bandwidth_gbs": "fast"}]})",
       "\"bandwidth_gbs\" is \"fast\""},
      {R"({"channels": [{"order": [0, 1, 2, 3, 4, 5, 6, 7], "speed": 1}]})",
       "channel 0: unknown field \"speed\""},
      {R"({"channels": [{"order": [0, 1, 2, 3, 4, 5, 6, 7], "bandwidth_gbs": 1000}]})",
       "channels reserve"},
  };
  for (const Case& c : cases) {
    std::string message = errorOf([&] { fromJson(c.text, g, "my.plan"); });
    EXPECT_EQ(message.rfind("my.plan", 0), 0u) << message;
    EXPECT_NE(message.find(c.expected), std::string::npos) << c.text << "\n" << message;
  }
}

TEST(Plan, RefusesWhatCannotBePlanned) {
  LinkGraph empty;
  EXPECT_NE(errorOf([&] { search(empty); }).find("no ranks"), std::string::npos);
  LinkGraph g = dgx1();
  SearchOptions backwards;
  backwards.minChannels = 4;
  backwards.maxChannels = 2;
  EXPECT_NE(errorOf([&] { search(g, backwards); }).find("minimum 4"), std::string::npos);
  int island = g.addVertex(VertexKind::Switch, 0, "island");
  g.addRank(0, "GPU8", island, 12, LinkKind::Pcie);
  EXPECT_NE(errorOf([&] { search(g); }).find("no route between them"), std::string::npos);
}

}  // namespace
}  // namespace braid::plan
