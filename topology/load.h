// Topology files: read, tell the format from the root element, load.
#pragma once

#include <string>
#include <string_view>

#include "topology/topology.h"

namespace braid::topo {

enum class FileFormat { NcclTopology, NcclGraph, Hwloc };

const char* formatName(FileFormat format);
// The whole file; fails naming it when it cannot be read or is implausibly large for a topology.
std::string readFile(const std::string& path);
// By the root element: <system> NCCL topology, <graphs> NCCL graph, <topology> hwloc. Fails naming
// the file, the line and what was expected on anything else or on malformed XML.
FileFormat detectFormat(std::string_view text, const std::string& origin);
// An NCCL topology or hwloc XML file. An NCCL graph file holds no topology: that fails, saying so.
Topology loadTopology(const std::string& path);

}  // namespace braid::topo
