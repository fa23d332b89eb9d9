// Connecting a rank to its peers on other hosts.
#pragma once

#include "transport/transport.h"

namespace braid::net {

// The network transport for the registry: ranks on other hosts, over the socket plug-in on the
// interface BRAID_SOCKET_IFNAME chooses (the bootstrap's), one connection per peer and direction,
// and a proxy thread that serves them. Its setup all-gathers the listeners' addresses, so it is
// chosen on every rank or none: with more than one host every rank has peers elsewhere.
const Transport* netTransport();

}  // namespace braid::net
