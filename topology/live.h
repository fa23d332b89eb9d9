// Live discovery: hwloc (CPUs, NUMA nodes, the PCI tree), sysfs (link speeds and widths, network
// interfaces, RDMA devices), libibverbs' device list, NVML (GPUs, NVLink peers and counts) and the
// CUDA runtime (GPU count). NVML, CUDA and libibverbs are loaded with dlopen at run time: none is a
// build dependency, and each absent one is said in Topology::sources.
#pragma once

#include "topology/topology.h"

namespace braid::topo {

struct LiveOptions {
  // hwloc for CPUs, NUMA and the PCI tree when braid was built with it; else sysfs alone.
  bool useHwloc = true;
  // GPUs (NVML, the CUDA runtime) and RDMA devices (libibverbs). false: the host alone (CPUs,
  // NUMA nodes, caches, the PCI tree, network interfaces), as a communicator of CPU ranks needs it.
  bool devices = true;
};

Topology discoverLive(const LiveOptions& options = {});

}  // namespace braid::topo
