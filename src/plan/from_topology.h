// The planner's link graph from a machine's topology (braid-topo --plan, tests, benchmarks).
//
// Vertices: every CPU (NUMA node); a Switch per host bridge, bridge or PCIe switch above a rank or
// a NIC (ports joined to their parent by an internal link, such as a switch's downstream ports,
// are folded into it); a Rank per GPU (the first `ranksPerHost` by index, all when <= 0); a Nic
// per network port of a PCI NIC (its RDMA ports when it has any; interfaces with no PCI device
// are left out), named after the port ("mlx5_0"), or "NIC <bus id>" for a NIC known by its PCI
// class alone; one NvSwitch vertex per host for the GPUs' links to NVSwitches. Ports of one GUID
// share their device's PCIe link (a Switch vertex for the device). With several hosts every label
// starts with "h<host>:".
// A machine without GPUs gets `ranksPerHost` CPU ranks (one per NUMA node when <= 0), placed
// round-robin over the NUMA nodes by Memory links of kSharedMemoryGBs.
//
// Capacities, per direction, in NCCL's units so that plans compare with NCCL's graphs:
// - PCIe: 75% of the raw rate, GT/s x lanes / 8 (Gen3 x16 = 12 GB/s, Gen4 x16 = 24). hwloc
//   states GB/s after line encoding; that is scaled back by 130/128. A link the file gives no
//   speed for runs at the PCIe generation native to the machine's GPUs (sm80, sm86, sm89: Gen4;
//   sm90 and later: Gen5; else Gen3), a missing width is x16.
// - NVLink: links x the per-link rate of the GPU generation (topology's linkRateGBs), GPU to GPU,
//   GPU to the host's NVSwitch vertex, and GPU to its CPU (POWER). Links to itself are ignored.
// - InterSocket: between every pair of CPUs, NCCL's figure for the CPU (interSocketGBs).
// - Network: a port's speed (Mbps / 8000); a port of unknown speed gets its NIC's PCIe rate.
//
// `hosts` copies of the machine, host h holding ranks h*ranksPerHost.., all of host class 0; with
// more than one host, every Nic links to one Network vertex (a non-blocking fabric).
#pragma once

#include "plan/plan.h"
#include "topology/topology.h"

namespace braid::plan {

// Throws braid::Error (braidInvalidArgument) when the machine has fewer GPUs than ranksPerHost, no
// CPU, or hosts < 1.
LinkGraph fromTopology(const topo::Topology& topology, int ranksPerHost, int hosts);

}  // namespace braid::plan
