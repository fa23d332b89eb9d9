// What braid-topo prints: the matrix in nvidia-smi's layout, path bandwidths, the PCI tree, a
// system summary, and JSON.
#pragma once

#include <ostream>
#include <string>
#include <vector>

#include "topology/nccl_xml.h"
#include "topology/paths.h"
#include "topology/topology.h"

namespace braid::topo {

// `nvidia-smi topo -m` exactly: tab-separated cells, " X " on the diagonal, the CPU Affinity, NUMA
// Affinity and GPU NUMA ID columns on GPU rows, the legend and the NIC legend. Then notes on what
// the source could not tell (PHB versus NODE from an NCCL file). Prints nothing without endpoints.
void printMatrix(std::ostream& out, const Topology& topology, const Matrix& matrix);
// The same grid with each path's bottleneck bandwidth in GB/s.
void printBandwidth(std::ostream& out, const Topology& topology, const Matrix& matrix);
// The PCI tree under each NUMA node with link generations, widths and bandwidths, and NVLinks.
void printTree(std::ostream& out, const Topology& topology);
// CPUs, NUMA nodes, GPUs (or plainly that there is none), NICs outside the matrix, sources, notes.
void printSummary(std::ostream& out, const Topology& topology);
// Every text view above, in that order (tests and fuzz targets exercise them all at once).
void printAllViews(std::ostream& out, const Topology& topology, const Matrix& matrix);
std::string toJson(const Topology& topology, const Matrix& matrix);

void printGraphs(std::ostream& out, const std::string& origin,
                 const std::vector<NcclGraph>& graphs);
std::string graphsToJson(const std::string& origin, const std::vector<NcclGraph>& graphs);

}  // namespace braid::topo
