// The ring search (docs/plan.md, "Search"): greedy channels, each the ring with the widest
// bottleneck under what earlier channels left, found by a branch-and-bound search over the ranks
// of one host (and the NIC a ring between hosts enters and leaves it by). The step budget is a
// count, not a clock, so that every rank computes the same plan.
#include <algorithm>
#include <limits>
#include <map>
#include <numeric>

#include "base/error.h"
#include "plan/routing.h"

namespace braid::plan {
namespace {

using Clock = std::chrono::steady_clock;
constexpr long kStepsPerMs = 50000;       // search steps granted per millisecond of budget
constexpr long kLengthSteps = 16384;      // steps to look for a shorter ring at the same bottleneck
constexpr double kUsefulShare = 1.0 / 8;  // a channel below this share of the first is not worth it
constexpr double kInf = std::numeric_limits<double>::infinity();

bool above(double a, double b) {
  return a > b + 1e-9 * std::max(1.0, b);
}

struct Cycle {
  std::vector<int> order;  // member indices, starting with member 0
  double bound = 0;        // GB/s it can reserve
  int length = 0;          // edges crossed; fewer is closer
};

// Depth-first search for the Hamiltonian cycle over a host's members (from member 0) with the
// widest bottleneck, then, at that bottleneck, the fewest edges. A cycle crosses every directed
// edge at most once, which keeps each switch uplink and inter-socket link to one crossing per
// direction. Interchangeable ranks (same links, same residual) are visited in index order only.
class CycleSearch {
 public:
  CycleSearch(int n, const std::vector<std::vector<int>>& routes, const std::vector<char>& allowed,
              const std::vector<double>& residual, std::vector<int> classPrev)
      : n_(n),
        hopEdges_(n * n),
        hopCap_(n * n, 0),
        hopLen_(n * n, 0),
        candidates_(n),
        minIn_(n, std::numeric_limits<int>::max() / 4),
        classPrev_(std::move(classPrev)) {
    std::map<int, int> local;
    for (int h = 0; h < n * n; ++h) {
      if (!allowed[h] || routes[h].empty()) continue;
      double cap = kInf;
      for (int e : routes[h]) {
        auto [it, added] = local.emplace(e, static_cast<int>(local.size()));
        hopEdges_[h].push_back(it->second);
        cap = std::min(cap, residual[e]);
      }
      if (cap <= 1e-12) continue;
      hopCap_[h] = cap;
      hopLen_[h] = static_cast<int>(routes[h].size());
      candidates_[h / n].push_back(h % n);
      minIn_[h % n] = std::min(minIn_[h % n], hopLen_[h]);
    }
    used_.assign(local.size(), 0);
    for (int i = 0; i < n; ++i)
      std::stable_sort(candidates_[i].begin(), candidates_[i].end(), [&](int a, int b) {
        int ha = i * n + a, hb = i * n + b;
        return hopCap_[ha] != hopCap_[hb] ? hopCap_[ha] > hopCap_[hb] : hopLen_[ha] < hopLen_[hb];
      });
  }

  // Improves `best` (an empty order: none yet). Returns false when the step budget ran out before
  // the widest bottleneck was proven.
  bool improve(Cycle* best, long* steps, long lengthSteps) {
    best_ = best;
    double upper = kInf;  // no cycle is wider than any member's widest way in or out
    for (int i = 0; i < n_; ++i) {
      double in = 0, out = 0;
      for (int j = 0; j < n_; ++j) {
        out = std::max(out, hopCap_[i * n_ + j]);
        in = std::max(in, hopCap_[j * n_ + i]);
      }
      upper = std::min({upper, in, out});
    }
    steps_ = steps;
    if (upper > 0 && (best->order.empty() || above(upper, best->bound))) run(false);
    bool proven = !aborted_;
    int lowest = std::accumulate(minIn_.begin(), minIn_.end(), 0);
    if (!best->order.empty() && best->length > lowest) {
      long budget = std::min(*steps, lengthSteps), left = budget;
      steps_ = &left;
      run(true);
      *steps -= budget - left;
    }
    return proven;
  }

 private:
  void run(bool shorter) {
    shorter_ = shorter;
    aborted_ = false;
    visited_.assign(n_, 0);
    visited_[0] = 1;
    order_ = {0};
    bound_ = kInf;
    length_ = 0;
    minInLeft_ = std::accumulate(minIn_.begin(), minIn_.end(), 0);
    dfs(0);
  }

  bool free(int hop) const {
    for (int e : hopEdges_[hop])
      if (used_[e]) return false;
    return true;
  }

  void dfs(int last) {
    if (static_cast<int>(order_.size()) == n_) {
      int hop = last * n_;
      if (hopCap_[hop] <= 0 || !free(hop)) return;
      double bound = std::min(bound_, hopCap_[hop]);
      int length = length_ + hopLen_[hop];
      bool better = best_->order.empty() || above(bound, best_->bound) ||
                    (shorter_ && !above(best_->bound, bound) && length < best_->length);
      if (better) *best_ = Cycle{order_, bound, length};
      return;
    }
    for (int next : candidates_[last]) {
      if (--*steps_ < 0) {  // a step is a candidate looked at: their cost varies little
        aborted_ = true;
        return;
      }
      int hop = last * n_ + next;
      double cap = hopCap_[hop];
      if (!best_->order.empty() &&
          (shorter_ ? above(best_->bound, cap) : !above(cap, best_->bound)))
        break;  // candidates are sorted widest first
      if (!shorter_ && !best_->order.empty() && !above(bound_, best_->bound)) return;
      if (visited_[next] || (classPrev_[next] >= 0 && !visited_[classPrev_[next]])) continue;
      if (shorter_ && length_ + hopLen_[hop] + minInLeft_ - minIn_[next] >= best_->length) continue;
      if (!free(hop)) continue;
      for (int e : hopEdges_[hop]) used_[e] = 1;
      visited_[next] = 1;
      order_.push_back(next);
      double savedBound = bound_;
      bound_ = std::min(bound_, cap);
      length_ += hopLen_[hop];
      minInLeft_ -= minIn_[next];
      dfs(next);
      minInLeft_ += minIn_[next];
      length_ -= hopLen_[hop];
      bound_ = savedBound;
      order_.pop_back();
      visited_[next] = 0;
      for (int e : hopEdges_[hop]) used_[e] = 0;
      if (aborted_) return;
    }
  }

  int n_;
  std::vector<std::vector<int>> hopEdges_;  // hop i*n+j -> local edge indices
  std::vector<double> hopCap_;              // 0: no such hop
  std::vector<int> hopLen_;
  std::vector<std::vector<int>> candidates_;  // per member: next members, widest hop first
  std::vector<int> minIn_, classPrev_;
  std::vector<char> used_, visited_;
  std::vector<int> order_;
  double bound_ = kInf;
  int length_ = 0, minInLeft_ = 0;
  bool shorter_ = false, aborted_ = false;
  long* steps_ = nullptr;
  Cycle* best_ = nullptr;
};

// A host's members: its ranks in structural order, after the NIC (member 0) for a ring between
// hosts. Routes from and to the NIC include its network link.
struct HostMembers {
  std::vector<int> vertices;
  std::vector<std::vector<int>> routes;  // n*n
  std::vector<char> nvlink;              // n*n: an NVLink hop (NIC legs count as one)
  bool nvlinkOnly = false;
  bool tierDecided = false;
  bool ranksJoinedByNvlink = false;  // some two ranks here have an NVLink hop between them

  HostMembers(const LinkGraph& graph, Router& router, const std::vector<int>& ranks, int nic) {
    if (nic >= 0) vertices.push_back(nic);
    for (int rank : ranks) vertices.push_back(graph.rankVertex[rank]);
    int n = static_cast<int>(vertices.size());
    routes.resize(n * n);
    nvlink.assign(n * n, 0);
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) {
        if (i == j) continue;
        std::vector<int>& route = routes[i * n + j];
        route = router.route(vertices[i], vertices[j]);
        if (route.empty()) continue;
        bool leg = nic >= 0 && (i == 0 || j == 0);
        if (leg && i == 0) route.insert(route.begin(), router.fromNetwork(nic));
        if (leg && j == 0) route.push_back(router.toNetwork(nic));
        const bool nvlinkHop = router.kindOf(routes[i * n + j]) == HopKind::NvLink;
        nvlink[i * n + j] = leg || nvlinkHop;
        ranksJoinedByNvlink = ranksJoinedByNvlink || (!leg && nvlinkHop);
      }
    for (int j = 1; j < n; ++j)
      if (routes[j].empty() || routes[j * n].empty())
        fail(braidInvalidArgument,
             "{} and {} have no route between them through the switches and CPUs of host {}",
             graph.vertices[vertices[0]].label, graph.vertices[vertices[j]].label,
             graph.vertices[vertices[j]].host);
  }
  int size() const { return static_cast<int>(vertices.size()); }

  // Ranks with one and the same set of links (neighbour, kind, residual both ways) are
  // interchangeable: each points to the previous such member, or -1. Edge e ^ 1 is e's reverse
  // (LinkGraph::addLink).
  std::vector<int> interchangeable(const LinkGraph& graph, const Router& router,
                                   const std::vector<double>& residual) const {
    std::map<std::vector<double>, int> last;
    std::vector<int> previous(size(), -1);
    for (int m = 0; m < size(); ++m) {
      if (graph.vertices[vertices[m]].kind != VertexKind::Rank) continue;
      std::vector<double> signature;
      bool direct = false;
      for (int e : router.outEdges(vertices[m])) {
        const Edge& edge = graph.edges[e];
        direct = direct || graph.vertices[edge.to].kind == VertexKind::Rank;
        signature.insert(signature.end(),
                         {double(edge.to), double(edge.kind), residual[e], residual[e ^ 1]});
      }
      if (direct) continue;
      auto [it, added] = last.emplace(signature, m);
      if (!added) previous[m] = std::exchange(it->second, m);
    }
    return previous;
  }

  Cycle evaluate(std::vector<int> order, const std::vector<double>& residual) const {
    Cycle cycle{std::move(order), 0, 0};
    std::vector<const std::vector<int>*> ring;
    for (size_t i = 0; i < cycle.order.size(); ++i) {
      int hop = cycle.order[i] * size() + cycle.order[(i + 1) % cycle.order.size()];
      if (routes[hop].empty() || (nvlinkOnly && !nvlink[hop])) return Cycle{};
      ring.push_back(&routes[hop]);
      cycle.length += static_cast<int>(routes[hop].size());
    }
    cycle.bound = ringBound(ring, residual);
    return cycle;
  }
};

std::vector<int> reversed(const std::vector<int>& order) {
  std::vector<int> back(order.rbegin(), order.rend() - 1);
  back.insert(back.begin(), order.front());
  return back;
}

class Searcher {
 public:
  Searcher(const LinkGraph& graph, const SearchOptions& options)
      : graph_(graph), options_(options), router_(graph) {
    for (const Edge& edge : graph.edges) residual_.push_back(edge.capacityGBs);
    steps_ = std::max<long>(0, options.budget.count()) * kStepsPerMs;
    lengthSteps_ = std::min(steps_ / 32, kLengthSteps);
    plan_.nranks = graph.nranks();
    // CPU ranks (shared memory only) are bound by their cores, not by links: one channel.
    bool cpuRanks = true;
    for (int vertex : graph.rankVertex)
      for (int e : router_.outEdges(vertex))
        cpuRanks = cpuRanks && graph.edges[e].kind == LinkKind::Memory;
    maxChannels_ = cpuRanks ? 1 : options.maxChannels;
    if (cpuRanks)
      plan_.notes.push_back("CPU ranks: one channel; they are bound by their cores, not by links");
  }

  Plan run() {
    std::map<int, std::vector<int>> byHost;  // host -> ranks in structural order
    for (int rank : structuralOrder()) byHost[graph_.hostOfRank(rank)].push_back(rank);
    std::vector<int> hosts;
    for (auto& [host, ranks] : byHost) hosts.push_back(host);
    std::sort(hosts.begin(), hosts.end(), [&](int a, int b) {
      return *std::min_element(byHost[a].begin(), byHost[a].end()) <
             *std::min_element(byHost[b].begin(), byHost[b].end());
    });
    if (graph_.nranks() == 1) {
      plan_.channels.push_back(Channel{{0}, {router_.hop(0, 0, 0)}, 0});
      plan_.notes.push_back("one rank: nothing moves between ranks");
    } else if (hosts.size() == 1) {
      singleHost(byHost.begin()->second);
    } else {
      multiHost(hosts, byHost);
    }
    if (plan_.channels.empty())
      fail(braidInvalidArgument, "no ring over the {} ranks has bandwidth left on every link",
           graph_.nranks());
    splitChannels();
    return std::move(plan_);
  }

 private:
  // Ranks by their place in a depth-first walk from each CPU down the PCIe tree: the ranks under
  // one switch, and those of one NUMA node, come out contiguous.
  std::vector<int> structuralOrder() {
    std::vector<int> order;
    std::vector<char> seen(graph_.vertices.size(), 0);
    std::vector<int> rankOf(graph_.vertices.size(), -1);
    for (int r = 0; r < graph_.nranks(); ++r) rankOf[graph_.rankVertex[r]] = r;
    auto walk = [&](auto&& self, int v) -> void {
      seen[v] = 1;
      if (rankOf[v] >= 0) {  // a rank's links lead to other ranks, not further down its tree
        order.push_back(rankOf[v]);
        return;
      }
      for (int e : router_.outEdges(v)) {
        int to = graph_.edges[e].to;
        VertexKind kind = graph_.vertices[to].kind;
        if (!seen[to] && (kind == VertexKind::Switch || kind == VertexKind::Rank)) self(self, to);
      }
    };
    for (int v = 0; v < static_cast<int>(graph_.vertices.size()); ++v)
      if (graph_.vertices[v].kind == VertexKind::Cpu) walk(walk, v);
    for (int r = 0; r < graph_.nranks(); ++r)
      if (!seen[graph_.rankVertex[r]]) order.push_back(r);
    return order;
  }

  // The best cycle for one host's members from `seeds`; the first search on these members decides
  // whether its rings keep to NVLink (when the ranks' NVLinks alone form a ring).
  Cycle best(HostMembers& members, std::vector<std::vector<int>> seeds) {
    bool proven = true;
    Cycle found;
    if (!members.tierDecided && members.ranksJoinedByNvlink) {
      members.tierDecided = true;
      members.nvlinkOnly = true;
      found = bestUnder(members, {}, &proven);
      members.nvlinkOnly = !found.order.empty();
      if (members.nvlinkOnly && !noted_)
        plan_.notes.push_back("NVLink only: the GPUs' NVLinks form a ring");
      noted_ = noted_ || members.nvlinkOnly;
    }
    if (found.order.empty()) found = bestUnder(members, std::move(seeds), &proven);
    if (!proven && !plan_.fallback) {
      plan_.fallback = true;
      plan_.notes.push_back(fmt::format(
          "search budget ({} ms) ran out at channel {}: kept the best ring found, seeded with the "
          "structural order",
          options_.budget.count(), plan_.channels.size()));
    }
    return found;
  }

  Cycle bestUnder(HostMembers& members, std::vector<std::vector<int>> seeds, bool* proven) {
    Cycle best;
    for (std::vector<int>& seed : seeds) {
      Cycle cycle = members.evaluate(std::move(seed), residual_);
      if (!cycle.order.empty() && cycle.bound > 0 &&
          (best.order.empty() || above(cycle.bound, best.bound) ||
           (!above(best.bound, cycle.bound) && cycle.length < best.length)))
        best = std::move(cycle);
    }
    std::vector<char> allowed(members.routes.size(), 1);
    if (members.nvlinkOnly) allowed = members.nvlink;
    CycleSearch search(members.size(), members.routes, allowed, residual_,
                       members.interchangeable(graph_, router_, residual_));
    *proven = search.improve(&best, &steps_, lengthSteps_) && *proven;
    return best;
  }

  // Appends the channel and reserves its bandwidth if it is worth it; says whether it did.
  bool addChannel(const std::vector<int>& order, int rail) {
    Channel channel{order, {}, 0};
    std::vector<const std::vector<int>*> routes;
    for (size_t i = 0; i < order.size(); ++i)
      channel.hops.push_back(router_.hop(order[i], order[(i + 1) % order.size()], rail));
    for (const Hop& hop : channel.hops) routes.push_back(&hop.route);
    channel.bandwidthGBs = std::min(capGBs_, ringBound(routes, residual_));
    if (!(channel.bandwidthGBs > 1e-9) ||
        (!plan_.channels.empty() &&
         channel.bandwidthGBs < kUsefulShare * plan_.channels.front().bandwidthGBs))
      return false;
    std::map<int, int> uses;
    for (const Hop& hop : channel.hops)
      for (int e : hop.route) ++uses[e];
    for (auto [e, n] : uses) residual_[e] -= channel.bandwidthGBs * n;
    plan_.channels.push_back(std::move(channel));
    return true;
  }

  void singleHost(const std::vector<int>& ranks) {
    HostMembers members(graph_, router_, ranks, -1);
    std::vector<int> structural(ranks.size());
    std::iota(structural.begin(), structural.end(), 0);
    std::vector<int> previous;
    while (static_cast<int>(plan_.channels.size()) < maxChannels_) {
      std::vector<std::vector<int>> seeds{structural};
      if (!previous.empty()) seeds.push_back(reversed(previous));
      Cycle cycle = best(members, seeds);
      if (cycle.order.empty()) break;
      std::vector<int> order;
      for (int m : cycle.order) order.push_back(ranks[m]);
      if (!addChannel(order, 0)) break;
      previous = cycle.order;
    }
  }

  // A ring enters a host from the NIC at the rank closest to it and leaves from the next closest;
  // the others keep their structural order in between.
  static std::vector<int> nearNic(const HostMembers& members) {
    int n = members.size();
    auto closest = [&](bool into, int skip) {
      int best = -1;
      for (int m = 1; m < n; ++m) {
        const std::vector<int>& route = members.routes[into ? m : m * n];
        if (m != skip && !route.empty() &&
            (best < 0 || route.size() < members.routes[into ? best : best * n].size()))
          best = m;
      }
      return best;
    };
    int entry = closest(true, -1), exit = closest(false, entry);
    std::vector<int> order{0};
    if (entry > 0) order.push_back(entry);
    for (int m = 1; m < n; ++m)
      if (m != entry && m != exit) order.push_back(m);
    if (exit > 0) order.push_back(exit);
    return order;
  }

  void multiHost(const std::vector<int>& hosts, std::map<int, std::vector<int>>& byHost) {
    // Hosts of one class share their plan: the first of the class is searched.
    std::map<int, int> representative;  // class -> host
    std::vector<int> searched(hosts.size());
    size_t rails = 0;
    for (size_t i = 0; i < hosts.size(); ++i) {
      int host = hosts[i];
      size_t nics = router_.rails(host).size();
      if (nics == 0)
        fail(braidInvalidArgument,
             "host {} (rank {}) has no NIC linked to the network; a ring between hosts enters "
             "and leaves every host through one",
             host, byHost[host].front());
      rails = std::max(rails, nics);
      int cls = host < static_cast<int>(graph_.hostClass.size()) ? graph_.hostClass[host] : -1;
      int rep = representative.emplace(cls, host).first->second;
      bool sameShape =
          byHost[rep].size() == byHost[host].size() && router_.rails(rep).size() == nics;
      searched[i] = cls >= 0 && sameShape ? rep : host;
    }
    // Greedy channels may stop short of the NICs when links inside the hosts run out first; the
    // same bandwidth spread over every fast NIC is then the better plan.
    std::vector<double> initial = residual_;
    size_t used = railChannels(hosts, byHost, searched, rails);
    auto speed = [&](int nic) { return graph_.edges[router_.toNetwork(nic)].capacityGBs; };
    const std::vector<int>& nics = router_.rails(hosts.front());
    size_t fast = std::count_if(nics.begin(), nics.end(), [&](int nic) {
      return speed(nic) >= 0.99 * speed(nics.front());  // the rails; slower NICs are extras
    });
    if (used < fast && maxChannels_ > 1) {
      std::vector<Channel> greedy = std::move(plan_.channels);
      std::vector<double> greedyResidual = residual_;
      double total = 0;
      for (const Channel& channel : greedy) total += channel.bandwidthGBs;
      plan_.channels.clear();
      residual_ = initial;
      capGBs_ = total / fast;
      railChannels(hosts, byHost, searched, rails);
      double spread = plan_.totalBandwidthGBs();
      if (spread < total * (1 - 1e-6)) {
        plan_.channels = std::move(greedy);
        residual_ = std::move(greedyResidual);
      } else {
        plan_.notes.push_back(fmt::format(
            "channels capped at {:.1f} GB/s: the hosts' links carry {:.1f} GB/s, spread over "
            "{} NICs",
            capGBs_, total, fast));
      }
    }
    std::string names;
    for (int nic : nics)
      names += fmt::format(" {} ({:.1f} GB/s)", graph_.vertices[nic].label, speed(nic));
    plan_.notes.push_back(fmt::format(
        "{} hosts, each host's ranks contiguous; a channel leaves and enters every host through "
        "the NIC of the same index (rail-aligned); host {}'s NICs, fastest first:{}",
        hosts.size(), hosts.front(), names));
  }

  // Channels rail after rail until every rail is spent; returns how many rails carry a channel.
  size_t railChannels(const std::vector<int>& hosts, std::map<int, std::vector<int>>& byHost,
                      const std::vector<int>& searched, size_t rails) {
    std::vector<char> dead(rails, 0), used(rails, 0);
    size_t rail = 0, deadCount = 0;
    while (static_cast<int>(plan_.channels.size()) < maxChannels_ && deadCount < rails) {
      std::map<int, std::vector<int>> cycles;  // searched host -> its members' order
      for (int host : searched) {
        if (cycles.count(host)) continue;
        int nic = router_.nicOfRail(host, static_cast<int>(rail));
        auto key = std::make_pair(host, nic);
        auto it = members_.find(key);
        if (it == members_.end())
          it = members_.emplace(key, HostMembers(graph_, router_, byHost[host], nic)).first;
        HostMembers& m = it->second;
        if (tier_.count(host)) {
          m.tierDecided = true;
          m.nvlinkOnly = tier_[host];
        }
        std::vector<int> seed = nearNic(m);
        cycles[host] = best(m, {seed}).order;
        tier_[host] = m.nvlinkOnly;
      }
      std::vector<int> order;
      bool complete = true;
      for (size_t i = 0; i < hosts.size(); ++i) {
        const std::vector<int>& cycle = cycles[searched[i]];
        complete = complete && !cycle.empty();
        for (size_t k = 1; k < cycle.size(); ++k) order.push_back(byHost[hosts[i]][cycle[k] - 1]);
      }
      if (complete && addChannel(order, static_cast<int>(rail))) {
        used[rail] = 1;
      } else {
        dead[rail] = 1;  // this NIC (or what leads to it) has nothing left
        ++deadCount;
      }
      for (size_t step = 0; step < rails && deadCount < rails; ++step) {
        rail = (rail + 1) % rails;
        if (!dead[rail]) break;
      }
    }
    return std::count(used.begin(), used.end(), 1);
  }

  // BRAID_NCHANNELS' minimum: halve the widest channel (a copy at half the bandwidth is as valid).
  void splitChannels() {
    int target = options_.minChannels;
    if (static_cast<int>(plan_.channels.size()) >= target) return;
    plan_.notes.push_back(fmt::format("{} channel(s) found, split into {} (minimum asked)",
                                      plan_.channels.size(), target));
    while (static_cast<int>(plan_.channels.size()) < target) {
      auto widest = std::max_element(
          plan_.channels.begin(), plan_.channels.end(),
          [](const Channel& a, const Channel& b) { return a.bandwidthGBs < b.bandwidthGBs; });
      widest->bandwidthGBs /= 2;
      plan_.channels.push_back(*widest);
    }
  }

  const LinkGraph& graph_;
  const SearchOptions& options_;
  Router router_;
  std::vector<double> residual_;
  long steps_ = 0, lengthSteps_ = 0;
  int maxChannels_ = 1;
  bool noted_ = false;
  double capGBs_ = kInf;                                // most a channel may reserve
  std::map<std::pair<int, int>, HostMembers> members_;  // (searched host, NIC) -> its members
  std::map<int, bool> tier_;                            // searched host -> NVLink only
  Plan plan_;
};

}  // namespace

Plan search(const LinkGraph& graph, const SearchOptions& options) {
  Clock::time_point start = Clock::now();
  if (graph.nranks() == 0) fail(braidInvalidArgument, "the graph has no ranks to plan a ring for");
  if (options.minChannels < 1 || options.maxChannels < options.minChannels)
    fail(braidInvalidArgument,
         "channels: minimum {} and maximum {}; expected 1 <= minimum <= maximum",
         options.minChannels, options.maxChannels);
  Plan plan = Searcher(graph, options).run();
  validate(graph, plan);
  plan.searchMs = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  return plan;
}

}  // namespace braid::plan
