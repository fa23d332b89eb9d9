// Every tunable, declared once: name, environment variable, type, default, help.
// Read from the environment on first use; `braid-perf --env` prints the table.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

// X(name, env, type, default, help)
#define BRAID_PARAMS(X)                                                                            \
  X(Debug, "BRAID_DEBUG", std::string, "WARN", "log level: NONE, WARN, INFO or TRACE")             \
  X(DebugSubsys, "BRAID_DEBUG_SUBSYS", std::string, "ALL",                                         \
    "subsystems logged at INFO/TRACE: INIT,COLL,P2P,SHM,NET,BOOTSTRAP,ENV or ALL; ^ excludes")     \
  X(DebugFile, "BRAID_DEBUG_FILE", std::string, "",                                                \
    "log to this file instead of stderr; %h is replaced by the host name, %p by the pid")          \
  X(TimeoutMs, "BRAID_TIMEOUT", int64_t, 600000,                                                   \
    "milliseconds an operation waits for a peer before failing with braidTimeout (on a GPU, from " \
    "its kernel's start: a group's work list shares one)")                                         \
  X(Device, "BRAID_DEVICE", std::string, "auto", "communicator device: auto, cpu or cuda")         \
  X(CommId, "BRAID_COMM_ID", std::string, "",                                                      \
    "host:port of the rendezvous; every rank derives the same unique id from it")                  \
  X(Secret, "BRAID_SECRET", std::string, "",                                                       \
    "shared secret for environment-started jobs (default: derived from the launcher's job id)")    \
  X(SocketIfname, "BRAID_SOCKET_IFNAME", std::string, "",                                          \
    "interfaces for bootstrap and net traffic: prefix list, ^ to exclude, = for exact names")      \
  X(NSocks, "BRAID_NSOCKS", int64_t, 1,                                                            \
    "TCP sockets each direction of a connection to another host owns (1..16), besides a shared "   \
    "one: messages larger than a TCP segment split across them")                                   \
  X(SocketKeepaliveMs, "BRAID_SOCKET_KEEPALIVE_MS", int64_t, 20000,                                \
    "a peer host answering no TCP keepalive probe for this long (ms) is reported unreachable")     \
  X(Net, "BRAID_NET", std::string, "",                                                             \
    "network between hosts: socket or ucx (default: ucx where an RDMA device is present, else "    \
    "socket)")                                                                                     \
  X(NetPlugin, "BRAID_NET_PLUGIN", std::string, "",                                                \
    "an NCCL net plug-in (ncclNet v8) to carry traffic between hosts: a path, or NAME for "        \
    "libnccl-net-NAME.so")                                                                         \
  X(BuffSize, "BRAID_BUFFSIZE", int64_t, 0,                                                        \
    "bytes of FIFO per connector (split into BRAID_FIFO_SLOTS slots); 0: 1 MiB")                   \
  X(FifoSlots, "BRAID_FIFO_SLOTS", int64_t, 8, "slots per connector FIFO (pipeline depth)")        \
  X(Algo, "BRAID_ALGO", std::string, "",                                                           \
    "algorithms the planner may choose: ring, direct, doubling, halving, tree, hier-doubling, "    \
    "hier-halving, hier (both), bruck (comma-separated; empty: the model picks)")                  \
  X(HalvingLevels, "BRAID_HALVING_LEVELS", int64_t, 0,                                             \
    "of recursive halving's exchanges, how many halve (the rest double on the part held); 0: the " \
    "model picks per size")                                                                        \
  X(Proto, "BRAID_PROTO", std::string, "",                                                         \
    "protocols the planner may choose: simple, ll, segmented (host transports run simple only; "   \
    "devices take segmented only where named)")                                                    \
  X(MinNChannels, "BRAID_MIN_NCHANNELS", int64_t, 1, "fewest channels (rings) the planner makes")  \
  X(MaxNChannels, "BRAID_MAX_NCHANNELS", int64_t, 32, "most channels (rings) the planner makes")   \
  X(PlanFile, "BRAID_PLAN_FILE", std::string, "",                                                  \
    "load the channels from this plan file (JSON, as BRAID_PLAN_DUMP_FILE writes) instead of "     \
    "searching")                                                                                   \
  X(PlanDumpFile, "BRAID_PLAN_DUMP_FILE", std::string, "",                                         \
    "rank 0 writes the communicator's plan here (JSON); %h host, %p pid")                          \
  X(ModelReduceGBs, "BRAID_MODEL_REDUCE_GBS", double, 6.5,                                         \
    "model: ring bytes/s (GB/s) one host core pushes through reduce-scatter steps")                \
  X(ModelCopyGBs, "BRAID_MODEL_COPY_GBS", double, 7.5,                                             \
    "model: ring bytes/s (GB/s) one host core pushes through all-gather steps")                    \
  X(ModelCachedSpeedup, "BRAID_MODEL_CACHED_SPEEDUP", double, 2.0,                                 \
    "model: how much faster host cores run ring steps whose data stays in the last-level cache")   \
  X(ModelSharedCoreCost, "BRAID_MODEL_SHARED_CORE_COST", double, 0.8,                              \
    "model: a rank's ring cost on a core it shares, per rank on that core (slots stay in its "     \
    "cache)")                                                                                      \
  X(ModelTcpGBs, "BRAID_MODEL_TCP_GBS", double, 3.2,                                               \
    "model: GB/s a machine's TCP moves through virtual interfaces (veth), all streams together")   \
  X(ModelCallUs, "BRAID_MODEL_CALL_US", double, 0.3, "model: microseconds of one call's overhead") \
  X(ModelHopUs, "BRAID_MODEL_HOP_US", double, 1.0,                                                 \
    "model: microseconds of one handoff between ranks of a host")                                  \
  X(ModelNetHopUs, "BRAID_MODEL_NET_HOP_US", double, 15.0,                                         \
    "model: microseconds of one message to another host")                                          \
  X(ModelSwitchUs, "BRAID_MODEL_SWITCH_US", double, 40.0,                                          \
    "model: microseconds of a core switch when busy threads outnumber cores: per handoff of a "    \
    "call's first ring pass and per FIFO window")                                                  \
  X(StreamingMinBytes, "BRAID_STREAMING_MIN_BYTES", int64_t, 8 << 20,                              \
    "outputs of at least this many bytes per rank are written with non-temporal stores")           \
  X(HostNChannels, "BRAID_HOST_NCHANNELS", int64_t, 0,                                             \
    "CPU channels of a host communicator (rings each moving a share of a large call, on a thread " \
    "of its own, over FIFOs of its own); 0: as many as the busiest machine's cores give each of "  \
    "its ranks, at most 4, within BRAID_MIN_NCHANNELS..BRAID_MAX_NCHANNELS")                       \
  X(HostChannelMinBytes, "BRAID_HOST_CHANNEL_MIN_BYTES", int64_t, 2 << 20,                         \
    "host ring calls whose output is at least this large run on every CPU channel")                \
  X(GroupFuseBytes, "BRAID_GROUP_FUSE_BYTES", int64_t, 16 << 10,                                   \
    "consecutive collectives of a group that agree (collective, datatype, operator, root), each "  \
    "of at most this many bytes, run as one call over a staging buffer where the model prices "    \
    "that below the calls one by one; 0: each call alone")                                         \
  X(GroupFuseMaxBytes, "BRAID_GROUP_FUSE_MAX_BYTES", int64_t, 16 << 20,                            \
    "the calls of one such fused pass hold at most this many bytes together")                      \
  X(SlotStores, "BRAID_SLOT_STORES", std::string, "auto",                                          \
    "how ring calls of 1 MiB or more write FIFO slots: cached, streaming (non-temporal) or auto "  \
    "(each rank measures both and keeps the faster)")                                              \
  X(ShmDisable, "BRAID_SHM_DISABLE", int64_t, 0, "1: never use shared memory between processes")   \
  X(SpinCount, "BRAID_SPIN_COUNT", int64_t, 4000, "busy-poll iterations before a wait yields")     \
  X(YieldCount, "BRAID_YIELD_COUNT", int64_t, 200,                                                 \
    "sched_yield rounds before a wait sleeps (unset: 2000 where ranks drive network links)")       \
  X(DeviceLaunchWorks, "BRAID_DEVICE_LAUNCH_WORKS", int64_t, 32,                                   \
    "the most consecutive ring collectives of a group one kernel launch of a CUDA communicator's " \
    "rank carries (a work list, docs/core.md; at most 32); 1: each collective alone")              \
  X(LaunchInRounds, "BRAID_LAUNCH_ROUNDS", int64_t, 1,                                             \
    "0: ranks that share a GPU from threads of one process queue collectives without waiting "     \
    "for each other's rounds (for diagnosis only: see docs/cuda.md)")                              \
  X(Simd, "BRAID_SIMD", std::string, "auto", "host reduction kernels: auto, avx512, avx2, scalar")

namespace braid::param {

// name(): the value read at first use, for the life of the process. name##Now(): the environment
// read again (braidResetDebugInit). name##IsSet(): whether the environment sets it, where a
// communicator may otherwise choose its own default (BRAID_YIELD_COUNT across hosts).
#define BRAID_DECLARE_PARAM(name, env, type, def, help) \
  const type& name();                                   \
  type name##Now();                                     \
  bool name##IsSet();
BRAID_PARAMS(BRAID_DECLARE_PARAM)
#undef BRAID_DECLARE_PARAM

struct Description {
  const char* env;
  std::string defaultValue;
  std::string currentValue;
  const char* help;
};
std::vector<Description> describeAll();

// BRAID_BUFFSIZE, or where it is 0 its default. Across hosts every slot is a network message with
// a fixed cost: 512 KiB slots rather than 128 KiB made a 2-host all-reduce of 256 KiB - 16 MiB
// 1.2-1.6x faster (docs/net.md); within a host 1 MiB holds the cache-resident sizes.
int64_t fifoBytes();

}  // namespace braid::param
