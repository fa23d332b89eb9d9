#include "plan/host_graph.h"

#include <fmt/format.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <set>

#include "base/params.h"
#include "topology/live.h"

namespace braid::plan {
namespace {

// The CPU-to-CPU link of a host whose CPU model the ranks do not report: the lowest figure NCCL
// uses for current x86 parts (Skylake UPI). Only the order of ranks depends on it.
constexpr double kInterSocketGBs = 10.0;

}  // namespace

HostRankInfo describeThisRank(const std::string& nicName) {
  // The host as topology discovery sees it, once per process: CPUs, NUMA nodes, caches, network
  // interfaces (no devices: a CPU communicator needs none, and loading their libraries costs).
  static const topo::Topology host = topo::discoverLive({.useHwloc = true, .devices = false});
  HostRankInfo info;
  unsigned cpu = 0, node = 0;
  if (syscall(SYS_getcpu, &cpu, &node, nullptr) == 0) info.numa = static_cast<int32_t>(node);
  for (const topo::Node& n : host.nodes)
    if (n.kind == topo::NodeKind::Cpu &&
        std::binary_search(n.cpu.cpus.begin(), n.cpu.cpus.end(), static_cast<int>(cpu)))
      info.llcBytes = n.cpu.llcBytes;
  if (nicName.empty()) return info;
  // A physical interface is a NIC of the PCI tree; veth, bridges and loopback are not, and their
  // "speed" is made up: the kernel's own copies set their pace.
  for (const topo::Node& n : host.nodes)
    for (const topo::NetPort& port : n.ports)
      if (n.kind == topo::NodeKind::Nic && port.name == nicName) {
        info.nicGBs = port.speedMbps / 8000.0;
        const int cpuNode = host.cpuOf(static_cast<int>(&n - host.nodes.data()));
        if (cpuNode >= 0) info.nicNuma = host.nodes[cpuNode].cpu.numaId;
      }
  info.virtualNic = info.nicGBs <= 0;
  return info;
}

LinkGraph hostGraph(const std::vector<HostRankInfo>& ranks) {
  LinkGraph graph;
  // Hosts numbered in the order of their lowest rank.
  std::map<uint64_t, int> hostIndex;
  for (const HostRankInfo& r : ranks) hostIndex.emplace(r.host, -1);
  int hosts = 0;
  for (const HostRankInfo& r : ranks)
    if (hostIndex[r.host] < 0) hostIndex[r.host] = hosts++;
  graph.hosts = hosts;

  // NUMA vertices per host, created in rank order so the graph is the same on every rank.
  std::map<std::pair<int, int>, int> numaVertex;  // (host, numa) -> vertex
  auto cpuVertex = [&](int host, int numa) {
    auto [it, inserted] = numaVertex.emplace(std::make_pair(host, numa), -1);
    if (inserted) {
      it->second = graph.addVertex(
          VertexKind::Cpu, host,
          numa >= 0 ? fmt::format("host{} NUMA{}", host, numa) : fmt::format("host{} CPU", host));
      for (const auto& [key, vertex] : numaVertex)
        if (key.first == host && vertex != it->second)
          graph.addLink(vertex, it->second, kInterSocketGBs, LinkKind::InterSocket);
    }
    return it->second;
  };
  for (size_t r = 0; r < ranks.size(); ++r) {
    const int host = hostIndex[ranks[r].host];
    graph.addRank(host, fmt::format("rank{}", r), cpuVertex(host, ranks[r].numa), kSharedMemoryGBs,
                  LinkKind::Memory);
  }
  if (graph.hosts > 1) {
    std::map<uint64_t, std::set<uint64_t>> hostsOf;  // machine -> its hosts
    for (const HostRankInfo& r : ranks) hostsOf[r.machine].insert(r.host);
    std::map<uint64_t, double> hostsOnMachine;
    for (const auto& [machine, hosts] : hostsOf) hostsOnMachine[machine] = hosts.size();
    const int network = graph.addVertex(VertexKind::Network, -1, "network");
    for (int h = 0; h < graph.hosts; ++h) {
      // The host's lowest rank speaks for its NIC.
      size_t first = 0;
      while (hostIndex[ranks[first].host] != h) ++first;
      const HostRankInfo& r = ranks[first];
      const int numa = numaVertex.count({h, r.nicNuma}) ? r.nicNuma : r.numa;
      const int nic = graph.addVertex(VertexKind::Nic, h, fmt::format("host{} NIC", h));
      graph.addLink(cpuVertex(h, numa), nic, kSharedMemoryGBs, LinkKind::Memory);
      graph.addLink(nic, network,
                    r.virtualNic ? param::ModelTcpGBs() / hostsOnMachine[r.machine] : r.nicGBs,
                    LinkKind::Network);
    }
  }
  // Hosts with the same ranks per NUMA node and the same NIC plan alike.
  std::map<std::string, int> classes;
  for (int h = 0; h < graph.hosts; ++h) {
    std::string shape;
    for (const HostRankInfo& r : ranks)
      if (hostIndex[r.host] == h)
        shape += fmt::format("{}/{}/{}/{};", r.numa, r.nicNuma, r.nicGBs, r.virtualNic);
    graph.hostClass.push_back(
        classes.emplace(shape, static_cast<int>(classes.size())).first->second);
  }
  return graph;
}

}  // namespace braid::plan
