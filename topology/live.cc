#include "topology/live.h"

#include <dirent.h>
#include <dlfcn.h>
#include <sys/utsname.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>

#include "base/error.h"
#include "base/log.h"
#include "topology/hwloc_import.h"

namespace braid::topo {
namespace {

const std::string kPciDevices = "/sys/bus/pci/devices/";

// The first line of a sysfs file, trimmed; empty when unreadable.
std::string readLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back()))) line.pop_back();
  return line;
}

std::vector<std::string> listDir(const std::string& path) {
  std::vector<std::string> names;
  if (DIR* dir = opendir(path.c_str())) {
    while (dirent* entry = readdir(dir))
      if (entry->d_name[0] != '.') names.push_back(entry->d_name);
    closedir(dir);
  }
  std::sort(names.begin(), names.end());
  return names;
}

std::string realPath(const std::string& path) {
  std::unique_ptr<char, decltype(&std::free)> resolved(realpath(path.c_str(), nullptr), &std::free);
  return resolved ? std::string(resolved.get()) : "";
}

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  std::stringstream in(text);
  for (std::string part; std::getline(in, part, separator);) parts.push_back(part);
  return parts;
}

// The PCI function a sysfs device link (".../device") resolves to; empty when it is not one (USB,
// virtual). A virtio device sits one level below its PCI function.
std::string pciBusOf(const std::string& deviceLink) {
  std::vector<std::string> parts = split(realPath(deviceLink), '/');
  if (!parts.empty() && parts.back().rfind("virtio", 0) == 0) parts.pop_back();
  if (parts.empty() || canonicalBusId(parts.back()) != parts.back()) return "";
  return parts.back();
}

// "0-3,8-11" -> CPU numbers.
std::vector<int> parseCpuList(const std::string& list) {
  std::vector<int> cpus;
  for (const std::string& range : split(list, ',')) {
    int first = 0, last = 0;
    if (std::sscanf(range.c_str(), "%d-%d", &first, &last) == 2) {
      for (int cpu = first; cpu <= last && cpus.size() < 65536; ++cpu) cpus.push_back(cpu);
    } else if (std::sscanf(range.c_str(), "%d", &first) == 1) {
      cpus.push_back(first);
    }
  }
  return cpus;
}

// A shared library opened at run time. Never closed: the CUDA runtime and NVML keep global state
// that must outlive any handle we hold.
class DynamicLibrary {
 public:
  explicit DynamicLibrary(std::initializer_list<const char*> names) {
    for (const char* name : names) {
      handle_ = dlopen(name, RTLD_NOW | RTLD_LOCAL);
      if (handle_) return;
      if (error_.empty()) error_ = dlerror();
    }
  }
  bool loaded() const { return handle_ != nullptr; }
  const std::string& error() const { return error_; }
  template <typename Function>
  Function symbol(const char* name) const {
    return handle_ ? reinterpret_cast<Function>(dlsym(handle_, name)) : nullptr;
  }

 private:
  void* handle_ = nullptr;
  std::string error_;
};

// The CPU this process runs on, from /proc/cpuinfo, in NCCL's encoding.
void readCpuInfo(CpuInfo* info) {
  utsname name{};
  if (uname(&name) == 0) info->arch = ncclArch(name.machine);
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line) && !line.empty();) {
    size_t colon = line.find(':');
    if (colon == std::string::npos) continue;
    std::string key = line.substr(0, line.find_last_not_of(" \t", colon - 1) + 1);
    std::string value = colon + 2 <= line.size() ? line.substr(colon + 2) : "";
    if (key == "vendor_id") info->vendor = value;
    if (key == "model name") info->model = value;
    if (key == "cpu family") {
      int family = std::atoi(value.c_str());
      info->familyId = family < 15 ? family : 15 + ((family - 15) << 4);
    }
    if (key == "model") info->modelId = std::atoi(value.c_str());
  }
}

// The classes hwloc keeps as "important" (and NVSwitches), so both trees hold the same devices.
bool importantClass(unsigned classCode, bool nvidia) {
  unsigned base = classCode >> 16, sub = classCode >> 8;
  return base == 0x00 || base == 0x01 || base == 0x02 || base == 0x03 || base == 0x0b ||
         base == 0x12 || sub == 0x0c04 || sub == 0x0c06 || sub == 0x0502 ||
         (sub == 0x0680 && nvidia);
}

// The NUMA nodes of /sys/devices/system/node as CPU nodes of `topology` (one for the whole machine
// where there are none): their node ids by NUMA id.
std::map<int, int> addNumaNodes(Topology& topology) {
  CpuInfo processor;
  readCpuInfo(&processor);
  std::map<int, int> cpuByNuma;
  auto addCpu = [&](int numa, const std::string& cpuList) {
    Node node;
    node.kind = NodeKind::Cpu;
    node.cpu = processor;
    node.cpu.numaId = numa;
    node.cpu.cpus = parseCpuList(readLine(cpuList));
    cpuByNuma[numa] = topology.add(std::move(node), -1);
  };
  for (const std::string& entry : listDir("/sys/devices/system/node")) {
    int numa = -1;
    if (std::sscanf(entry.c_str(), "node%d", &numa) == 1)
      addCpu(numa, "/sys/devices/system/node/" + entry + "/cpulist");
  }
  if (cpuByNuma.empty()) addCpu(0, "/sys/devices/system/cpu/online");
  return cpuByNuma;
}

// A PCI device as sysfs shows it.
struct SysfsDevice {
  std::string busId, hostBridge;
  std::vector<std::string> path;  // bus ids from the root bus down to this device
  unsigned classCode;
  bool nvidia;
  int numa;
};

// The PCI devices under a root bus, parents before their children.
std::vector<SysfsDevice> sysfsDevices() {
  std::vector<SysfsDevice> devices;
  for (const std::string& entry : listDir(kPciDevices)) {
    SysfsDevice device;
    device.busId = canonicalBusId(entry);
    if (device.busId.empty()) continue;
    for (const std::string& part : split(realPath(kPciDevices + entry), '/')) {
      if (part.rfind("pci", 0) == 0 && part.size() > 3) {
        device.hostBridge = part;  // "pci0000:00": one root bus
        device.path.clear();
      } else if (!device.hostBridge.empty() && canonicalBusId(part) == part) {
        device.path.push_back(part);
      }
    }
    device.classCode = static_cast<unsigned>(
        std::strtoul(readLine(kPciDevices + entry + "/class").c_str(), nullptr, 16));
    device.nvidia = readLine(kPciDevices + entry + "/vendor") == "0x10de";
    device.numa = std::atoi(readLine(kPciDevices + entry + "/numa_node").c_str());
    if (!device.hostBridge.empty() && !device.path.empty()) devices.push_back(std::move(device));
  }
  std::stable_sort(devices.begin(), devices.end(), [](const SysfsDevice& a, const SysfsDevice& b) {
    return a.path.size() < b.path.size();
  });
  return devices;
}

// The device's node: its ids from sysfs, its kind from its class and vendor.
Node pciNode(const SysfsDevice& device) {
  Node node;
  node.busId = device.busId;
  node.pciClass = fmt::format("0x{:06x}", device.classCode);
  node.vendor = readLine(kPciDevices + device.busId + "/vendor");
  node.device = readLine(kPciDevices + device.busId + "/device");
  node.subsystemVendor = readLine(kPciDevices + device.busId + "/subsystem_vendor");
  node.subsystemDevice = readLine(kPciDevices + device.busId + "/subsystem_device");
  const unsigned sub = device.classCode >> 8;
  const bool nvidia = node.vendor == "0x10de";
  if (sub == 0x0604)
    node.kind = NodeKind::Bridge;
  else if ((device.classCode >> 16) == 0x03 && nvidia)
    node.kind = NodeKind::Gpu;
  else if (sub == 0x0680 && nvidia)
    node.kind = NodeKind::NvSwitch;
  else if ((device.classCode >> 16) == 0x02 || sub == 0x0c06)
    node.kind = NodeKind::Nic;
  else
    node.kind = NodeKind::PciDevice;
  return node;
}

// Without hwloc: NUMA nodes from /sys/devices/system/node, the PCI tree from sysfs paths.
Topology sysfsTree() {
  Topology topology;
  topology.source = Source::Live;
  topology.origin = "live";
  const std::map<int, int> cpuByNuma = addNumaNodes(topology);
  const std::vector<SysfsDevice> devices = sysfsDevices();
  // Keep what hwloc would: important devices and the bridges above them.
  std::map<std::string, bool> keep;
  for (const SysfsDevice& device : devices)
    if (importantClass(device.classCode, device.nvidia))
      for (const std::string& busId : device.path) keep[busId] = true;
  std::map<std::string, int> hostBridges;
  for (const SysfsDevice& device : devices) {
    if (!keep.count(device.busId)) continue;
    int parent = -1;
    if (device.path.size() > 1) parent = topology.findBus(device.path[device.path.size() - 2]);
    if (parent < 0) {
      auto it = hostBridges.find(device.hostBridge);
      if (it == hostBridges.end()) {
        auto numa = cpuByNuma.find(device.numa);
        const int cpu = numa != cpuByNuma.end() ? numa->second : cpuByNuma.begin()->second;
        Node bridge;
        bridge.kind = NodeKind::HostBridge;
        bridge.busId = device.hostBridge;
        it = hostBridges.emplace(device.hostBridge, topology.add(std::move(bridge), cpu)).first;
      }
      parent = it->second;
    }
    topology.add(pciNode(device), parent);
  }
  assignBridgeRoles(topology);
  return topology;
}

#ifdef BRAID_HAVE_HWLOC
Topology hwlocTree() {
  hwloc_topology_t hwloc = nullptr;
  if (hwloc_topology_init(&hwloc) != 0)
    fail(braidSystemError, "live discovery: hwloc_topology_init failed");
  std::unique_ptr<hwloc_topology, void (*)(hwloc_topology_t)> owner(hwloc, hwloc_topology_destroy);
  hwloc_topology_set_io_types_filter(hwloc, HWLOC_TYPE_FILTER_KEEP_IMPORTANT);
  // GPUs and NICs come from NVML and sysfs below; hwloc's own GPU backends would only cost time.
  hwloc_topology_set_type_filter(hwloc, HWLOC_OBJ_OS_DEVICE, HWLOC_TYPE_FILTER_KEEP_NONE);
  hwloc_topology_set_cache_types_filter(hwloc, HWLOC_TYPE_FILTER_KEEP_NONE);
  hwloc_topology_set_icache_types_filter(hwloc, HWLOC_TYPE_FILTER_KEEP_NONE);
  for (const char* component : {"opencl", "cuda", "nvml", "rsmi", "levelzero", "gl"})
    hwloc_topology_set_components(hwloc, HWLOC_TOPOLOGY_COMPONENTS_FLAG_BLACKLIST, component);
  if (hwloc_topology_load(hwloc) != 0)
    fail(braidSystemError, "live discovery: hwloc_topology_load failed: {}", std::strerror(errno));
  return fromHwloc(hwloc, Source::Live, "live");
}
#endif

struct SysfsLink {
  double laneGTs = 0;
  int width = 0;
  std::string text;
};

SysfsLink maxLink(const std::string& busId) {
  SysfsLink link;
  link.text = readLine(kPciDevices + busId + "/max_link_speed");
  link.laneGTs = parseLinkSpeed(link.text);
  int width = std::atoi(readLine(kPciDevices + busId + "/max_link_width").c_str());
  link.width = width > 0 && width <= 32 ? width : 0;
  return link;
}

// Link capability from sysfs, the lower of the device's and its port's, as NCCL takes it (the
// current speed drops while a GPU idles). Also the full 24-bit class code.
void addLinkSpeeds(Topology& topology) {
  std::map<int, SysfsLink> links;
  for (int i = 0; i < static_cast<int>(topology.nodes.size()); ++i) {
    const Node& node = topology.nodes[i];
    if (node.kind != NodeKind::Cpu && node.kind != NodeKind::HostBridge)
      links[i] = maxLink(node.busId);
  }
  for (auto& [index, own] : links) {
    Node& node = topology.nodes[index];
    std::string classCode = readLine(kPciDevices + node.busId + "/class");
    if (!classCode.empty()) node.pciClass = classCode;
    if (node.link.internal) continue;
    SysfsLink link = own;
    auto port = links.find(node.parent);
    if (port != links.end() && topology.nodes[node.parent].link.internal) {
      if (port->second.laneGTs > 0 && (link.laneGTs <= 0 || port->second.laneGTs < link.laneGTs)) {
        link.laneGTs = port->second.laneGTs;
        link.text = port->second.text;
      }
      if (port->second.width > 0 && (link.width <= 0 || port->second.width < link.width))
        link.width = port->second.width;
    }
    if (link.laneGTs > 0) {
      node.link.laneGTs = link.laneGTs;
      node.link.speedText = link.text;
    }
    if (link.width > 0) node.link.width = link.width;
    if (link.laneGTs > 0 && link.width > 0) node.link.givenGBs = 0;
  }
}

// Each CPU node's last-level cache: the highest level sysfs lists for its first CPU ("32768K").
void addCaches(Topology& topology) {
  for (Node& node : topology.nodes) {
    if (node.kind != NodeKind::Cpu || node.cpu.cpus.empty()) continue;
    const std::string caches =
        fmt::format("/sys/devices/system/cpu/cpu{}/cache/", node.cpu.cpus.front());
    for (int index = 0; index < 8; ++index) {
      const double kib = std::atof(readLine(caches + fmt::format("index{}/size", index)).c_str());
      if (kib > 0) node.cpu.llcBytes = kib * 1024;
    }
  }
}

// A NIC port on the PCI node `busId`; the node becomes a NIC if it was not one.
NetPort* addPort(Topology& topology, const std::string& busId, const std::string& name) {
  int index = topology.findBus(busId);
  if (index < 0) {
    topology.notes.push_back(fmt::format("{} ({}) is not in the PCI tree.", name, busId));
    return nullptr;
  }
  Node& node = topology.nodes[index];
  if (node.kind == NodeKind::PciDevice) node.kind = NodeKind::Nic;
  if (node.kind != NodeKind::Nic) return nullptr;
  node.ports.push_back(NetPort{});
  node.ports.back().name = name;
  return &node.ports.back();
}

std::vector<std::string> rdmaDevices(Topology& topology) {
  const std::string sysfs = "/sys/class/infiniband";
  std::vector<std::string> names = listDir(sysfs);
  if (names.empty()) {
    topology.sources.push_back("RDMA devices: none (no " + sysfs + ")");
    return names;
  }
  struct ibv_device;
  DynamicLibrary verbs({"libibverbs.so.1"});
  auto getList = verbs.symbol<ibv_device** (*)(int*)>("ibv_get_device_list");
  auto freeList = verbs.symbol<void (*)(ibv_device**)>("ibv_free_device_list");
  auto getName = verbs.symbol<const char* (*)(ibv_device*)>("ibv_get_device_name");
  if (!getList || !freeList || !getName) {
    topology.sources.push_back(fmt::format("RDMA devices: {} from {} (libibverbs not loaded: {})",
                                           names.size(), sysfs, verbs.error()));
    return names;
  }
  int count = 0;
  ibv_device** list = getList(&count);
  names.clear();
  for (int i = 0; list && i < count; ++i) names.push_back(getName(list[i]));
  if (list) freeList(list);
  topology.sources.push_back(fmt::format("RDMA devices: {} from libibverbs", names.size()));
  return names;
}

void addNics(Topology& topology, bool rdma) {
  for (const std::string& name : rdma ? rdmaDevices(topology) : std::vector<std::string>{}) {
    std::string dir = "/sys/class/infiniband/" + name;
    NetPort* port = addPort(topology, pciBusOf(dir + "/device"), name);
    if (!port) continue;
    port->inMatrix = true;  // nvidia-smi's NIC columns are the RDMA devices
    std::string guid = readLine(dir + "/node_guid");
    guid.erase(std::remove(guid.begin(), guid.end(), ':'), guid.end());
    if (!guid.empty()) port->guid = "0x" + guid;
    for (const std::string& number : listDir(dir + "/ports")) {
      // "400 Gb/sec (4X NDR)"
      int gbits = std::atoi(readLine(dir + "/ports/" + number + "/rate").c_str());
      if (gbits * 1000 > port->speedMbps) {
        port->speedMbps = gbits * 1000;
        port->port = std::atoi(number.c_str());
      }
    }
  }
  int interfaces = 0;
  for (const std::string& name : listDir("/sys/class/net")) {
    std::string busId = pciBusOf("/sys/class/net/" + name + "/device");
    if (busId.empty()) continue;  // virtual: lo, bridges, veth, tunnels
    NetPort* port = addPort(topology, busId, name);
    if (!port) continue;
    ++interfaces;
    int speed = std::atoi(readLine("/sys/class/net/" + name + "/speed").c_str());
    port->speedMbps = speed > 0 ? speed : 0;
  }
  topology.sources.push_back(
      fmt::format("network interfaces on PCI: {} from /sys/class/net", interfaces));
}

struct NvmlPciInfo {  // nvmlPciInfo_t as nvmlDeviceGetPciInfo_v3 fills it
  char busIdLegacy[16];
  unsigned domain, bus, device, pciDeviceId, pciSubSystemId;
  char busId[32];
};

// The NVML functions the topology reads, from the loaded library (null where it lacks one).
struct Nvml {
  using Device = void*;
  explicit Nvml(DynamicLibrary& lib)
      : init(lib.symbol<int (*)()>("nvmlInit_v2")),
        shutdown(lib.symbol<int (*)()>("nvmlShutdown")),
        errorString(lib.symbol<const char* (*)(int)>("nvmlErrorString")),
        getCount(lib.symbol<int (*)(unsigned*)>("nvmlDeviceGetCount_v2")),
        getHandle(lib.symbol<int (*)(unsigned, Device*)>("nvmlDeviceGetHandleByIndex_v2")),
        getPci(lib.symbol<int (*)(Device, NvmlPciInfo*)>("nvmlDeviceGetPciInfo_v3")),
        getName(lib.symbol<int (*)(Device, char*, unsigned)>("nvmlDeviceGetName")),
        getCapability(
            lib.symbol<int (*)(Device, int*, int*)>("nvmlDeviceGetCudaComputeCapability")),
        getLinkState(lib.symbol<int (*)(Device, unsigned, int*)>("nvmlDeviceGetNvLinkState")),
        getRemotePci(lib.symbol<int (*)(Device, unsigned, NvmlPciInfo*)>(
            "nvmlDeviceGetNvLinkRemotePciInfo_v2")),
        getRemoteType(
            lib.symbol<int (*)(Device, unsigned, int*)>("nvmlDeviceGetNvLinkRemoteDeviceType")),
        getNuma(lib.symbol<int (*)(Device, unsigned*)>("nvmlDeviceGetNumaNodeId")) {}
  // Whether the functions every version since NVLink's has are there.
  bool complete() const {
    return init && shutdown && getCount && getHandle && getPci && getLinkState && getRemotePci;
  }

  int (*init)();
  int (*shutdown)();
  const char* (*errorString)(int);
  int (*getCount)(unsigned*);
  int (*getHandle)(unsigned, Device*);
  int (*getPci)(Device, NvmlPciInfo*);
  int (*getName)(Device, char*, unsigned);
  int (*getCapability)(Device, int*, int*);
  int (*getLinkState)(Device, unsigned, int*);
  int (*getRemotePci)(Device, unsigned, NvmlPciInfo*);
  int (*getRemoteType)(Device, unsigned, int*);
  int (*getNuma)(Device, unsigned*);
};

std::string nvmlBusOf(const NvmlPciInfo& pci) {
  return fmt::format("{:04x}:{:02x}:{:02x}.0", pci.domain, pci.bus, pci.device);
}

// The GPU's model, compute capability and NUMA node, where NVML gives them.
void describeGpu(const Nvml& nvml, Nvml::Device device, unsigned index, GpuInfo& gpu) {
  gpu.index = static_cast<int>(index);
  gpu.described = true;
  char name[96] = {};
  if (nvml.getName && nvml.getName(device, name, sizeof(name)) == 0) gpu.model = name;
  int major = 0, minor = 0;
  if (nvml.getCapability && nvml.getCapability(device, &major, &minor) == 0)
    gpu.sm = major * 10 + minor;
  unsigned numa = 0;
  if (nvml.getNuma && nvml.getNuma(device, &numa) == 0 && numa < 1u << 16)
    gpu.numaId = static_cast<int>(numa);
}

// The GPU's active NVLinks, counted per remote bus id into gpu.links (peers as NVSwitches until
// every GPU is known); the remote device type NVML reports, by bus id.
std::map<std::string, int> addNvLinks(const Nvml& nvml, Nvml::Device device, GpuInfo& gpu) {
  constexpr int kNvmlErrorInvalidArgument = 2, kNvmlFeatureEnabled = 1, kNvmlMaxLinks = 18;
  std::map<std::string, int> types;
  for (int link = 0; link < kNvmlMaxLinks; ++link) {
    int state = 0;
    const int status = nvml.getLinkState(device, link, &state);
    if (status == kNvmlErrorInvalidArgument) break;
    NvmlPciInfo remote{};
    if (status != 0 || state != kNvmlFeatureEnabled ||
        nvml.getRemotePci(device, link, &remote) != 0)
      continue;
    const std::string target = nvmlBusOf(remote);
    auto existing = std::find_if(gpu.links.begin(), gpu.links.end(),
                                 [&](const GpuLink& l) { return l.target == target; });
    if (existing == gpu.links.end()) {
      gpu.links.push_back(GpuLink{target, 0, PeerKind::NvSwitch, ""});
      existing = gpu.links.end() - 1;
    }
    ++existing->count;
    int type = -1;
    if (nvml.getRemoteType && nvml.getRemoteType(device, link, &type) == 0) types[target] = type;
  }
  return types;
}

// Each link's peer, once every GPU is known: a GPU's bus id, else what NVML says, else an
// NVSwitch. `remoteTypes`: by GPU node, NVML's remote device types by bus id.
void classifyNvLinkPeers(
    Topology& topology,
    const std::vector<std::pair<int, std::map<std::string, int>>>& remoteTypes) {
  constexpr int kRemoteGpu = 0, kRemoteIbmNpu = 1, kRemoteSwitch = 2;
  for (const auto& [index, types] : remoteTypes)
    for (GpuLink& link : topology.nodes[index].gpu.links) {
      const int peer = topology.findBus(link.target);
      const auto type = types.find(link.target);
      if ((peer >= 0 && topology.nodes[peer].kind == NodeKind::Gpu) ||
          (type != types.end() && type->second == kRemoteGpu))
        link.peer = PeerKind::Gpu;
      else if (type != types.end() && type->second == kRemoteIbmNpu)
        link.peer = PeerKind::Cpu;
      else if (type == types.end() || type->second == kRemoteSwitch)
        link.peer = PeerKind::NvSwitch;
    }
}

void addNvml(Topology& topology) {
  DynamicLibrary library({"libnvidia-ml.so.1", "libnvidia-ml.so"});
  const Nvml nvml(library);
  if (!library.loaded()) {
    BRAID_INFO(log::kInit, "topology: NVML not loaded ({}); no NVLink information",
               library.error());
    topology.sources.push_back("NVML: not loaded (" + library.error() +
                               "), so no NVLink information");
    return;
  }
  if (!nvml.complete()) {
    topology.sources.push_back("NVML: too old (missing v2/v3 functions), so no NVLink information");
    return;
  }
  if (int status = nvml.init(); status != 0) {
    std::string why = nvml.errorString ? nvml.errorString(status) : fmt::format("error {}", status);
    BRAID_INFO(log::kInit, "topology: nvmlInit failed: {}", why);
    topology.sources.push_back("NVML: nvmlInit failed (" + why + ")");
    return;
  }
  unsigned count = 0;
  nvml.getCount(&count);
  for (Node& node : topology.nodes)
    if (node.kind == NodeKind::Gpu) node.gpu.index = -1;  // NVML's numbering replaces bus order
  std::vector<std::pair<int, std::map<std::string, int>>> remoteTypes;
  for (unsigned i = 0; i < count; ++i) {
    Nvml::Device device = nullptr;
    NvmlPciInfo pci{};
    if (nvml.getHandle(i, &device) != 0 || nvml.getPci(device, &pci) != 0) continue;
    const int index = topology.findBus(nvmlBusOf(pci));
    if (index < 0) {
      topology.notes.push_back(
          fmt::format("NVML GPU {} ({}) is not in the PCI tree.", i, nvmlBusOf(pci)));
      continue;
    }
    Node& node = topology.nodes[index];
    node.kind = NodeKind::Gpu;
    describeGpu(nvml, device, i, node.gpu);
    remoteTypes.emplace_back(index, addNvLinks(nvml, device, node.gpu));
  }
  nvml.shutdown();
  classifyNvLinkPeers(topology, remoteTypes);
  topology.sources.push_back(fmt::format("NVML: {} GPU(s)", count));
}

void addCudaCount(Topology& topology) {
  DynamicLibrary cudart(
      {"libcudart.so", "libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0"});
  auto getCount = cudart.symbol<int (*)(int*)>("cudaGetDeviceCount");
  auto errorString = cudart.symbol<const char* (*)(int)>("cudaGetErrorString");
  if (!getCount) {
    topology.sources.push_back("CUDA runtime: not loaded (" + cudart.error() + ")");
    return;
  }
  int count = 0;
  int status = getCount(&count);
  if (status != 0) {
    topology.sources.push_back(
        fmt::format("CUDA runtime: no devices ({})",
                    errorString ? errorString(status) : fmt::format("error {}", status)));
    return;
  }
  topology.sources.push_back(fmt::format("CUDA runtime: {} device(s)", count));
  size_t gpus = gpuNodes(topology).size();
  if (static_cast<size_t>(count) != gpus)
    topology.notes.push_back(fmt::format(
        "The CUDA runtime sees {} GPU(s) and the PCI tree holds {} (CUDA_VISIBLE_DEVICES?).", count,
        gpus));
}

}  // namespace

Topology discoverLive(const LiveOptions& options) {
  auto start = std::chrono::steady_clock::now();
  Topology topology;
#ifdef BRAID_HAVE_HWLOC
  if (options.useHwloc) {
    topology = hwlocTree();
    topology.sources.push_back(hwlocVersion() + ": CPUs, NUMA nodes, PCI tree");
  }
#endif
  if (topology.nodes.empty()) {
    topology = sysfsTree();
    topology.sources.push_back(
        std::string("sysfs: CPUs, NUMA nodes, PCI tree (") +
        (haveHwloc() ? "hwloc not used)" : "braid was built without hwloc)"));
  }
  addLinkSpeeds(topology);
  addCaches(topology);
  addNics(topology, options.devices);
  if (options.devices) {
    addNvml(topology);
    addCudaCount(topology);
  }
  assignGpuIndexes(topology);
  for (Node& node : topology.nodes)
    if (node.kind == NodeKind::Gpu)
      node.gpu.localityUnknown = readLine(kPciDevices + node.busId + "/numa_node") == "-1";
  topology.discoveryMs =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  BRAID_INFO(log::kInit, "topology: live discovery took {:.1f} ms", topology.discoveryMs);
  return topology;
}

}  // namespace braid::topo
