// NCCL's topology XML (NCCL_TOPO_FILE / NCCL_TOPO_DUMP_FILE) in and out, and its graph XML
// (NCCL_GRAPH_DUMP_FILE) in. Read with a real XML parser but held to what NCCL's own parser does:
// see ../shared/topologies/NCCL_XML_SCHEMA.md and docs/topology.md.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "topology/topology.h"

namespace braid::topo {

// `origin` names the file in error messages. Throws braid::Error (braidInvalidArgument) naming the
// file, the line and what was expected.
Topology readNcclXml(std::string_view text, const std::string& origin);

// The topology as NCCL would dump it: no prolog, one <cpu> per NUMA node, one <pci> per switch
// (root and downstream ports left out), GPUs with <gpu>/<nvlink>, NICs with <nic>/<net>.
std::string writeNcclXml(const Topology& topology);

struct NcclGraphStep {
  bool net = false;  // a <net> (the network), else a <gpu>
  int64_t dev = 0;
};

struct NcclGraph {
  int id = 0, pattern = 0, nchannels = 0, crossnic = 0;
  double speedIntra = 0, speedInter = 0;
  std::string typeIntra, typeInter;
  std::vector<std::vector<NcclGraphStep>> channels;
};

std::vector<NcclGraph> readNcclGraphXml(std::string_view text, const std::string& origin);
// "ring", "tree", ... for a graph's id.
const char* graphIdName(int id);

}  // namespace braid::topo
