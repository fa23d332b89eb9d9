// The link graph of a communicator of CPU ranks, from what every rank reports about itself: its
// host, the NUMA node it runs on, and the network interface its host uses for other hosts.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "plan/plan.h"

namespace braid::plan {

struct HostRankInfo {
  uint64_t host = 0;        // ranks with equal values share a host (its memory and its NIC)
  uint64_t machine = 0;     // hosts with equal values share one machine's cores (namespaces)
  int32_t numa = -1;        // NUMA node the rank's thread runs on; -1 when not known
  int32_t nicNuma = -1;     // NUMA node of its host's network interface; -1 when not known
  double nicGBs = 0;        // a physical interface's GB/s per direction; 0 when there is none
  bool virtualNic = false;  // a veth, bridge or loopback: the machine's own TCP copies set its pace
  double llcBytes = 0;      // the last-level cache of the CPU the rank runs on; 0: unknown
};

// What this rank reports: the NUMA node it runs on now, its CPU's last-level cache, and the
// interface `nicName` (the one the bootstrap uses): its speed and NUMA node, or that it is virtual
// (veth, bridge, loopback), whose "speed" is made up. The host's facts come from topology
// discovery (topology/live.h), once per process.
HostRankInfo describeThisRank(const std::string& nicName);

// One Cpu vertex per NUMA node in use (joined pairwise by InterSocket links), each rank on its NUMA
// node by a Memory link, and when there are several hosts one Nic per host joined to the Network.
// A virtual interface carries BRAID_MODEL_TCP_GBS (what a machine's kernel moves over TCP through
// its virtual interfaces, all streams together) shared by the hosts of its machine.
// Hosts are numbered in the order of their lowest rank.
LinkGraph hostGraph(const std::vector<HostRankInfo>& ranks);

}  // namespace braid::plan
