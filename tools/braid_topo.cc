// braid-topo: how this machine's GPUs, NICs and CPUs connect, as `nvidia-smi topo -m` shows it,
// from live discovery or from a file people already have (hwloc XML, NCCL topology XML).
//   braid-topo                      the live machine's matrix
//   braid-topo --file topo.xml      a file; its format is told from its root element
//   --tree | --json | --bandwidth   the PCI tree with link speeds, JSON, path bandwidths in GB/s
//   --dump-xml out.xml              write the topology as NCCL topology XML (NCCL_TOPO_FILE)
// Exit status: 0 done, 1 the topology could not be read or written, 2 bad flags.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <fstream>
#include <iostream>

#include "core/error.h"
#include "topology/hwloc_import.h"
#include "topology/live.h"
#include "topology/load.h"
#include "topology/nccl_xml.h"
#include "topology/report.h"

namespace {

using namespace braid::topo;

enum class View { Matrix, Tree, Json, Bandwidth };

void show(View view, const Topology& topology) {
  Matrix matrix = computeMatrix(topology);
  switch (view) {
    case View::Matrix:
      printMatrix(std::cout, topology, matrix);
      printSummary(std::cout, topology);
      break;
    case View::Bandwidth:
      printBandwidth(std::cout, topology, matrix);
      printSummary(std::cout, topology);
      break;
    case View::Tree: printTree(std::cout, topology); break;
    case View::Json: std::cout << toJson(topology, matrix); break;
  }
}

void dumpXml(const Topology& topology, const std::string& path) {
  std::ofstream out(path);
  out << writeNcclXml(topology);
  out.close();
  if (!out) braid::failErrno(braidSystemError, path + ": cannot write", errno);
}

int run(const std::string& file, View view, bool viewChosen, const std::string& dumpPath) {
  Topology topology;
  if (file.empty()) {
    topology = discoverLive();
  } else {
    std::string text = readFile(file);
    FileFormat format = detectFormat(text, file);
    if (format == FileFormat::NcclGraph) {
      if (!dumpPath.empty() || (view != View::Matrix && view != View::Json))
        braid::fail(braidInvalidUsage,
                    "{}: an NCCL graph file holds channels, not a topology; only -m and --json "
                    "show it",
                    file);
      std::vector<NcclGraph> graphs = readNcclGraphXml(text, file);
      if (view == View::Json)
        std::cout << graphsToJson(file, graphs);
      else
        printGraphs(std::cout, file, graphs);
      return 0;
    }
    topology = format == FileFormat::Hwloc ? readHwlocXml(text, file) : readNcclXml(text, file);
  }
  if (!dumpPath.empty()) {
    dumpXml(topology, dumpPath);
    if (!viewChosen) {
      std::cout << "wrote " << dumpPath << " (NCCL topology XML)\n";
      return 0;
    }
  }
  show(view, topology);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "braid-topo: how GPUs, NICs and CPUs connect (nvidia-smi topo -m's matrix, path classes X, "
      "NV#, PIX, PXB, PHB, NODE, SYS), from this machine or from a file"};
  std::string file, dumpPath;
  bool matrix = false, tree = false, json = false, bandwidth = false;
  app.add_option("--file", file,
                 "read a topology file instead of this machine: hwloc XML, NCCL topology XML or "
                 "NCCL graph XML (format told from the root element)");
  auto* matrixFlag = app.add_flag("-m,--matrix", matrix, "the path-class matrix (default)");
  auto* treeFlag =
      app.add_flag("--tree", tree, "the PCI tree with link generations, widths, speeds");
  auto* jsonFlag = app.add_flag("--json", json, "everything as JSON");
  auto* bandwidthFlag =
      app.add_flag("--bandwidth", bandwidth, "the matrix of path bottleneck bandwidths in GB/s");
  app.add_option("--dump-xml", dumpPath, "write the topology as NCCL topology XML to this file");
  for (CLI::Option* a : {matrixFlag, treeFlag, jsonFlag, bandwidthFlag})
    for (CLI::Option* b : {matrixFlag, treeFlag, jsonFlag, bandwidthFlag})
      if (a != b) a->excludes(b);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int status = app.exit(e);
    return status == 0 ? 0 : 2;
  }
  View view = tree ? View::Tree : json ? View::Json : bandwidth ? View::Bandwidth : View::Matrix;
  try {
    return run(file, view, matrix || tree || json || bandwidth, dumpPath);
  } catch (const braid::Error& e) {
    fmt::print(stderr, "braid-topo: {}\n", e.what());
    return 1;
  }
}
