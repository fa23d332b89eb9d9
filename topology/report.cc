#include "topology/report.h"

#include <fmt/format.h>

#include <map>
#include <nlohmann/json.hpp>

namespace braid::topo {
namespace {

const char* const kLegend =
    "  X    = Self\n"
    "  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes "
    "(e.g., QPI/UPI)\n"
    "  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges "
    "within a NUMA node\n"
    "  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)\n"
    "  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host "
    "Bridge)\n"
    "  PIX  = Connection traversing at most a single PCIe bridge\n"
    "  NV#  = Connection traversing a bonded set of # NVLinks\n";

bool hasGpus(const Matrix& matrix, const Topology& topology) {
  return !matrix.endpoints.empty() &&
         topology.nodes[matrix.endpoints.front().node].kind == NodeKind::Gpu;
}

bool any(const Matrix& matrix, PathClass cls) {
  for (const auto& row : matrix.paths)
    for (const Path& path : row)
      if (path.cls == cls) return true;
  return false;
}

std::string numaText(int numa) {
  return numa >= 0 ? fmt::format("{}", numa) : "N/A";
}

// GB/s with one decimal, two below 1 (a Gen1 x1 link is 0.25).
std::string gbText(double gbs) {
  return gbs < 1 ? fmt::format("{:.2f}", gbs) : fmt::format("{:.1f}", gbs);
}

// The grid both views share: header, rows with `cell` per path, GPU rows with affinities.
template <typename Cell>
void printGrid(std::ostream& out, const Topology& topology, const Matrix& matrix, bool affinities,
               Cell cell) {
  bool gpus = hasGpus(matrix, topology) && affinities;
  out << '\t';
  for (size_t c = 0; c < matrix.endpoints.size(); ++c)
    out << (c ? "\t" : "") << matrix.endpoints[c].label;
  if (gpus) out << "\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID";
  out << '\n';
  for (size_t r = 0; r < matrix.endpoints.size(); ++r) {
    const Endpoint& row = matrix.endpoints[r];
    out << row.label;
    for (const Path& path : matrix.paths[r]) out << '\t' << cell(path);
    const Node& node = topology.nodes[row.node];
    if (gpus && node.kind == NodeKind::Gpu) {
      int cpu = topology.cpuOf(row.node);
      const CpuInfo* info = cpu >= 0 ? &topology.nodes[cpu].cpu : nullptr;
      int numa = info && !node.gpu.localityUnknown ? info->numaId : -1;
      out << '\t' << (info ? cpuList(info->cpus) : "N/A") << '\t' << numaText(numa) << "\t\t"
          << numaText(node.gpu.numaId);
    }
    out << '\n';
  }
}

void printNicLegend(std::ostream& out, const Topology& topology, const Matrix& matrix,
                    bool withSpeed) {
  bool header = false;
  for (const Endpoint& endpoint : matrix.endpoints) {
    if (topology.nodes[endpoint.node].kind != NodeKind::Nic) continue;
    if (!header) out << "\nNIC Legend:\n\n";
    header = true;
    out << "  " << endpoint.label << ": " << endpoint.name;
    if (withSpeed && endpoint.port >= 0) {
      int speed = topology.nodes[endpoint.node].ports[endpoint.port].speedMbps;
      if (speed > 0) out << fmt::format(" ({} Gb/s)", speed / 1000.0);
    }
    out << '\n';
  }
}

std::string generation(double laneGTs) {
  static const std::map<double, int> kGenerations = {{2.5, 1}, {5, 2},  {8, 3},
                                                     {16, 4},  {32, 5}, {64, 6}};
  auto it = kGenerations.find(laneGTs);
  return it != kGenerations.end() ? fmt::format("Gen{}", it->second)
                                  : fmt::format("{} GT/s", laneGTs);
}

std::string linkText(const PciLink& link) {
  if (link.internal) return "";
  if (link.givenGBs > 0) return fmt::format("{:.2f} GB/s", link.givenGBs);
  std::string speed = link.laneGTs > 0 ? generation(link.laneGTs) : "speed ?";
  std::string width = link.width > 0 ? fmt::format("x{}", link.width) : "x?";
  std::string assumed = link.laneGTs > 0 ? "x16" : link.width > 0 ? "Gen3" : "Gen3 x16";
  return fmt::format("{} {} = {} GB/s{}", speed, width, gbText(link.bandwidth()),
                     link.estimated() ? " (" + assumed + " assumed)" : "");
}

const char* roleName(BridgeRole role) {
  switch (role) {
    case BridgeRole::RootPort: return "root port";
    case BridgeRole::SwitchUpstream: return "switch upstream port";
    case BridgeRole::SwitchDownstream: return "switch downstream port";
    case BridgeRole::Switch: return "switch";
    case BridgeRole::None: return "bridge";
  }
  return "bridge";
}

std::string cpuDescription(const CpuInfo& cpu) {
  std::string text = cpu.numaId >= 0 ? fmt::format("NUMA {}", cpu.numaId) : "NUMA node unknown";
  text += ": CPUs " + cpuList(cpu.cpus);
  std::string what = cpu.model.empty() ? cpu.vendor : cpu.model;
  if (!cpu.arch.empty()) what += (what.empty() ? "" : ", ") + cpu.arch;
  return what.empty() ? text : text + " (" + what + ")";
}

std::string portText(const NetPort& port) {
  std::string text = port.name;
  if (port.speedMbps > 0) text += fmt::format(" {} Gb/s", port.speedMbps / 1000.0);
  return text;
}

void printNode(std::ostream& out, const Topology& topology, int index, int depth) {
  const Node& node = topology.nodes[index];
  std::string indent(2 * depth, ' ');
  std::string link = linkText(node.link);
  std::string tail = link.empty() ? "" : "  " + link;
  switch (node.kind) {
    case NodeKind::Cpu: out << indent << cpuDescription(node.cpu) << '\n'; break;
    case NodeKind::HostBridge: out << indent << "host bridge " << node.busId << '\n'; break;
    case NodeKind::Bridge:
      out << indent << roleName(node.role) << ' ' << node.busId << tail << '\n';
      break;
    case NodeKind::Gpu: {
      out << indent << "GPU" << node.gpu.index << ' ' << node.busId
          << (node.gpu.model.empty() ? "" : " " + node.gpu.model)
          << (node.gpu.sm > 0 ? fmt::format(" sm{}", node.gpu.sm) : "") << tail << '\n';
      std::map<std::string, int> links;
      for (const GpuLink& peer : node.gpu.links) {
        int target = topology.findBus(peer.target);
        std::string name =
            peer.peer == PeerKind::NvSwitch ? "NVSwitches"
            : peer.peer == PeerKind::Cpu    ? "the CPU"
            : target >= 0 ? fmt::format("GPU{} ({})", topology.nodes[target].gpu.index, peer.target)
                          : peer.target;
        links[name] += peer.count;
      }
      bool guessed = false;
      double rate = linkRateGBs(node.gpu, &guessed);
      for (const auto& [name, count] : links)
        out << indent << "  " << (node.gpu.xgmi ? "xGMI" : "NVLink") << " x" << count << " to "
            << name
            << fmt::format(" = {:.1f} GB/s{}", count * rate, guessed ? " (rate assumed)" : "")
            << '\n';
      break;
    }
    case NodeKind::Nic:
      if (node.busId.empty()) {
        out << indent << "network interfaces without a PCI device:";
        for (const NetPort& port : node.ports) out << ' ' << port.name;
        out << '\n';
        break;
      }
      out << indent << "NIC " << node.busId << (node.name.empty() ? "" : " " + node.name) << tail
          << '\n';
      for (const NetPort& port : node.ports)
        out << indent << "  " << portText(port) << (port.inMatrix ? "" : " (not in the matrix)")
            << '\n';
      break;
    case NodeKind::NvSwitch: out << indent << "NVSwitch " << node.busId << tail << '\n'; break;
    case NodeKind::PciDevice:
      out << indent << "PCI " << node.busId
          << (node.pciClass.empty() ? " (class unknown)" : " class " + node.pciClass)
          << (node.name.empty() ? "" : " " + node.name) << tail << '\n';
      break;
  }
  for (int child : node.children) printNode(out, topology, child, depth + 1);
}

std::vector<int> cpuNodes(const Topology& topology) {
  std::vector<int> cpus;
  for (int i = 0; i < static_cast<int>(topology.nodes.size()); ++i)
    if (topology.nodes[i].kind == NodeKind::Cpu) cpus.push_back(i);
  return cpus;
}

void printInterSocket(std::ostream& out, const Topology& topology, const std::string& indent) {
  std::vector<int> cpus = cpuNodes(topology);
  if (cpus.size() < 2) return;
  bool guessed = false;
  double bandwidth = interSocketGBs(topology.nodes[cpus.front()].cpu, &guessed);
  out << indent
      << fmt::format("Between NUMA nodes (SYS): {:.1f} GB/s per direction, NCCL's figure for {}\n",
                     bandwidth, guessed ? "an unknown CPU" : "this CPU generation");
}

std::string sourceName(const Topology& topology) {
  switch (topology.source) {
    case Source::Live: return "this machine (live discovery)";
    case Source::HwlocXml: return topology.origin + " (hwloc XML)";
    case Source::NcclXml:
      return topology.origin + (topology.rccl ? " (RCCL topology XML)" : " (NCCL topology XML)");
  }
  return topology.origin;
}

}  // namespace

void printMatrix(std::ostream& out, const Topology& topology, const Matrix& matrix) {
  if (matrix.endpoints.empty()) return;
  printGrid(out, topology, matrix, true, [](const Path& path) {
    return path.cls == PathClass::Self ? std::string(" X ") : classLabel(path);
  });
  out << "\nLegend:\n\n" << kLegend;
  if (any(matrix, PathClass::Xgmi))
    out << "  XG#  = Connection traversing a bonded set of # AMD xGMI links (not nvidia-smi's)\n";
  printNicLegend(out, topology, matrix, false);
  if (!topology.hostBridgesKnown && any(matrix, PathClass::Phb))
    out << "\nNote: " << topology.origin
        << " is an NCCL topology file, which records no PCIe host bridges, so PHB and NODE cannot "
           "be "
           "told apart: devices under one CPU that share no PCIe switch are shown as PHB (NCCL's "
           "class for both); on the machine they may be NODE.\n";
}

void printBandwidth(std::ostream& out, const Topology& topology, const Matrix& matrix) {
  if (matrix.endpoints.empty()) return;
  bool estimated = false;
  printGrid(out, topology, matrix, false, [&](const Path& path) {
    if (path.cls == PathClass::Self) return std::string(" X ");
    estimated = estimated || path.estimated;
    return gbText(path.bandwidthGBs) + (path.estimated ? "*" : "");
  });
  out << "\nGB/s per direction at the narrowest link of each path: PCIe generation x width, NVLink "
         "links x per-link rate, and the link between NUMA nodes on SYS paths.\n";
  if (estimated)
    out << "* the source gives no speed, width or rate for a link on this path: PCIe is taken as "
           "Gen3 x16 (as NCCL does), NVLink as 25 GB/s per link.\n";
  printNicLegend(out, topology, matrix, true);
}

void printTree(std::ostream& out, const Topology& topology) {
  out << sourceName(topology) << '\n';
  for (int cpu : cpuNodes(topology)) printNode(out, topology, cpu, 0);
  printInterSocket(out, topology, "");
}

void printSummary(std::ostream& out, const Topology& topology) {
  std::vector<int> gpus = gpuNodes(topology);
  if (gpus.empty())
    out << (topology.source == Source::Live ? "No GPU found on this machine.\n"
                                            : "No GPU in " + topology.origin + ".\n");
  out << "\nSystem: " << sourceName(topology) << '\n';
  for (int cpu : cpuNodes(topology)) out << "  " << cpuDescription(topology.nodes[cpu].cpu) << '\n';
  printInterSocket(out, topology, "  ");
  if (!gpus.empty()) out << "  GPUs: " << gpus.size() << '\n';
  std::vector<std::string> matrixNics, otherNics, virtualNics;
  int unknown = 0;
  for (const Node& node : topology.nodes) {
    if (node.kind == NodeKind::PciDevice && node.pciClass.empty()) ++unknown;
    if (node.kind != NodeKind::Nic) continue;
    for (const NetPort& port : node.ports) {
      if (node.busId.empty()) {
        virtualNics.push_back(port.name);
        continue;
      }
      int cpu = topology.cpuOf(static_cast<int>(&node - topology.nodes.data()));
      std::string where = fmt::format("{} ({}, NUMA {})", portText(port), node.busId,
                                      cpu >= 0 ? numaText(topology.nodes[cpu].cpu.numaId) : "N/A");
      (port.inMatrix ? matrixNics : otherNics).push_back(where);
    }
  }
  auto list = [&](const char* title, const std::vector<std::string>& items) {
    if (items.empty()) return;
    out << "  " << title << ":\n";
    for (const std::string& item : items) out << "    " << item << '\n';
  };
  list("NICs in the matrix", matrixNics);
  list(topology.source == Source::NcclXml
           ? "Network devices"
           : "Network interfaces without RDMA (not in the matrix, as in nvidia-smi)",
       otherNics);
  if (!virtualNics.empty()) {
    std::string names;
    for (const std::string& name : virtualNics) names += (names.empty() ? "" : ", ") + name;
    out << "  Interfaces without a PCI device (not in the matrix): " << names << '\n';
  }
  if (unknown > 0)
    out << "  PCI devices of unknown class: " << unknown
        << " (the file gives only bus ids; NCCL fills them in from the live machine)\n";
  for (const std::string& source : topology.sources) out << "  Source: " << source << '\n';
  if (topology.source == Source::Live)
    out << fmt::format("  Discovered in {:.1f} ms\n", topology.discoveryMs);
  for (const std::string& note : topology.notes) out << "  Note: " << note << '\n';
}

namespace {

using nlohmann::json;

// One node of the tree, with what its kind adds (a CPU's cores, a GPU's links, a NIC's ports).
json nodeJson(const Node& node, size_t id) {
  json entry = {{"id", id}, {"kind", kindName(node.kind)}, {"parent", node.parent}};
  if (!node.busId.empty()) entry["busid"] = node.busId;
  if (!node.pciClass.empty()) entry["class"] = node.pciClass;
  if (!node.name.empty()) entry["name"] = node.name;
  if (node.kind == NodeKind::Bridge) entry["role"] = roleName(node.role);
  if (node.kind != NodeKind::Cpu && node.kind != NodeKind::HostBridge && !node.link.internal)
    entry["link"] = {{"gts", node.link.laneGTs},
                     {"width", node.link.width},
                     {"gbps", node.link.bandwidth()},
                     {"estimated", node.link.estimated()}};
  if (node.kind == NodeKind::Cpu) {
    const CpuInfo& cpu = node.cpu;
    entry["numa"] = cpu.numaId;
    entry["cpus"] = cpuList(cpu.cpus);
    entry["arch"] = cpu.arch;
    entry["vendor"] = cpu.vendor;
    if (!cpu.model.empty()) entry["model"] = cpu.model;
  }
  if (node.kind == NodeKind::Gpu) {
    json links = json::array();
    for (const GpuLink& link : node.gpu.links)
      links.push_back({{"target", link.target},
                       {"count", link.count},
                       {"peer", link.peer == PeerKind::Gpu        ? "gpu"
                                : link.peer == PeerKind::NvSwitch ? "nvswitch"
                                                                  : "cpu"}});
    entry["gpu"] = {{"index", node.gpu.index},
                    {"sm", node.gpu.sm},
                    {"model", node.gpu.model},
                    {"links", links},
                    {"link_kind", node.gpu.xgmi ? "xgmi" : "nvlink"}};
  }
  if (node.kind == NodeKind::Nic) {
    json ports = json::array();
    for (const NetPort& port : node.ports)
      ports.push_back(
          {{"name", port.name}, {"speed_mbps", port.speedMbps}, {"in_matrix", port.inMatrix}});
    entry["ports"] = ports;
  }
  return entry;
}

// The matrix as nvidia-smi topo -m prints it: labels, names, each pair's class and bandwidth.
json matrixJson(const Topology& topology, const Matrix& matrix) {
  json labels = json::array(), names = json::array(), classes = json::array(),
       bandwidth = json::array();
  for (const Endpoint& endpoint : matrix.endpoints) {
    labels.push_back(endpoint.label);
    names.push_back(endpoint.name.empty() ? topology.nodes[endpoint.node].busId : endpoint.name);
  }
  for (const auto& row : matrix.paths) {
    json classRow = json::array(), bandwidthRow = json::array();
    for (const Path& path : row) {
      classRow.push_back(classLabel(path));
      if (path.cls == PathClass::Self)
        bandwidthRow.push_back(nullptr);
      else
        bandwidthRow.push_back(path.bandwidthGBs);
    }
    classes.push_back(classRow);
    bandwidth.push_back(bandwidthRow);
  }
  return {
      {"labels", labels}, {"names", names}, {"classes", classes}, {"bandwidth_gbps", bandwidth}};
}

}  // namespace

std::string toJson(const Topology& topology, const Matrix& matrix) {
  json nodes = json::array();
  for (size_t i = 0; i < topology.nodes.size(); ++i)
    nodes.push_back(nodeJson(topology.nodes[i], i));
  json document = {{"source", sourceName(topology)},
                   {"host_bridges_known", topology.hostBridgesKnown},
                   {"nodes", nodes},
                   {"matrix", matrixJson(topology, matrix)},
                   {"notes", topology.notes},
                   {"sources", topology.sources}};
  if (topology.source == Source::Live) document["discovery_ms"] = topology.discoveryMs;
  // Names come from files and sysfs: bytes that are not UTF-8 become U+FFFD instead of throwing.
  return document.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

void printGraphs(std::ostream& out, const std::string& origin,
                 const std::vector<NcclGraph>& graphs) {
  out << origin << " is an NCCL graph file: the channels NCCL's search chose, not a topology.\n";
  for (const NcclGraph& graph : graphs) {
    out << fmt::format(
        "\ngraph {} ({}, pattern {}): {} channel(s), {} GB/s intra ({}), {} GB/s inter ({})\n",
        graph.id, graphIdName(graph.id), graph.pattern, graph.nchannels, graph.speedIntra,
        graph.typeIntra, graph.speedInter, graph.typeInter);
    for (size_t c = 0; c < graph.channels.size(); ++c) {
      out << "  channel " << c << ':';
      for (const NcclGraphStep& step : graph.channels[c])
        out << (step.net ? " NET" : " GPU") << step.dev;
      out << '\n';
    }
  }
}

std::string graphsToJson(const std::string& origin, const std::vector<NcclGraph>& graphs) {
  using nlohmann::json;
  json list = json::array();
  for (const NcclGraph& graph : graphs) {
    json channels = json::array();
    for (const auto& channel : graph.channels) {
      json steps = json::array();
      for (const NcclGraphStep& step : channel)
        steps.push_back({{step.net ? "net" : "gpu", step.dev}});
      channels.push_back(steps);
    }
    list.push_back({{"id", graph.id},
                    {"kind", graphIdName(graph.id)},
                    {"pattern", graph.pattern},
                    {"nchannels", graph.nchannels},
                    {"speedintra", graph.speedIntra},
                    {"speedinter", graph.speedInter},
                    {"typeintra", graph.typeIntra},
                    {"typeinter", graph.typeInter},
                    {"channels", channels}});
  }
  return json({{"source", origin}, {"format", "NCCL graph XML"}, {"graphs", list}})
             .dump(2, ' ', false, json::error_handler_t::replace) +
         "\n";
}

void printAllViews(std::ostream& out, const Topology& topology, const Matrix& matrix) {
  printMatrix(out, topology, matrix);
  printBandwidth(out, topology, matrix);
  printTree(out, topology);
  printSummary(out, topology);
}

}  // namespace braid::topo
