#include "topology/paths.h"

#include <fmt/format.h>

#include <algorithm>
#include <set>

namespace braid::topo {
namespace {

int linksTo(const GpuInfo& gpu, const std::string& peerBus) {
  int count = 0;
  for (const GpuLink& link : gpu.links)
    if (link.peer == PeerKind::Gpu && link.target == peerBus) count += link.count;
  return count;
}

int switchLinks(const GpuInfo& gpu) {
  int count = 0;
  for (const GpuLink& link : gpu.links)
    if (link.peer == PeerKind::NvSwitch) count += link.count;
  return count;
}

// NVLink (or xGMI) between two GPUs; cls stays Self when they have none.
Path gpuLinkPath(const Node& a, const Node& b) {
  Path path;
  bool estimatedA = false, estimatedB = false;
  double rateA = linkRateGBs(a.gpu, &estimatedA), rateB = linkRateGBs(b.gpu, &estimatedB);
  int direct = std::max(linksTo(a.gpu, b.busId), linksTo(b.gpu, a.busId));
  if (direct > 0) {
    path.links = direct;
    path.bandwidthGBs = direct * std::min(rateA, rateB);
  } else {
    int viaA = switchLinks(a.gpu), viaB = switchLinks(b.gpu);
    if (viaA == 0 || viaB == 0) return path;
    path.links = std::min(viaA, viaB);
    path.bandwidthGBs = std::min(viaA * rateA, viaB * rateB);
  }
  path.cls = a.gpu.xgmi || b.gpu.xgmi ? PathClass::Xgmi : PathClass::NvLink;
  path.estimated = estimatedA || estimatedB;
  return path;
}

// The PCIe switch a bridge belongs to: a downstream port is part of its upstream port's switch.
int switchUnit(const Topology& topology, int bridge) {
  const Node& node = topology.nodes[bridge];
  return node.role == BridgeRole::SwitchDownstream && node.parent >= 0 ? node.parent : bridge;
}

bool isPciNode(const Node& node) {
  return node.kind != NodeKind::Cpu && node.kind != NodeKind::HostBridge;
}

Path pciPath(const Topology& topology, int a, int b) {
  Path path;
  std::vector<int> chainA = topology.ancestors(a), chainB = topology.ancestors(b);
  chainA.insert(chainA.begin(), a);
  chainB.insert(chainB.begin(), b);
  std::set<int> onB(chainB.begin(), chainB.end());
  auto lcaIt = std::find_if(chainA.begin(), chainA.end(), [&](int n) { return onB.count(n) > 0; });
  int lca = lcaIt == chainA.end() ? -1 : *lcaIt;

  double bandwidth = 0;
  bool estimated = false;
  auto crossLink = [&](const PciLink& link) {
    double gbs = link.bandwidth();
    bandwidth = bandwidth == 0 ? gbs : std::min(bandwidth, gbs);
    estimated = estimated || link.estimated();
  };
  std::set<int> switches;
  for (const std::vector<int>* chain : {&chainA, &chainB}) {
    for (size_t i = 0; i < chain->size() && (*chain)[i] != lca; ++i) {
      const Node& node = topology.nodes[(*chain)[i]];
      if (isPciNode(node) && !node.link.internal) crossLink(node.link);
      if (i > 0 && node.kind == NodeKind::Bridge)
        switches.insert(switchUnit(topology, (*chain)[i]));
    }
  }

  int cpuA = topology.cpuOf(a), cpuB = topology.cpuOf(b);
  if (lca < 0 || cpuA != cpuB) {
    path.cls = PathClass::Sys;
    for (int cpu : {cpuA, cpuB}) {
      if (cpu < 0) continue;
      bool guessed = false;
      double smp = interSocketGBs(topology.nodes[cpu].cpu, &guessed);
      bandwidth = bandwidth == 0 ? smp : std::min(bandwidth, smp);
      estimated = estimated || guessed;
    }
  } else if (topology.nodes[lca].kind == NodeKind::Cpu) {
    path.cls = topology.hostBridgesKnown ? PathClass::Node : PathClass::Phb;
  } else if (topology.nodes[lca].kind == NodeKind::HostBridge) {
    path.cls = PathClass::Phb;
  } else {
    if (topology.nodes[lca].kind == NodeKind::Bridge) switches.insert(switchUnit(topology, lca));
    path.cls = switches.size() <= 1 ? PathClass::Pix : PathClass::Pxb;
  }
  path.bandwidthGBs = bandwidth;
  path.estimated = estimated;
  return path;
}

}  // namespace

Path pathBetween(const Topology& topology, const Endpoint& a, const Endpoint& b) {
  if (a.node == b.node) {
    Path path;
    if (a.port == b.port) return path;  // X
    // Two ports of one device: nvidia-smi says PIX; traffic between them stays on the device.
    path.cls = PathClass::Pix;
    path.bandwidthGBs = topology.nodes[a.node].link.bandwidth();
    path.estimated = topology.nodes[a.node].link.estimated();
    return path;
  }
  const Node& nodeA = topology.nodes[a.node];
  const Node& nodeB = topology.nodes[b.node];
  if (nodeA.kind == NodeKind::Gpu && nodeB.kind == NodeKind::Gpu) {
    Path link = gpuLinkPath(nodeA, nodeB);
    if (link.cls != PathClass::Self) return link;
  }
  return pciPath(topology, a.node, b.node);
}

std::string classLabel(const Path& path) {
  switch (path.cls) {
    case PathClass::Self: return "X";
    case PathClass::NvLink: return fmt::format("NV{}", path.links);
    case PathClass::Xgmi: return fmt::format("XG{}", path.links);
    case PathClass::Pix: return "PIX";
    case PathClass::Pxb: return "PXB";
    case PathClass::Phb: return "PHB";
    case PathClass::Node: return "NODE";
    case PathClass::Sys: return "SYS";
  }
  return "?";
}

Matrix computeMatrix(const Topology& topology) {
  Matrix matrix;
  matrix.endpoints = endpoints(topology);
  for (const Endpoint& row : matrix.endpoints) {
    std::vector<Path> paths;
    for (const Endpoint& column : matrix.endpoints)
      paths.push_back(pathBetween(topology, row, column));
    matrix.paths.push_back(std::move(paths));
  }
  return matrix;
}

}  // namespace braid::topo
