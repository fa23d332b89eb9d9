#include "plan/routing.h"

#include <algorithm>
#include <limits>
#include <queue>
#include <set>

#include "base/error.h"

namespace braid::plan {

Router::Router(const LinkGraph& graph)
    : graph_(graph),
      out_(graph.vertices.size()),
      rails_(std::max(graph.hosts, 0)),
      toNetwork_(graph.vertices.size(), -1),
      fromNetwork_(graph.vertices.size(), -1),
      routed_(graph.vertices.size(), 0) {
  for (int e = 0; e < static_cast<int>(graph.edges.size()); ++e) {
    const Edge& edge = graph.edges[e];
    out_[edge.from].push_back(e);
    if (graph.vertices[edge.to].kind == VertexKind::Network) toNetwork_[edge.from] = e;
    if (graph.vertices[edge.from].kind == VertexKind::Network) fromNetwork_[edge.to] = e;
  }
  for (int v = 0; v < static_cast<int>(graph.vertices.size()); ++v) {
    const Vertex& vertex = graph.vertices[v];
    if (vertex.kind == VertexKind::Nic && vertex.host >= 0 && vertex.host < graph.hosts &&
        toNetwork_[v] >= 0 && fromNetwork_[v] >= 0)
      rails_[vertex.host].push_back(v);
  }
  auto speed = [&](int nic) { return graph.edges[toNetwork_[nic]].capacityGBs; };
  for (std::vector<int>& nics : rails_)
    std::stable_sort(nics.begin(), nics.end(), [&](int a, int b) { return speed(a) > speed(b); });
}

int Router::nicOfRail(int host, int rail) const {
  const std::vector<int>& nics = rails_[host];
  return nics.empty() ? -1 : nics[rail % nics.size()];
}

// Only switches and CPUs carry a route onward; ranks and NICs are where routes end.
bool Router::passable(int source, int v) const {
  const VertexKind kind = graph_.vertices[v].kind;
  return v == source || kind == VertexKind::Cpu || kind == VertexKind::Switch ||
         kind == VertexKind::NvSwitch;
}

bool Router::sameHost(int a, int b) const {
  return graph_.vertices[a].host == graph_.vertices[b].host;
}

// Dijkstra on max-min.
std::unordered_map<int, double> Router::widestFrom(int source) const {
  std::unordered_map<int, double> width{{source, std::numeric_limits<double>::infinity()}};
  std::priority_queue<std::pair<double, int>> queue;
  queue.push({width[source], -source});
  while (!queue.empty()) {
    auto [w, negative] = queue.top();
    queue.pop();
    const int v = -negative;
    if (w < width[v] || !passable(source, v)) continue;
    for (int e : out_[v]) {
      const int to = graph_.edges[e].to;
      const double through = std::min(w, graph_.edges[e].capacityGBs);
      if (sameHost(to, source) && through > 0 && through > width[to]) {
        width[to] = through;
        queue.push({through, -to});
      }
    }
  }
  return width;
}

// A breadth-first search over the edges at least `w` wide: the last edge into every vertex.
std::unordered_map<int, int> Router::fewestEdgesAtWidth(int source, double w) const {
  std::unordered_map<int, int> parentEdge{{source, -1}};
  std::queue<int> frontier;
  frontier.push(source);
  while (!frontier.empty()) {
    const int v = frontier.front();
    frontier.pop();
    if (!passable(source, v)) continue;
    for (int e : out_[v]) {
      const int to = graph_.edges[e].to;
      if (!sameHost(to, source) || graph_.edges[e].capacityGBs < w || parentEdge.count(to))
        continue;
      parentEdge[to] = e;
      frontier.push(to);
    }
  }
  return parentEdge;
}

void Router::routesFrom(int source) {
  routed_[source] = 1;
  const long long count = static_cast<long long>(graph_.vertices.size());
  std::unordered_map<int, double> width = widestFrom(source);
  // Among the widest paths to each rank and NIC the one with the fewest edges.
  std::set<double> widths;
  std::vector<int> targets;
  for (auto [v, w] : width) {
    const VertexKind kind = graph_.vertices[v].kind;
    if (v != source && (kind == VertexKind::Rank || kind == VertexKind::Nic)) {
      targets.push_back(v);
      widths.insert(w);
    }
  }
  std::sort(targets.begin(), targets.end());
  for (double w : widths) {
    std::unordered_map<int, int> parentEdge = fewestEdgesAtWidth(source, w);
    for (int target : targets) {
      if (width[target] != w) continue;
      std::vector<int>& path = routes_[source * count + target];
      for (int v = target; v != source; v = graph_.edges[parentEdge[v]].from)
        path.push_back(parentEdge[v]);
      std::reverse(path.begin(), path.end());
    }
  }
  // A direct link (NVLink between two GPUs) is the route whatever its width.
  for (int target : targets) {
    int direct = -1;
    for (int e : out_[source])
      if (graph_.edges[e].to == target &&
          (direct < 0 || graph_.edges[e].capacityGBs > graph_.edges[direct].capacityGBs))
        direct = e;
    if (direct >= 0) routes_[source * count + target] = {direct};
  }
}

const std::vector<int>& Router::route(int from, int to) {
  static const std::vector<int> kNone;
  if (!routed_[from]) routesFrom(from);
  auto it = routes_.find(static_cast<long long>(from) * graph_.vertices.size() + to);
  return it == routes_.end() ? kNone : it->second;
}

HopKind Router::kindOf(const std::vector<int>& route) const {
  bool allNvLink = true, throughCpu = false;
  for (int e : route) {
    const Edge& edge = graph_.edges[e];
    if (edge.kind == LinkKind::Network) return HopKind::Network;
    allNvLink = allNvLink && edge.kind == LinkKind::NvLink;
    throughCpu = throughCpu || graph_.vertices[edge.to].kind == VertexKind::Cpu;
  }
  if (throughCpu || route.empty()) return HopKind::HostMemory;
  return allNvLink ? HopKind::NvLink : HopKind::PcieP2p;
}

Hop Router::hop(int from, int to, int rail) {
  Hop hop;
  hop.from = from;
  hop.to = to;
  int a = graph_.rankVertex[from], b = graph_.rankVertex[to];
  int hostA = graph_.vertices[a].host, hostB = graph_.vertices[b].host;
  if (from == to) {
    hop.kind = kindOf(hop.route);
    return hop;
  }
  if (hostA == hostB) {
    hop.route = route(a, b);
    if (hop.route.empty())
      fail(braidInvalidArgument,
           "rank {} ({}) has no route to rank {} ({}) through switches or CPUs of its host", from,
           graph_.vertices[a].label, to, graph_.vertices[b].label);
  } else {
    for (auto [host, rank] : {std::pair{hostA, from}, std::pair{hostB, to}}) {
      if (nicOfRail(host, rail) < 0)
        fail(braidInvalidArgument,
             "rank {} is on host {}, which has no NIC linked to the network; a ring between "
             "hosts needs one on every host",
             rank, host);
    }
    hop.nicOut = nicOfRail(hostA, rail);
    hop.nicIn = nicOfRail(hostB, rail);
    const std::vector<int>& out = route(a, hop.nicOut);
    const std::vector<int>& in = route(hop.nicIn, b);
    if (out.empty() || in.empty())
      fail(braidInvalidArgument, "no route from rank {} to NIC {} or from NIC {} to rank {}", from,
           graph_.vertices[hop.nicOut].label, graph_.vertices[hop.nicIn].label, to);
    hop.route = out;
    hop.route.push_back(toNetwork_[hop.nicOut]);
    hop.route.push_back(fromNetwork_[hop.nicIn]);
    hop.route.insert(hop.route.end(), in.begin(), in.end());
  }
  hop.kind = kindOf(hop.route);
  return hop;
}

double ringBound(const std::vector<const std::vector<int>*>& routes,
                 const std::vector<double>& residual) {
  std::unordered_map<int, int> uses;
  for (const std::vector<int>* route : routes)
    for (int e : *route) ++uses[e];
  double bound = std::numeric_limits<double>::infinity();
  for (auto [e, n] : uses) bound = std::min(bound, residual[e] / n);
  return bound;
}

}  // namespace braid::plan
