#include <cmath>
#include <sstream>

#include "base/error.h"
#include "plan/plan.h"

namespace braid::plan {
namespace {

// The route of hop `h` of channel `c` must walk edge by edge from its rank to the next one,
// touching no other rank, and name the NICs where it crosses the network.
void checkRoute(const LinkGraph& graph, int c, int h, const Hop& hop) {
  int edgeCount = static_cast<int>(graph.edges.size());
  int at = graph.rankVertex[hop.from], nicOut = -1, nicIn = -1;
  for (size_t k = 0; k < hop.route.size(); ++k) {
    int e = hop.route[k];
    if (e < 0 || e >= edgeCount)
      fail(braidInternalError, "channel {} hop {}: edge {} does not exist (the graph has {})", c, h,
           e, edgeCount);
    const Edge& edge = graph.edges[e];
    if (edge.from != at)
      fail(braidInternalError,
           "channel {} hop {} ({} -> {}): edge {} leaves {}, expected it to leave {}", c, h,
           hop.from, hop.to, e, graph.vertices[edge.from].label, graph.vertices[at].label);
    if (k > 0 && graph.vertices[at].kind == VertexKind::Rank)
      fail(braidInternalError,
           "channel {} hop {} ({} -> {}) passes through {}, another rank; expected switches, "
           "CPUs or the network only",
           c, h, hop.from, hop.to, graph.vertices[at].label);
    if (graph.vertices[edge.to].kind == VertexKind::Network) nicOut = edge.from;
    if (graph.vertices[edge.from].kind == VertexKind::Network) nicIn = edge.to;
    at = edge.to;
  }
  if (at != graph.rankVertex[hop.to])
    fail(braidInternalError, "channel {} hop {}: route ends at {}, expected rank {} ({})", c, h,
         graph.vertices[at].label, hop.to, graph.vertices[graph.rankVertex[hop.to]].label);
  if (nicOut != hop.nicOut || nicIn != hop.nicIn)
    fail(braidInternalError,
         "channel {} hop {}: names NICs {} -> {}, its route crosses the network at {} -> {}", c, h,
         hop.nicOut, hop.nicIn, nicOut, nicIn);
}

}  // namespace

void validate(const LinkGraph& graph, const Plan& plan) {
  const int n = graph.nranks();
  if (plan.nranks != n)
    fail(braidInternalError, "plan is for {} ranks; the graph has {}", plan.nranks, n);
  if (plan.channels.empty()) fail(braidInternalError, "plan has no channel");
  std::vector<double> load(graph.edges.size(), 0);
  for (size_t c = 0; c < plan.channels.size(); ++c) {
    const Channel& channel = plan.channels[c];
    if (static_cast<int>(channel.order.size()) != n)
      fail(braidInternalError, "channel {}: its ring has {} ranks; expected all {}", c,
           channel.order.size(), n);
    std::vector<char> seen(n, 0);
    for (size_t i = 0; i < channel.order.size(); ++i) {
      int rank = channel.order[i];
      if (rank < 0 || rank >= n)
        fail(braidInternalError, "channel {}: position {} holds {}; expected a rank 0..{}", c, i,
             rank, n - 1);
      if (seen[rank]++)
        fail(braidInternalError, "channel {}: rank {} appears twice; expected each rank once", c,
             rank);
    }
    if (!std::isfinite(channel.bandwidthGBs) || channel.bandwidthGBs < 0)
      fail(braidInternalError, "channel {}: bandwidth {} GB/s; expected a finite value >= 0", c,
           channel.bandwidthGBs);
    if (channel.hops.size() != channel.order.size())
      fail(braidInternalError, "channel {}: {} hops for {} ranks", c, channel.hops.size(), n);
    for (int h = 0; h < n; ++h) {
      const Hop& hop = channel.hops[h];
      int from = channel.order[h], to = channel.order[(h + 1) % n];
      if (hop.from != from || hop.to != to)
        fail(braidInternalError, "channel {} hop {}: goes {} -> {}; expected {} -> {}", c, h,
             hop.from, hop.to, from, to);
      checkRoute(graph, static_cast<int>(c), h, hop);
      for (int e : hop.route) load[e] += channel.bandwidthGBs;
    }
  }
  for (size_t e = 0; e < load.size(); ++e) {
    const Edge& edge = graph.edges[e];
    if (load[e] > edge.capacityGBs * (1 + 1e-9) + 1e-9)
      fail(braidInternalError,
           "link {} -> {} (edge {}): the channels reserve {:.3f} GB/s; it carries {:.3f}",
           graph.vertices[edge.from].label, graph.vertices[edge.to].label, e, load[e],
           edge.capacityGBs);
  }
}

std::string describe(const LinkGraph& graph, const Plan& plan) {
  std::ostringstream out;
  for (size_t c = 0; c < plan.channels.size(); ++c) {
    const Channel& channel = plan.channels[c];
    out << fmt::format("channel {:2}: ", c);
    for (int rank : channel.order) out << rank << " -> ";
    out << fmt::format("{}  {:.1f} GB/s ", channel.order.front(), channel.bandwidthGBs);
    for (const Hop& hop : channel.hops) {
      out << ' ' << hopKindName(hop.kind);
      if (hop.nicOut >= 0)
        out << fmt::format("({}>{})", graph.vertices[hop.nicOut].label,
                           graph.vertices[hop.nicIn].label);
    }
    out << '\n';
  }
  out << fmt::format("total {:.1f} GB/s over {} channel(s), planned in {:.2f} ms{}\n",
                     plan.totalBandwidthGBs(), plan.channels.size(), plan.searchMs,
                     plan.fallback ? " (fallback)" : "");
  for (const std::string& note : plan.notes) out << "note: " << note << '\n';
  return out.str();
}

}  // namespace braid::plan
