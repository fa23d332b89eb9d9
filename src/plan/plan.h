// The ring planner (DESIGN.md, "Topology and the planner"): a graph of links with capacities and
// the ranks placed on it -> channels (ring orders that reserve bandwidth on every link they cross),
// checked by a validator, priced by a latency + bandwidth model (plan/model.h).
//
// The graph is abstract on purpose: the communicator builds it for CPU ranks from what every rank
// reports (host, NUMA node, network interface; plan/host_graph.h), tools and tests build it from a
// machine's topology (plan/from_topology.h). The search knows neither source.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace braid::plan {

enum class VertexKind : uint8_t {
  Rank,      // a rank's endpoint: its GPU, or its CPU thread
  Cpu,       // a NUMA node (memory and the root complex below it)
  Switch,    // a PCIe switch, bridge or host bridge
  NvSwitch,  // NVSwitch fabric of one host
  Nic,       // one network port of a host
  Network    // the fabric between hosts (one vertex for all of them)
};

enum class LinkKind : uint8_t {
  NvLink,       // GPU-GPU or GPU-NVSwitch (AMD xGMI too)
  Pcie,         // a PCIe link (GB/s as NCCL counts it: 75% of the raw rate)
  InterSocket,  // CPU-CPU (QPI/UPI/xGMI/X-Bus)
  Memory,       // a CPU rank to its NUMA node: shared memory, no link to reserve
  Network       // a NIC port to the fabric
};

// The capacity of a Memory link: shared memory between ranks of a host reserves nothing on a link;
// what limits CPU ranks is their cores, which the model prices. Never a ring's bottleneck.
constexpr double kSharedMemoryGBs = 1000;

struct Vertex {
  VertexKind kind = VertexKind::Switch;
  int host = 0;       // index of the host this vertex belongs to; -1 for the Network vertex
  std::string label;  // "GPU3", "NUMA1", "mlx5_0", "PCI 0000:17:00.0"; for messages and dumps
};

// One direction of a link. Links are full duplex: addLink() adds both directions, each with the
// full capacity.
struct Edge {
  int from = -1, to = -1;
  double capacityGBs = 0;  // per direction, GB/s (1e9 bytes)
  LinkKind kind = LinkKind::Pcie;
};

struct LinkGraph {
  std::vector<Vertex> vertices;
  std::vector<Edge> edges;
  std::vector<int> rankVertex;  // rank -> its Rank vertex
  int hosts = 0;
  // Hosts with the same class have the same shape (the same topology, ranks and NICs in the same
  // places), so the search may plan one and reuse it; -1 = unique. Indexed by host.
  std::vector<int> hostClass;

  int addVertex(VertexKind kind, int host, std::string label);
  // Both directions, `capacityGBs` each. Returns the index of the first direction; the reverse is
  // the next index.
  int addLink(int a, int b, double capacityGBs, LinkKind kind);
  // Appends a Rank vertex for the next rank and links it to `attach` (Memory links for CPU ranks).
  int addRank(int host, std::string label, int attach, double capacityGBs, LinkKind kind);
  int nranks() const { return static_cast<int>(rankVertex.size()); }
  int hostOfRank(int rank) const { return vertices[rankVertex[rank]].host; }
};

// How a hop moves bytes, from the links its route crosses.
enum class HopKind : uint8_t {
  NvLink,      // only NvLink edges
  PcieP2p,     // GPU to GPU over PCIe without touching a CPU's memory (PIX/PXB)
  HostMemory,  // through a CPU: shared memory between CPU ranks, or GPU traffic through the RC
  Network      // crosses the Network vertex
};
const char* hopKindName(HopKind kind);

struct Hop {
  int from = -1, to = -1;  // ranks
  std::vector<int> route;  // edge indices, from `from`'s Rank vertex to `to`'s
  HopKind kind = HopKind::HostMemory;
  int nicOut = -1, nicIn = -1;  // Nic vertices where the hop leaves and enters a host; else -1
};

struct Channel {
  std::vector<int> order;   // ranks, a permutation; the ring closes from back() to front()
  std::vector<Hop> hops;    // hops[i] goes from order[i] to order[(i + 1) % n]
  double bandwidthGBs = 0;  // reserved on every edge of every hop's route
};

struct Plan {
  int nranks = 0;
  std::vector<Channel> channels;
  bool fallback = false;  // the search ran out of time and kept the structural order
  double searchMs = 0;
  std::vector<std::string> notes;    // why the plan looks the way it does, for the user
  double totalBandwidthGBs() const;  // sum over channels
};

struct SearchOptions {
  int minChannels = 1;
  int maxChannels = 32;
  // Past this, the search keeps the best plan found so far, or the structural fallback.
  std::chrono::milliseconds budget{200};
};

// As many rings as the links carry without oversubscribing any: a channel reserves its bandwidth
// on every edge of its routes; ranks of a host stay contiguous; a ring leaves and enters a host
// through the NIC nearest the GPUs at the ends of that host's stretch, channels spread over NICs
// (channel c of every host uses the same NIC index: rail-aligned). Throws braid::Error
// (braidInvalidArgument) for a graph it cannot plan (a rank no route reaches, ...), naming it.
Plan search(const LinkGraph& graph, const SearchOptions& options = {});

// Throws braid::Error (braidInternalError) naming the channel, the rank or the edge when a ring is
// not a permutation of the ranks, a hop's route does not connect its ranks, a route passes through
// another rank, or the channels reserve more than an edge's capacity.
void validate(const LinkGraph& graph, const Plan& plan);

// Human-readable: one line per channel ("0 -> 1 -> 3 -> 2 -> 0  24.0 GB/s  NVL NVL PCI SYS"),
// then the notes.
std::string describe(const LinkGraph& graph, const Plan& plan);

}  // namespace braid::plan
