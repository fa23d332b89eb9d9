// Path classes exactly as `nvidia-smi topo -m` defines them, and each path's bottleneck bandwidth.
#pragma once

#include <string>
#include <vector>

#include "topology/topology.h"

namespace braid::topo {

// Best (closest) first, as in nvidia-smi's legend read bottom-up.
enum class PathClass : uint8_t { Self, NvLink, Xgmi, Pix, Pxb, Phb, Node, Sys };

struct Path {
  PathClass cls = PathClass::Self;
  int links = 0;            // NV#: links in the bonded set (xGMI: XG#)
  double bandwidthGBs = 0;  // narrowest link on the path, GB/s per direction; 0 for Self
  bool estimated = false;   // some link on the path had no speed, width or rate in the source
};

// X: self. NV#: a bonded set of # NVLinks, direct or through NVSwitches (the smaller GPU's count).
// Otherwise PCIe: SYS when the two sit under different NUMA nodes, NODE when under different host
// bridges of one NUMA node, PHB when the path crosses their host bridge, else PIX when the path
// crosses at most one PCIe switch (or one bridge) and PXB when it crosses several. Without host
// bridges (NCCL files) NODE cannot be told from PHB and PHB is given, as NCCL does.
Path pathBetween(const Topology& topology, const Endpoint& a, const Endpoint& b);

// nvidia-smi's token: "X", "NV18", "PIX", ...; AMD xGMI links print as "XG#".
std::string classLabel(const Path& path);

struct Matrix {
  std::vector<Endpoint> endpoints;
  std::vector<std::vector<Path>> paths;  // [row][column]
};
Matrix computeMatrix(const Topology& topology);

}  // namespace braid::topo
