// braid's model of a machine: one tree of CPUs (one per NUMA node), PCIe host bridges, bridges and
// switches, and endpoints (GPUs, NICs, NVSwitches), plus NVLink (or AMD xGMI) links between GPUs.
// Every source — live discovery, hwloc XML, NCCL topology XML — builds this model, and path classes
// and bandwidths are computed from it alone. See docs/topology.md.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

namespace braid::topo {

enum class Source { Live, HwlocXml, NcclXml };

enum class NodeKind : uint8_t { Cpu, HostBridge, Bridge, Gpu, Nic, NvSwitch, PciDevice };

// How a bridge counts in nvidia-smi's "at most a single PCIe bridge" rule: all ports of one switch
// count once. Full trees (hwloc, sysfs) have root ports and switch up/downstream ports; an NCCL
// file has one <pci> per switch (NCCL skips root and downstream ports), which is Switch.
enum class BridgeRole : uint8_t { None, RootPort, SwitchUpstream, SwitchDownstream, Switch };

// The PCIe link from a node up to its parent.
struct PciLink {
  double laneGTs = 0;     // per-lane transfer rate in GT/s; 0 when the source does not say
  int width = 0;          // lanes; 0 when the source does not say
  double givenGBs = 0;    // bandwidth as the source states it (hwloc XML), 0 when not given
  bool internal = false;  // no physical link: a root port inside the CPU, a switch's internal bus
  std::string speedText;  // NCCL's link_speed text as read, written back unchanged

  // GB/s per direction. A missing rate or width is taken as Gen3 or x16, as NCCL does.
  double bandwidth() const;
  bool estimated() const { return givenGBs <= 0 && (laneGTs <= 0 || width <= 0); }
};

enum class PeerKind : uint8_t { Gpu, NvSwitch, Cpu };

// NVLinks (or xGMI links) from a GPU to one peer, as NCCL's <nvlink target count tclass>.
struct GpuLink {
  std::string target;  // the peer's bus id (canonical when it parses, else as written)
  int count = 0;       // links to that peer
  PeerKind peer = PeerKind::NvSwitch;
  std::string targetClass;  // NCCL's tclass as read ("0x068000"), kept for dumps
};

struct GpuInfo {
  int index = -1;                // CUDA/NVML device index: the n of "GPUn"
  int rank = -1;                 // NCCL rank in a dump; -1 when none
  int sm = 0;                    // compute capability x10; 0 when not known
  int gdr = -1;                  // NCCL's GPUDirect RDMA flag; -1 when not known
  int numaId = -1;               // the GPU's own NUMA node (coherent GPU memory); -1 = N/A
  bool localityUnknown = false;  // the OS knows no NUMA node for it: nvidia-smi prints N/A
  bool described = false;  // the source described the GPU itself (NCCL <gpu>, NVML, hwloc osdev)
  bool xgmi = false;       // links are AMD xGMI (RCCL dialect), not NVLink
  std::string model;
  std::vector<GpuLink> links;
  int c2cBwMBs = 0, c2cCount = 0;  // NCCL <c2c> (Grace), kept for dumps
};

// One network port: an NCCL <net>, an RDMA device, or a network interface.
struct NetPort {
  std::string name;
  int dev = -1;       // NCCL network device index
  int speedMbps = 0;  // 0 when not known
  int port = -1;
  int gdr = -1, maxconn = -1, coll = -1;
  std::string guid, latency;
  // Shown as a NIC column of the matrix. nvidia-smi shows RDMA devices; an NCCL file shows the
  // network devices NCCL uses.
  bool inMatrix = false;
};

struct CpuInfo {
  int numaId = -1;        // -1 when not known (NCCL numaid="-1")
  std::vector<int> cpus;  // sorted; empty when not known
  std::string arch, vendor, model, hostHash;
  int familyId = -1,
      modelId = -1;     // in NCCL's encoding (family + extFamily<<4, model + extModel<<4)
  double llcBytes = 0;  // the last-level cache of its CPUs (live discovery); 0 when not known
};

struct Node {
  NodeKind kind = NodeKind::PciDevice;
  int parent = -1;
  std::vector<int> children;
  std::string busId;     // "dddd:bb:dd.f"; host bridges "dddd:[bb-bb]"; empty for CPUs
  std::string pciClass;  // "0x030200" as the source gives it; empty when not known
  std::string vendor, device, subsystemVendor, subsystemDevice;  // "0x10de"; empty when not known
  std::string name;  // a description: the PCI device name, the GPU model
  BridgeRole role = BridgeRole::None;
  PciLink link;                // to the parent
  CpuInfo cpu;                 // kind Cpu
  GpuInfo gpu;                 // kind Gpu
  std::vector<NetPort> ports;  // kind Nic
  int line = 0;                // line in the source file; 0 when not from a file
};

struct Topology {
  Source source = Source::Live;
  std::string origin;            // the file read, or "live"
  bool rccl = false;             // RCCL's dialect of the NCCL file (version 2, xGMI)
  bool hostBridgesKnown = true;  // false for NCCL files: PHB and NODE cannot be told apart
  std::vector<Node> nodes;
  std::vector<std::string> notes;    // what the source could not tell, said under the output
  std::vector<std::string> sources;  // live discovery: what was consulted and what it found
  double discoveryMs = 0;            // live discovery time

  // Appends `node` under `parent` (-1 for none) and returns its index. Fails on a bus id already
  // present, naming both places.
  int add(Node node, int parent);
  int findBus(const std::string& busId) const;
  // The Cpu node above `node` (itself for a Cpu), -1 when none.
  int cpuOf(int node) const;
  // Ancestors of `node` from its parent up to the root.
  std::vector<int> ancestors(int node) const;

 private:
  std::unordered_map<std::string, int> byBus_;
};

// A row/column of the matrix: a GPU, or one port of a NIC (nvidia-smi lists ports).
struct Endpoint {
  int node = -1;
  int port = -1;      // index into Node::ports; -1 for a GPU or a NIC known by class only
  std::string label;  // "GPU0", "NIC3"
  std::string name;   // the NIC's name for the legend
};

// GPUs by index, then NIC ports by name (natural order: mlx5_2 before mlx5_10).
std::vector<Endpoint> endpoints(const Topology& topology);
std::vector<int> gpuNodes(const Topology& topology);

// Gives bridges their roles from the tree's shape (host bridge > root port > switch upstream port
// > downstream ports > ...), and marks root and downstream ports' uplinks internal.
void assignBridgeRoles(Topology& topology);
// Gives GPUs without a valid unique index the lowest free numbers, in bus id order.
void assignGpuIndexes(Topology& topology);
// Files (an NCCL topology file, hwloc XML) often name GPUs by PCI class alone: NCCL reads their
// NVLinks from NVML at run time. Where the file holds eight GPUs with the PCI device id of an SXM
// part (A100/A800 SXM4, H100/H800/H200 SXM5, B200), as on an HGX 8-GPU board, which joins them all
// to NVSwitches, those without NVLink detail get the part's NVLinks to the NVSwitches. Where eight
// GPUs carry no id at all but sit as the HGX H100/H200 board seats them (PCIe Gen5 x16, each
// paired with one NIC), they are taken for H100 SXM5. Either way the topology's notes say what the
// file lacked and what was inferred, never a silent PCIe plan.
void inferGpuFabric(Topology& topology);

// "0000:0f:00.0" from forms like "00000000:0F:00.0" or "0:f:0.0"; empty when `text` is not one.
std::string canonicalBusId(const std::string& text);
// The rate of a PCIe link_speed text, as sysfs and NCCL write it ("16.0 GT/s PCIe", "8 GT/s",
// "32 GT/s PCIe/s"); 0 when not that form ("", "Unknown").
double parseLinkSpeed(const std::string& text);
// GB/s per lane per direction after line encoding.
double laneGBs(double laneGTs);
// NVLink GB/s per link per direction by compute capability (xGMI: AMD MI300X's rate).
double linkRateGBs(const GpuInfo& gpu, bool* estimated);
// Compute capability x10 from a GPU model name ("Tesla V100-SXM2-16GB" -> 70); 0 when unknown.
int smFromModel(const std::string& model);
// NCCL's name for a machine architecture: "x86_64", "arm64" (aarch64), "ppc64" (ppc64le).
std::string ncclArch(const std::string& machine);
// Inter-socket bandwidth (GB/s) of this CPU generation; NCCL's figures.
double interSocketGBs(const CpuInfo& cpu, bool* estimated);
// "0-23,48-71"; "N/A" when empty.
std::string cpuList(const std::vector<int>& cpus);
// Linux cpumask ("0000ffff,0000ffff") <-> sorted CPU numbers. Parsing returns false on bad text.
bool parseCpuMask(const std::string& mask, std::vector<int>* cpus);
std::string cpuMask(const std::vector<int>& cpus);
const char* kindName(NodeKind kind);

}  // namespace braid::topo
