// Every tunable, declared once: name, environment variable, type, default, help.
// Read from the environment on first use; `braid-perf --env` prints the table.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

// X(name, env, type, default, help)
#define BRAID_PARAMS(X)                                                                          \
  X(Debug, "BRAID_DEBUG", std::string, "WARN", "log level: NONE, WARN, INFO or TRACE")           \
  X(DebugSubsys, "BRAID_DEBUG_SUBSYS", std::string, "ALL",                                       \
    "subsystems logged at INFO/TRACE: INIT,COLL,P2P,SHM,NET,BOOTSTRAP,ENV or ALL; ^ excludes")   \
  X(DebugFile, "BRAID_DEBUG_FILE", std::string, "",                                              \
    "log to this file instead of stderr; %h is replaced by the host name, %p by the pid")        \
  X(TimeoutMs, "BRAID_TIMEOUT", int64_t, 600000,                                                 \
    "milliseconds an operation waits for a peer before failing with braidTimeout")               \
  X(Device, "BRAID_DEVICE", std::string, "auto", "communicator device: auto, cpu or cuda")       \
  X(CommId, "BRAID_COMM_ID", std::string, "",                                                    \
    "host:port of the rendezvous; every rank derives the same unique id from it")                \
  X(Secret, "BRAID_SECRET", std::string, "",                                                     \
    "shared secret for environment-started jobs (default: derived from the launcher's job id)")  \
  X(SocketIfname, "BRAID_SOCKET_IFNAME", std::string, "",                                        \
    "interfaces for bootstrap and net traffic: prefix list, ^ to exclude, = for exact names")    \
  X(NSocks, "BRAID_NSOCKS", int64_t, 1,                                                          \
    "TCP sockets per connection to a peer on another host (1..16); messages split across them")  \
  X(SocketKeepaliveMs, "BRAID_SOCKET_KEEPALIVE_MS", int64_t, 20000,                              \
    "a peer host answering no TCP keepalive probe for this long (ms) is reported unreachable")   \
  X(BuffSize, "BRAID_BUFFSIZE", int64_t, 1 << 20,                                                \
    "bytes of FIFO per connector (split into BRAID_FIFO_SLOTS slots)")                           \
  X(FifoSlots, "BRAID_FIFO_SLOTS", int64_t, 8, "slots per connector FIFO (pipeline depth)")      \
  X(DirectMaxBytes, "BRAID_DIRECT_MAX_BYTES", int64_t, 16384,                                    \
    "all-reduce messages up to this size use the one-shot all-pairs algorithm instead of rings") \
  X(StreamingMinBytes, "BRAID_STREAMING_MIN_BYTES", int64_t, 8 << 20,                            \
    "outputs of at least this many bytes per rank are written with non-temporal stores")         \
  X(ShmDisable, "BRAID_SHM_DISABLE", int64_t, 0, "1: never use shared memory between processes") \
  X(SpinCount, "BRAID_SPIN_COUNT", int64_t, 4000, "busy-poll iterations before a wait yields")   \
  X(YieldCount, "BRAID_YIELD_COUNT", int64_t, 200, "sched_yield rounds before a wait sleeps")    \
  X(Simd, "BRAID_SIMD", std::string, "auto", "host reduction kernels: auto, avx512, avx2, scalar")

namespace braid::param {

#define BRAID_DECLARE_PARAM(name, env, type, def, help) const type& name();
BRAID_PARAMS(BRAID_DECLARE_PARAM)
#undef BRAID_DECLARE_PARAM

struct Description {
  const char* env;
  std::string defaultValue;
  std::string currentValue;
  const char* help;
};
std::vector<Description> describeAll();

}  // namespace braid::param
