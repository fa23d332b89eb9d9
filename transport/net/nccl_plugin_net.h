// Networks that ship only an NCCL net plug-in (aws-ofi-nccl, vendor plug-ins): such a plug-in
// loaded and seen through braid's Net interface (BRAID_NET_PLUGIN).
#pragma once

#include <memory>
#include <string>

#include "transport/net/net.h"

namespace braid::net {

// Loads the NCCL net plug-in `nameOrPath` names, as NCCL_NET_PLUGIN does: a value with a '/' is
// the file, any other NAME means libnccl-net-NAME.so, found where dlopen looks (LD_LIBRARY_PATH,
// the loading library's run path, the system's directories). The plug-in must export
// ncclNetPlugin_v8 (nccl_net_v8.h). It is loaded and initialized once per process and stays
// loaded. Fails naming BRAID_NET_PLUGIN and the file when it cannot be loaded, lacks the symbol,
// fails to initialize or has no device.
//
// The Net's comms use the plug-in's host-memory registrations. NCCL has no end of stream, so
// SendComm::end() does nothing: a peer's departure looks like whatever the plug-in makes of a
// closed connection. A Net and the comms it opens are used from one thread until accept() has
// returned (connections complete while it waits, docs/net.md); then the comms may move.
std::unique_ptr<Net> loadNcclNetPlugin(const std::string& nameOrPath);

}  // namespace braid::net
