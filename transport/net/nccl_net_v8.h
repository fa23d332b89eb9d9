// The NCCL net plug-in ABI, version 8 (ncclNet_v8_t): what a libnccl-net-NAME.so exports as
// ncclNetPlugin_v8. Declared here from the ABI as NCCL documents it (ext-net/example/nccl/net_v8.h,
// net_device.h, err.h, common.h; src/include/plugin/net/net_v8.h): the same type and member names
// in the same order, in braid's namespace so that no NCCL header is needed. Plug-ins are C, built
// apart from braid: the layout must match theirs to the byte, and the asserts below pin it for
// LP64 Linux.
#pragma once

#include <cstddef>
#include <cstdint>

namespace braid::net::nccl {

// Plug-ins return nccl.h's codes; these are the ones NCCL's plug-in headers name.
enum ncclResult_t : int {
  ncclSuccess = 0,
  ncclUnhandledCudaError = 1,
  ncclSystemError = 2,
  ncclInternalError = 3,
  ncclInvalidArgument = 4,
  ncclInvalidUsage = 5,
  ncclRemoteError = 6,
  ncclInProgress = 7,
};

enum ncclDebugLogLevel : int {
  NCCL_LOG_NONE = 0,
  NCCL_LOG_VERSION = 1,
  NCCL_LOG_WARN = 2,
  NCCL_LOG_INFO = 3,
  NCCL_LOG_ABORT = 4,
  NCCL_LOG_TRACE = 5,
};
// The subsystem flag of network messages (NCCL_NET in ncclDebugLogSubSys).
constexpr unsigned long kLogNet = 16;

// printf-style; given to init() for the plug-in's messages.
using ncclDebugLogger_t = void (*)(ncclDebugLogLevel level, unsigned long flags, const char* file,
                                   int line, const char* fmt, ...);

enum ncclNetDeviceType : int { NCCL_NET_DEVICE_HOST = 0, NCCL_NET_DEVICE_UNPACK = 1 };
constexpr int kNetDeviceInvalidVersion = 0;  // NCCL_NET_DEVICE_INVALID_VERSION

// A connection's device-side (offload) handle. connect() and accept() take a pointer to a pointer
// to one; a null pointer asks for no offload.
struct ncclNetDeviceHandle_v8_t {
  ncclNetDeviceType netDeviceType;
  int netDeviceVersion;
  void* handle;
  size_t size;
  int needsProxyProgress;
};

constexpr size_t kNetHandleMaxSize = 128;  // NCCL_NET_HANDLE_MAXSIZE: what listen() may fill
constexpr int kNetMaxRequests = 32;        // NCCL_NET_MAX_REQUESTS in flight per comm
// Host memory, as a regMr type and a ptrSupport bit (NCCL_PTR_HOST; CUDA is 0x2, DMA-BUF 0x4).
constexpr int kPtrHost = 0x1;

struct ncclNetProperties_v8_t {
  char* name;       // for logs
  char* pciPath;    // the device's PCI path in /sys; null for none
  uint64_t guid;    // the NIC chip, to tell ports of one NIC from NICs
  int ptrSupport;   // NCCL_PTR_* bits: the memory regMr accepts
  int regIsGlobal;  // registrations are not tied to a comm
  int speed;        // Mbps
  int port;
  float latency;  // us; 0: NCCL's default
  int maxComms;   // comms the device can hold
  int maxRecvs;   // buffers one irecv may post (grouped receives)
  ncclNetDeviceType netDeviceType;
  int netDeviceVersion;
};

// Every call returns ncclSuccess or an error code. connect() and accept() never wait: they return
// success with a null comm until the connection is up, and are called again. isend() and irecv()
// return a null request when they cannot post now. A request lives until test() reports it done.
struct ncclNet_v8_t {
  const char* name;
  ncclResult_t (*init)(ncclDebugLogger_t logFunction);
  ncclResult_t (*devices)(int* ndev);
  ncclResult_t (*getProperties)(int dev, ncclNetProperties_v8_t* props);
  // Fills `handle` (kNetHandleMaxSize bytes) for the peers that will connect.
  ncclResult_t (*listen)(int dev, void* handle, void** listenComm);
  ncclResult_t (*connect)(int dev, void* handle, void** sendComm,
                          ncclNetDeviceHandle_v8_t** sendDevComm);
  ncclResult_t (*accept)(void* listenComm, void** recvComm, ncclNetDeviceHandle_v8_t** recvDevComm);
  // `comm` is a sendComm or a recvComm; `type` an NCCL_PTR_* bit.
  ncclResult_t (*regMr)(void* comm, void* data, size_t size, int type, void** mhandle);
  ncclResult_t (*regMrDmaBuf)(void* comm, void* data, size_t size, int type, uint64_t offset,
                              int fd, void** mhandle);
  ncclResult_t (*deregMr)(void* comm, void* mhandle);
  ncclResult_t (*isend)(void* sendComm, void* data, int size, int tag, void* mhandle,
                        void** request);
  // Posts `n` (at most maxRecvs) buffers of sizes[i] bytes, for messages sent with tags[i].
  ncclResult_t (*irecv)(void* recvComm, int n, void** data, int* sizes, int* tags, void** mhandles,
                        void** request);
  // Makes data received into CUDA memory visible to the GPU.
  ncclResult_t (*iflush)(void* recvComm, int n, void** data, int* sizes, void** mhandles,
                         void** request);
  // Sets *done; once done, sizes (when not null) gets the bytes sent, or received per buffer.
  ncclResult_t (*test)(void* request, int* done, int* sizes);
  ncclResult_t (*closeSend)(void* sendComm);
  ncclResult_t (*closeRecv)(void* recvComm);
  ncclResult_t (*closeListen)(void* listenComm);
  // Device offload (netDeviceType other than host) only; may be null otherwise.
  ncclResult_t (*getDeviceMr)(void* comm, void* mhandle, void** dptr_mhandle);
  ncclResult_t (*irecvConsumed)(void* recvComm, int n, void* request);
};

static_assert(sizeof(ncclNetDeviceHandle_v8_t) == 32);
static_assert(offsetof(ncclNetDeviceHandle_v8_t, handle) == 8);
static_assert(offsetof(ncclNetDeviceHandle_v8_t, size) == 16);
static_assert(offsetof(ncclNetDeviceHandle_v8_t, needsProxyProgress) == 24);

static_assert(sizeof(ncclNetProperties_v8_t) == 64);
static_assert(offsetof(ncclNetProperties_v8_t, pciPath) == 8);
static_assert(offsetof(ncclNetProperties_v8_t, guid) == 16);
static_assert(offsetof(ncclNetProperties_v8_t, ptrSupport) == 24);
static_assert(offsetof(ncclNetProperties_v8_t, regIsGlobal) == 28);
static_assert(offsetof(ncclNetProperties_v8_t, speed) == 32);
static_assert(offsetof(ncclNetProperties_v8_t, port) == 36);
static_assert(offsetof(ncclNetProperties_v8_t, latency) == 40);
static_assert(offsetof(ncclNetProperties_v8_t, maxComms) == 44);
static_assert(offsetof(ncclNetProperties_v8_t, maxRecvs) == 48);
static_assert(offsetof(ncclNetProperties_v8_t, netDeviceType) == 52);
static_assert(offsetof(ncclNetProperties_v8_t, netDeviceVersion) == 56);

// A name and 18 functions, each a pointer, in this order.
static_assert(sizeof(ncclNet_v8_t) == 19 * sizeof(void*));
static_assert(offsetof(ncclNet_v8_t, init) == 1 * sizeof(void*));
static_assert(offsetof(ncclNet_v8_t, listen) == 4 * sizeof(void*));
static_assert(offsetof(ncclNet_v8_t, regMr) == 7 * sizeof(void*));
static_assert(offsetof(ncclNet_v8_t, isend) == 10 * sizeof(void*));
static_assert(offsetof(ncclNet_v8_t, test) == 13 * sizeof(void*));
static_assert(offsetof(ncclNet_v8_t, closeListen) == 16 * sizeof(void*));
static_assert(offsetof(ncclNet_v8_t, irecvConsumed) == 18 * sizeof(void*));

}  // namespace braid::net::nccl
