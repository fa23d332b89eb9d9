// The bootstrap's root, as the ranks' side starts it: a root thread on a listener, or the job's
// rendezvous service at an environment-given address.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "base/socket.h"
#include "base/wait.h"
#include "core/bootstrap.h"

namespace braid::bootstrap_detail {

// The root runs detached and owns everything it touches, so it neither outlives its rendezvous
// nor depends on its starter; no exception leaves the thread.
void startRootThread(Socket listener, const uint8_t* secret, Clock::time_point deadline,
                     std::optional<CommKey> onlyKey);

// The job's rendezvous service at an environment-given address, started by rank 0 of the first
// communicator of this process that needs it. Another process of the job may hold the port
// already (rank 0 of a communicator over other ranks): then that one serves this communicator too.
void ensureRootService(const BootstrapId& id, const std::string& self);

}  // namespace braid::bootstrap_detail
