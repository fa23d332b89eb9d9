// braid-topo: how this machine's GPUs, NICs and CPUs connect, as `nvidia-smi topo -m` shows it,
// from live discovery or from a file people already have (hwloc XML, NCCL topology XML).
//   braid-topo                      the live machine's matrix
//   braid-topo --file topo.xml      a file; its format is told from its root element
//   --tree | --json | --bandwidth   the PCI tree with link speeds, JSON, path bandwidths in GB/s
//   --dump-xml out.xml              write the topology as NCCL topology XML (NCCL_TOPO_FILE)
//   --plan [--ranks-per-host N --hosts M] [--dump-plan plan.json]
//                                   the planner's channels for the machine (or M copies of it)
//                                   and the predicted busbw and latency per size
// Exit status: 0 done, 1 the topology could not be read or written, 2 bad flags.
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <cmath>
#include <fstream>
#include <iostream>

#include "base/error.h"
#include "base/params.h"
#include "plan/from_topology.h"
#include "plan/model.h"
#include "plan/plan_file.h"
#include "topology/hwloc_import.h"
#include "topology/live.h"
#include "topology/load.h"
#include "topology/nccl_xml.h"
#include "topology/report.h"

namespace {

using namespace braid::topo;

enum class View { Matrix, Tree, Json, Bandwidth, Plan };

struct PlanRequest {
  int ranksPerHost = 0;  // 0: every GPU (or one CPU rank per NUMA node)
  int hosts = 1;
  std::string dumpPath;  // write the plan as JSON (BRAID_PLAN_FILE reads it back)
};

// Usable cores of one copy of the machine: its CPUs, or one per rank when the file lists none.
int coresOf(const Topology& topology, int ranks) {
  size_t cores = 0;
  for (const Node& node : topology.nodes)
    if (node.kind == NodeKind::Cpu) cores += node.cpu.cpus.size();
  return cores > 0 ? static_cast<int>(cores) : std::max(1, ranks);
}

void showPlan(const Topology& topology, const PlanRequest& request) {
  namespace plan = braid::plan;
  const plan::LinkGraph graph = plan::fromTopology(topology, request.ranksPerHost, request.hosts);
  plan::SearchOptions options;
  options.minChannels = static_cast<int>(braid::param::MinNChannels());
  options.maxChannels = static_cast<int>(braid::param::MaxNChannels());
  const plan::Plan found = plan::search(graph, options);
  plan::validate(graph, found);
  if (!request.dumpPath.empty()) {
    std::ofstream out(request.dumpPath);
    out << plan::toJson(graph, found);
    if (!out) braid::failErrno(braidSystemError, request.dumpPath + ": cannot write", errno);
  }

  plan::ModelInput input = plan::modelInputFromParams();
  input.hostRanks = gpuNodes(topology).empty();
  const int perHost = graph.nranks() / std::max(1, graph.hosts);
  input.coresPerHost.assign(graph.hosts, coresOf(topology, perHost));
  input.ranksPerHost.assign(graph.hosts, perHost);
  input.fifoBytes = static_cast<size_t>(braid::param::fifoBytes());
  const int slots = static_cast<int>(braid::param::FifoSlots());
  input.slotBytes = input.fifoBytes / static_cast<size_t>(slots);
  input.directMaxBytes = plan::hostDirectMaxBytes(graph.hosts, input.slotBytes, slots);
  // A file's GPUs are a rank each, with the channels a CUDA communicator would run.
  input.deviceChannels =
      plan::deviceChannels(graph.hosts == 1, 1, options.minChannels, options.maxChannels);
  const plan::Model model(graph, found, input);

  fmt::print("{} rank(s) on {} host(s) of {}\n", graph.nranks(), graph.hosts, topology.origin);
  // What the source could not tell (GPUs without NVLink detail among it) shapes the plan too.
  for (const std::string& note : topology.notes) fmt::print("note: {}\n", note);
  fmt::print("{}", plan::describe(graph, found));
  fmt::print("{}\n\n", model.describe());
  fmt::print("# predicted all-reduce, reduce-scatter and all-gather (nccl-tests sizes)\n");
  fmt::print("# {:>12}  {:>10} {:>8}  {:>10} {:>8}  {:>10} {:>8}  {}\n", "size (B)", "allreduce",
             "busbw", "reducescat", "busbw", "allgather", "busbw", "allreduce uses");
  fmt::print("# {:>12}  {:>10} {:>8}  {:>10} {:>8}  {:>10} {:>8}\n", "", "(us)", "(GB/s)", "(us)",
             "(GB/s)", "(us)", "(GB/s)");
  // A file's GPUs are ranks of their own, each launching apart: the direct engine reaches only
  // ranks that share one GPU (one launch of them all, or windows).
  const plan::DeviceLaunch launch =
      input.hostRanks ? plan::DeviceLaunch::Together : plan::DeviceLaunch::Apart;
  for (size_t bytes = 8; bytes <= (size_t{1} << 32); bytes *= 8) {
    const plan::Prediction ar = model.best(plan::Operation::AllReduce, bytes, launch);
    const plan::Prediction rs = model.best(plan::Operation::ReduceScatter, bytes, launch);
    const plan::Prediction ag = model.best(plan::Operation::AllGather, bytes, launch);
    // Why: the next fastest algorithm and how much longer it would take.
    const plan::Prediction next = model.runnerUp(plan::Operation::AllReduce, bytes, launch);
    const std::string why =
        std::isinf(next.us)
            ? std::string("(the only one that runs)")
            : fmt::format("(next: {}/{} {:.2f}x)", plan::algorithmName(next.algorithm),
                          plan::protocolName(next.protocol), next.us / ar.us);
    fmt::print("  {:>12}  {:>10.1f} {:>8.2f}  {:>10.1f} {:>8.2f}  {:>10.1f} {:>8.2f}  {}/{} {}\n",
               bytes, ar.us, ar.busBwGBs, rs.us, rs.busBwGBs, ag.us, ag.busBwGBs,
               plan::algorithmName(ar.algorithm), plan::protocolName(ar.protocol), why);
  }
}

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
    case View::Plan: break;
  }
}

void dumpXml(const Topology& topology, const std::string& path) {
  std::ofstream out(path);
  out << writeNcclXml(topology);
  out.close();
  if (!out) braid::failErrno(braidSystemError, path + ": cannot write", errno);
}

int run(const std::string& file, View view, bool viewChosen, const std::string& dumpPath,
        const PlanRequest& planRequest) {
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
  if (view == View::Plan)
    showPlan(topology, planRequest);
  else
    show(view, topology);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "braid-topo: how GPUs, NICs and CPUs connect (nvidia-smi topo -m's matrix, path classes X, "
      "NV#, PIX, PXB, PHB, NODE, SYS), from this machine or from a file"};
  std::string file, dumpPath;
  bool matrix = false, tree = false, json = false, bandwidth = false, plan = false;
  PlanRequest planRequest;
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
  auto* planFlag = app.add_flag(
      "--plan", plan, "the planner's channels and the predicted busbw and latency per size");
  app.add_option("--ranks-per-host", planRequest.ranksPerHost,
                 "with --plan: ranks on each host (GPUs by index; CPU ranks over NUMA nodes on "
                 "a machine without GPUs); default every GPU")
      ->check(CLI::Range(1, 4096))
      ->needs(planFlag);
  app.add_option("--hosts", planRequest.hosts,
                 "with --plan: copies of the machine joined by a network through their NICs")
      ->check(CLI::Range(1, 65536))
      ->needs(planFlag);
  app.add_option("--dump-plan", planRequest.dumpPath,
                 "with --plan: write the plan as JSON (BRAID_PLAN_FILE loads it)")
      ->needs(planFlag);
  for (CLI::Option* a : {matrixFlag, treeFlag, jsonFlag, bandwidthFlag, planFlag})
    for (CLI::Option* b : {matrixFlag, treeFlag, jsonFlag, bandwidthFlag, planFlag})
      if (a != b) a->excludes(b);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int status = app.exit(e);
    return status == 0 ? 0 : 2;
  }
  View view = tree        ? View::Tree
              : json      ? View::Json
              : bandwidth ? View::Bandwidth
              : plan      ? View::Plan
                          : View::Matrix;
  try {
    return run(file, view, matrix || tree || json || bandwidth || plan, dumpPath, planRequest);
  } catch (const braid::Error& e) {
    fmt::print(stderr, "braid-topo: {}\n", e.what());
    return 1;
  }
}
