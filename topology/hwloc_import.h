// hwloc as a source: its XML (what `lstopo --of xml` writes), imported by hwloc itself, and the
// conversion of a loaded hwloc topology (live or from XML) into braid's model.
#pragma once

#include <string>
#include <string_view>

#include "topology/topology.h"

#ifdef BRAID_HAVE_HWLOC
#include <hwloc.h>
#endif

namespace braid::topo {

// Whether braid was built with hwloc; without it, hwloc XML cannot be read.
bool haveHwloc();
// "hwloc 2.9.0", or why there is none.
std::string hwlocVersion();

// Throws braid::Error naming `origin`, the line and what was expected on XML errors, and naming the
// file where hwloc's importer refuses it. hwloc 3.0 files are imported by hwloc 2.x after their
// two differences that matter (the version, osdev_type as a bit mask) are translated.
Topology readHwlocXml(std::string_view text, const std::string& origin);

#ifdef BRAID_HAVE_HWLOC
// NUMA nodes, CPU sets, host bridges and the PCI tree below them, GPUs (PCI class, CUDA/NVML
// OS devices), NICs with their RDMA and network OS devices, and NVLinks from the
// "NVLinkBandwidth" distances matrix.
Topology fromHwloc(hwloc_topology_t hwloc, Source source, const std::string& origin);
#endif

}  // namespace braid::topo
