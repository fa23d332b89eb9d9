#include "topology/nccl_xml.h"

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <map>
#include <set>
#include <sstream>

#include "base/error.h"
#include "topology/xml_text.h"

namespace braid::topo {
namespace {

constexpr size_t kNcclMaxString = 255;  // NCCL's MAX_STR_LEN, for names and values
constexpr size_t kNcclMaxNodes = 256;   // NCCL_TOPO_XML_MAX_NODES
constexpr int kMaxDepth = 64;           // far beyond any machine; bounds the recursion

// Integers as NCCL reads them: strtol(text, 0), so 0x.. hex and leading-0 octal too.
bool parseNcclInt(const std::string& text, long long* value) {
  if (text.empty()) return false;
  errno = 0;
  char* end = nullptr;
  *value = std::strtoll(text.c_str(), &end, 0);
  return errno == 0 && end && *end == '\0';
}

bool isClassCode(const std::string& text) {
  if (text.size() < 3 || text.size() > 10 || text[0] != '0' || (text[1] != 'x' && text[1] != 'X'))
    return false;
  for (size_t i = 2; i < text.size(); ++i)
    if (!std::isxdigit(static_cast<unsigned char>(text[i]))) return false;
  return true;
}

// A PCI class attribute as a number (0 when absent); isClassCode has checked its form.
unsigned long classCodeOf(const std::string& pciClass) {
  return pciClass.empty() ? 0 : std::stoul(pciClass, nullptr, 16);
}

// Whether the class alone makes a device a NIC (base class 0x02), as the reader decides: the
// writer leaves out an empty <nic> only then, so that what it writes reads back the same.
bool classSaysNic(const std::string& pciClass) {
  return !pciClass.empty() && (classCodeOf(pciClass) >> 16) == 0x02;
}

class NcclReader {
 public:
  NcclReader(const XmlText& xml, Topology& topology) : xml_(xml), topology_(topology) {}

  void read() {
    pugi::xml_node system = xml_.root();
    if (std::string(system.name()) != "system")
      fail(braidInvalidArgument,
           "{}: root element is <{}>; expected <system version=\"1\"> (NCCL topology XML)",
           xml_.where(system), system.name());
    checkLimits(system);
    std::string version = system.attribute("version").value();
    if (version == "2") {
      topology_.rccl = true;
      topology_.notes.push_back(
          "RCCL's dialect of the NCCL format (version 2, <xgmi> links); NCCL itself refuses it.");
    } else if (version != "1") {
      fail(braidInvalidArgument,
           "{}: <system version=\"{}\">; expected version=\"1\" (or 2, RCCL's dialect)",
           xml_.where(system), version);
    }
    for (pugi::xml_node child : system.children()) {
      if (child.type() != pugi::node_element) continue;
      if (std::string(child.name()) == "cpu")
        readCpu(child);
      else
        ignore(child);
    }
    if (virtualRepeats_ > 0)
      topology_.notes.push_back(fmt::format(
          "{} network interface(s) without a PCI device were repeated under several <cpu>; each is "
          "kept once.",
          virtualRepeats_));
    if (netsWithoutDev_ > 0)
      topology_.notes.push_back(fmt::format(
          "{} <net> element(s) without dev were skipped, as NCCL does.", netsWithoutDev_));
    if (!ignored_.empty()) {
      std::string names;
      for (const std::string& name : ignored_) names += (names.empty() ? "<" : ", <") + name + ">";
      topology_.notes.push_back("Ignored, as NCCL does: " + names + ".");
    }
  }

 private:
  // NCCL's fixed-size parser limits, checked up front, and a bound on nesting.
  void checkLimits(pugi::xml_node system) {
    size_t elements = 0;
    struct Walker : pugi::xml_tree_walker {
      const XmlText* xml;
      size_t* elements;
      bool for_each(pugi::xml_node& node) override {
        if (node.type() != pugi::node_element) return true;
        ++*elements;
        if (depth() >= kMaxDepth)
          fail(braidInvalidArgument, "{}: elements nested {} deep; expected at most {} levels",
               xml->where(node), depth() + 1, kMaxDepth);
        if (std::string_view(node.name()).size() > kNcclMaxString)
          fail(braidInvalidArgument, "{}: element name of {} characters; NCCL allows at most {}",
               xml->where(node), std::string_view(node.name()).size(), kNcclMaxString);
        for (pugi::xml_attribute attribute : node.attributes()) {
          size_t length = std::string_view(attribute.value()).size();
          size_t nameLength = std::string_view(attribute.name()).size();
          if (length > kNcclMaxString || nameLength > kNcclMaxString)
            fail(braidInvalidArgument,
                 "{}: attribute {:.40}{} of <{}> is {} characters long; NCCL allows at most {}",
                 xml->where(node), attribute.name(), nameLength > 40 ? "..." : "", node.name(),
                 std::max(length, nameLength), kNcclMaxString);
        }
        return true;
      }
    } walker;
    walker.xml = &xml_;
    walker.elements = &elements;
    system.traverse(walker);
    if (elements + 1 > kNcclMaxNodes)
      topology_.notes.push_back(
          fmt::format("This file has {} elements; NCCL refuses topology files of more than {}.",
                      elements + 1, kNcclMaxNodes));
  }

  void ignore(pugi::xml_node node) {
    constexpr size_t kNamed = 8;  // a note, not a dump of a garbage file
    if (ignored_.size() < kNamed) ignored_.insert(node.name());
  }

  std::string text(pugi::xml_node node, const char* name) { return node.attribute(name).value(); }

  // An integer attribute; `fallback` when absent or empty, an error when not a number.
  long long number(pugi::xml_node node, const char* name, long long fallback) {
    pugi::xml_attribute attribute = node.attribute(name);
    std::string value = attribute.value();
    if (!attribute || value.empty()) return fallback;
    long long parsed = 0;
    if (!parseNcclInt(value, &parsed) || parsed < INT32_MIN || parsed > INT32_MAX)
      fail(braidInvalidArgument, "{}: <{} {}=\"{}\">: expected an integer (decimal, or 0x.. hex)",
           xml_.where(node), node.name(), name, value);
    return parsed;
  }

  void readCpu(pugi::xml_node element) {
    Node cpu;
    cpu.kind = NodeKind::Cpu;
    cpu.line = xml_.lineOf(element);
    cpu.cpu.numaId = static_cast<int>(number(element, "numaid", -1));
    if (cpu.cpu.numaId >= 0) {
      auto [it, inserted] = numaLines_.emplace(cpu.cpu.numaId, cpu.line);
      if (!inserted)
        fail(
            braidInvalidArgument,
            "{}: a second <cpu numaid=\"{}\"> (first at line {}); expected one <cpu> per NUMA node",
            xml_.where(element), cpu.cpu.numaId, it->second);
    }
    std::string affinity = text(element, "affinity");
    if (!affinity.empty() && !parseCpuMask(affinity, &cpu.cpu.cpus))
      fail(braidInvalidArgument,
           "{}: <cpu affinity=\"{}\">: expected a Linux cpumask such as \"0000ffff,0000ffff\"",
           xml_.where(element), affinity);
    cpu.cpu.arch = text(element, "arch");
    cpu.cpu.vendor = text(element, "vendor");
    cpu.cpu.familyId = static_cast<int>(number(element, "familyid", -1));
    cpu.cpu.modelId = static_cast<int>(number(element, "modelid", -1));
    cpu.cpu.hostHash = text(element, "host_hash");
    int index = topology_.add(std::move(cpu), -1);
    for (pugi::xml_node child : element.children()) {
      if (child.type() != pugi::node_element) continue;
      std::string name = child.name();
      if (name == "pci")
        readPci(child, index);
      else if (name == "nic")
        readVirtualNic(child, index);
      else
        ignore(child);
    }
  }

  void readPci(pugi::xml_node element, int parent) {
    Node node;
    node.line = xml_.lineOf(element);
    std::string busId = text(element, "busid");
    if (!element.attribute("busid"))
      fail(braidInvalidArgument, "{}: <pci> without busid; expected busid=\"dddd:bb:dd.f\"",
           xml_.where(element));
    node.busId = canonicalBusId(busId);
    if (node.busId.empty())
      fail(braidInvalidArgument, "{}: <pci busid=\"{}\">: expected a PCI bus id dddd:bb:dd.f (hex)",
           xml_.where(element), busId);
    node.pciClass = text(element, "class");
    if (!node.pciClass.empty() && !isClassCode(node.pciClass))
      fail(braidInvalidArgument,
           "{}: <pci busid=\"{}\" class=\"{}\">: unknown class; expected a PCI class code 0xCCSSPP "
           "(0x030200 GPU, 0x020700 InfiniBand NIC, 0x060400 bridge)",
           xml_.where(element), busId, node.pciClass);
    node.vendor = text(element, "vendor");
    node.device = text(element, "device");
    node.subsystemVendor = text(element, "subsystem_vendor");
    node.subsystemDevice = text(element, "subsystem_device");
    node.link.speedText = text(element, "link_speed");
    node.link.laneGTs = parseLinkSpeed(node.link.speedText);
    long long width = number(element, "link_width", 0);
    if (width < 0 || width > 32)
      fail(braidInvalidArgument, "{}: <pci link_width=\"{}\">: expected 0 to 32 lanes",
           xml_.where(element), width);
    node.link.width = static_cast<int>(width);

    pugi::xml_node gpu = element.child("gpu"), nic = element.child("nic");
    bool hasPci = static_cast<bool>(element.child("pci"));
    const unsigned long classCode = classCodeOf(node.pciClass);
    if (gpu)
      node.kind = NodeKind::Gpu;
    else if (nic)
      node.kind = NodeKind::Nic;
    else if (hasPci || (classCode >> 8) == 0x0604)
      node.kind = NodeKind::Bridge;
    else if (!node.pciClass.empty() && (classCode >> 16) == 0x03)
      node.kind = NodeKind::Gpu;  // known by class only: NCCL fills it in from NVML at run time
    else if (classSaysNic(node.pciClass))
      node.kind = NodeKind::Nic;
    else if (classCode == 0x068000)
      node.kind = NodeKind::NvSwitch;
    else
      node.kind = NodeKind::PciDevice;
    if (node.kind == NodeKind::Bridge) node.role = BridgeRole::Switch;
    if (gpu) readGpu(gpu, node);
    if (nic) readPorts(nic, &node.ports, true);
    int index = topology_.add(std::move(node), parent);

    for (pugi::xml_node child : element.children()) {
      if (child.type() != pugi::node_element) continue;
      std::string name = child.name();
      if (name == "pci")
        readPci(child, index);
      else if (name != "gpu" && name != "nic")
        ignore(child);
    }
  }

  void readGpu(pugi::xml_node element, Node& node) {
    GpuInfo& gpu = node.gpu;
    gpu.described = true;
    gpu.index = static_cast<int>(number(element, "dev", -1));
    gpu.rank = static_cast<int>(number(element, "rank", -1));
    gpu.sm = static_cast<int>(number(element, "sm", 0));
    gpu.gdr = static_cast<int>(number(element, "gdr", -1));
    for (pugi::xml_node child : element.children()) {
      if (child.type() != pugi::node_element) continue;
      std::string name = child.name();
      if (name == "nvlink" || name == "xgmi") {
        if (name == "xgmi") gpu.xgmi = true;
        GpuLink link;
        std::string target = text(child, "target");
        link.target = canonicalBusId(target);
        if (link.target.empty()) link.target = target;  // NCCL's placeholder for an unseen NVSwitch
        link.count = static_cast<int>(number(child, "count", 0));
        if (link.count < 0 || link.count > 1024)
          fail(braidInvalidArgument, "{}: <{} count=\"{}\">: expected a link count from 0 to 1024",
               xml_.where(child), name, link.count);
        link.targetClass = text(child, "tclass");
        if (link.targetClass.rfind("0x03", 0) == 0 || link.targetClass.rfind("0x12", 0) == 0)
          link.peer = PeerKind::Gpu;
        else if (link.targetClass == "0x068001")
          link.peer = PeerKind::Cpu;
        else
          link.peer = PeerKind::NvSwitch;  // NCCL assumes an NVSwitch for any other target
        if (link.peer == PeerKind::Gpu && link.target == node.busId) {
          topology_.notes.push_back(fmt::format(
              "{}: GPU {} lists NVLinks to itself; ignored (NCCL would make a self-loop).",
              xml_.where(child), node.busId));
          continue;
        }
        gpu.links.push_back(std::move(link));
      } else if (name == "c2c") {
        gpu.c2cBwMBs = static_cast<int>(number(child, "bw", 0));
        gpu.c2cCount = static_cast<int>(number(child, "count", 0));
      } else {
        ignore(child);
      }
    }
  }

  void readPorts(pugi::xml_node nic, std::vector<NetPort>* ports, bool inMatrix) {
    for (pugi::xml_node net : nic.children()) {
      if (net.type() != pugi::node_element) continue;
      if (std::string(net.name()) != "net") {
        ignore(net);
        continue;
      }
      if (!net.attribute("dev")) {
        ++netsWithoutDev_;
        continue;
      }
      NetPort port;
      port.name = text(net, "name");
      port.dev = static_cast<int>(number(net, "dev", -1));
      port.speedMbps = static_cast<int>(number(net, "speed", 0));
      port.port = static_cast<int>(number(net, "port", -1));
      port.gdr = static_cast<int>(number(net, "gdr", -1));
      port.maxconn = static_cast<int>(number(net, "maxconn", -1));
      port.coll = static_cast<int>(number(net, "coll", -1));
      port.guid = text(net, "guid");
      port.latency = text(net, "latency");
      if (port.name.empty()) port.name = fmt::format("net{}", port.dev);
      port.inMatrix = inMatrix;
      ports->push_back(std::move(port));
    }
  }

  // A <nic> right under <cpu>: sockets over virtual or non-PCI interfaces. Not a NIC column.
  void readVirtualNic(pugi::xml_node element, int cpu) {
    Node node;
    node.kind = NodeKind::Nic;
    node.line = xml_.lineOf(element);
    std::vector<NetPort> ports;
    readPorts(element, &ports, false);
    for (NetPort& port : ports) {
      if (virtualNames_.insert(port.name).second)
        node.ports.push_back(std::move(port));
      else
        ++virtualRepeats_;
    }
    if (!node.ports.empty()) topology_.add(std::move(node), cpu);
  }

  const XmlText& xml_;
  Topology& topology_;
  std::map<int, int> numaLines_;
  std::set<std::string> virtualNames_;
  int virtualRepeats_ = 0;
  int netsWithoutDev_ = 0;
  std::set<std::string> ignored_;
};

void setAttr(pugi::xml_node element, const char* name, const std::string& value) {
  element.append_attribute(name).set_value(value.c_str());
}

void setAttr(pugi::xml_node element, const char* name, long long value) {
  element.append_attribute(name).set_value(value);
}

// NCCL's link_speed text for a rate: "16.0 GT/s PCIe".
std::string speedText(const PciLink& link) {
  if (!link.speedText.empty() || link.laneGTs <= 0) return link.speedText;
  return fmt::format("{:.1f} GT/s PCIe", link.laneGTs);
}

class NcclWriter {
 public:
  explicit NcclWriter(const Topology& topology) : topology_(topology) {}

  std::string write() {
    pugi::xml_document doc;
    pugi::xml_node system = doc.append_child("system");
    setAttr(system, "version", topology_.rccl ? 2 : 1);
    for (int i = 0; i < static_cast<int>(topology_.nodes.size()); ++i)
      if (topology_.nodes[i].kind == NodeKind::Cpu) writeCpu(system, i);
    std::ostringstream out;
    doc.save(out, "  ", pugi::format_indent | pugi::format_no_declaration, pugi::encoding_utf8);
    return out.str();
  }

 private:
  void writeCpu(pugi::xml_node system, int index) {
    const CpuInfo& info = topology_.nodes[index].cpu;
    pugi::xml_node cpu = system.append_child("cpu");
    if (!info.hostHash.empty()) setAttr(cpu, "host_hash", info.hostHash);
    setAttr(cpu, "numaid", info.numaId);
    if (!info.cpus.empty()) setAttr(cpu, "affinity", cpuMask(info.cpus));
    if (!info.arch.empty()) setAttr(cpu, "arch", info.arch);
    if (!info.vendor.empty()) setAttr(cpu, "vendor", info.vendor);
    if (info.familyId >= 0) setAttr(cpu, "familyid", info.familyId);
    if (info.modelId >= 0) setAttr(cpu, "modelid", info.modelId);
    for (int child : topology_.nodes[index].children) writeNode(cpu, child);
  }

  // Whether `index` or something below it is a device NCCL records.
  bool worthWriting(int index) const {
    const Node& node = topology_.nodes[index];
    switch (node.kind) {
      case NodeKind::Gpu: return true;
      case NodeKind::Nic: {  // as NCCL lists NICs: its network devices, here the RDMA ones
        bool networkDevice = node.busId.empty() || topology_.source == Source::NcclXml;
        for (const NetPort& port : node.ports) networkDevice = networkDevice || port.inMatrix;
        return networkDevice;
      }
      case NodeKind::PciDevice: return topology_.source == Source::NcclXml;
      case NodeKind::NvSwitch: return false;  // NCCL knows NVSwitches only as NVLink targets
      default:
        for (int child : node.children)
          if (worthWriting(child)) return true;
        return topology_.source == Source::NcclXml && node.kind == NodeKind::Bridge;
    }
  }

  void writeNode(pugi::xml_node parent, int index) {
    const Node& node = topology_.nodes[index];
    if (!worthWriting(index)) return;
    bool hoist = node.kind == NodeKind::HostBridge ||
                 (node.kind == NodeKind::Bridge &&
                  (node.busId.empty() || node.role == BridgeRole::RootPort ||
                   node.role == BridgeRole::SwitchDownstream));
    if (hoist) {  // NCCL's tree skips these: a device's parent is its switch's upstream port
      for (int child : node.children) writeNode(parent, child);
      return;
    }
    if (node.kind == NodeKind::Nic && node.busId.empty()) {
      writePorts(parent.append_child("nic"), node.ports);
      return;
    }
    pugi::xml_node pci = parent.append_child("pci");
    setAttr(pci, "busid", node.busId);
    if (!node.pciClass.empty()) setAttr(pci, "class", node.pciClass);
    if (!node.vendor.empty()) setAttr(pci, "vendor", node.vendor);
    if (!node.device.empty()) setAttr(pci, "device", node.device);
    if (!node.subsystemVendor.empty()) setAttr(pci, "subsystem_vendor", node.subsystemVendor);
    if (!node.subsystemDevice.empty()) setAttr(pci, "subsystem_device", node.subsystemDevice);
    setAttr(pci, "link_speed", speedText(node.link));
    setAttr(pci, "link_width", node.link.width);
    if (node.kind == NodeKind::Gpu && node.gpu.described) writeGpu(pci, node.gpu);
    // A NIC keeps its <nic> unless its class alone says NIC, as in cloud providers' files; the
    // reader trusts the class only for a device without <pci> inside (else it is a bridge).
    if (node.kind == NodeKind::Nic &&
        (!node.ports.empty() || !classSaysNic(node.pciClass) || !node.children.empty()))
      writePorts(pci.append_child("nic"), node.ports);
    for (int child : node.children) writeNode(pci, child);
  }

  void writeGpu(pugi::xml_node pci, const GpuInfo& info) {
    pugi::xml_node gpu = pci.append_child("gpu");
    setAttr(gpu, "dev", info.index);
    setAttr(gpu, "sm", info.sm);
    setAttr(gpu, "rank", info.rank >= 0 ? info.rank : info.index);
    setAttr(gpu, "gdr", info.gdr >= 0 ? info.gdr : 0);
    for (const GpuLink& link : info.links) {
      pugi::xml_node element = gpu.append_child(info.xgmi ? "xgmi" : "nvlink");
      setAttr(element, "target", link.target);
      setAttr(element, "count", link.count);
      std::string tclass = link.targetClass;
      if (tclass.empty())
        tclass = link.peer == PeerKind::Gpu   ? "0x030200"
                 : link.peer == PeerKind::Cpu ? "0x068001"
                                              : "0x068000";
      setAttr(element, "tclass", tclass);
    }
    if (info.c2cCount > 0) {
      pugi::xml_node c2c = gpu.append_child("c2c");
      setAttr(c2c, "bw", info.c2cBwMBs);
      setAttr(c2c, "count", info.c2cCount);
    }
  }

  void writePorts(pugi::xml_node nic, const std::vector<NetPort>& ports) {
    for (const NetPort& port : ports) {
      if (!port.inMatrix && topology_.source != Source::NcclXml) continue;
      pugi::xml_node net = nic.append_child("net");
      setAttr(net, "name", port.name);
      setAttr(net, "dev", port.dev);
      if (!port.latency.empty()) setAttr(net, "latency", port.latency);
      setAttr(net, "speed", port.speedMbps);
      setAttr(net, "port", port.port >= 0 ? port.port : 0);
      if (!port.guid.empty()) setAttr(net, "guid", port.guid);
      if (port.maxconn >= 0) setAttr(net, "maxconn", port.maxconn);
      setAttr(net, "gdr", port.gdr >= 0 ? port.gdr : 0);
      if (port.coll >= 0) setAttr(net, "coll", port.coll);
    }
  }

  const Topology& topology_;
};

}  // namespace

Topology readNcclXml(std::string_view text, const std::string& origin) {
  XmlText xml(text, origin);
  auto [tabLine, tabColumn] = xml.firstTabBetweenTokens();
  if (tabLine > 0)
    fail(
        braidInvalidArgument,
        "{}:{}:{}: tab character; NCCL's topology parser does not skip tabs and would misread this "
        "file; expected spaces",
        origin, tabLine, tabColumn);
  Topology topology;
  topology.source = Source::NcclXml;
  topology.origin = origin;
  topology.hostBridgesKnown = false;
  NcclReader(xml, topology).read();
  assignGpuIndexes(topology);
  inferGpuFabric(topology);
  return topology;
}

std::string writeNcclXml(const Topology& topology) {
  return NcclWriter(topology).write();
}

std::vector<NcclGraph> readNcclGraphXml(std::string_view text, const std::string& origin) {
  XmlText xml(text, origin);
  pugi::xml_node root = xml.root();
  if (std::string(root.name()) != "graphs")
    fail(braidInvalidArgument,
         "{}: root element is <{}>; expected <graphs version=\"1\"> (NCCL graph XML)",
         xml.where(root), root.name());
  auto number = [&](pugi::xml_node node, const char* name) -> long long {
    std::string value = node.attribute(name).value();
    long long parsed = 0;
    if (!value.empty() && !parseNcclInt(value, &parsed))
      fail(braidInvalidArgument, "{}: <{} {}=\"{}\">: expected an integer", xml.where(node),
           node.name(), name, value);
    return parsed;
  };
  std::vector<NcclGraph> graphs;
  for (pugi::xml_node element : root.children("graph")) {
    NcclGraph graph;
    graph.id = static_cast<int>(number(element, "id"));
    graph.pattern = static_cast<int>(number(element, "pattern"));
    graph.nchannels = static_cast<int>(number(element, "nchannels"));
    graph.crossnic = static_cast<int>(number(element, "crossnic"));
    graph.speedIntra = element.attribute("speedintra").as_double();
    graph.speedInter = element.attribute("speedinter").as_double();
    graph.typeIntra = element.attribute("typeintra").value();
    graph.typeInter = element.attribute("typeinter").value();
    for (pugi::xml_node channel : element.children("channel")) {
      std::vector<NcclGraphStep> steps;
      for (pugi::xml_node step : channel.children()) {
        std::string name = step.name();
        if (name != "gpu" && name != "net") continue;
        steps.push_back({name == "net", number(step, "dev")});
      }
      graph.channels.push_back(std::move(steps));
    }
    graphs.push_back(std::move(graph));
  }
  return graphs;
}

const char* graphIdName(int id) {
  switch (id) {
    case 0: return "ring";
    case 1: return "tree";
    case 2: return "collnet";
    case 3: return "nvls";
    case 4: return "collnet direct";
  }
  return "unknown";
}

}  // namespace braid::topo
