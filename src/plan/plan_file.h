// Plan files: a plan dumped as JSON and loaded back (BRAID's plan-file override), e.g.
//   {"braid_plan": 1, "nranks": 4,
//    "channels": [{"order": [0, 1, 3, 2], "bandwidth_gbs": 24.0, "rail": 0}, ...]}
// "order" is required. "bandwidth_gbs" is optional: without it a channel takes what its routes
// leave after the channels before it. "rail" (default: the channel's index) picks the NIC, in each
// host's rail order, where the ring leaves and enters a host. Hops are routed as the search routes
// them, and the result is validated.
#pragma once

#include <string>
#include <string_view>

#include "plan/plan.h"

namespace braid::plan {

std::string toJson(const LinkGraph& graph, const Plan& plan);

// Throws braid::Error (braidInvalidArgument) naming `origin`, the channel and what was expected.
Plan fromJson(std::string_view text, const LinkGraph& graph, const std::string& origin);

}  // namespace braid::plan
