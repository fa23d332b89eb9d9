#include "plan/plan_file.h"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "base/error.h"
#include "plan/routing.h"

namespace braid::plan {

using nlohmann::json;

std::string toJson(const LinkGraph& graph, const Plan& plan) {
  Router router(graph);
  std::string out =
      fmt::format("{{\n  \"braid_plan\": 1,\n  \"nranks\": {},\n  \"channels\": [", plan.nranks);
  for (size_t c = 0; c < plan.channels.size(); ++c) {
    const Channel& channel = plan.channels[c];
    json entry = {{"order", channel.order}, {"bandwidth_gbs", channel.bandwidthGBs}};
    for (const Hop& hop : channel.hops) {
      if (hop.nicOut < 0) continue;
      const std::vector<int>& rails = router.rails(graph.vertices[hop.nicOut].host);
      entry["rail"] = std::find(rails.begin(), rails.end(), hop.nicOut) - rails.begin();
      break;
    }
    out += fmt::format("{}\n    {}", c ? "," : "", entry.dump());
  }
  return out + fmt::format("\n  ],\n  \"notes\": {}\n}}\n", json(plan.notes).dump());
}

namespace {

void expectKeys(const json& object, std::initializer_list<const char*> keys,
                const std::string& where) {
  for (const auto& item : object.items())
    if (std::none_of(keys.begin(), keys.end(), [&](const char* k) { return item.key() == k; })) {
      std::string known;
      for (const char* k : keys) known += fmt::format("{}\"{}\"", known.empty() ? "" : ", ", k);
      fail(braidInvalidArgument, "{}: unknown field \"{}\"; expected {}", where, item.key(), known);
    }
}

// The file's top level, checked against this job: its channels.
json channelsOf(std::string_view text, int n, const std::string& origin) {
  json file;
  try {
    file = json::parse(text);
  } catch (const json::exception& e) {
    fail(braidInvalidArgument, "{}: not a plan file (JSON): {}", origin, e.what());
  }
  if (!file.is_object())
    fail(braidInvalidArgument, "{}: expected a JSON object with \"channels\"", origin);
  expectKeys(file, {"braid_plan", "nranks", "channels", "notes"}, origin);
  if (file.contains("braid_plan") && file["braid_plan"] != 1)
    fail(braidInvalidArgument, "{}: \"braid_plan\" is {}; expected 1", origin,
         file["braid_plan"].dump());
  if (file.contains("nranks") && file["nranks"] != n)
    fail(braidInvalidArgument, "{}: \"nranks\" is {}; this job has {} ranks", origin,
         file["nranks"].dump(), n);
  json channels = file.contains("channels") ? file["channels"] : json();
  if (!channels.is_array() || channels.empty())
    fail(braidInvalidArgument, "{}: expected \"channels\": a non-empty array of channels", origin);
  return channels;
}

// A channel's ring order: every one of the n ranks, once.
std::vector<int> orderOf(const json& entry, int n, const std::string& where) {
  const json& order = entry.contains("order") ? entry["order"] : json();
  if (!order.is_array() || static_cast<int>(order.size()) != n)
    fail(braidInvalidArgument, "{}: expected \"order\": an array of the {} ranks, found {}", where,
         n, order.dump());
  std::vector<int> ranks;
  std::vector<char> seen(n, 0);
  for (const json& rank : order) {
    if (!rank.is_number_integer() || rank < 0 || rank >= n)
      fail(braidInvalidArgument, "{}: \"order\" holds {}; expected ranks 0..{}", where, rank.dump(),
           n - 1);
    if (seen[rank.get<int>()]++)
      fail(braidInvalidArgument, "{}: rank {} appears twice in \"order\"; expected each once",
           where, rank.get<int>());
    ranks.push_back(rank.get<int>());
  }
  return ranks;
}

// The NIC rail channel c leaves its hosts by: its "rail", else its index.
int railOf(const json& entry, size_t c, const std::string& where) {
  if (!entry.contains("rail")) return static_cast<int>(c);
  if (!entry["rail"].is_number_integer() || entry["rail"] < 0)
    fail(braidInvalidArgument, "{}: \"rail\" is {}; expected a NIC index >= 0", where,
         entry["rail"].dump());
  return entry["rail"].get<int>();
}

// A channel's bandwidth: its "bandwidth_gbs", else what the channels before it left on its links
// (`residual`, by edge).
double bandwidthOf(const json& entry, const std::vector<const std::vector<int>*>& routes,
                   const std::vector<double>& residual, int n, const std::string& where) {
  if (entry.contains("bandwidth_gbs")) {
    const json& gbs = entry["bandwidth_gbs"];
    if (!gbs.is_number() || !(gbs.get<double>() > 0 || (n == 1 && gbs.get<double>() == 0)))
      fail(braidInvalidArgument, "{}: \"bandwidth_gbs\" is {}; expected a number > 0", where,
           gbs.dump());
    return gbs.get<double>();
  }
  const double bound = n == 1 ? 0 : ringBound(routes, residual);
  if (n > 1 && !(bound > 0))
    fail(braidInvalidArgument,
         "{}: the channels before it leave no bandwidth on its links; give \"bandwidth_gbs\" "
         "or drop a channel",
         where);
  return bound;
}

// Channel c of the file, routed on the graph, its bandwidth taken from `residual`.
Channel channelOf(const json& entry, size_t c, Router& router, std::vector<double>& residual, int n,
                  const std::string& origin) {
  const std::string where = fmt::format("{}: channel {}", origin, c);
  if (!entry.is_object())
    fail(braidInvalidArgument, "{}: expected an object with \"order\", found {}", where,
         entry.type_name());
  expectKeys(entry, {"order", "bandwidth_gbs", "rail"}, where);
  Channel channel;
  channel.order = orderOf(entry, n, where);
  const int rail = railOf(entry, c, where);
  try {
    for (int i = 0; i < n; ++i)
      channel.hops.push_back(router.hop(channel.order[i], channel.order[(i + 1) % n], rail));
  } catch (const Error& e) {
    fail(braidInvalidArgument, "{}: {}", where, e.what());
  }
  std::vector<const std::vector<int>*> routes;
  for (const Hop& hop : channel.hops) routes.push_back(&hop.route);
  channel.bandwidthGBs = bandwidthOf(entry, routes, residual, n, where);
  for (const std::vector<int>* route : routes)
    for (int e : *route) residual[e] -= channel.bandwidthGBs;
  return channel;
}

}  // namespace

Plan fromJson(std::string_view text, const LinkGraph& graph, const std::string& origin) {
  const int n = graph.nranks();
  const json channels = channelsOf(text, n, origin);
  Plan plan;
  plan.nranks = n;
  Router router(graph);
  std::vector<double> residual;
  for (const Edge& edge : graph.edges) residual.push_back(edge.capacityGBs);
  for (size_t c = 0; c < channels.size(); ++c)
    plan.channels.push_back(channelOf(channels[c], c, router, residual, n, origin));
  plan.notes.push_back("plan loaded from " + origin);
  try {
    validate(graph, plan);
  } catch (const Error& e) {
    fail(braidInvalidArgument, "{}: {}", origin, e.what());
  }
  return plan;
}

}  // namespace braid::plan
