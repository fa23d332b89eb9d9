#include <numeric>

#include "plan/plan.h"

namespace braid::plan {

int LinkGraph::addVertex(VertexKind kind, int host, std::string label) {
  if (host >= hosts) {
    hosts = host + 1;
    hostClass.resize(hosts, -1);
  }
  vertices.push_back(Vertex{kind, host, std::move(label)});
  return static_cast<int>(vertices.size()) - 1;
}

int LinkGraph::addLink(int a, int b, double capacityGBs, LinkKind kind) {
  edges.push_back(Edge{a, b, capacityGBs, kind});
  edges.push_back(Edge{b, a, capacityGBs, kind});
  return static_cast<int>(edges.size()) - 2;
}

int LinkGraph::addRank(int host, std::string label, int attach, double capacityGBs, LinkKind kind) {
  int vertex = addVertex(VertexKind::Rank, host, std::move(label));
  rankVertex.push_back(vertex);
  addLink(vertex, attach, capacityGBs, kind);
  return vertex;
}

const char* hopKindName(HopKind kind) {
  switch (kind) {
    case HopKind::NvLink: return "NVL";
    case HopKind::PcieP2p: return "PCI";
    case HopKind::HostMemory: return "SYS";
    case HopKind::Network: return "NET";
  }
  return "?";
}

double Plan::totalBandwidthGBs() const {
  return std::accumulate(channels.begin(), channels.end(), 0.0,
                         [](double sum, const Channel& c) { return sum + c.bandwidthGBs; });
}

}  // namespace braid::plan
