// How a hop between two ranks crosses the link graph; shared by the search and the plan-file loader
// so that a loaded plan routes exactly as a searched one.
#pragma once

#include <unordered_map>
#include <vector>

#include "plan/plan.h"

namespace braid::plan {

class Router {
 public:
  explicit Router(const LinkGraph& graph);

  // Edges from vertex `from` to vertex `to` of the same host: the widest direct edge between them
  // if there is one (NVLink), else the widest path (then the fewest edges) through switches and
  // CPUs of that host, never through another rank or NIC. Empty when there is none.
  const std::vector<int>& route(int from, int to);
  // The host's NICs linked to the network, in rail order: fastest first, then in graph order.
  const std::vector<int>& rails(int host) const { return rails_[host]; }
  int nicOfRail(int host, int rail) const;
  int toNetwork(int nic) const { return toNetwork_[nic]; }
  int fromNetwork(int nic) const { return fromNetwork_[nic]; }
  // Rank `from` to rank `to`; between hosts through the NICs of `rail` on both sides. Throws
  // braidInvalidArgument naming both ranks when no route exists.
  Hop hop(int from, int to, int rail);
  HopKind kindOf(const std::vector<int>& route) const;
  const std::vector<int>& outEdges(int vertex) const { return out_[vertex]; }

 private:
  // Every route from `source` to the ranks and NICs of its host, into routes_.
  void routesFrom(int source);
  // Each vertex of the host reached from `source`: the widest bottleneck of a path to it.
  std::unordered_map<int, double> widestFrom(int source) const;
  std::unordered_map<int, int> fewestEdgesAtWidth(int source, double w) const;
  bool passable(int source, int v) const;
  bool sameHost(int a, int b) const;

  const LinkGraph& graph_;
  std::vector<std::vector<int>> out_;  // vertex -> outgoing edges, in edge order
  std::vector<std::vector<int>> rails_;
  std::vector<int> toNetwork_, fromNetwork_;  // Nic vertex -> its edge to/from the Network vertex
  std::vector<char> routed_;                  // sources whose routes are in routes_
  std::unordered_map<long long, std::vector<int>> routes_;
};

// Bandwidth a ring of `routes` can reserve under `residual`: the narrowest residual / uses over the
// edges it crosses (an edge crossed twice gives each crossing half).
double ringBound(const std::vector<const std::vector<int>*>& routes,
                 const std::vector<double>& residual);

}  // namespace braid::plan
