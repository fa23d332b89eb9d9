// Checks of a plan shared by the planner's tests, written independently of plan::validate.
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <vector>

#include "plan/plan.h"

namespace braid::plan {

// Independent of validate(): rings are permutations, routes walk edge by edge from a rank to the
// next through no other rank, and no edge carries more than its capacity. Returns, per channel,
// how many times each directed edge is crossed.
inline std::vector<std::map<int, int>> expectSound(const LinkGraph& g, const Plan& plan) {
  std::vector<std::map<int, int>> crossings;
  std::vector<double> load(g.edges.size(), 0);
  for (const Channel& channel : plan.channels) {
    std::set<int> ranks(channel.order.begin(), channel.order.end());
    EXPECT_EQ(ranks.size(), static_cast<size_t>(g.nranks()));
    EXPECT_EQ(channel.order.size(), static_cast<size_t>(g.nranks()));
    EXPECT_GT(channel.bandwidthGBs, 0);
    std::map<int, int>& uses = crossings.emplace_back();
    for (size_t i = 0; i < channel.hops.size(); ++i) {
      const Hop& hop = channel.hops[i];
      EXPECT_EQ(hop.from, channel.order[i]);
      EXPECT_EQ(hop.to, channel.order[(i + 1) % channel.order.size()]);
      int at = g.rankVertex[hop.from];
      for (size_t k = 0; k < hop.route.size(); ++k) {
        const Edge& edge = g.edges[hop.route[k]];
        EXPECT_EQ(edge.from, at);
        if (k > 0) {
          EXPECT_NE(g.vertices[at].kind, VertexKind::Rank) << g.vertices[at].label;
        }
        at = edge.to;
        load[hop.route[k]] += channel.bandwidthGBs;
        ++uses[hop.route[k]];
      }
      EXPECT_EQ(at, g.rankVertex[hop.to]);
    }
  }
  for (size_t e = 0; e < load.size(); ++e) EXPECT_LE(load[e], g.edges[e].capacityGBs + 1e-6);
  return crossings;
}

// How many times a ring moves from one group of ranks to another (a contiguous group: once).
inline int groupChanges(const std::vector<int>& order, const std::vector<int>& groupOfRank) {
  int changes = 0;
  for (size_t i = 0; i < order.size(); ++i)
    changes += groupOfRank[order[i]] != groupOfRank[order[(i + 1) % order.size()]];
  return changes;
}

}  // namespace braid::plan
