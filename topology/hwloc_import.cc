#include "topology/hwloc_import.h"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <sstream>

#include "base/error.h"
#include "base/log.h"
#include "topology/xml_text.h"

namespace braid::topo {

#ifdef BRAID_HAVE_HWLOC

bool haveHwloc() {
  return true;
}

#ifndef BRAID_HWLOC_VERSION
#define BRAID_HWLOC_VERSION "2"
#endif

std::string hwlocVersion() {
  return "hwloc " BRAID_HWLOC_VERSION;
}

namespace {

std::string hex4(unsigned value) {
  return fmt::format("0x{:04x}", value);
}

std::string busIdOf(const hwloc_obj_attr_u::hwloc_pcidev_attr_s& pci) {
  return fmt::format("{:04x}:{:02x}:{:02x}.{:x}", pci.domain, pci.bus, pci.dev, pci.func);
}

const char* info(hwloc_obj_t obj, const char* name) {
  const char* value = obj ? hwloc_obj_get_info_by_name(obj, name) : nullptr;
  return value ? value : "";
}

// An hwloc enumeration field as an integer: a file can put any number there, not only the
// enumeration's values, and loading such a value as the enum type is undefined.
template <typename Enum>
int asInt(const Enum& field) {
  int value = 0;
  static_assert(sizeof(value) == sizeof(field));
  std::memcpy(&value, &field, sizeof(value));
  return value;
}

// "nvml3" -> 3; -1 when `name` is not prefix + number.
int suffixNumber(const char* name, const char* prefix) {
  size_t length = std::strlen(prefix);
  if (!name || std::strncmp(name, prefix, length) != 0 || !name[length]) return -1;
  char* end = nullptr;
  long number = std::strtol(name + length, &end, 10);
  return *end == '\0' && number >= 0 && number < 1 << 20 ? static_cast<int>(number) : -1;
}

class Converter {
 public:
  Converter(hwloc_topology_t hwloc, Topology& topology) : hwloc_(hwloc), topology_(topology) {}

  void run() {
    addCpus();
    for (hwloc_obj_t bridge = nullptr; (bridge = hwloc_get_next_bridge(hwloc_, bridge));) {
      if (asInt(bridge->attr->bridge.upstream_type) != HWLOC_OBJ_BRIDGE_HOST) continue;
      Node node;
      node.kind = NodeKind::HostBridge;
      const auto& down = bridge->attr->bridge.downstream.pci;
      node.busId = fmt::format("{:04x}:[{:02x}-{:02x}]", down.domain, down.secondary_bus,
                               down.subordinate_bus);
      addChildren(bridge, topology_.add(std::move(node), cpuFor(bridge)));
    }
    addNvLinks();
    assignBridgeRoles(topology_);
    assignGpuIndexes(topology_);
    inferGpuFabric(topology_);
  }

 private:
  void addCpus() {
    const char* arch = info(hwloc_get_root_obj(hwloc_), "Architecture");
    for (hwloc_obj_t numa = nullptr;
         (numa = hwloc_get_next_obj_by_type(hwloc_, HWLOC_OBJ_NUMANODE, numa));) {
      Node node;
      node.kind = NodeKind::Cpu;
      node.cpu.numaId = static_cast<int>(numa->os_index);
      // An infinite set (possible in a hand-made file) is no CPU list.
      if (numa->cpuset && hwloc_bitmap_weight(numa->cpuset) > 0)
        for (int cpu = hwloc_bitmap_first(numa->cpuset); cpu >= 0 && node.cpu.cpus.size() < 65536;
             cpu = hwloc_bitmap_next(numa->cpuset, cpu))
          node.cpu.cpus.push_back(cpu);
      node.cpu.arch = ncclArch(arch);
      hwloc_obj_t package = hwloc_get_ancestor_obj_by_type(hwloc_, HWLOC_OBJ_PACKAGE, numa);
      node.cpu.vendor = info(package, "CPUVendor");
      node.cpu.model = info(package, "CPUModel");
      int family = std::atoi(info(package, "CPUFamilyNumber"));
      int model = std::atoi(info(package, "CPUModelNumber"));
      // NCCL encodes family as family + (extended family << 4); hwloc gives their sum.
      if (*info(package, "CPUFamilyNumber"))
        node.cpu.familyId = family < 15 ? family : 15 + ((family - 15) << 4);
      if (*info(package, "CPUModelNumber")) node.cpu.modelId = model;
      if (cpuByNuma_.count(numa->os_index)) continue;
      cpuByNuma_[numa->os_index] = topology_.add(std::move(node), -1);
    }
  }

  // The NUMA node a host bridge is local to; an unknown-NUMA CPU when its locality spans several.
  int cpuFor(hwloc_obj_t bridge) {
    hwloc_obj_t above = hwloc_get_non_io_ancestor_obj(hwloc_, bridge);
    if (above && above->nodeset && hwloc_bitmap_weight(above->nodeset) == 1) {
      auto it = cpuByNuma_.find(static_cast<unsigned>(hwloc_bitmap_first(above->nodeset)));
      if (it != cpuByNuma_.end()) return it->second;
    }
    if (cpuByNuma_.size() == 1) return cpuByNuma_.begin()->second;
    if (unknownCpu_ < 0) {
      Node node;
      node.kind = NodeKind::Cpu;
      unknownCpu_ = topology_.add(std::move(node), -1);
      topology_.notes.push_back("Some PCI devices are local to no single NUMA node.");
    }
    return unknownCpu_;
  }

  void addChildren(hwloc_obj_t obj, int parent) {
    for (hwloc_obj_t child = obj->io_first_child; child; child = child->next_sibling) {
      if (child->type == HWLOC_OBJ_BRIDGE) {
        Node node;
        int upstream = asInt(child->attr->bridge.upstream_type);
        node.kind = upstream == HWLOC_OBJ_BRIDGE_HOST ? NodeKind::HostBridge : NodeKind::Bridge;
        if (upstream == HWLOC_OBJ_BRIDGE_HOST) {
          const auto& down = child->attr->bridge.downstream.pci;
          node.busId = fmt::format("{:04x}:[{:02x}-{:02x}]", down.domain, down.secondary_bus,
                                   down.subordinate_bus);
        } else if (upstream == HWLOC_OBJ_BRIDGE_PCI) {
          const auto& pci = child->attr->bridge.upstream.pci;
          node.busId = busIdOf(pci);
          node.pciClass = fmt::format("0x{:04x}00", pci.class_id);
          node.vendor = hex4(pci.vendor_id);
          node.device = hex4(pci.device_id);
          node.link.givenGBs = pci.linkspeed;
        }
        node.name = info(child, "PCIDevice");
        addChildren(child, topology_.add(std::move(node), parent));
      } else if (child->type == HWLOC_OBJ_PCI_DEVICE) {
        addDevice(child, parent);
      }
    }
  }

  void addDevice(hwloc_obj_t obj, int parent) {
    const auto& pci = obj->attr->pcidev;
    Node node;
    node.busId = busIdOf(pci);
    node.pciClass = fmt::format("0x{:04x}00", pci.class_id);
    node.vendor = hex4(pci.vendor_id);
    node.device = hex4(pci.device_id);
    node.subsystemVendor = hex4(pci.subvendor_id);
    node.subsystemDevice = hex4(pci.subdevice_id);
    node.link.givenGBs = pci.linkspeed;
    node.name = info(obj, "PCIDevice");
    int gpuIndex = -1;
    bool gpuOsdev = false, netOsdev = false;
    std::vector<NetPort> ports;
    for (hwloc_obj_t os = obj->io_first_child; os; os = os->next_sibling) {
      if (os->type != HWLOC_OBJ_OS_DEVICE || !os->name) continue;
      int type = asInt(os->attr->osdev.type);
      if (type == HWLOC_OBJ_OSDEV_GPU || type == HWLOC_OBJ_OSDEV_COPROC) {
        int nvml = suffixNumber(os->name, "nvml"), cuda = suffixNumber(os->name, "cuda");
        if (nvml >= 0 || cuda >= 0) {
          gpuOsdev = true;
          if (nvml >= 0 || gpuIndex < 0) gpuIndex = nvml >= 0 ? nvml : cuda;
          if (*info(os, "GPUModel")) node.gpu.model = info(os, "GPUModel");
        }
        gpuOsdevs_[os] = -1;
      } else if (type == HWLOC_OBJ_OSDEV_OPENFABRICS || type == HWLOC_OBJ_OSDEV_NETWORK) {
        netOsdev = true;
        NetPort port;
        port.name = os->name;
        port.inMatrix = type == HWLOC_OBJ_OSDEV_OPENFABRICS;  // nvidia-smi lists RDMA devices
        ports.push_back(std::move(port));
      }
    }
    unsigned classCode = pci.class_id;
    if (gpuOsdev || ((classCode >> 8) == 0x03 && pci.vendor_id == 0x10de)) {
      node.kind = NodeKind::Gpu;
      node.gpu.index = gpuIndex;
      node.gpu.described = gpuOsdev;
      if (node.gpu.model.empty()) node.gpu.model = node.name;
      node.gpu.sm = smFromModel(node.gpu.model);
    } else if ((obj->subtype && std::string(obj->subtype) == "NVSwitch") ||
               (pci.vendor_id == 0x10de && classCode == 0x0680)) {
      node.kind = NodeKind::NvSwitch;
    } else if ((classCode >> 8) == 0x02 || classCode == 0x0c06 || netOsdev) {
      node.kind = NodeKind::Nic;
      node.ports = std::move(ports);
    } else {
      node.kind = NodeKind::PciDevice;
    }
    int index = topology_.add(std::move(node), parent);
    for (hwloc_obj_t os = obj->io_first_child; os; os = os->next_sibling)
      if (gpuOsdevs_.count(os)) gpuOsdevs_[os] = index;
    pciNodes_[obj] = index;
  }

  // Our node for an object of the NVLinkBandwidth matrix: a GPU's OS device or an NVSwitch.
  int nodeFor(hwloc_obj_t obj) const {
    auto os = gpuOsdevs_.find(obj);
    if (os != gpuOsdevs_.end()) return os->second;
    auto pci = pciNodes_.find(obj);
    return pci == pciNodes_.end() ? -1 : pci->second;
  }

  void addNvLinks() {
    unsigned count = 0;
    if (hwloc_distances_get_by_name(hwloc_, "NVLinkBandwidth", &count, nullptr, 0) != 0 ||
        count == 0)
      return;
    std::vector<hwloc_distances_s*> matrices(count);
    if (hwloc_distances_get_by_name(hwloc_, "NVLinkBandwidth", &count, matrices.data(), 0) != 0)
      return;
    for (unsigned m = 0; m < count; ++m) {
      hwloc_distances_s* matrix = matrices[m];
      unsigned n = matrix->nbobjs;
      for (unsigned i = 0; i < n; ++i) {
        int from = nodeFor(matrix->objs[i]);
        if (from < 0 || topology_.nodes[from].kind != NodeKind::Gpu) continue;
        Node& gpu = topology_.nodes[from];
        bool guessed = false;
        double rateMBs = linkRateGBs(gpu.gpu, &guessed) * 1000.0;
        for (unsigned j = 0; j < n; ++j) {
          hwloc_uint64_t bandwidth = matrix->values[i * n + j];
          if (i == j || bandwidth == 0) continue;
          GpuLink link;
          double links = static_cast<double>(bandwidth) / rateMBs;
          link.count = links > 1024 ? 1024 : std::max(1, static_cast<int>(std::lround(links)));
          int to = nodeFor(matrix->objs[j]);
          if (to >= 0 && topology_.nodes[to].kind == NodeKind::Gpu) {
            link.peer = PeerKind::Gpu;
            link.target = topology_.nodes[to].busId;
          } else if (to >= 0) {
            link.peer = PeerKind::NvSwitch;
            link.target = topology_.nodes[to].busId;
          } else {
            link.peer = PeerKind::Cpu;  // POWER's NVLink to the CPU package
            link.target = fmt::format("{}:{}", hwloc_obj_type_string(matrix->objs[j]->type),
                                      matrix->objs[j]->os_index);
          }
          gpu.gpu.links.push_back(std::move(link));
        }
      }
      hwloc_distances_release(hwloc_, matrix);
    }
  }

  hwloc_topology_t hwloc_;
  Topology& topology_;
  std::map<unsigned, int> cpuByNuma_;
  int unknownCpu_ = -1;
  std::map<hwloc_obj_t, int> gpuOsdevs_, pciNodes_;
};

// hwloc 3.0's osdev_type is a bit mask; hwloc 2.x reads an enumeration.
int osdevTypeFromMask(long mask) {
  if (mask & (1 << 2)) return HWLOC_OBJ_OSDEV_GPU;
  if (mask & (1 << 5)) return HWLOC_OBJ_OSDEV_OPENFABRICS;
  if (mask & (1 << 4)) return HWLOC_OBJ_OSDEV_NETWORK;
  if (mask & (1 << 3)) return HWLOC_OBJ_OSDEV_COPROC;
  if (mask & (1 << 6)) return HWLOC_OBJ_OSDEV_DMA;
  return HWLOC_OBJ_OSDEV_BLOCK;
}

struct HwlocDeleter {
  void operator()(hwloc_topology* topology) const { hwloc_topology_destroy(topology); }
};
using HwlocHandle = std::unique_ptr<hwloc_topology, HwlocDeleter>;

// hwloc's topology for an XML buffer, all I/O objects kept; null (errno set) when hwloc refuses it.
HwlocHandle loadXmlBuffer(const std::string& xml) {
  hwloc_topology_t raw = nullptr;
  if (hwloc_topology_init(&raw) != 0) return nullptr;
  HwlocHandle hwloc(raw);
  hwloc_topology_set_io_types_filter(raw, HWLOC_TYPE_FILTER_KEEP_ALL);
  // hwloc counts the terminating NUL in the size, as its own export does.
  if (hwloc_topology_set_xmlbuffer(raw, xml.c_str(), static_cast<int>(xml.size() + 1)) != 0 ||
      hwloc_topology_load(raw) != 0)
    return nullptr;
  return hwloc;
}

void writeAll(int fd, const char* data, size_t size) {
  while (size > 0) {
    ssize_t written = write(fd, data, size);
    if (written < 0 && errno == EINTR) continue;
    if (written <= 0) return;
    data += written;
    size -= static_cast<size_t>(written);
  }
}

// The child's part: imports the file and writes hwloc's export of it to `out` (status 0), or why
// not (status 1). A crash here is the child's own end, reported by the parent: no inherited crash
// handler runs, and hwloc's warnings about the file stay quiet (the parent says what went wrong).
[[noreturn]] void importInChild(const std::string& xml, int out) {
  for (int signal : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) std::signal(signal, SIG_DFL);
  setenv("HWLOC_HIDE_ERRORS", "2", 1);
  HwlocHandle hwloc = loadXmlBuffer(xml);
  char* exported = nullptr;
  int length = 0;
  if (hwloc && hwloc_topology_export_xmlbuffer(hwloc.get(), &exported, &length, 0) == 0) {
    writeAll(out, exported, static_cast<size_t>(length > 0 ? length - 1 : 0));
    _exit(0);
  }
  const char* why = std::strerror(errno);
  writeAll(out, why, std::strlen(why));
  _exit(1);
}

// Everything `fd` carries until its writer closes it, into `output`; false when `timeoutMs` ran
// out first.
bool readAllWithin(int fd, int timeoutMs, std::string& output) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeoutMs);
  while (true) {
    const int left = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                          deadline - std::chrono::steady_clock::now())
                                          .count());
    pollfd ready{fd, POLLIN, 0};
    const int polled = left > 0 ? poll(&ready, 1, left) : 0;
    if (polled < 0 && errno == EINTR) continue;
    if (polled <= 0) return false;
    char chunk[65536];
    const ssize_t got = read(fd, chunk, sizeof(chunk));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return true;
    output.append(chunk, static_cast<size_t>(got));
  }
}

// hwloc's importer is not hardened against hostile files (hwloc 2.9 dereferences a NUMA node's
// missing complete_nodeset, for one). So a child process imports the file and hands back hwloc's
// own export of what it read, which this process then imports: a crash or a hang costs the child
// only. Returns that export; fails naming the file when hwloc refuses it, crashes or hangs.
std::string importedByChild(const std::string& xml, const std::string& origin) {
  constexpr int kTimeoutMs = 10000;  // hwloc reads a large machine's file in well under a second
  int fds[2];
  if (pipe(fds) != 0) failErrno(braidSystemError, origin + ": pipe", errno);
  const pid_t child = fork();
  if (child < 0) {
    const int err = errno;
    close(fds[0]);
    close(fds[1]);
    failErrno(braidSystemError, origin + ": fork", err);
  }
  if (child == 0) {
    close(fds[0]);
    importInChild(xml, fds[1]);
  }
  close(fds[1]);
  std::string output;
  const bool timedOut = !readAllWithin(fds[0], kTimeoutMs, output);
  close(fds[0]);
  if (timedOut) kill(child, SIGKILL);
  int status = 0;
  while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  if (timedOut)
    fail(braidInvalidArgument, "{}: {} did not finish importing this hwloc XML within {} s", origin,
         hwlocVersion(), kTimeoutMs / 1000);
  if (WIFSIGNALED(status))
    fail(braidInvalidArgument,
         "{}: {} crashed (signal {}) importing this hwloc XML; expected a topology as `lstopo "
         "--of xml` writes it",
         origin, hwlocVersion(), WTERMSIG(status));
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
    fail(braidInvalidArgument,
         "{}: {} refused this hwloc XML ({}); expected a topology as `lstopo --of xml` writes it",
         origin, hwlocVersion(), output);
  return output;
}

}  // namespace

Topology fromHwloc(hwloc_topology_t hwloc, Source source, const std::string& origin) {
  Topology topology;
  topology.source = source;
  topology.origin = origin;
  topology.hostBridgesKnown = true;
  Converter(hwloc, topology).run();
  return topology;
}

Topology readHwlocXml(std::string_view text, const std::string& origin) {
  XmlText xml(text, origin);
  pugi::xml_node root = xml.root();
  if (std::string(root.name()) != "topology")
    fail(braidInvalidArgument, "{}: root element is <{}>; expected <topology> (hwloc XML)",
         xml.where(root), root.name());
  // hwloc 2.9 spends tens of seconds on a NUMA node or PU without os_index (a set of 2^32 bits);
  // lstopo always writes one for them.
  for (pugi::xpath_node found : root.select_nodes("//object[@type='NUMANode' or @type='PU']"))
    if (!found.node().attribute("os_index"))
      fail(braidInvalidArgument,
           "{}: <object type=\"{}\"> without os_index; expected os_index=\"N\"",
           xml.where(found.node()), found.node().attribute("type").value());
  // Re-serialized by pugixml, hwloc's own minimal XML parser gets clean, well-formed input.
  pugi::xml_document doc;
  doc.reset(xml.doc());
  pugi::xml_node topologyElement = doc.document_element();
  std::string version = topologyElement.attribute("version").value();
  std::vector<std::string> notes;
  if (std::atoi(version.c_str()) > static_cast<int>(HWLOC_API_VERSION >> 16)) {
    topologyElement.attribute("version").set_value("2.0");
    struct Walker : pugi::xml_tree_walker {
      bool for_each(pugi::xml_node& node) override {
        pugi::xml_attribute type = node.attribute("osdev_type");
        if (type && std::string(node.attribute("type").value()) == "OSDev")
          type.set_value(osdevTypeFromMask(std::strtol(type.value(), nullptr, 10)));
        return true;
      }
    } walker;
    doc.traverse(walker);
    notes.push_back(
        fmt::format("hwloc XML version {} read by {} after translating its version "
                    "and OS device types.",
                    version, hwlocVersion()));
  }
  std::ostringstream buffer;
  doc.save(buffer, "  ", pugi::format_indent, pugi::encoding_utf8);

  HwlocHandle hwloc = loadXmlBuffer(importedByChild(buffer.str(), origin));
  if (!hwloc)
    fail(braidInvalidArgument, "{}: {} refused its own export of this file ({})", origin,
         hwlocVersion(), std::strerror(errno));
  Topology topology = fromHwloc(hwloc.get(), Source::HwlocXml, origin);
  topology.notes.insert(topology.notes.begin(), notes.begin(), notes.end());
  // hwloc 3.0 writes the machine's infos after the root object, where hwloc 2.x skips them.
  pugi::xml_node architecture = root.find_child_by_attribute("info", "name", "Architecture");
  for (Node& node : topology.nodes)
    if (node.kind == NodeKind::Cpu && node.cpu.arch.empty())
      node.cpu.arch = ncclArch(architecture.attribute("value").value());
  return topology;
}

#else  // !BRAID_HAVE_HWLOC

bool haveHwloc() {
  return false;
}

std::string hwlocVersion() {
  return "no hwloc (braid was built without libhwloc-dev)";
}

Topology readHwlocXml(std::string_view, const std::string& origin) {
  fail(braidInvalidUsage,
       "{}: this is hwloc XML, and braid was built without hwloc; install "
       "libhwloc-dev and rebuild to read it",
       origin);
}

#endif

}  // namespace braid::topo
