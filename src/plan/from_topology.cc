#include "plan/from_topology.h"

#include <algorithm>
#include <map>

#include "base/error.h"

namespace braid::plan {
namespace {

using topo::Node;
using topo::NodeKind;

// GT/s of the PCIe generation native to the machine's GPUs (the oldest of them), Gen3 if unknown.
double nativeLaneGTs(const topo::Topology& topology) {
  double gts = 0;
  for (int gpu : topo::gpuNodes(topology)) {
    const Node& node = topology.nodes[gpu];
    int sm = node.gpu.sm > 0 ? node.gpu.sm : topo::smFromModel(node.gpu.model);
    double native = sm >= 90 ? 32.0 : sm >= 80 ? 16.0 : 8.0;
    gts = gts == 0 ? native : std::min(gts, native);
  }
  return gts > 0 ? gts : 8.0;
}

double pcieGBs(const topo::PciLink& link, double defaultLaneGTs) {
  int width = link.width > 0 ? link.width : 16;
  if (link.laneGTs > 0) return 0.75 * link.laneGTs * width / 8;
  if (link.givenGBs > 0) return 0.75 * link.givenGBs * 130 / 128;
  return 0.75 * defaultLaneGTs * width / 8;
}

// One host's vertices and links.
class HostBuilder {
 public:
  HostBuilder(const topo::Topology& topology, LinkGraph& graph, int host, bool prefixed)
      : topology_(topology),
        graph_(graph),
        host_(host),
        prefix_(prefixed ? fmt::format("h{}:", host) : ""),
        laneGTs_(nativeLaneGTs(topology)),
        vertex_(topology.nodes.size(), -1) {}

  // Returns (Nic vertex, network GB/s) for every port added.
  std::vector<std::pair<int, double>> build(int ranksPerHost) {
    std::vector<int> cpus;
    for (int n = 0; n < static_cast<int>(topology_.nodes.size()); ++n) {
      const Node& node = topology_.nodes[n];
      if (node.kind != NodeKind::Cpu) continue;
      std::string name = node.cpu.numaId >= 0 ? fmt::format("NUMA{}", node.cpu.numaId)
                                              : fmt::format("CPU{}", cpus.size());
      vertex_[n] = graph_.addVertex(VertexKind::Cpu, host_, prefix_ + name);
      cpus.push_back(n);
    }
    if (cpus.empty())
      fail(braidInvalidArgument, "{}: no CPU (NUMA node) to attach ranks and links to",
           topology_.origin);
    for (size_t a = 0; a < cpus.size(); ++a)
      for (size_t b = a + 1; b < cpus.size(); ++b) {
        bool guessed = false;
        double gbs = std::min(topo::interSocketGBs(topology_.nodes[cpus[a]].cpu, &guessed),
                              topo::interSocketGBs(topology_.nodes[cpus[b]].cpu, &guessed));
        graph_.addLink(vertex_[cpus[a]], vertex_[cpus[b]], gbs, LinkKind::InterSocket);
      }
    std::vector<int> gpus = topo::gpuNodes(topology_);
    if (gpus.empty()) {
      int count = ranksPerHost > 0 ? ranksPerHost : static_cast<int>(cpus.size());
      for (int r = 0; r < count; ++r) {
        int cpu = cpus[r % cpus.size()];
        graph_.addRank(host_, fmt::format("{}rank{}", prefix_, graph_.nranks()), vertex_[cpu],
                       kSharedMemoryGBs, LinkKind::Memory);
      }
    } else {
      if (ranksPerHost > static_cast<int>(gpus.size()))
        fail(braidInvalidArgument, "{}: {} ranks per host asked; the machine has {} GPUs",
             topology_.origin, ranksPerHost, gpus.size());
      if (ranksPerHost > 0) gpus.resize(ranksPerHost);
      addGpus(gpus);
    }
    return addNics();
  }

 private:
  // A PCI node's vertex; a node joined to its parent by an internal link is folded into it.
  int vertexOf(int node) {
    if (vertex_[node] >= 0) return vertex_[node];
    const Node& n = topology_.nodes[node];
    int parent = n.parent >= 0 ? vertexOf(n.parent) : -1;
    if (parent >= 0 && n.link.internal) return vertex_[node] = parent;
    int v = graph_.addVertex(VertexKind::Switch, host_, prefix_ + "PCI " + n.busId);
    if (parent >= 0) graph_.addLink(v, parent, pcieGBs(n.link, laneGTs_), LinkKind::Pcie);
    return vertex_[node] = v;
  }

  void addGpus(const std::vector<int>& gpus) {
    for (int gpu : gpus) {
      const Node& node = topology_.nodes[gpu];
      int attach = vertexOf(node.parent >= 0 ? node.parent : topology_.cpuOf(gpu));
      vertex_[gpu] = graph_.addRank(host_, fmt::format("{}GPU{}", prefix_, node.gpu.index), attach,
                                    pcieGBs(node.link, laneGTs_), LinkKind::Pcie);
    }
    auto links = [&](int gpu, topo::PeerKind peer, const std::string& target) {
      int count = 0;
      for (const topo::GpuLink& link : topology_.nodes[gpu].gpu.links)
        if (link.peer == peer && (peer != topo::PeerKind::Gpu || link.target == target))
          count += link.count;
      return count;
    };
    auto rate = [&](int gpu) {
      bool guessed = false;
      return topo::linkRateGBs(topology_.nodes[gpu].gpu, &guessed);
    };
    int nvswitch = -1;
    for (size_t i = 0; i < gpus.size(); ++i) {
      int a = gpus[i];
      for (size_t j = i + 1; j < gpus.size(); ++j) {  // as nvidia-smi: the larger side's count
        int b = gpus[j];
        int count = std::max(links(a, topo::PeerKind::Gpu, topology_.nodes[b].busId),
                             links(b, topo::PeerKind::Gpu, topology_.nodes[a].busId));
        if (count > 0)
          graph_.addLink(vertex_[a], vertex_[b], count * std::min(rate(a), rate(b)),
                         LinkKind::NvLink);
      }
      if (int count = links(a, topo::PeerKind::NvSwitch, ""); count > 0) {
        if (nvswitch < 0)
          nvswitch = graph_.addVertex(VertexKind::NvSwitch, host_, prefix_ + "NVSwitch");
        graph_.addLink(vertex_[a], nvswitch, count * rate(a), LinkKind::NvLink);
      }
      if (int count = links(a, topo::PeerKind::Cpu, ""); count > 0)
        graph_.addLink(vertex_[a], vertex_[topology_.cpuOf(a)], count * rate(a), LinkKind::NvLink);
    }
  }

  std::vector<std::pair<int, double>> addNics() {
    std::vector<int> nics;
    for (const topo::Endpoint& endpoint : topo::endpoints(topology_))
      if (topology_.nodes[endpoint.node].kind == NodeKind::Nic &&
          std::find(nics.begin(), nics.end(), endpoint.node) == nics.end())
        nics.push_back(endpoint.node);
    // NICs outside the matrix (Ethernet ports hwloc knows only as network interfaces) come last.
    for (int n = 0; n < static_cast<int>(topology_.nodes.size()); ++n)
      if (topology_.nodes[n].kind == NodeKind::Nic && !topology_.nodes[n].busId.empty() &&
          std::find(nics.begin(), nics.end(), n) == nics.end())
        nics.push_back(n);
    std::vector<std::pair<int, double>> ports;
    for (int n : nics) {
      const Node& node = topology_.nodes[n];
      if (node.parent < 0) continue;
      double pcie = pcieGBs(node.link, laneGTs_);
      // Ports of one device (one GUID) share its PCIe link; ports with GUIDs of their own are
      // devices of their own (a VM may list several NICs under one PCI function). A NIC known by
      // its PCI class alone is one port of unknown speed.
      std::vector<std::pair<std::string, std::vector<const topo::NetPort*>>> devices;
      auto add = [&](const topo::NetPort* port) {
        auto it = std::find_if(devices.begin(), devices.end(),
                               [&](const auto& device) { return device.first == port->guid; });
        if (it == devices.end()) it = devices.insert(devices.end(), {port->guid, {}});
        it->second.push_back(port);
      };
      bool rdma = std::any_of(node.ports.begin(), node.ports.end(),
                              [](const topo::NetPort& port) { return port.inMatrix; });
      for (const topo::NetPort& port : node.ports)
        if (port.inMatrix || !rdma) add(&port);
      topo::NetPort byClass;
      byClass.name = "NIC " + node.busId;
      if (node.ports.empty()) add(&byClass);
      for (auto& [guid, used] : devices) {
        int attach = vertexOf(node.parent);
        if (used.size() > 1) {
          attach = graph_.addVertex(VertexKind::Switch, host_, prefix_ + "PCI " + node.busId);
          graph_.addLink(attach, vertexOf(node.parent), pcie, LinkKind::Pcie);
        }
        for (const topo::NetPort* port : used) {
          int v = graph_.addVertex(VertexKind::Nic, host_, prefix_ + port->name);
          graph_.addLink(v, attach, pcie, LinkKind::Pcie);
          ports.emplace_back(v, port->speedMbps > 0 ? port->speedMbps / 8000.0 : pcie);
        }
      }
    }
    return ports;
  }

  const topo::Topology& topology_;
  LinkGraph& graph_;
  int host_;
  std::string prefix_;
  double laneGTs_;
  std::vector<int> vertex_;  // topology node -> vertex
};

}  // namespace

LinkGraph fromTopology(const topo::Topology& topology, int ranksPerHost, int hosts) {
  if (hosts < 1) fail(braidInvalidArgument, "{} hosts; expected at least 1", hosts);
  LinkGraph graph;
  std::vector<std::pair<int, double>> nics;
  for (int host = 0; host < hosts; ++host) {
    auto ports = HostBuilder(topology, graph, host, hosts > 1).build(ranksPerHost);
    nics.insert(nics.end(), ports.begin(), ports.end());
  }
  graph.hostClass.assign(hosts, 0);
  if (hosts > 1) {
    int network = graph.addVertex(VertexKind::Network, -1, "network");
    for (auto [nic, gbs] : nics) graph.addLink(nic, network, gbs, LinkKind::Network);
  }
  return graph;
}

}  // namespace braid::plan
