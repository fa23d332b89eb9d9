#include "topology/topology.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>
#include <string_view>

#include "base/error.h"

namespace braid::topo {

double PciLink::bandwidth() const {
  if (givenGBs > 0) return givenGBs;
  return laneGBs(laneGTs > 0 ? laneGTs : 8.0) * (width > 0 ? width : 16);
}

int Topology::add(Node node, int parent) {
  int index = static_cast<int>(nodes.size());
  if (!node.busId.empty()) {
    auto [it, inserted] = byBus_.emplace(node.busId, index);
    if (!inserted) {
      const Node& first = nodes[it->second];
      std::vector<int> above = parent >= 0 ? ancestors(parent) : std::vector<int>{};
      if (parent >= 0) above.insert(above.begin(), parent);
      bool cycle = std::find(above.begin(), above.end(), it->second) != above.end();
      std::string where = node.line > 0 ? fmt::format("{}:{}", origin, node.line) : origin;
      std::string firstAt = first.line > 0 ? fmt::format(" at line {}", first.line) : "";
      if (cycle)
        fail(braidInvalidArgument,
             "{}: bus id {} is nested inside itself (first{}): the PCI tree has a cycle; "
             "expected each device once",
             where, node.busId, firstAt);
      fail(braidInvalidArgument,
           "{}: bus id {} appears twice (first{}); expected one entry per PCI function", where,
           node.busId, firstAt);
    }
  }
  node.parent = parent;
  nodes.push_back(std::move(node));
  if (parent >= 0) nodes[parent].children.push_back(index);
  return index;
}

int Topology::findBus(const std::string& busId) const {
  auto it = byBus_.find(busId);
  return it == byBus_.end() ? -1 : it->second;
}

int Topology::cpuOf(int node) const {
  for (; node >= 0; node = nodes[node].parent)
    if (nodes[node].kind == NodeKind::Cpu) return node;
  return -1;
}

std::vector<int> Topology::ancestors(int node) const {
  std::vector<int> chain;
  for (int up = nodes[node].parent; up >= 0; up = nodes[up].parent) chain.push_back(up);
  return chain;
}

namespace {

// "mlx5_2" < "mlx5_10": digit runs compare as numbers.
bool naturalLess(const std::string& a, const std::string& b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    if (std::isdigit(static_cast<unsigned char>(a[i])) &&
        std::isdigit(static_cast<unsigned char>(b[j]))) {
      size_t ei = i, ej = j;
      while (ei < a.size() && std::isdigit(static_cast<unsigned char>(a[ei]))) ++ei;
      while (ej < b.size() && std::isdigit(static_cast<unsigned char>(b[ej]))) ++ej;
      std::string na = a.substr(i, ei - i), nb = b.substr(j, ej - j);
      na.erase(0, std::min(na.find_first_not_of('0'), na.size()));
      nb.erase(0, std::min(nb.find_first_not_of('0'), nb.size()));
      if (na.size() != nb.size()) return na.size() < nb.size();
      if (na != nb) return na < nb;
      i = ei;
      j = ej;
    } else {
      if (a[i] != b[j]) return a[i] < b[j];
      ++i;
      ++j;
    }
  }
  return a.size() - i < b.size() - j;
}

}  // namespace

std::vector<int> gpuNodes(const Topology& topology) {
  std::vector<int> gpus;
  for (int i = 0; i < static_cast<int>(topology.nodes.size()); ++i)
    if (topology.nodes[i].kind == NodeKind::Gpu) gpus.push_back(i);
  std::stable_sort(gpus.begin(), gpus.end(), [&](int a, int b) {
    return topology.nodes[a].gpu.index < topology.nodes[b].gpu.index;
  });
  return gpus;
}

std::vector<Endpoint> endpoints(const Topology& topology) {
  std::vector<Endpoint> result;
  for (int node : gpuNodes(topology))
    result.push_back({node, -1, fmt::format("GPU{}", topology.nodes[node].gpu.index), ""});
  std::vector<Endpoint> nics;
  for (int i = 0; i < static_cast<int>(topology.nodes.size()); ++i) {
    const Node& node = topology.nodes[i];
    if (node.kind != NodeKind::Nic || node.busId.empty()) continue;
    // A NIC an NCCL file knows by its class alone is still one of the machine's NICs.
    if (node.ports.empty() && topology.source == Source::NcclXml)
      nics.push_back({i, -1, "", node.busId});
    for (int p = 0; p < static_cast<int>(node.ports.size()); ++p)
      if (node.ports[p].inMatrix) nics.push_back({i, p, "", node.ports[p].name});
  }
  std::stable_sort(nics.begin(), nics.end(), [](const Endpoint& a, const Endpoint& b) {
    return naturalLess(a.name, b.name);
  });
  for (size_t n = 0; n < nics.size(); ++n) {
    nics[n].label = fmt::format("NIC{}", n);
    result.push_back(nics[n]);
  }
  return result;
}

void assignBridgeRoles(Topology& topology) {
  for (Node& node : topology.nodes) {
    if (node.kind != NodeKind::Bridge || node.role == BridgeRole::Switch) continue;
    const Node* parent = node.parent >= 0 ? &topology.nodes[node.parent] : nullptr;
    BridgeRole above = parent && parent->kind == NodeKind::Bridge ? parent->role : BridgeRole::None;
    if (above == BridgeRole::RootPort || above == BridgeRole::SwitchDownstream)
      node.role = BridgeRole::SwitchUpstream;
    else if (above == BridgeRole::SwitchUpstream)
      node.role = BridgeRole::SwitchDownstream;
    else
      node.role = BridgeRole::RootPort;
    node.link.internal =
        node.role == BridgeRole::RootPort || node.role == BridgeRole::SwitchDownstream;
  }
}

namespace {

// NVIDIA SXM parts: PCI device id, name, sm, NVLinks per GPU. Eight of them on one board (HGX
// 8-GPU) are always joined by NVSwitches; four (HGX 4-GPU, DGX Station) are wired GPU to GPU.
struct SwitchedPart {
  const char* device;
  const char* name;
  int sm;
  int nvlinks;
};
constexpr SwitchedPart kSwitchedParts[] = {
    {"0x20b0", "A100-SXM4-40GB", 80, 12}, {"0x20b2", "A100-SXM4-80GB", 80, 12},
    {"0x20f3", "A800-SXM4-80GB", 80, 8},  {"0x2330", "H100-SXM5-80GB", 90, 18},
    {"0x2324", "H800-SXM5-80GB", 90, 8},  {"0x2335", "H200-SXM5-141GB", 90, 18},
    {"0x2901", "B200", 100, 18}};

const SwitchedPart* switchedPart(const Node& node) {
  auto lower = [](std::string text) {
    for (char& c : text) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    return text;
  };
  if (lower(node.vendor) != "0x10de") return nullptr;
  for (const SwitchedPart& part : kSwitchedParts)
    if (lower(node.device) == part.device) return &part;
  return nullptr;
}

constexpr int kSwitchedBoardGpus = 8;

// The part a layout of the HGX H100/H200 board is planned as: the slower of the two.
constexpr const SwitchedPart& kGen5BoardPart = kSwitchedParts[3];  // H100-SXM5-80GB
static_assert(std::string_view(kSwitchedParts[3].name) == "H100-SXM5-80GB");

// Where a file names no part at all (Azure's NDv5 files carry neither ids nor NVLink), the HGX
// H100/H200 board's layout: eight GPUs in the file, none with a vendor or device id, each on PCIe
// Gen5 x16 under a bridge that holds it and exactly one NIC, as the board's PCIe switches pair
// them. PCIe H100 servers wired the same way would be taken for it, which the note says.
bool gen5BoardLayout(const Topology& topology, const std::vector<int>& bare) {
  int gpus = 0;
  for (const Node& node : topology.nodes) gpus += node.kind == NodeKind::Gpu;
  if (gpus != kSwitchedBoardGpus || static_cast<int>(bare.size()) != gpus) return false;
  for (int g : bare) {
    const Node& gpu = topology.nodes[g];
    const bool gen5 = gpu.link.laneGTs >= 32 && gpu.link.laneGTs < 64 && gpu.link.width == 16;
    if (!gpu.vendor.empty() || !gpu.device.empty() || !gen5 || gpu.parent < 0 ||
        topology.nodes[gpu.parent].kind != NodeKind::Bridge)
      return false;
    int nics = 0, siblingGpus = 0;
    for (int sibling : topology.nodes[gpu.parent].children) {
      nics += topology.nodes[sibling].kind == NodeKind::Nic;
      siblingGpus += topology.nodes[sibling].kind == NodeKind::Gpu;
    }
    if (nics != 1 || siblingGpus != 1) return false;
  }
  return true;
}

void addSwitchLinks(Node& gpu, const SwitchedPart& part) {
  gpu.gpu.links.push_back({"", part.nvlinks, PeerKind::NvSwitch, "0x068000"});
  if (gpu.gpu.sm == 0) gpu.gpu.sm = part.sm;
  if (gpu.gpu.model.empty()) gpu.gpu.model = part.name;
}

}  // namespace

void inferGpuFabric(Topology& topology) {
  int sxm = 0;
  std::vector<int> bare;
  for (int i = 0; i < static_cast<int>(topology.nodes.size()); ++i) {
    const Node& node = topology.nodes[i];
    if (node.kind != NodeKind::Gpu) continue;
    sxm += switchedPart(node) != nullptr;
    if (!node.gpu.described && node.gpu.links.empty()) bare.push_back(i);
  }
  if (sxm == 0 && gen5BoardLayout(topology, bare)) {
    for (int g : bare) addSwitchLinks(topology.nodes[g], kGen5BoardPart);
    topology.notes.push_back(fmt::format(
        "8 GPU(s) had no NVLink detail and no PCI device id (NCCL reads both from NVML at run "
        "time); each is on PCIe Gen5 x16 and paired with one NIC, the HGX H100/H200 board's "
        "layout: inferred as {} on NVSwitches ({} NVLinks each), from the layout alone (a PCIe "
        "server wired alike would be taken for it; device ids or NVLink detail in the file "
        "settle it).",
        kGen5BoardPart.name, kGen5BoardPart.nvlinks));
    return;
  }
  int inferred = 0;
  std::set<std::string> parts;
  for (int g : bare) {
    Node& node = topology.nodes[g];
    const SwitchedPart* part = switchedPart(node);
    if (part == nullptr || sxm != kSwitchedBoardGpus) continue;
    addSwitchLinks(node, *part);
    parts.insert(fmt::format("{} ({}, {} NVLinks)", part->name, part->device, part->nvlinks));
    ++inferred;
  }
  if (inferred > 0)
    topology.notes.push_back(fmt::format(
        "{} GPU(s) had no NVLink detail (NCCL reads it from NVML at run time); their PCI device "
        "id names {}, eight of which on a board are joined by NVSwitches: inferred.",
        inferred, fmt::join(parts, ", ")));
  if (static_cast<int>(bare.size()) > inferred)
    topology.notes.push_back(fmt::format(
        "{} GPU(s) have no NVLink detail and no PCI device id of an 8-GPU NVSwitch board (NCCL "
        "reads NVLink from NVML at run time): planned over PCIe alone. On the machine itself, live "
        "discovery reads NVLink from NVML.",
        bare.size() - inferred));
}

void assignGpuIndexes(Topology& topology) {
  std::vector<int> gpus;
  std::set<int> taken;
  std::map<int, int> seen;
  for (int i = 0; i < static_cast<int>(topology.nodes.size()); ++i)
    if (topology.nodes[i].kind == NodeKind::Gpu) {
      gpus.push_back(i);
      ++seen[topology.nodes[i].gpu.index];
    }
  std::vector<int> unnumbered;
  for (int gpu : gpus) {
    int index = topology.nodes[gpu].gpu.index;
    if (index >= 0 && seen[index] == 1)
      taken.insert(index);
    else
      unnumbered.push_back(gpu);
  }
  if (unnumbered.empty()) return;
  if (unnumbered.size() < gpus.size())
    topology.notes.push_back(fmt::format(
        "{} GPU(s) had no device index or a repeated one; they take the free numbers in bus id "
        "order.",
        unnumbered.size()));
  std::sort(unnumbered.begin(), unnumbered.end(),
            [&](int a, int b) { return topology.nodes[a].busId < topology.nodes[b].busId; });
  // The lowest free numbers, so that a dump (which pins described GPUs' numbers) reads back alike.
  int next = 0;
  for (int gpu : unnumbered) {
    while (taken.count(next)) ++next;
    topology.nodes[gpu].gpu.index = next++;
  }
}

std::string canonicalBusId(const std::string& text) {
  // [domain:]bus:device.function in hex; domains may be longer than 4 digits (NCCL placeholders).
  auto field = [](std::string_view digits, size_t maxDigits, unsigned long* value) {
    if (digits.empty() || digits.size() > maxDigits) return false;
    auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), *value, 16);
    return error == std::errc() && end == digits.data() + digits.size();
  };
  std::string_view view(text);
  size_t dot = view.rfind('.');
  size_t colon = dot == std::string_view::npos ? dot : view.rfind(':', dot);
  if (colon == std::string_view::npos) return "";
  std::string_view front = view.substr(0, colon);
  size_t domainEnd = front.rfind(':');
  std::string_view domain = domainEnd == std::string_view::npos ? "0" : front.substr(0, domainEnd);
  std::string_view bus = domainEnd == std::string_view::npos ? front : front.substr(domainEnd + 1);
  unsigned long domainValue = 0, busValue = 0, device = 0, function = 0;
  // No range checks beyond the digits: NCCL reads any hex, and hwloc keeps what a file says.
  if (!field(domain, 8, &domainValue) || !field(bus, 2, &busValue) ||
      !field(view.substr(colon + 1, dot - colon - 1), 2, &device) ||
      !field(view.substr(dot + 1), 2, &function))
    return "";
  return fmt::format("{:04x}:{:02x}:{:02x}.{:x}", domainValue, busValue, device, function);
}

double parseLinkSpeed(const std::string& text) {
  char* end = nullptr;
  double rate = std::strtod(text.c_str(), &end);
  if (end == text.c_str() || std::string(end).rfind(" GT/s", 0) != 0 || !(rate > 0 && rate < 1e3))
    return 0;
  return rate;
}

double laneGBs(double laneGTs) {
  if (laneGTs <= 5.0) return laneGTs * 8.0 / 10.0 / 8.0;     // Gen1/2: 8b/10b encoding
  if (laneGTs < 64.0) return laneGTs * 128.0 / 130.0 / 8.0;  // Gen3-5: 128b/130b
  return laneGTs / 8.0;                                      // Gen6 FLIT mode, as hwloc counts it
}

double linkRateGBs(const GpuInfo& gpu, bool* estimated) {
  *estimated = false;
  if (gpu.xgmi) return 64.0;  // MI300X Infinity Fabric: 128 GB/s per link both ways
  int sm = gpu.sm;
  if (sm >= 100) return 50.0;                // NVLink 5 (Blackwell)
  if (sm >= 90) return 25.0;                 // NVLink 4 (Hopper): 900 GB/s over 18 links, both ways
  if (sm == 86 || sm == 87) return 14.0625;  // NVLink 3 bridges on GA10x: 112.5 GB/s over 4 links
  if (sm >= 70 && sm < 89) return 25.0;      // NVLink 2 (Volta/Turing) and 3 (A100)
  if (sm >= 60 && sm < 70) return 20.0;      // NVLink 1 (P100)
  *estimated = true;
  return 25.0;
}

int smFromModel(const std::string& model) {
  static const struct {
    const char* token;
    int sm;
  } kModels[] = {{"GB300", 103}, {"B300", 103}, {"GB200", 100}, {"B200", 100}, {"B100", 100},
                 {"GH200", 90},  {"H100", 90},  {"H200", 90},   {"H800", 90},  {"H20", 90},
                 {"A100", 80},   {"A800", 80},  {"A30", 80},    {"V100", 70},  {"P100", 60},
                 {"T4", 75},     {"Ada", 89},   {"L40", 89},    {"L20", 89},   {"L4", 89},
                 {"RTX 40", 89}, {"A6000", 86}, {"A5000", 86},  {"A4000", 86}, {"A40", 86},
                 {"A10", 86},    {"A16", 86},   {"RTX 30", 86}};
  for (const auto& entry : kModels)
    if (model.find(entry.token) != std::string::npos) return entry.sm;
  return 0;
}

std::string ncclArch(const std::string& machine) {
  if (machine == "aarch64") return "arm64";
  if (machine.rfind("ppc64", 0) == 0) return "ppc64";
  return machine;
}

double interSocketGBs(const CpuInfo& cpu, bool* estimated) {
  *estimated = false;
  if (cpu.arch == "x86_64" && cpu.vendor == "GenuineIntel" && cpu.modelId >= 0) {
    if (cpu.modelId >= 0xCF) return 40.0;  // Emerald Rapids
    if (cpu.modelId >= 0x8F) return 22.0;  // Sapphire Rapids
    if (cpu.modelId >= 0x55) return 10.0;  // Skylake
    return 6.0;                            // Broadwell and older
  }
  if (cpu.arch == "x86_64" && cpu.vendor == "AuthenticAMD") return 16.0;
  if (cpu.arch == "ppc64") return 32.0;
  if (cpu.arch == "arm64") return 6.0;
  *estimated = true;
  return 6.0;
}

std::string cpuList(const std::vector<int>& cpus) {
  if (cpus.empty()) return "N/A";
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += j == i ? fmt::format("{}", cpus[i]) : fmt::format("{}-{}", cpus[i], cpus[j]);
    i = j + 1;
  }
  return out;
}

bool parseCpuMask(const std::string& mask, std::vector<int>* cpus) {
  constexpr size_t kMaxWords = 2048;  // 65536 CPUs
  std::vector<std::string> words;
  size_t start = 0;
  while (true) {
    size_t comma = mask.find(',', start);
    words.push_back(
        mask.substr(start, comma == std::string::npos ? std::string::npos : comma - start));
    if (comma == std::string::npos) break;
    start = comma + 1;
    if (words.size() > kMaxWords) return false;
  }
  cpus->clear();
  for (size_t w = 0; w < words.size(); ++w) {
    const std::string& word = words[words.size() - 1 - w];  // least significant word last
    if (word.empty() || word.size() > 8) return false;
    for (char c : word)
      if (!std::isxdigit(static_cast<unsigned char>(c))) return false;
    unsigned long bits = std::stoul(word, nullptr, 16);
    for (int b = 0; b < 32; ++b)
      if (bits & (1ul << b)) cpus->push_back(static_cast<int>(w * 32 + b));
  }
  return true;
}

std::string cpuMask(const std::vector<int>& cpus) {
  int top = cpus.empty() ? 0 : *std::max_element(cpus.begin(), cpus.end());
  std::vector<unsigned> words(top / 32 + 1, 0);
  for (int cpu : cpus) words[cpu / 32] |= 1u << (cpu % 32);
  std::string out;
  for (size_t w = words.size(); w-- > 0;)
    out += fmt::format("{}{:08x}", out.empty() ? "" : ",", words[w]);
  return out;
}

const char* kindName(NodeKind kind) {
  switch (kind) {
    case NodeKind::Cpu: return "cpu";
    case NodeKind::HostBridge: return "hostbridge";
    case NodeKind::Bridge: return "bridge";
    case NodeKind::Gpu: return "gpu";
    case NodeKind::Nic: return "nic";
    case NodeKind::NvSwitch: return "nvswitch";
    case NodeKind::PciDevice: return "pci";
  }
  return "?";
}

}  // namespace braid::topo
