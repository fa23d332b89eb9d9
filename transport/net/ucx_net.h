// The UCX plug-in: connections between hosts through UCP, the layer under UCC, Open MPI and
// torch-ucc. UCX drives InfiniBand and RoCE (through rdma-core) where they exist and TCP or shared
// memory elsewhere; which it uses is UCX's choice, steered by its own variables (UCX_TLS,
// UCX_NET_DEVICES, ...), which pass through untouched.
//
// One UCP context and worker per Net, so per proxy. A listener is a UCP listener on the device's IP
// address (UCX's connection manager: TCP here, rdmacm on RDMA fabrics); a connection is a UCP
// endpoint that first sends a hello on its stream (the listener's token, the tag, a connection
// id), then messages tagged with that connection id, which the receiver posts straight into its
// FIFO slots. Large messages go by UCX's rendezvous protocol: zero-copy RDMA reads on a fabric.
#pragma once

#include <memory>
#include <vector>

#include "base/socket.h"
#include "transport/net/net.h"

namespace braid::net {

// Whether this host has an RDMA device (/sys/class/infiniband: InfiniBand or RoCE), where UCX is
// the default network.
bool rdmaDevicePresent();

// `devices` in order of preference (findInterfaces): their addresses are where listeners listen.
// A peer that answers nothing for `keepaliveMs` is reported unreachable (UCX's keepalive, unless
// UCX_KEEPALIVE_INTERVAL or UCX_TCP_KEEP* say otherwise).
std::unique_ptr<Net> makeUcxNet(std::vector<NetInterface> devices, int keepaliveMs);

}  // namespace braid::net
